# Cython's declarations for timeline.py (hatch_build.py compiles it; commdsl.native says
# when the build runs). timeline.py stays the source and runs as it is without them.
# Compiled, a float's text is a C computation and a kept text a C dict lookup.
cimport cython

cdef class DecimalTexts:
    cdef public int digits
    cdef public dict kept
    cpdef str get(self, x)
    cpdef str text(self, x)

@cython.locals(y=double, whole=cython.longlong, thousandths=cython.longlong)
cpdef object thousandths_text(double x)
