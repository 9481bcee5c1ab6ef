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
from commdsl.run.compute import Kernels
from commdsl.run.config import DurationMode, RunConfig
from commdsl.run.executor import CpuExecutor, CudaExecutor, RankSetup

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
class NoiseResult:
    stalls_per_s: float
    stall_us: float
    ops: int
    """Compute ops timed (all ranks)."""
    stalled: int


def stalls(excess_us: list[float], nominal_us: float) -> NoiseResult:
    """The stall statistics of compute ops of `nominal_us` each that ran `excess_us` longer."""
    if not excess_us:
        return NoiseResult(0.0, 0.0, 0, 0)
    typical = statistics.median(excess_us)
    extra = [e - typical for e in excess_us if e - typical > STALL_MIN_US]
    seconds = len(excess_us) * nominal_us / 1e6
    return NoiseResult(len(extra) / seconds, statistics.fmean(extra) if extra else 0.0, len(excess_us), len(extra))


def compute_noise(probe: Probe, msg_bytes: int, iters: int = 40, warmup: int = 2) -> NoiseResult:
    """Run `PROBE` through the executor on every rank; every rank returns the result."""
    program = load_schedule_text(PROBE.format(ranks=probe.world_size), "<calibrate noise probe>", {"msg": f"{msg_bytes}B"})
    config = RunConfig(schedule="<calibrate noise probe>", warmup=warmup, iters=iters, duration_mode=DurationMode.BUSY)
    threads = 1 if probe.device.type == "cpu" else None  # as commdsl.run under torchrun (OMP_NUM_THREADS=1)
    kernels = Kernels(probe.device, DurationMode.BUSY, threads)
    kernels.calibrate()
    groups = {"world": dist.group.WORLD}
    setup = RankSetup(program, probe.rank, probe.backend, probe.device, groups, probe.cpu_group, config, kernels, None)
    executor = CudaExecutor(setup) if probe.device.type == "cuda" else CpuExecutor(setup)
    compute = [op for op in program.ops[probe.rank] if op.kind is OpKind.COMPUTE]
    excess: list[float] = []
    try:
        for it in range(warmup + iters):
            rec = executor.run_iteration()
            if it >= warmup:
                excess += [(rec.exec_end[op.index] - rec.exec_start[op.index]) / 1e3 - op.duration_us for op in compute]
    finally:
        executor.close()
    if probe.device.type == "cuda":
        torch.cuda.synchronize(probe.device)
    every = [e for mine in all_gather_objects(excess, probe.cpu_group, probe.world_size) for e in mine]
    return stalls(every, compute[0].duration_us)
