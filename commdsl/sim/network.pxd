# Cython's declarations for network.py (see engine.pxd): Network is a C-struct class, so
# that the flow network, compiled, can be one too.
cdef class Network:
    cdef public object env, machine, nccl, fabric, records, _algo_cache
    cdef public Py_ssize_t world_size
    cdef object __weakref__  # a network may be referred to weakly, as a Python object may
