"""How long the duration blocks take, agreed between the ranks of a host and kept current.

A compute op with an explicit duration (`compute F 2ms`) runs a duration block (a
matmul) as many times as fit the duration (`Kernels.spec`), so the block's timing
decides how long every such op runs. One rank's timing can come out wrong: a burst
of load elsewhere on the machine while it timed makes its blocks look slow, and then
every op it runs falls short of its duration by the same factor. So:

* start-up: every rank times its blocks until its timings are stable
  (`Kernels.time_blocks`); the ranks share their timings over the control group, and
  every rank adopts, per block, the lower median of the timings of the ranks on its
  host (`agreed_block_us`). The ranks of a host run the same cores, and load only
  lengthens a timing: the lower median outvotes up to half of the ranks disturbed (with
  two ranks, the faster timing wins);
* before every iteration after the first: a quick re-timing, shared and agreed the same
  way; where a host's agreed time moved by more than `RECHECK_TOLERANCE`, its ranks adopt
  the new time and re-size their ops. The machine's speed moves over minutes, and a
  start-up timing every rank of a host got wrong is corrected after one iteration.

Every rank makes the same collective calls (all ranks time, whether or not they run
duration-sized ops). The run's timeline keeps what happened (`meta`), and rank 0 warns
when duration-sized ops still ended off their requested durations
(`commdsl.comparison.duration_drifts`).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import torch.distributed as dist

from commdsl.errors import UsageError
from commdsl.run.backend import all_gather_objects
from commdsl.run.compute import Kernels

RECHECK_ROUNDS = 3
RECHECK_ROUND_US = 1000.0
RECHECK_ATTEMPTS = 3
"""A re-check times each block in RECHECK_ROUNDS rounds of about RECHECK_ROUND_US, until
stable, at most RECHECK_ATTEMPTS timings (a few tens of milliseconds on a CPU)."""
RECHECK_TOLERANCE = 0.10
"""A host's ranks adopt a re-checked block time that moved by more than this (relative)."""

SKEW_ENV = "COMMDSL_TEST_SKEW_STARTUP_TIMING"
"""Test hook, never set in normal use: `RANK=FACTOR[,RANK=FACTOR...]` multiplies what the
start-up timing of those ranks measures (re-checks are left alone), so that tests can
disturb one rank's start-up timing, or every rank's, on a quiet machine."""


def agreed_block_us(per_rank: list[dict[int, float]], hosts: list[str]) -> list[dict[int, float]]:
    """Per rank, per block side, the lower median of the timings of the ranks on its host."""
    out = []
    for host in hosts:
        mates = [t for t, h in zip(per_rank, hosts) if h == host]
        out.append({side: statistics.median_low(t[side] for t in mates) for side in mates[0]})
    return out


def skew_from_environ() -> dict[int, float]:
    """Rank -> factor, from `SKEW_ENV` (empty where it is not set)."""
    text = os.environ.get(SKEW_ENV, "").strip()
    factors: dict[int, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        r, sep, f = item.partition("=")
        try:
            key, value = int(r), float(f)
        except ValueError:
            key, value = -1, 0.0
        if not sep or key < 0 or not 0 < value < float("inf"):
            raise UsageError(f"{SKEW_ENV}={text!r}: give RANK=FACTOR[,RANK=FACTOR...] with factors > 0, e.g. 1=4")
        factors[key] = value
    return factors


@dataclass
class ComputeTiming:
    """One rank's side of the agreed duration-block timing."""

    kernels: Kernels
    group: dist.ProcessGroup
    """The control group (gloo): the timings travel there."""
    rank: int
    world_size: int
    hosts: list[str]
    """Host of every rank (ranks of one host agree on one timing)."""
    skew: dict[int, float] = field(default_factory=dict)
    """`SKEW_ENV`'s factors by rank (tests)."""
    startup_us: list[dict[int, float]] = field(default_factory=list)
    """Per rank, per block side, its own start-up timing (us per multiply)."""
    current_us: list[dict[int, float]] = field(default_factory=list)
    """Per rank, per block side, the time it sizes its ops with now (every rank knows
    every rank's: each is a function of the shared timings)."""
    rechecks: int = 0
    adopted: list[dict] = field(default_factory=list)
    """Re-checks that moved some host's time: the iteration it preceded, the ranks that
    re-sized their ops, and every rank's re-timed bulk block (us)."""

    def start(self) -> None:
        """Time the blocks, share, adopt the host's agreed time (a collective)."""
        factor = self.skew.get(self.rank, 1.0)
        mine = {side: us * factor for side, us in self.kernels.time_blocks().items()}
        self.startup_us = all_gather_objects(mine, self.group, self.world_size)
        self.current_us = agreed_block_us(self.startup_us, self.hosts)
        self.kernels.cal_us = dict(self.current_us[self.rank])

    def recheck(self, iteration: int) -> bool:
        """Re-time, share, and adopt each host's new time where it moved by more than
        RECHECK_TOLERANCE (a collective); True if this rank re-sized its ops."""
        mine = self.kernels.time_blocks(RECHECK_ROUNDS, RECHECK_ROUND_US, attempts=RECHECK_ATTEMPTS)
        everyone = all_gather_objects(mine, self.group, self.world_size)
        self.rechecks += 1
        bulk = self.kernels.blocks[0]
        moved = []
        for r, (new, old) in enumerate(zip(agreed_block_us(everyone, self.hosts), self.current_us)):
            if abs(new[bulk] - old[bulk]) > RECHECK_TOLERANCE * old[bulk]:
                self.current_us[r] = new
                moved.append(r)
        if moved:
            self.adopted.append({"before_iteration": iteration, "ranks": moved, "bulk_us": [round(t[bulk], 3) for t in everyone]})
        self.kernels.cal_us = dict(self.current_us[self.rank])
        return self.rank in moved

    def meta(self) -> dict:
        """What the measured timeline keeps (`compute_timing`): the block sides, every
        rank's start-up timing, the times every rank sized its ops with at the end, and
        the re-checks that moved them."""

        def table(per_rank: list[dict[int, float]]) -> dict[str, dict[str, float]]:
            return {str(r): {str(side): round(us, 3) for side, us in t.items()} for r, t in enumerate(per_rank)}

        return {
            "blocks": list(self.kernels.blocks),
            "startup_us": table(self.startup_us),
            "used_us": table(self.current_us),
            "rechecks": self.rechecks,
            "adopted": self.adopted,
            **({"test_skew": {str(r): f for r, f in sorted(self.skew.items())}} if self.skew else {}),
        }
