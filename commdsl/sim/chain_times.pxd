# Cython's declarations for chain_times.py (hatch_build.py compiles it; commdsl.native says
# when the build runs): a chain point's columns as C arrays, its replay in a C loop.
cimport cython

cdef class ChainTerms:
    cdef public Py_ssize_t rings, members, latencies
    cdef public object member_at, lead_coefficients, part_coefficients, lead_bytes, lead_fixed, part_bytes, part_fixed

    @cython.locals(size=Py_ssize_t, i=Py_ssize_t, total=double)
    cpdef double run_us(self, unit, double rate, double launch_us, Py_ssize_t iters)

@cython.locals(p=Py_ssize_t, col=Py_ssize_t, value=double)
cdef void _forms(double[:] coefficients, double[:] moved, double[:] fixed, double[:] unit, double rate, Py_ssize_t latencies,
                 double[:] out)

@cython.locals(i=Py_ssize_t, m=Py_ssize_t, j=Py_ssize_t, k=Py_ssize_t, p=Py_ssize_t, issue=double, begin=double,
               finish=double, begin_before=double, end_before=double)
cdef void _replay(long long[:] member_at, double[:] lead, double[:] part, Py_ssize_t rings, Py_ssize_t members,
                  double launch_us, Py_ssize_t iters, double[:] end, double[:] arrival)
