"""What a schedule and a machine may ask for: the documented bounds (docs/limits.md).

Each bound is checked where the value is made (the expression of a size or duration,
the machine file's field, the world's size) so the message points at that place; the
simulator never sees a value outside them. Together they keep every simulated time
finite and every op's own time within `HORIZON_US`, so no schedule can stall the
simulator's clock at infinity (a false deadlock) or make it lose its nanoseconds.
"""

from __future__ import annotations

HORIZON_US = 1e12
"""The simulated time the simulator answers for: 10^12 us (10^6 s, about 11.6 days).
Below it a float64 time keeps better than nanosecond resolution (the traces' unit). No
op may last longer on its own (a duration, a transfer, a stall), and a simulation whose
ops end past it is refused, naming the first op that does."""

MAX_DURATION_US = HORIZON_US
"""Longest duration a compute or host op may give."""

MAX_SIZE_BYTES = 2**50
"""Largest size of one op's buffer: 1 PiB."""

MAX_FLOPS = 1e21
"""Most work one compute op may give: 10^21 FLOP (a zettaFLOP)."""

MAX_TRACE_BYTES = 2**31
"""Largest profiler trace file `commdsl compare` and `commdsl import kineto` read: 2 GiB,
of JSON after a gzip is decompressed (a few profiler steps of a large job; parsing takes
several times that in memory)."""

MAX_WORLD_SIZE = 65_536
"""Most ranks a schedule may have, and most devices a machine (nodes x gpus_per_node)."""

DEFAULT_MAX_OPS = 5_000_000
"""Default limit on the ops a schedule may expand to, over all ranks (`--max-ops`)."""

MAX_RUN_ITERS = 100_000
"""Most warm-up or measured iterations of `commdsl run` (each at least a barrier and the
schedule's ops; the spans of every measured one are kept until the medians are taken)."""

MAX_LOCAL_RANKS = 256
"""Most ranks `commdsl run -n` / `commdsl calibrate -n` start on this machine: each is a
Python process with torch loaded (a few hundred MB). More ranks: torchrun over several
nodes (docs/executor.md)."""

MAX_SWEEP_POINTS = 100_000
"""Most points one sweep may have (schedules x every param's values x machines x node
counts), refused before any point runs: a typo in a range should not queue days of work.
A point costs tens of milliseconds to seconds (docs/performance.md: 79 ms for a 64-rank
1F1B), so 100,000 of them are hours on a workstation; split a larger sweep."""

MIN_BANDWIDTH_GB_PER_S = 1e-3
"""Slowest bandwidth a machine may give (a link, a transport, memory): 1 MB/s."""

MIN_TFLOPS = 1e-6
"""Slowest compute rate a machine may give: 1 MFLOP/s."""

MAX_MACHINE_TIME_US = 1e9
"""Longest time a machine may give for one latency, launch, stall or measured op: 1000 s."""

MAX_STALLS_PER_S = 1e6
"""Most compute stalls per second a machine's noise may give (one per microsecond)."""

MAX_FACTOR = 1e3
"""Largest slowdown or stretch factor a machine may give."""

MAX_MACHINE_COUNT = 1 << 20
"""Largest count a machine may give that is not a number of devices (SMs, copy engines)."""
