"""The sweep's speed and overhead: `--points` points of a 64-rank 1F1B, with `-j` worker
processes, and (`--ray`) as Ray tasks on a local Ray instance with as many CPUs.

The points vary the forward and backward times and the activation size of
`1f1b -p stages=64 -p microbatches=8` on dgx-h100 x 8 nodes (every point the same op
count), so each costs about the same. Figures:

  * wall: the sweep's wall time (target: 1,000 points in <= 60 s with -j 2);
  * simulations: the sum over points of each point's CPU time in its worker (load,
    simulate, metrics: `Row.cpu_s`);
  * CPU overhead: the CPU time of this process and every process under it while the
    sweep runs (the worker processes; for Ray its workers, raylet, GCS and agents, read
    from /proc), less the simulations, over the simulations: starting workers, sending
    points and rows, the progress (targets: < 10% locally, < 25% on Ray). The Ray
    instance's start is timed apart (a cluster is started once);
  * wall overhead: wall x jobs / simulations - 1: what the sweep adds to a perfect
    split of the simulations over the jobs, idle workers at the end included (on a
    loaded machine it counts the other processes' share of the cores too).

    python bench/sweep.py [--points 1000] [-j 2] [--network flow] [--ray] [--no-local]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time

from commdsl.sweeps import plan, run_plan


def tree_cpu() -> float:
    """CPU time (user + system) of this process, its reaped children, and every live
    process under it, from /proc (Linux): Ray's workers and daemons descend from the
    process that started Ray."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me, total = os.getpid(), 0.0
    for pid in cpu:
        p = pid
        while p not in (me, 0, 1) and p in parent:
            p = parent[p]
        if p == me and pid != me:
            total += cpu[pid]
    usage_self, usage_children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + sum(u.ru_utime + u.ru_stime for u in (usage_self, usage_children))


def measure(label: str, run, jobs: int, points: int) -> None:
    cpu, wall = tree_cpu(), time.perf_counter()
    rows = run()
    wall, cpu = time.perf_counter() - wall, tree_cpu() - cpu
    sims = sum(r.cpu_s for r in rows)
    failed = sum(not r.ok for r in rows)
    print(f"  {label}: {rows[0].num_ops:,} ops a point, {failed} failed; wall {wall:.1f} s; simulations {sims:.1f} s CPU "
          f"({sims / points * 1e3:.0f} ms a point); CPU overhead {(cpu - sims) / sims:+.1%}; "
          f"wall overhead {wall * jobs / sims - 1:+.1%}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--stages", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--network", default="flow")
    parser.add_argument("--ray", action="store_true", help="also run the sweep as Ray tasks on a local instance")
    parser.add_argument("--no-local", action="store_true", help="skip the local workers' sweep")
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
          f"dgx-h100 x {nodes} nodes, -j {args.jobs}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    if not args.no_local:
        measure("local", lambda: run_plan(checked, jobs=args.jobs), args.jobs, points)
    if args.ray:
        import ray

        start = time.perf_counter()
        ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False, configure_logging=False)
        print(f"  ray: the local instance started in {time.perf_counter() - start:.1f} s", flush=True)
        try:
            measure("ray", lambda: run_plan(checked, jobs=args.jobs, executor="ray"), args.jobs, points)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
