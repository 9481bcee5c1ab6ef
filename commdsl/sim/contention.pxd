# Cython's declarations for contention.py (hatch_build.py compiles it; commdsl.native
# says when the build runs). The models are C-struct classes: the engine (which cimports
# `Contention`) calls their per-op methods (kernel, transfer, factor, work) in C, and
# they read their flags, tables and per-rank lists as C fields, without lookups; a comm
# kernel's slowdown is pushed by a C call.
cimport cython

cdef class Contention:
    cdef public bint timed, timed_copies, tracks_kernels, tracks_traffic, noisy, rank_local
    cdef public double duration_stretch

    cpdef bint kernel(self, Py_ssize_t g, op, bint started) except -1
    cpdef bint work(self, Py_ssize_t rank, bint is_copy, int delta) except -1
    cpdef tuple transfer(self, transfer, bint started)
    cpdef double factor(self, Py_ssize_t rank, op) except? -1.0
    cpdef bint traffic_matters(self, bint memory_bound) except -1
    cpdef double noisy_compute(self, Py_ssize_t g, double start_us, double duration_us, double now) except? -1.0
    cpdef tuple woken(self, Py_ssize_t entry, double t, double now)
    cpdef double wake_us(self, Py_ssize_t entry) except? -1.0

cdef class _KernelFactors(Contention):
    cdef public object machine
    cdef public list kernels, top
    cdef public dict _factor_of, _machine_factor, _op_factor
    cdef public double[:] factor_at

    @cython.locals(factor=double)
    cpdef bint kernel(self, Py_ssize_t g, op, bint started) except -1
    cpdef double kernel_factor(self, op) except? -1.0
    cpdef tuple kernel_key(self, op)
    cpdef bint _kernel_at(self, Py_ssize_t rank, kind, dtype, bint started) except -1
    cpdef double _kernel_factor(self, Py_ssize_t rank) except? -1.0

cdef class GpuModel(_KernelFactors):
    cdef public object network, group_ranks, sm_count
    cdef public double memory_bytes_per_us
    cdef public list traffic
    cdef public dict _traffic_of, _memory_bound, _machine_memory_bound
    cdef public bint slows_comm

    # (overrides of the methods above are declared by the base's declarations, but where
    # their locals are typed)
    @cython.locals(rate=double, r=Py_ssize_t, traffic=list)
    cpdef tuple transfer(self, transfer, bint started)
    @cython.locals(traffic=double)
    cpdef double factor(self, Py_ssize_t rank, op) except? -1.0
    cpdef bint _is_memory_bound(self, op, kind) except -1

cdef class CpuHostModel(_KernelFactors):
    cdef public object network, spec, _stall_bits, _wake_bits, _wake_below
    cdef public bint slows_comm, _counts_compute
    cdef public list computing, copying, _starting
    cdef public Py_ssize_t ranks_computing
    cdef public double _busy_until, _stalls_per_us

@cython.locals(before=double, value=double)
cpdef bint _push_slowdown(list kernels, list top, Py_ssize_t rank, double factor, bint started) except -1
