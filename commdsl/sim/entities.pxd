# Cython's declarations for entities.py (see engine.pxd): the entities become C-struct
# classes whose counters, clocks and flags the compiled engine reads without lookups.
cdef class Entity:
    cdef public int kind
    cdef public Py_ssize_t rank
    cdef public bint kicked

cdef class Host(Entity):
    cdef public Py_ssize_t pc, end, cause, block_g
    cdef public double t
    cdef public object block_deps, sync_targets

cdef class _Fifo(Entity):
    pass

cdef class Stream(_Fifo):
    cdef public object name, fifo, drain_waiters
    cdef public bint busy, woke, delay, slowed
    cdef public Py_ssize_t done, last_g, cur, cur_cause, token
    cdef public double last_end, work_left, t_run, factor

cdef class Queue(_Fifo):
    cdef public object group, fifo, drain_waiters
    cdef public Py_ssize_t number, remaining, done, last_g
    cdef public bint active
    cdef public double last_end

cdef class Collective:
    cdef public object group, ops, arrived
    cdef public Py_ssize_t seq, size, number, needed
