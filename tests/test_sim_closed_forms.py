"""The simulator against closed forms: GPipe and 1F1B pipelines with free communication."""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.machine import load_machine_text
from commdsl.sim import simulate
from commdsl.sim.summary import summarize

FREE_MACHINE = """
name: free
doc: communication and launches cost nothing; compute takes its explicit duration
devices: 4096
device: {name: test, peak_tflops: {fp32: 1.0}, memory_bandwidth_gb_per_s: 1000, sm_count: 1}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: .inf}
transports:
  nccl: {latency_us: 0, bandwidth_gb_per_s: .inf}
  gloo: {latency_us: 0, bandwidth_gb_per_s: .inf}
  memcpy: {latency_us: 0, bandwidth_gb_per_s: .inf}
"""

GPIPE = """
name: gpipe
params: {stages: 4, microbatches: 8, act: 1MiB, t_fwd: 2ms, t_bwd: 4ms}
world: {pp: stages}
streams: [compute]
program: |
  first = pp.rank == 0
  last = pp.rank == stages - 1
  for mb in range(microbatches):
      if not first:
          recv act[mb] act from rank - 1 group=pp
      compute F[mb] t_fwd
      if not last:
          send act[mb] act to rank + 1 group=pp
  for mb in range(microbatches):
      if not last:
          recv grad[mb] act from rank + 1 group=pp
      compute B[mb] t_bwd
      if not first:
          send grad[mb] act to rank - 1 group=pp
"""

ONE_F_ONE_B = """
name: 1f1b
params: {stages: 4, microbatches: 8, act: 1MiB, t_fwd: 2ms, t_bwd: 4ms}
world: {pp: stages}
streams: [compute]
program: |
  first = pp.rank == 0
  last = pp.rank == stages - 1
  warmup = min(stages - pp.rank - 1, microbatches)
  for mb in range(warmup):
      if not first:
          recv act[mb] act from rank - 1 group=pp
      compute F[mb] t_fwd
      if not last:
          send act[mb] act to rank + 1 group=pp
  if not first and warmup < microbatches:
      recv act[warmup] act from rank - 1 group=pp
  for i in range(microbatches - warmup):
      f = warmup + i
      compute F[f] t_fwd
      if not last:
          batch:
              isend act[f] act to rank + 1 group=pp
              irecv grad[i] act from rank + 1 group=pp
      compute B[i] t_bwd
      if not first:
          if f + 1 < microbatches:
              batch:
                  isend grad[i] act to rank - 1 group=pp
                  irecv act[f + 1] act from rank - 1 group=pp
          else:
              send grad[i] act to rank - 1 group=pp
  for b in range(microbatches - warmup, microbatches):
      if not last:
          recv grad[b] act from rank + 1 group=pp
      compute B[b] t_bwd
      if not first:
          send grad[b] act to rank - 1 group=pp
"""

CASES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 5, 8, 16) if not (p == 1 and m == 1)] + [(16, 64), (7, 3)]


def _run(text: str, p: int, m: int, t_fwd: int = 2000, t_bwd: int = 4000):
    program = load_schedule_text(
        text, "test.yaml", {"stages": str(p), "microbatches": str(m), "t_fwd": f"{t_fwd}us", "t_bwd": f"{t_bwd}us"}
    )
    return simulate(program, load_machine_text(FREE_MACHINE, "free.yaml"))


@pytest.mark.parametrize("text", [GPIPE, ONE_F_ONE_B], ids=["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", CASES)
def test_pipeline_makespan_and_bubble_are_exact(text, p, m):
    t_f, t_b = 2000, 4000
    result = _run(text, p, m, t_f, t_b)
    summary = summarize(result)
    assert summary.makespan_us == (m + p - 1) * (t_f + t_b)
    assert summary.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    for r in summary.ranks:
        assert r.compute_us == m * (t_f + t_b)


@pytest.mark.parametrize("text", [GPIPE, ONE_F_ONE_B], ids=["gpipe", "1f1b"])
def test_pipeline_with_unequal_forward_and_backward(text):
    # t_b = 3 t_f and t_b = t_f both keep the closed form.
    for t_f, t_b in ((1000, 3000), (1500, 1500)):
        result = _run(text, 5, 7, t_f, t_b)
        assert result.makespan_us == (7 + 5 - 1) * (t_f + t_b)


@pytest.mark.parametrize("text", [GPIPE, ONE_F_ONE_B], ids=["gpipe", "1f1b"])
def test_critical_path_is_a_chain_of_computes_spanning_the_makespan(text):
    p, m = 4, 6
    result = _run(text, p, m)
    raw = result.raw
    path = result.critical_path
    # It starts at time 0 on stage 0 and ends with the last backward on stage 0.
    first, last = result.op_at(path[0]), result.op_at(path[-1])
    assert (first.rank, first.name, raw.start[path[0]]) == (0, "F[0]", 0.0)
    assert (last.rank, last.name, raw.end[path[-1]]) == (0, f"B[{m - 1}]", result.makespan_us)
    computes = [g for g in path if result.op_at(g).kind.value == "compute"]
    assert sum(raw.end[g] - raw.start[g] for g in computes) == result.makespan_us
    # Consecutive computes on the path touch: no gap, no overlap.
    for a, b in zip(computes, computes[1:]):
        assert raw.end[a] == raw.start[b]
