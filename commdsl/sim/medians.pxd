# Cython's declarations for medians.py (see engine.pxd): three samples' medians in a C loop.
cimport cython

@cython.locals(i=Py_ssize_t, x=double, y=double, z=double, lo=double, hi=double)
cdef void _middle_of_three(double[:] a, double[:] b, double[:] c, double[:] out)
