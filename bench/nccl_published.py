"""How close the simulator comes to published nccl-tests measurements of H100 / A100 / B200
systems (1 to 64 nodes; the sources and run conditions are in bench/data/README.md).

    python bench/nccl_published.py            # every point; docs/validation.md quotes it
    python bench/nccl_published.py --quick    # every point, no 4,096-rank all_to_all

Each point of bench/data/nccl_published.csv (see bench/data/README.md) is re-simulated as
nccl-tests runs it: a few ops back to back on every rank of the preset it names, with the
run's launch mode (one process driving `-g N` GPUs, or CUDA graphs), NCCL_ALGO and
NCCL_MAX_NCHANNELS, and the steady-state time per op (`commdsl.calibrate.nccl_tests`).
Printed: every point's published and simulated time, bus bandwidth and error; per op and
size band (<= 64 KiB, <= 64 MiB, larger) the median and worst absolute error; overall.
Targets: median <= 5% and worst <= 15% in every op and band.

Also: the wall time of one all_to_all over 4,096 ranks (512 DGX H100 nodes), whose
per-link loads are summed per node and NIC rather than per pair of ranks.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import time
from pathlib import Path

from commdsl.calibrate.nccl_tests import Run, busbw_gb_per_s, simulate_run
from commdsl.dsl import load_schedule_text
from commdsl.ir import Algo, OpKind
from commdsl.machine import resolve_machine
from commdsl.machine.nccl import parse_nccl_version
from commdsl.sim import simulate

DATA = Path(__file__).parent / "data" / "nccl_published.csv"
OPS = {"all_reduce": OpKind.ALL_REDUCE, "all_gather": OpKind.ALL_GATHER, "reduce_scatter": OpKind.REDUCE_SCATTER,
       "alltoall": OpKind.ALL_TO_ALL, "sendrecv": OpKind.SEND,
       "broadcast": OpKind.BROADCAST, "reduce": OpKind.REDUCE}  # fmt: skip
BANDS = ((64 * 2**10, "<= 64 KiB"), (64 * 2**20, "<= 64 MiB"), (float("inf"), "> 64 MiB"))
TARGET_MEDIAN, TARGET_WORST = 0.05, 0.15

A2A = """
name: a2a
world: {ranks}
streams: [s]
program: |
  all_to_all x {size}
"""


def band(size: int) -> str:
    return next(name for limit, name in BANDS if size <= limit)


def run_of(row: dict) -> Run:
    algo = Algo(row["nccl_algo"]) if row["nccl_algo"] else None
    max_ch = int(row["nccl_max_channels"]) if row["nccl_max_channels"] else None
    version = re.search(r"NCCL (\d+\.\d+\.\d+)", row["conditions"])  # the run's NCCL release, where the source says it
    ranks, nodes = int(row["ranks"]), int(row["nodes"])
    return Run(OPS[row["op"]], ranks, int(row["gpus_per_process"]), row["cuda_graph"] == "1", algo=algo, max_channels=max_ch,
               nccl_version=parse_nccl_version(version.group(1)) if version else None,
               ranks_per_node=ranks // nodes if nodes > 1 else None)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the 4,096-rank all_to_all")
    args = parser.parse_args()

    rows = list(csv.DictReader(DATA.open()))
    machines = {}
    errors: dict[tuple[str, str], list[float]] = {}
    by_source: dict[tuple[str, str], list[float]] = {}  # (source, op) -> signed errors, in file order
    print(f"{'point':22} {'op':15} {'ranks':>5} {'size':>11} {'published us':>13} {'simulated us':>13} "
          f"{'pub busbw':>9} {'sim busbw':>9} {'error':>7}")  # fmt: skip
    t0 = time.perf_counter()
    for row in rows:
        preset = row["preset"]
        machine = machines.get(preset) or machines.setdefault(preset, resolve_machine(preset))
        run = run_of(row)
        size = int(row["size_bytes"])
        published = float(row["published_us"])
        simulated = simulate_run(machine, run, size)
        err = simulated / published - 1.0
        errors.setdefault((row["op"], band(size)), []).append(abs(err))
        by_source.setdefault((row["point"].split("-")[0], row["op"]), []).append(err)
        print(f"{row['point']:22} {row['op']:15} {run.ranks:5d} {size:11d} {published:13.2f} {simulated:13.2f} "
              f"{busbw_gb_per_s(run.op, run.ranks, size, published):9.2f} {busbw_gb_per_s(run.op, run.ranks, size, simulated):9.2f} "
              f"{100 * err:+6.1f}%")  # fmt: skip
    wall = time.perf_counter() - t0

    print()
    print(f"{'op':15} {'band':10} {'points':>6} {'median':>7} {'worst':>7}  target")
    met = True
    everything: list[float] = []
    for (op, name), errs in sorted(errors.items(), key=lambda kv: (kv[0][0], [b for _, b in BANDS].index(kv[0][1]))):
        med, worst = statistics.median(errs), max(errs)
        ok = med <= TARGET_MEDIAN and worst <= TARGET_WORST
        met &= ok
        everything += errs
        print(f"{op:15} {name:10} {len(errs):6d} {100 * med:6.1f}% {100 * worst:6.1f}%  {'met' if ok else 'MISSED'}")
    print(f"{'all':15} {'':10} {len(everything):6d} {100 * statistics.median(everything):6.1f}% {100 * max(everything):6.1f}%  "
          f"{'met' if met else 'MISSED'} (median <= {100 * TARGET_MEDIAN:.0f}%, worst <= {100 * TARGET_WORST:.0f}% in every op and band)")  # fmt: skip
    print()
    print(f"{'op':15} {'points':>6} {'median':>7} {'worst':>7}  (all sizes)")
    for op in sorted({op for op, _ in errors}):
        errs = [e for (o, _), es in errors.items() if o == op for e in es]
        print(f"{op:15} {len(errs):6d} {100 * statistics.median(errs):6.1f}% {100 * max(errs):6.1f}%")
    print()
    print("| source | op | points | median | worst | range |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (source, op), errs in by_source.items():
        absolute = [abs(e) for e in errs]
        print(f"| `{source}` | {op} | {len(errs)} | {100 * statistics.median(absolute):.1f}% | {100 * max(absolute):.1f}% | "
              f"{100 * min(errs):+.0f}% .. {100 * max(errs):+.0f}% |")  # fmt: skip
    print(f"{len(rows)} points simulated in {wall:.2f} s")

    if not args.quick:
        ranks = 4096
        program = load_schedule_text(A2A.format(ranks=ranks, size=f"{ranks * 2**20}B"), "a2a.yaml")
        machine = resolve_machine("dgx-h100").with_nodes(ranks // 8)
        t0 = time.perf_counter()
        result = simulate(program, machine)
        wall = time.perf_counter() - t0
        stat = result.flow_stats()[0]
        print(f"all_to_all of 4 GiB per rank over {ranks} ranks ({ranks // 8} DGX H100 nodes): sim {wall:.2f} s, "
              f"{stat.links:,} links loaded, predicted {(stat.end_us - stat.start_us) / 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
