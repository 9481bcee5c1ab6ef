# Cython's declarations for trace.py (hatch_build.py compiles it; commdsl.native says when
# the build runs). trace.py stays the source and runs as it is without them. Compiled, a
# window of spans is joined into its events by a C loop over typed arrays.
cimport cython
from commdsl.timeline cimport DecimalTexts

cdef class _EventTexts:
    cdef public list heads, middles, tails, ranks, tracks, indexes

@cython.locals(i=Py_ssize_t, code=int, f=Py_ssize_t, k=int, local=int, start=double, end=double, pieces=list, heads=list,
               middles=list, tails=list, ranks=list, tracks=list, indexes=list, exec_ends=double[:], issue_ends=double[:])
cpdef str _window_text(list order, int[:] codes, double[:] starts, int[:] runs, int[:] firsts, format_of, _EventTexts texts,
                       tuple ends, DecimalTexts times, bint keep)

@cython.locals(i=Py_ssize_t, c=object, f=object, of=dict, key=list, exec_format=list)
cpdef _classify(tuple rank_ops, Py_ssize_t b, const unsigned char[:] algos, const unsigned char[:] protos, known, int[:] cls, int[:] formats)

@cython.locals(count=int[:], spans=Py_ssize_t, i=Py_ssize_t, g=Py_ssize_t, j=Py_ssize_t, k=Py_ssize_t, first=double, last=double,
               codes=int[:], starts=double[:], end=double[:], issue_end=double[:])
cpdef tuple _rank_runs(int[:] cls, int[:] track_of, Py_ssize_t tracks, Py_ssize_t b, Py_ssize_t m, tuple ends, double[:] start,
                       double[:] issue_start, double[:] bounds)
