# Cython's declarations for engine.py (hatch_build.py compiles it; commdsl.native
# says when the build runs). engine.py stays the source and runs as it is without them.
# Compiled, Engine is a C-struct class: the per-op arrays are typed views of `columns`,
# the flags and rates C values, and the hot methods C calls with typed locals.
cimport cython
from commdsl.sim.entities cimport Entity, Host, Stream, Queue, Collective
from commdsl.sim.contention cimport Contention
from commdsl.sim.network cimport timeout

# The constants the hot paths compare with (imported or bound in engine.py): C ints.
cdef int ACTIVE, DONE, ELIGIBLE, EXEC, MARK, SYNC, STREAM, QUEUE
cdef int _K_COMPUTE, _K_COPY, _K_SEND, _K_WAIT, _K_WAIT_EVENT
# Per kind code, whether it is in a set (`kind_table`): bytes, indexed as C chars.
cdef bytes _IS_DEVICE, _IS_MEMORY, _IS_COMM

cdef class Engine:
    cdef public object program, machine, env, network, base, ops, columns
    cdef public double[:] issue_start, issue_end, ready, start, end
    cdef public unsigned char[:] state, kind, on_stream
    cdef public int[:] cause, queue_at, partner, coll_at, batch_last
    cdef public list _todo
    cdef public Contention contention
    cdef public object waiters, hosts, streams, group_ranks, wiring, queues, queue_list
    cdef public object collectives, batch_multi, algos, batch_gloo, protos
    cdef public object copy_engines, pair_fifo, _transfers, _p2p_shapes, _pair_of, _machine_transfers, _on_transfer_done, nominal_us, issued, _work_us, _machine_work_us
    cdef public object _chains
    cdef public bint folded, kernels, traffic, timed, noisy, _keep_issued
    cdef public double stretch

    cpdef _kick(self, Entity e)
    @cython.locals(todo=list, i=Py_ssize_t, entity=Entity, kind=int)
    cpdef _drain(self)
    cpdef _wait_on(self, Py_ssize_t g, Entity e)
    @cython.locals(w=list, todo=list)
    cpdef _finish(self, Py_ssize_t g, double t)
    @cython.locals(state=cython.uchar[:], d=Py_ssize_t)
    cpdef Py_ssize_t _first_pending(self, deps)
    @cython.locals(end=cython.double[:], best=Py_ssize_t, d=Py_ssize_t)
    cpdef Py_ssize_t _latest(self, deps)
    @cython.locals(g=Py_ssize_t, end=Py_ssize_t, t=double, k=int, memory=bint, launch_us=double, comm_launch_us=double,
                   first=Py_ssize_t, sync=bint, blocking=bint, s=Stream, kinds=cython.uchar[:], on_stream=cython.uchar[:],
                   issue_start=cython.double[:], issue_end=cython.double[:], cause=cython.int[:], queue_at=cython.int[:], todo=list)
    cpdef _advance_host(self, Host h)
    @cython.locals(g=Py_ssize_t, t=double, d=Py_ssize_t)
    cpdef bint _host_unblocked(self, Host h)
    @cython.locals(now=double, entry=Py_ssize_t, g=Py_ssize_t, tag=int, t=double, c=Py_ssize_t, duration=double, woke=bint,
                   k=int, b=Py_ssize_t, d=Py_ssize_t, x=Py_ssize_t, i=Py_ssize_t, start=double, q=Queue,
                   ready=cython.double[:], cause=cython.int[:], end=cython.double[:], kinds=cython.uchar[:], state=cython.uchar[:],
                   queue_at=cython.int[:], todo=list)
    cpdef _advance_stream(self, Stream s)
    # Compute ops on timers (the contention model's factors): typed streams and clocks.
    @cython.locals(now=double, g=Py_ssize_t)
    cpdef bint _hold(self, Stream s, Py_ssize_t entry, double t, Py_ssize_t c)
    @cython.locals(now=double, g=Py_ssize_t, is_copy=bint)
    cpdef _start_timed(self, Stream s, Py_ssize_t entry, double t, Py_ssize_t c, double duration)
    cpdef _timer(self, Stream s)
    @cython.locals(s=Stream, token=Py_ssize_t, g=Py_ssize_t)
    cpdef _on_timer(self, ev)
    cpdef _kernel_changed(self, Py_ssize_t g, bint started)
    @cython.locals(now=double, timed_copies=bint, s=Stream, factor=double)
    cpdef _retime(self, Py_ssize_t rank)
    cpdef bint _went_on_late(self, Stream s, Py_ssize_t c, double t)
    cpdef double _duration(self, op) except? -1.0
    cpdef _on_stream_timer(self, ev)
    @cython.locals(g=Py_ssize_t, tag=int, q=Queue, w=list)
    cpdef _complete_entry(self, Stream s, Py_ssize_t entry, double t, Py_ssize_t c)
    @cython.locals(item=Py_ssize_t, last=Py_ssize_t, now=double, c=Py_ssize_t, g=Py_ssize_t, inst=Collective, x=Queue,
                   state=cython.uchar[:], start=cython.double[:], cause=cython.int[:], queue_at=cython.int[:])
    cpdef _advance_queue(self, Queue q)
    @cython.locals(c=Py_ssize_t, inst=Collective, k=int, p=Py_ssize_t)
    cpdef _activated(self, Py_ssize_t g, double now)
    @cython.locals(start=cython.double[:], cause=cython.int[:], m=Py_ssize_t)
    cpdef _all_arrived(self, Collective inst, Py_ssize_t g, double now)
    @cython.locals(now=double, g=Py_ssize_t, q=Queue, s=Stream, w=list, on_stream=cython.uchar[:], queue_at=cython.int[:],
                   end=cython.double[:], state=cython.uchar[:], todo=list)
    cpdef _transfer_done(self, transfer, tuple members, engines=*)
    @cython.locals(key=tuple, shape=tuple, members=tuple)
    cpdef _start_p2p(self, Py_ssize_t send, Py_ssize_t recv)
    cpdef _start_transfer(self, transfer, members, engines=*)
    @cython.locals(first=Py_ssize_t)
    cpdef _start_collective(self, Collective inst)
