"""All_to_all, sendrecv, all_gather, reduce_scatter and all_reduce over 10 DGX H100 nodes
with 1, 2 and 4 GPUs a node: published nccl-tests curves (bench/data/nccl_partial_nodes.csv,
NCCL 2.29; the 8-GPU ones are in nccl_published.csv) against NCCL's model on the ranks
they ran on. None of these points set a parameter of the preset.

    python bench/nccl_partial_nodes.py

The communicator is the GPUs with local index < G of each of the 10 nodes of `dgx-h100`.
Each point is timed as the transfer alone on the machine's links (`NcclFlows.coflow`:
NCCL's choice, channels, loads and latency; at these sizes, 32 MiB to 16 GiB, the host's
launch cost of nccl-tests' loop is far below the op): an all_to_all is one coflow, a
sendrecv ring the slowest of its pairs. A collective is simulated as nccl-tests runs it,
`ITERS` ops in a row over the group of those ranks (the machine's NCCL at the log's
release, 2.29.2), timed between two ends on its first rank. Printed: every point with both of the log's
columns (out-of-place, in-place), and per op and G the median and worst error against
each column.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import replace
from pathlib import Path

from commdsl.dsl import load_schedule_text
from commdsl.ir import Algo, OpKind
from commdsl.machine import resolve_machine
from commdsl.machine.nccl import parse_nccl_version
from commdsl.sim import simulate
from commdsl.sim.nccl_flows import machine_links

DATA = Path(__file__).parent / "data" / "nccl_partial_nodes.csv"
GPUS_PER_NODE = 8
NCCL_VERSION = "2.29.2"  # the logs' "nccl-library=22902"


def simulated_us(flows, capacity, op: str, group: tuple[int, ...], size: int) -> float:
    """The op alone on the links: its latency plus its bytes at its solo rate."""
    if op == "alltoall":
        pairs = [(OpKind.ALL_TO_ALL, group)]
    else:
        pairs = [(OpKind.SEND, (a, group[(i + 1) % len(group)])) for i, a in enumerate(group)]
    worst = 0.0
    for kind, ranks in pairs:
        c = flows.choice_of(kind, ranks, size, Algo.DIRECT, None, group)
        co = flows.coflow(kind, ranks, size, None, Algo.DIRECT, c.proto, group)
        worst = max(worst, co.latency_us + size / co.solo_rate(capacity))
    return worst


ITERS = 4
COLLECTIVE = """
name: partial
world: {world}
groups:
  sub: {group}
streams: [s]
program: |
  if rank % {per_node} < {g}:
      for i in range({iters}):
          {op} x[i] {size}B group=sub dtype=fp64
"""


def collective_us(machine, op: str, group: tuple[int, ...], g: int, size: int) -> float:
    """nccl-tests' steady time per op of a collective over `group` (g GPUs a node)."""
    text = COLLECTIVE.format(world=machine.num_devices, group=list(group), per_node=GPUS_PER_NODE, g=g, iters=ITERS, op=op, size=size)
    raw = simulate(load_schedule_text(text, "<partial>"), machine).raw
    ends = sorted(raw.end[i] for i, o in enumerate(raw.ops) if o.rank == group[0] and o.kind.is_comm)
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def main() -> None:
    rows = list(csv.DictReader(DATA.open()))
    errors: dict[tuple[str, int], list[tuple[float, float]]] = {}
    print(f"{'point':20} {'ranks':>5} {'size':>11} {'out-of-place':>12} {'in-place':>9} {'simulated':>10} {'error':>7} {'in-pl.':>7}")
    for row in rows:
        nodes, g = int(row["nodes"]), int(row["gpus_per_node"])
        machine = resolve_machine("dgx-h100").with_nodes(nodes)
        machine = replace(machine, nccl=replace(machine.nccl, version=parse_nccl_version(NCCL_VERSION)))
        fabric, flows = machine_links(machine, nodes * GPUS_PER_NODE)
        group = tuple(r for r in range(nodes * GPUS_PER_NODE) if r % GPUS_PER_NODE < g)
        size = int(row["size_bytes"])
        out, inp = float(row["published_us"]), float(row["published_inplace_us"])
        if row["op"] in ("alltoall", "sendrecv"):
            t = simulated_us(flows, fabric.capacity, row["op"], group, size)
        else:
            t = collective_us(machine, row["op"], group, g, size)
        errors.setdefault((row["op"], g), []).append((t / out - 1, t / inp - 1))
        print(f"{row['point']:20} {len(group):5d} {size:11d} {out:12.1f} {inp:9.1f} {t:10.1f} {t / out - 1:+7.1%} {t / inp - 1:+7.1%}")
    print(f"\n{'op':15} {'GPUs/node':>9} {'points':>6} {'median':>7} {'worst':>7}  (out-of-place; in-place)")
    for (op, g), errs in sorted(errors.items()):
        o = [abs(e[0]) for e in errs]
        i = [abs(e[1]) for e in errs]
        print(f"{op:15} {g:9d} {len(errs):6d} {statistics.median(o):7.1%} {max(o):7.1%}  ({statistics.median(i):.1%}, {max(i):.1%})")


if __name__ == "__main__":
    main()
