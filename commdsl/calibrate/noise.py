"""Compute stalls, measured with the executor itself (`Machine.compute_noise`).

On a small shared CPU the scheduler takes a compute thread off its core for a slice now
and then: 10 ms compute ops ran 10.1 ms at the median and about 14 ms in 12% of runs
inside a schedule, against 2% in a compute loop alone, since the stalls come from the
executor's other threads (comm queues, gloo's I/O, the host) wanting the cores. So
they are measured where they happen: `PROBE`, a small schedule of compute ops between
exchanges and all_reduces, runs through `commdsl.run`'s own executor on every rank,
and every compute op's time over its requested duration gives the stalls:

    stalled     excess over the requested duration > typical excess + STALL_MIN_US
    rate        stalled ops / seconds of compute (all ranks)
    stall_us    mean of (excess - typical excess) over the stalled ops

The same goes for late wake-ups: the gap between the end of the comm ops a compute op
waits for and its start (the stream thread being woken), over the typical gap, gives
`wake_stall_probability` and `wake_stall_us`.

The simulator draws them only in a sampled run (`simulate --samples N`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.calibrate.measure import Probe
from commdsl.dsl import load_schedule_text
from commdsl.ir import OpKind
from commdsl.run.backend import all_gather_objects
from commdsl.run.compute import Kernels, compute_threads
from commdsl.run.config import DurationMode, RunConfig
from commdsl.run.executor import RankSetup, make_executor

PROBE = """\
name: calibrate_noise
doc: compute ops between exchanges and all_reduces, to count the stalls of compute
params:
  rounds: 6
  t_compute: 10ms
  msg: 4MiB
world: {ranks}
streams: [compute]
program: |
  peer = rank + 1 - 2 * (rank % 2)   # the neighbour: 0<->1, 2<->3, ...
  for i in range(rounds):
      compute C[i] t_compute
      if peer < world_size:
          batch:
              isend a[i] msg to peer
              irecv b[i] msg from peer
      if i % 2 == 1:
          all_reduce r[i] msg
"""
"""The probe schedule: every rank exchanges with its neighbour (0<->1, 2<->3...) and joins an
all_reduce every other round, so compute shares the cores with comm threads, as in the
bundled schedules."""

STALL_MIN_US = 1000.0
"""An op stalled if it ran this much longer than the typical op (a scheduler slice is
4 ms here; calibrated durations are within a few hundred microseconds)."""


@dataclass(frozen=True)
class Stalls:
    """Samples (op times or wake-up gaps) that ran over STALL_MIN_US longer than the typical one."""

    samples: int
    stalled: int
    mean_us: float
    """Mean of (sample - typical) over the stalled samples (0 without any)."""


def stalls(samples_us: list[float]) -> Stalls:
    if not samples_us:
        return Stalls(0, 0, 0.0)
    typical = statistics.median(samples_us)
    extra = [x - typical for x in samples_us if x - typical > STALL_MIN_US]
    return Stalls(len(samples_us), len(extra), statistics.fmean(extra) if extra else 0.0)


@dataclass(frozen=True)
class NoiseResult:
    compute: Stalls
    """Per compute op: its time over the requested duration."""
    wake: Stalls
    """Per compute op kept waiting for comm ops: its start after their end."""
    compute_us: float
    """Requested duration of each compute op of the probe."""

    @property
    def stalls_per_s(self) -> float:
        seconds = self.compute.samples * self.compute_us / 1e6
        return self.compute.stalled / seconds if seconds else 0.0

    @property
    def wake_stall_probability(self) -> float:
        return self.wake.stalled / self.wake.samples if self.wake.samples else 0.0

    def machine_json(self) -> dict:
        """The machine file's `compute_noise:`."""
        return {"stalls_per_s": round(self.stalls_per_s, 3), "stall_us": round(self.compute.mean_us, 1),
                "wake_stall_probability": round(self.wake_stall_probability, 4), "wake_stall_us": round(self.wake.mean_us, 1)}  # fmt: skip


def compute_noise(probe: Probe, msg_bytes: int, iters: int = 40, warmup: int = 2) -> NoiseResult:
    """Run `PROBE` through the executor on every rank; every rank returns the result."""
    program = load_schedule_text(PROBE.format(ranks=probe.world_size), "<calibrate noise probe>", {"msg": f"{msg_bytes}B"})
    config = RunConfig(schedule="<calibrate noise probe>", warmup=warmup, iters=iters, duration_mode=DurationMode.BUSY)
    kernels = Kernels(probe.device, DurationMode.BUSY, compute_threads(probe.device))
    kernels.calibrate()
    groups = {"world": dist.group.WORLD}
    setup = RankSetup(program, probe.rank, probe.backend, probe.device, groups, probe.cpu_group, config, kernels, None)
    executor = make_executor(setup)
    ops = program.ops[probe.rank]
    compute = [op for op in ops if op.kind is OpKind.COMPUTE]
    # Each compute op after the first waits for the comm ops of the round before it.
    waited = {op.index: [p.index for p in ops[prev.index + 1 : op.index]] for prev, op in zip(compute, compute[1:])}
    excess: list[float] = []
    gaps: list[float] = []
    try:
        for it in range(warmup + iters):
            rec = executor.run_iteration()
            if it < warmup:
                continue
            excess += [(rec.exec_end[op.index] - rec.exec_start[op.index]) / 1e3 - op.duration_us for op in compute]
            gaps += [(rec.exec_start[i] - max(rec.exec_end[j] for j in comm)) / 1e3 for i, comm in waited.items() if comm]
    finally:
        executor.close()
    if probe.device.type == "cuda":
        torch.cuda.synchronize(probe.device)
    both = all_gather_objects((excess, gaps), probe.cpu_group, probe.world_size)
    return NoiseResult(stalls([e for mine, _ in both for e in mine]), stalls([g for _, mine in both for g in mine]),
                       compute[0].duration_us)  # fmt: skip
