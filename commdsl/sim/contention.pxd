# Cython's declarations for contention.py (hatch_build.py compiles it; commdsl.native
# says when the build runs). Its classes stay Python classes, compiled, and the per-op
# calls the engine makes into the model (kernel, transfer, factor, work) skip the
# interpreter's dispatch; a comm kernel's slowdown is pushed by a C call.
cimport cython

@cython.locals(before=double, value=double)
cpdef bint _push_slowdown(list kernels, list top, Py_ssize_t rank, double factor, bint started)
