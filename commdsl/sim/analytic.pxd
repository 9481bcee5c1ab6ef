# Cython's declarations for analytic.py (hatch_build.py compiles it; commdsl.native says
# when the build runs). None yet: its classes stay Python classes, compiled, and the
# analytic network's per-transfer calls (start, the end of a transfer) skip the
# interpreter's dispatch.
from commdsl.sim.network cimport timeout
