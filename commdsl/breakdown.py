"""Per-rank time split, one definition for every report (simulate's summary, compare).

Over a makespan, per rank:
  * compute: time covered by at least one compute op (union over the rank's streams);
  * comm: time covered by at least one communication op (from when it is active on the
    rank: an early member of a collective waits inside its kernel);
  * exposed comm: comm time not overlapped by compute;
  * idle: time covered by no compute, comm or copy op.
Host work, waits, records and synchronizes are not device work and count for none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from commdsl.ir import OpKind

Interval = tuple[float, float]


@dataclass(frozen=True)
class Breakdown:
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    idle_us: float


def union_length(intervals: list[Interval]) -> float:
    """Total length covered by at least one interval."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - (a if a > end else end)  # max(a, end), without a call per interval
        end = b
    return total


def breakdown(compute: list[Interval], comm: list[Interval], copy: list[Interval], makespan_us: float) -> Breakdown:
    compute_us = union_length(compute)
    comm_us = union_length(comm)
    # A union with nothing added is the union already measured (most ranks have no copies).
    busy = union_length(compute + comm) if compute and comm else compute_us + comm_us
    covered = union_length(compute + comm + copy) if copy else busy
    return Breakdown(compute_us, comm_us, busy - compute_us, max(makespan_us - covered, 0.0))


def breakdown_of(ops: Iterable[tuple[OpKind, float, float]], makespan_us: float) -> Breakdown:
    """The breakdown of one rank's ops given as (kind, start_us, end_us)."""
    spans: dict[str, list[Interval]] = {"compute": [], "comm": [], "copy": []}
    for kind, start, end in ops:
        cat = category(kind)
        if cat is not None and end > start:
            spans[cat].append((start, end))
    return breakdown(spans["compute"], spans["comm"], spans["copy"], makespan_us)


def category(kind: OpKind) -> str | None:
    """"compute", "comm", "copy", or None for ops that are no device work."""
    if kind is OpKind.COMPUTE:
        return "compute"
    if kind.is_comm:
        return "comm"
    if kind is OpKind.COPY:
        return "copy"
    return None
