# Cython's declarations for flow.py (see engine.pxd): a flow is a C struct, and the flow
# network's event handling and max-min recomputation C calls with typed locals.
cimport cython
from commdsl.sim.network cimport Network

# The module's constants: C values.
cdef int _ACTIVATE, _FINISH
cdef double _INF, _UNSCHEDULED

cdef class _Flow:
    cdef public object demands, then, leg, transfer, ops
    cdef public double cap, solo, remaining, total, rate, t_upd
    cdef public Py_ssize_t version, mark, nbusy, record
    cdef public bint is_solo

cdef class FlowNetwork(Network):
    cdef public object _users, _load, _bytes, _heap, _dirty, _legs, _s_t, _s_c, _s_v, _solo_at, _solo_demands, _solo_t0
    cdef public object _solo_t1, _solo_rate, _leg_of, _wake_cb, _on_device, _cpu_channels, _busy
    cdef public Py_ssize_t _seq, _wake_gen, _mark, events
    cdef public double _wake_t

    @cython.locals(now=double, f=_Flow, solo=bint, c=Py_ssize_t, other=_Flow, d=Py_ssize_t)
    cpdef _start_flow(self, leg, then, transfer=*, ops=*, Py_ssize_t record=*)
    cpdef _unsolo(self, _Flow f, double now)
    cpdef _log_solo(self, _Flow f, double until)
    cpdef _sample(self, double t, Py_ssize_t c, double load)
    cpdef _push(self, double t, _Flow f, int what)
    @cython.locals(now=double, gen=Py_ssize_t)
    cpdef _ensure_wake(self, double t)
    cpdef _on_wake_event(self, ev)
    @cython.locals(now=double, f=_Flow, c=Py_ssize_t, w=double, what=int, version=Py_ssize_t, finished=list, seeds=list, d=Py_ssize_t)
    cpdef _on_wake(self, Py_ssize_t gen)
    @cython.locals(f=_Flow, g=_Flow, mark=Py_ssize_t, c=Py_ssize_t, r=double, w=double, v=double, comp=list, chans=list, todo=list, active=list)
    cpdef _recompute(self, list seeds, double now)

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, busy=double, top=double, x=double)
cdef object _busy_and_top_in_order(double[:] t, double[:] v)

cdef class SteppedFlowNetwork(FlowNetwork):
    pass
