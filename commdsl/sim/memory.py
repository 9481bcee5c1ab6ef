"""Each rank's device memory over a simulation: the buffers `alloc` and `free` hold.

An `alloc` makes its buffer live when its stream reaches it, a `free` releases it the
same way (the kernels queued before a free may still use the buffer); two memory ops
of one rank at the same time count in program order. From the simulated times this
module gives each rank's peak, when it happens and what is live then, the counter
track the trace shows, and the out-of-memory check against the machine's device
memory (`device.memory_gib`).

Only declared buffers count: the schedule says what its ops keep (activations saved
for the backward, weights, gradients, optimizer state); transfer buffers and kernel
workspaces are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, compress

from commdsl.errors import MemoryExceededError
from commdsl.ir import MEMORY_KINDS, Op, OpKind
from commdsl.machine.model import Machine
from commdsl.sim.entities import RawResult, kind_table

MEMORY_TRACK = "device memory MiB"
"""Counter track of each rank's live declared memory in a trace (MiB)."""


@dataclass(frozen=True)
class LiveGroup:
    """The buffers one `alloc` statement holds at a rank's peak."""

    statement: str
    """"file:line" of the alloc statement."""
    first: str
    """Name of the first of them (in allocation order)."""
    count: int
    size_bytes: int
    """Their total size."""


@dataclass(frozen=True)
class RankMemory:
    rank: int
    peak_bytes: int
    """Most bytes live at once."""
    peak_us: float
    """When the peak is first reached."""
    live_at_peak: tuple[LiveGroup, ...]
    """What is live then, largest group first."""
    end_bytes: int
    """Still live when the rank's program ends (static memory, such as weights)."""


_IS_MEMORY = kind_table(MEMORY_KINDS)
"""Kind code -> 1 for alloc and free (`kind_table`)."""


def _events(raw: RawResult) -> list[list[int]]:
    """Per rank, its memory ops (global numbers) in the order their effect lands."""
    kinds, end, base = raw.kinds, raw.end, raw.base
    per_rank: list[list[int]] = []
    for rank, b in enumerate(base):  # a rank's ops are the global numbers base[rank] .. base[rank + 1] - 1
        e = base[rank + 1] if rank + 1 < len(base) else len(raw.ops)
        events = list(compress(range(b, e), kinds[b:e].translate(_IS_MEMORY)))  # its alloc and free ops, in program order
        events.sort(key=end.__getitem__)  # stable: ties keep program order (g)
        per_rank.append(events)
    return per_rank


def _deltas(raw: RawResult, events: list[int]) -> list[int]:
    """What each of `events` (memory ops, global numbers) adds to its rank's live bytes."""
    alloc = OpKind.ALLOC
    return [op.spec.size_bytes if op.kind is alloc else -op.spec.size_bytes for op in map(raw.ops.__getitem__, events)]


def memory_profile(raw: RawResult) -> tuple[RankMemory, ...]:
    """Per rank (all ranks, in order), its peak and what is live then; () if the
    schedule declares no memory."""
    per_rank = _events(raw)
    if not any(per_rank):
        return ()
    out = []
    for rank, events in enumerate(per_rank):
        if not events:  # (what the lines below make of none, without making it)
            out.append(RankMemory(rank, 0, 0.0, (), 0))
            continue
        live_after = list(accumulate(_deltas(raw, events)))  # live bytes after each event
        live = live_after[-1] if live_after else 0
        peak = max(live_after, default=0)
        peak_at = live_after.index(peak) if peak > 0 else -1  # where the peak is first reached
        peak = max(peak, 0)
        holding: dict[str, Op] = {}
        for g in events[: peak_at + 1]:
            op = raw.ops[g]
            if op.kind is OpKind.ALLOC:
                holding[op.name] = op
            else:
                holding.pop(op.name, None)
        groups: dict[tuple[str, int, int], list[Op]] = {}
        for op in holding.values():
            groups.setdefault((op.loc.file, op.loc.line, op.loc.column), []).append(op)
        live_groups = sorted(
            (LiveGroup(f"{ops[0].loc.file}:{ops[0].loc.line}", ops[0].name, len(ops), sum(o.size_bytes for o in ops))
             for ops in groups.values()),
            key=lambda lg: (-lg.size_bytes, lg.statement),
        )  # fmt: skip
        peak_us = raw.end[events[peak_at]] if peak_at >= 0 else 0.0
        out.append(RankMemory(rank, peak, peak_us, tuple(live_groups), live))
    return tuple(out)


def memory_counters(raw: RawResult) -> tuple[list[int], list[float], list[float]]:
    """Each rank's live declared memory over time, one sample per change (MiB), as
    columns: ranks, times (us), values (MiB)."""
    ranks: list[int] = []
    times: list[float] = []
    values: list[float] = []
    end = raw.end
    for rank, events in enumerate(_events(raw)):
        if not events:
            continue
        ranks.append(rank)
        times.append(0.0)
        values.append(0.0)
        ends = list(map(end.__getitem__, events))
        for k, (t, live) in enumerate(zip(ends, accumulate(_deltas(raw, events)))):
            if k + 1 < len(ends) and ends[k + 1] == t:
                continue  # several changes at one instant: the counter shows where they end
            ranks.append(rank)
            times.append(t)
            values.append(live / 2**20)
    return ranks, times, values


def check_memory(raw: RawResult, machine: Machine) -> None:
    """Raise `MemoryExceededError` at the first alloc that takes a rank past its
    device's memory (`device.memory_gib`); nothing if the machine sets no limit."""
    limit = machine.device.memory_bytes
    if limit is None:
        return
    first: tuple[float, int, int] | None = None  # (time, g, live bytes)
    for events in _events(raw):
        live_after = list(accumulate(_deltas(raw, events)))
        if max(live_after, default=0) <= limit:
            continue
        k = next(k for k, live in enumerate(live_after) if live > limit)
        g = events[k]
        if first is None or (raw.end[g], g) < first[:2]:
            first = (raw.end[g], g, live_after[k])
    if first is None:
        return
    t, g, live = first
    op = raw.ops[g]
    raise MemoryExceededError(
        f"rank {op.rank} runs out of device memory at `alloc {op.name}` ({t / 1e3:.3f} ms): "
        f"{_gib(live)} live, the {machine.device.name} of machine {machine.name} has {_gib(limit)}",
        op.loc,
        rank=op.rank,
        hint="declare less (smaller params, fewer microbatches in flight) or simulate on a machine with more memory "
        "(device.memory_gib)",
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
