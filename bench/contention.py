"""How fast the flow network is on contended and large cases.

    python bench/contention.py            # docs/performance.md quotes these numbers
    python bench/contention.py --quick    # smaller sizes, for a smoke run

Workloads and their targets:
  (a) 1000 chained 64 MiB ring all_reduces on 64 ranks, one link per rank at 50 GB/s and
      500 ns latency (a machine without topology: the implied star). Target <= 1 s wall,
      predicted time equal to the analytic model's within 0.5%. (`bench/scale.py --astra`
      times ASTRA-sim's analytical backend on the same case.)
  (b) 512 concurrent 64 MiB flows on dgx-h100 x 8 nodes (64 GPUs): every rank sends to 8
      others at once (one in its node, seven across the network), 4 rounds.
  (c) a 3D-parallel training step on dgx-h100 x 8 nodes: tp=8 inside a node (all_reduce
      per layer), pp=4 across nodes (GPipe, 16 microbatches), dp=2 (gradient all_reduce
      per stage). Target >= 20k flow events per second.

"flow events" are flow starts and ends the network processed (a whole collective is
one flow); "sim s" is the best wall time of `simulate()` over a few runs.
"""

from __future__ import annotations

import argparse
import gc
import time

from commdsl.dsl import load_schedule_text
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate
from commdsl.sim.collectives import plan
from commdsl.ir import Algo, OpKind

RING_MACHINE = """
name: ring-50
doc: one link per rank at 50 GB/s and 500 ns per step (the implied topology)
devices: 64
device: {name: test, peak_tflops: {fp32: 1}, memory_bandwidth_gb_per_s: 1000, sm_count: 1}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {latency_us: 0, bandwidth_gb_per_s: 10}
transports:
  nccl: {latency_us: 0.5, bandwidth_gb_per_s: 50}
"""

CHAINED = """
name: chained_all_reduce
params: {ranks: 64, count: 1000, size: 64MiB}
world: ranks
streams: [s]
program: |
  for i in range(count):
      all_reduce x[i] size algo=ring
"""

CONCURRENT = """
name: concurrent_flows
params: {rounds: 4, fanout: 8, size: 64MiB, gpus: 8}
world: 64
streams: [s]
program: |
  for i in range(rounds):
      batch:
          for k in range(fanout):
              isend x[i, rank, k] size to (rank + gpus * k + 1) % world_size
          for k in range(fanout):
              irecv x[i, (rank - gpus * k - 1) % world_size, k] size from (rank - gpus * k - 1) % world_size
"""

STEP_3D = """
name: step_3d
params: {dp: 2, pp: 4, tp: 8, microbatches: 16, layers: 4, act: 16MiB, grads: 256MiB, t_layer: 300us}
world: {dp: dp, pp: pp, tp: tp}
streams: [compute, comm]
program: |
  first = pp.rank == 0
  last = pp.rank == pp.size - 1
  for mb in range(microbatches):
      if not first:
          recv a[mb] act from rank - tp group=pp
      for l in range(layers):
          compute F[mb, l] t_layer
          all_reduce y[mb, l] act group=tp
      if not last:
          send a[mb] act to rank + tp group=pp
  for mb in range(microbatches):
      if not last:
          recv g[mb] act from rank + tp group=pp
      for l in range(layers):
          compute B[mb, l] 2 * t_layer
          all_reduce dx[mb, l] act group=tp
      if not first:
          send g[mb] act to rank - tp group=pp
  record grads_ready on compute
  wait grads_ready on comm
  h = all_reduce wgrad grads group=dp on comm
  wait h
  compute optimizer t_layer
"""


def run(program, machine, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result = simulate(program, machine)
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    # (a)
    count = 250 if args.quick else 1000
    program = load_schedule_text(CHAINED, "chained.yaml", {"count": str(count)})
    machine = load_machine_text(RING_MACHINE, "ring-50.yaml")
    wall, result = run(program, machine, args.repeats)
    p = plan(OpKind.ALL_REDUCE, Algo.RING, 64, 64 * 2**20, machine.chunk_bytes)
    analytic = count * (p.latency_steps * 0.5 + p.serial_bytes / 50e3)
    err = abs(result.makespan_us - analytic) / analytic
    print(f"(a) {count} chained 64MiB ring all_reduce x 64 ranks: sim {wall:.3f} s (target <= 1 s at 1000), "
          f"{result.network_model.events:,} flow events, predicted {result.makespan_us / 1e3:.3f} ms, "
          f"analytic {analytic / 1e3:.3f} ms, error {100 * err:.4f}% (target <= 0.5%)")  # fmt: skip

    # (b)
    dgx8 = resolve_machine("dgx-h100").with_nodes(8)
    rounds = 1 if args.quick else 4
    program = load_schedule_text(CONCURRENT, "concurrent.yaml", {"rounds": str(rounds)})
    wall, result = run(program, dgx8, args.repeats)
    events = result.network_model.events
    print(f"(b) {rounds} rounds of 512 concurrent 64MiB flows, dgx-h100 x 8 nodes: sim {wall:.3f} s, "
          f"{events:,} flow events, {events / wall:,.0f} flow events/s, makespan {result.makespan_us / 1e3:.3f} ms")  # fmt: skip

    # (c)
    mbs = 4 if args.quick else 16
    program = load_schedule_text(STEP_3D, "step_3d.yaml", {"microbatches": str(mbs)})
    wall, result = run(program, dgx8, args.repeats)
    events = result.network_model.events
    print(f"(c) 3D-parallel step (dp=2 pp=4 tp=8, {mbs} microbatches), dgx-h100 x 8 nodes: {program.num_ops:,} ops, "
          f"sim {wall:.3f} s, {events:,} flow events, {events / wall:,.0f} flow events/s (target >= 20k), "
          f"makespan {result.makespan_us / 1e3:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
