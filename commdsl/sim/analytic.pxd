# Cython's declarations for analytic.py (hatch_build.py compiles it; commdsl.native says
# when the build runs). The analytic network is a C-struct class, as the flow network:
# its per-transfer tables are C fields, and a transfer's start logs it (the base's
# `TransferLog`) and schedules its end (`timeout`) by C calls.
from commdsl.sim.network cimport Network, TransferLog, timeout

cdef class AnalyticNetwork(Network):
    cdef public list _times, _slow, _busy, _on_device
    cdef public dict _known
