"""All_to_all, sendrecv, all_gather, reduce_scatter and all_reduce over 10 DGX H100 nodes
with 1, 2 and 4 GPUs a node: published nccl-tests curves (bench/data/nccl_partial_nodes.csv,
NCCL 2.29; the 8-GPU ones are in nccl_published.csv) against NCCL's model on the ranks
they ran on. None of these points set a parameter of the preset.

    python bench/nccl_partial_nodes.py

Each point is simulated as `commdsl calibrate --from-nccl-tests` simulates a log of it
(`commdsl.calibrate.nccl_tests.simulate_run`): the run's ranks are the GPUs with local
index < G of each of the 10 nodes of `dgx-h100`, its ops in a row on them with NCCL at the
log's release (2.29.2) and type (double), timed between two ends on its first rank.
Printed: every point with both of the log's columns (out-of-place, in-place), and per op
and G the median and worst error against each column.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from commdsl.calibrate.nccl_tests import Run, simulate_run
from commdsl.ir import Dtype, OpKind
from commdsl.machine import resolve_machine
from commdsl.machine.nccl import parse_nccl_version

DATA = Path(__file__).parent / "data" / "nccl_partial_nodes.csv"
NCCL_VERSION = "2.29.2"  # the logs' "nccl-library=22902"
OPS = {"all_gather": OpKind.ALL_GATHER, "reduce_scatter": OpKind.REDUCE_SCATTER, "all_reduce": OpKind.ALL_REDUCE,
       "alltoall": OpKind.ALL_TO_ALL, "sendrecv": OpKind.SEND}  # fmt: skip


def main() -> None:
    rows = list(csv.DictReader(DATA.open()))
    errors: dict[tuple[str, int], list[tuple[float, float]]] = {}
    print(f"{'point':20} {'ranks':>5} {'size':>11} {'out-of-place':>12} {'in-place':>9} {'simulated':>10} {'error':>7} {'in-pl.':>7}")
    machine = resolve_machine("dgx-h100")
    version = parse_nccl_version(NCCL_VERSION)
    for row in rows:
        nodes, g = int(row["nodes"]), int(row["gpus_per_node"])
        run = Run(OPS[row["op"]], nodes * g, dtype=Dtype.FP64, ranks_per_node=g, nccl_version=version)
        size = int(row["size_bytes"])
        out, inp = float(row["published_us"]), float(row["published_inplace_us"])
        t = simulate_run(machine, run, size)
        errors.setdefault((row["op"], g), []).append((t / out - 1, t / inp - 1))
        print(f"{row['point']:20} {run.ranks:5d} {size:11d} {out:12.1f} {inp:9.1f} {t:10.1f} {t / out - 1:+7.1%} {t / inp - 1:+7.1%}")
    print(f"\n{'op':15} {'GPUs/node':>9} {'points':>6} {'median':>7} {'worst':>7}  (out-of-place; in-place)")
    for (op, g), errs in sorted(errors.items()):
        o = [abs(e[0]) for e in errs]
        i = [abs(e[1]) for e in errs]
        print(f"{op:15} {g:9d} {len(errs):6d} {statistics.median(o):7.1%} {max(o):7.1%}  ({statistics.median(i):.1%}, {max(i):.1%})")


if __name__ == "__main__":
    main()
