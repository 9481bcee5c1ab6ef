# Cython's declarations for wiring.py (see engine.pxd): `wire`'s per-op loop with C ints.
cimport cython

@cython.locals(n=Py_ssize_t, g=Py_ssize_t, b=Py_ssize_t, rank=Py_ssize_t, code=int, q=Py_ssize_t, algo=int, proto=int,
               first=Py_ssize_t, p=Py_ssize_t, k=Py_ssize_t, comm=bint, stream_only=bint, facts=dict, seq=dict, unmatched=dict,
               partner_at=cython.int[:], queue_of=cython.int[:], coll_of=cython.int[:], kind_of=cython.uchar[:],
               on_stream_of=cython.uchar[:], algo_of=cython.uchar[:], proto_of=cython.uchar[:])
cpdef wire(program, list ops, list base, machine, network, bint symmetric=*)
