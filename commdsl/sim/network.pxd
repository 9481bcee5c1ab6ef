# Cython's declarations for network.py (see engine.pxd): Network is a C-struct class, so
# that the flow network, compiled, can be one too; a transfer log's entries are C calls.
cdef class TransferLog:
    cdef public object transfers, _index, kind, start, end, _ops, _ops_at, _int_start

    cpdef tuple intern(self, transfer)
    cpdef Py_ssize_t add(self, Py_ssize_t index, ops, start_us)

cdef class Network:
    cdef public object env, machine, nccl, fabric, _algo_cache
    cdef public TransferLog records
    cdef public Py_ssize_t world_size
    cdef object __weakref__  # a network may be referred to weakly, as a Python object may

cpdef timeout(env, delay, value, callback)
