"""The sweep's speed and overhead: `--points` points of a 64-rank 1F1B, with `-j` worker
processes, and (`--ray`) as Ray tasks on a local Ray instance with as many CPUs.

The points vary the forward and backward times and the activation size of
`1f1b -p stages=64 -p microbatches=8` (every point the same op count), so each costs
about the same. Figures:

  * wall: the sweep's wall time (target: 1,000 points in <= 60 s with -j 2);
  * simulations: the sum over points of each point's CPU time in its worker (load,
    simulate, metrics: `Row.cpu_s`);
  * CPU overhead (local): the CPU time of the whole sweep, this process and its worker
    processes (`resource.getrusage`), less the simulations, over the simulations:
    start-up of the workers, sending points and rows, the progress bar (target < 10%);
  * wall overhead: wall x jobs / simulations - 1: what the sweep adds to a perfect
    split of the simulations over the jobs, idle workers at the end included (on a
    loaded machine it counts the other processes' share of the cores too). For Ray
    (target < 25%) this is the figure, as Ray's workers are not this process's
    children; the instance's start is timed apart (a cluster is started once).

    python bench/sweep.py [--points 1000] [-j 2] [--network flow] [--ray]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time

from commdsl.sweeps import plan, run_plan


def _cpu() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--network", default="flow")
    parser.add_argument("--ray", action="store_true", help="also run the sweep as Ray tasks on a local instance")
    args = parser.parse_args()
    side = max(1, round(args.points ** (1 / 3)))
    last = max(1, math.ceil(args.points / side**2))
    params = {"stages": [str(args.stages)], "microbatches": [str(args.microbatches)],
              "t_fwd": [f"{1 + i}ms" for i in range(side)], "t_bwd": [f"{2 + 2 * i}ms" for i in range(side)],
              "act": [f"{1 << i}MiB" for i in range(last)]}  # fmt: skip
    nodes = math.ceil(args.stages / 8)  # dgx-h100: 8 GPUs a node
    checked = plan(["1f1b"], params, machines=["dgx-h100"], nodes=[nodes], network=args.network)
    points = len(checked.points)
    print(f"{points} points of 1f1b stages={args.stages} microbatches={args.microbatches}, network {args.network}, "
          f"dgx-h100 x {nodes} nodes, -j {args.jobs}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip

    cpu, wall = _cpu(), time.perf_counter()
    rows = run_plan(checked, jobs=args.jobs)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    sims = sum(r.cpu_s for r in rows)
    failed = sum(not r.ok for r in rows)
    print(f"  local: {rows[0].num_ops:,} ops a point, {failed} failed; wall {wall:.1f} s; simulations {sims:.1f} s CPU "
          f"({sims / points * 1e3:.0f} ms a point); CPU overhead {(cpu - sims) / sims:+.1%}; "
          f"wall overhead {wall * args.jobs / sims - 1:+.1%}")  # fmt: skip
    if args.ray:
        import ray

        start = time.perf_counter()
        ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False, configure_logging=False)
        started = time.perf_counter() - start
        try:
            wall = time.perf_counter()
            rows = run_plan(checked, jobs=args.jobs, executor="ray")
            wall = time.perf_counter() - wall
        finally:
            ray.shutdown()
        sims = sum(r.cpu_s for r in rows)
        print(f"  ray:   start {started:.1f} s; wall {wall:.1f} s; simulations {sims:.1f} s CPU; "
              f"wall overhead {wall * args.jobs / sims - 1:+.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
