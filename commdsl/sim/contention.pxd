# Cython's declarations for contention.py (hatch_build.py compiles it; commdsl.native
# says when the build runs). None yet: its classes stay Python classes, compiled, and the
# per-op calls the engine makes into the model (kernel, transfer, factor, work) skip the
# interpreter's dispatch.
