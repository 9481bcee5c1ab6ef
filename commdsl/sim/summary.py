"""The terminal summary of a simulation: makespan, per-rank busy/idle, bubble, critical path.

Definitions (all per rank, over the makespan, i.e. from time 0 to the last op's end):

  * compute: time covered by at least one compute op (union over the rank's streams);
  * comm: time covered by at least one comm op's kernel, from when it is active on this
    rank (an early member waits inside its kernel) to its end;
  * exposed comm: comm time not overlapped by compute on that rank;
  * idle: time covered by no compute, comm or copy op;
  * memory: a rank's peak of declared buffers (`alloc`/`free`, see commdsl.sim.memory);
  * bubble fraction of a rank: (makespan - compute) / makespan, the idle fraction of its
    compute stream(s); the schedule's bubble fraction is the mean over the ranks that
    compute. For GPipe and 1F1B with free communication every stage computes m(t_f + t_b)
    in a makespan of (m + p - 1)(t_f + t_b), so the bubble fraction is (p - 1)/(m + p - 1).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator
from itertools import compress
from operator import attrgetter, gt, mul, sub
from dataclasses import dataclass, fields, is_dataclass
from typing import TextIO

from commdsl.breakdown import Breakdown, breakdown, category
from commdsl.ir import OpKind
from commdsl.sim.entities import KINDS
from commdsl.sim.folding import unfolded
from commdsl.sim.memory import RankMemory, memory_profile
from commdsl.sim.network import algbw_gb_per_s
from commdsl.sim.result import SimOutcome


@dataclass(frozen=True)
class RankSummary:
    """One rank's time split over the makespan (see the module doc)."""

    rank: int
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    idle_us: float
    bubble_fraction: float | None
    """None for a rank with no compute op."""


@dataclass(frozen=True)
class PathStep:
    """One op of the critical path."""

    op_id: str
    rank: int
    kind: str
    name: str
    start_us: float
    end_us: float
    source: str
    """"file:line" of the statement."""


@dataclass(frozen=True)
class TransferSummary:
    """Transfers of one transport and op kind, as the network timed them."""

    transport: str
    kind: str
    count: int
    bytes: int
    mean_us: float
    mean_algbw_gb_per_s: float
    """Mean over transfers of size / time."""


@dataclass(frozen=True)
class SlowedCompute:
    """Compute ops of one statement that ran while comm kernels held their device."""

    name: str
    """The first op's name and the statement's "file:line"."""
    ops: int
    slowed_ops: int
    nominal_us: float
    """Mean time without interference."""
    mean_us: float
    """Mean simulated time."""


@dataclass(frozen=True)
class LinkSummary:
    """One link direction that carried bytes, as the network timed it."""

    name: str
    kind: str
    bandwidth_gb_per_s: float
    bytes: float
    busy_us: float
    utilization: float
    """bytes / (bandwidth x makespan)."""
    peak_utilization: float


@dataclass(frozen=True)
class Summary:
    """What `commdsl simulate` prints, and its `--json`."""

    schedule: str
    machine: str
    network: str
    world_size: int
    num_ops: int
    makespan_us: float
    bubble_fraction: float | None
    ranks: tuple[RankSummary, ...]
    critical_path: tuple[PathStep, ...]
    warnings: tuple[str, ...]
    transfers: tuple[TransferSummary, ...] = ()
    compute_slowdown: float = 1.0
    per_op_interference: bool = False
    """The machine lists comm ops with their own factors (`interference_by_op`)."""
    sm_share: bool = False
    """Compute is slowed by the SMs NCCL kernels hold and their memory traffic (a GPU
    machine with no measured factor, `GpuContention`), not by a machine-wide factor."""
    slowed: tuple[SlowedCompute, ...] = ()
    links: tuple[LinkSummary, ...] = ()
    """Links that carried bytes, busiest (most bytes) first."""
    flows: tuple[dict, ...] = ()
    """Per transfer: op ids, kind, transport, algo, bytes, start/end, latency, algbw,
    bottleneck link (`flow_entries`); empty unless `summarize(..., flows=True)` (what
    `--json --flows` prints)."""
    sample_makespans_us: tuple[float, ...] = ()
    """A sampled simulation (`--samples N`): each sample's makespan (`makespan_us` is
    that of the per-op medians); empty otherwise."""
    memory: tuple[RankMemory, ...] = ()
    """Per rank, its peak of declared memory (`alloc`/`free`) and what is live then;
    empty when the schedule declares none."""
    fold: str = ""
    """What folding did (`Program.fold_note`): where the replicas along a mesh axis were
    folded, the ranks, memory and transfers above are every rank's, each replica's the
    representative's renamed, and the links and the critical path the representative's
    (`commdsl.sim.folding`); empty where folding was not asked for."""

    def to_json(self) -> dict:
        """The summary as JSON-able values (what `write_json` prints)."""
        return {f.name: _json_value(getattr(self, f.name)) for f in fields(self)}

    def write_json(self, out: TextIO, flows: Iterable[dict] | None = None) -> None:
        """Write `to_json()` to `out`, one line per key and per entry of a list (so that
        thousands of entries cost one short line each); `flows` (e.g. `flow_entries`),
        if given, is written as the "flows" list entry by entry, never held in memory."""
        doc = self.to_json()
        if flows is not None:
            doc["flows"] = (_json_value(f) for f in flows)
        out.write("{")
        for i, (key, value) in enumerate(doc.items()):
            out.write(f'{"," if i else ""}\n {json.dumps(key)}: ')
            if isinstance(value, dict) or (isinstance(value, list) and not any(isinstance(v, dict) for v in value)):
                out.write(json.dumps(value))  # a mapping, or a list of numbers and strings: one line
            elif isinstance(value, list | Iterator):
                out.write("[")
                last = -1
                for k, entry in enumerate(value):
                    out.write(f'{"," if k else ""}\n  {json.dumps(entry)}')
                    last = k
                out.write("\n ]" if last >= 0 else "]")
            else:
                out.write(json.dumps(value))
        out.write("\n}\n")


def summarize(result: SimOutcome, *, flows: bool = False) -> Summary:
    """The summary of `result`, in one pass over its per-op arrays; `flows` True lists
    every transfer in `Summary.flows` (`flow_entries`; a P2P-heavy schedule has one per
    send, so it is left out unless asked for)."""
    raw, program = result.raw, result.program
    makespan = result.makespan_us
    ranks = unfolded(tuple(_rank_summaries(result)), program)  # a folded program's: every rank's, as in a run of all
    bubbles = [r.bubble_fraction for r in ranks if r.bubble_fraction is not None]
    path = []
    for g in result.critical_path:
        op = raw.ops[g]
        path.append(PathStep(op.id, op.rank, op.kind.value, op.name, raw.start[g], raw.end[g], f"{op.loc.file}:{op.loc.line}"))
    return Summary(
        transfers=_transfers(result),
        compute_slowdown=result.machine.contention.compute_slowdown(),
        per_op_interference=bool(result.machine.contention.interference_by_op),
        sm_share=result.machine.nccl_sm_share(),
        slowed=_slowed(result),
        links=tuple(
            LinkSummary(l.name, l.kind.value, l.bandwidth_gb_per_s, l.bytes, l.busy_us, l.utilization, l.peak_utilization)
            for l in sorted(result.link_stats(), key=lambda l: (-l.bytes, l.name))
        ),
        flows=tuple(flow_entries(result)) if flows else (),
        schedule=program.name,
        machine=result.machine.name,
        network=result.network,
        world_size=program.world_size,
        num_ops=program.total_ops,
        makespan_us=makespan,
        bubble_fraction=sum(bubbles) / len(bubbles) if bubbles else None,
        ranks=ranks,
        critical_path=tuple(path),
        sample_makespans_us=tuple(result.sampling.get("sample_makespans_us", ())),
        memory=unfolded(memory_profile(raw), program),
        warnings=tuple(result.warnings) + tuple(program.warnings),
        fold=program.fold_note,
    )


def flow_entries(result: SimOutcome) -> Iterator[dict]:
    """Per transfer, in start order: op ids, kind, transport, algo, bytes, start/end,
    latency, algbw, bottleneck link and number of links (`--json --flows`)."""
    ops = result.raw.ops
    for f in result.flow_stats():
        yield {
            "ops": [ops[g].id for g in f.ops], "kind": f.kind.value, "transport": f.transport.value, "algo": f.algo.value,
            "bytes": f.size_bytes, "start_us": f.start_us, "end_us": f.end_us, "latency_us": f.latency_us,
            "algbw_gb_per_s": f.algbw_gb_per_s, "bottleneck": f.bottleneck, "links": f.links,
        }  # fmt: skip


def _rank_summaries(result: SimOutcome) -> list[RankSummary | None]:
    """Each rank's breakdown (`commdsl.breakdown`): its ops' intervals by category, read
    straight from the flat start/end arrays; of a folded program, None for the ranks
    without ops of their own (`commdsl.sim.folding.unfolded` fills them in)."""
    raw, program, makespan = result.raw, result.program, result.makespan_us
    out = []
    first: tuple[tuple[bytes, bytes, bytes], Breakdown] | None = None
    """Rank 0's intervals and breakdown: a rank with the same intervals (interchangeable
    ranks) shares it; only rank 0's are kept, not every rank's."""
    folded = program.fold is not None
    for rank, rank_ops in enumerate(program.ops):
        if folded and not rank_ops:
            out.append(None)  # a folded replica's rank: `unfolded` gives it its representative's
            continue
        b, n = raw.base[rank], len(rank_ops)
        # Each category's (start, end) in program order, picked in C-level passes: per op its
        # category if it took time (0 if not), then one selector per category. The times as
        # lists: each a float object once, not once per pass.
        start_array, end_array = raw.start[b : b + n], raw.end[b : b + n]
        starts, ends = start_array.tolist(), end_array.tolist()
        spans = bytes(map(mul, raw.kinds[b : b + n].translate(_CATEGORY_OF_KIND), map(gt, ends, starts)))
        key = (start_array.tobytes(), end_array.tobytes(), spans)
        if first is not None and first[0] == key:
            split = first[1]
        else:
            compute, comm, copy = (_picked(starts, ends, spans.translate(_PICK[c])) if c in spans else [] for c in (1, 2, 3))
            split = breakdown(compute, comm, copy, makespan)
        if first is None:
            first = (key, split)
        bubble = (makespan - split.compute_us) / makespan if split.compute_us > 0 and makespan > 0 else None
        out.append(RankSummary(rank, split.compute_us, split.comm_us, split.exposed_comm_us, split.idle_us, bubble))
    return out


def _picked(starts: list[float], ends: list[float], selector: bytes) -> list[tuple[float, float]]:
    """The (start, end) pairs `selector` picks, a tuple made only for each of those."""
    return list(zip(compress(starts, selector), compress(ends, selector)))


_CATEGORY_OF_KIND = bytes([{"compute": 1, "comm": 2, "copy": 3, None: 0}[category(k)] for k in KINDS]).ljust(256, b"\0")
"""Kind code (`KINDS`) -> 1 compute, 2 comm, 3 copy, 0 none: a `bytes.translate` table."""

def _picker(code: int) -> bytes:
    """The `bytes.translate` table that maps `code` to 1 and every other byte to 0."""
    return bytes(256)[:code] + b"\1" + bytes(255 - code)


_PICK = {c: _picker(c) for c in (1, 2, 3)}
"""Category -> its `_picker`."""


def _transfers(result: SimOutcome) -> tuple[TransferSummary, ...]:
    """Per (transport, kind): the count, the bytes, and the mean time and algbw of the
    network's transfers, each mean summed in start order (as sum() sums a list)."""
    network = result.network_model
    if network is None or not len(network.records):
        return ()
    log = network.records
    # Per distinct transfer its group; per started transfer, in C-level passes, its
    # group's selector, its time and its algbw.
    keys = [(t.transport, t.kind) for t in log.transfers]
    group_of = list(dict.fromkeys(keys))
    code_of_transfer = bytes(map(group_of.index, keys))
    sizes = [t.size_bytes for t in log.transfers]
    codes = bytes(map(code_of_transfer.__getitem__, log.kind))
    weights = _replica_weights(result.program, log.transfers)
    out = []
    for code, (transport, kind) in enumerate(group_of):
        pick = codes.translate(_picker(code)) if len(group_of) > 1 else b"\1" * len(codes)
        nbytes = list(map(sizes.__getitem__, compress(log.kind, pick)))
        times = array("d", map(sub, compress(log.end, pick), compress(log.start, pick)))
        if weights is not None:  # folded: each transfer inside the representative replica stands for one per replica
            w = list(map(weights.__getitem__, compress(log.kind, pick)))
            count = sum(w)
            algbws = list(map(algbw_gb_per_s, nbytes, times))
            out.append(((transport.value, kind.value), TransferSummary(transport.value, kind.value, count, sum(map(mul, w, nbytes)),
                                                                       sum(map(mul, w, times)) / count, sum(map(mul, w, algbws)) / count)))  # fmt: skip
            continue
        count = len(nbytes)
        out.append(((transport.value, kind.value), TransferSummary(transport.value, kind.value, count, sum(nbytes), sum(times) / count,
                                                                   sum(map(algbw_gb_per_s, nbytes, times)) / count)))  # fmt: skip
    return tuple(summary for _, summary in sorted(out, key=lambda pair: pair[0]))


def _replica_weights(program, transfers) -> list[int] | None:
    """Of a folded program, per distinct transfer how many transfers of a run of every rank
    it stands for: one per replica if its ranks are the representative's, else one (a
    collective across the replicas); None where the program is not folded."""
    fold = program.fold
    if fold is None:
        return None
    own = set(fold.ranks)
    return [fold.replicas if own.issuperset(t.ranks) else 1 for t in transfers]


def _slowed(result: SimOutcome) -> tuple[SlowedCompute, ...]:
    if not result.nominal_us:
        return ()
    raw = result.raw
    by_stmt: dict[tuple, list[int]] = {}
    for g, op in enumerate(raw.ops):
        if op.kind is OpKind.COMPUTE:
            by_stmt.setdefault((op.loc.file, op.loc.line, op.loc.column), []).append(g)
    out = []
    for gs in by_stmt.values():
        slowed = [g for g in gs if g in result.nominal_us]
        if not slowed:
            continue
        actual = [raw.end[g] - raw.start[g] for g in gs]
        nominal = [result.nominal_us.get(g, a) for g, a in zip(gs, actual)]
        op = raw.ops[gs[0]]
        copies = result.program.fold.replicas if result.program.fold is not None else 1  # folded: every replica's ops
        out.append(SlowedCompute(f"{op.name} ({op.loc.file}:{op.loc.line})", copies * len(gs), copies * len(slowed), sum(nominal) / len(gs),
                                 sum(actual) / len(gs)))  # fmt: skip
    return tuple(out)


def format_bytes(n: float) -> str:
    """Binary units for the terminal: 256.0 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _json_value(value):
    """A summary's value as JSON-able values: dataclasses as dicts, tuples as lists
    (`dataclasses.asdict` without its deep copies), floats rounded (`_round`)."""
    if isinstance(value, float):
        return _round(value)
    if isinstance(value, list | tuple):
        if value and is_dataclass(value[0]):
            return _entries(value)
        return [_json_value(v) for v in value]
    if is_dataclass(value):
        return {f.name: _json_value(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
_PLAIN_TYPES = _SCALAR_TYPES - {float}
"""Values `_json_value` gives back as they are."""


def _entries(items: list | tuple) -> list:
    """`_json_value` of a list of dataclasses (a summary's ranks, critical path, links,
    memory): each entry of the first one's class becomes its dict in one comprehension,
    its floats rounded and only its list or dataclass fields (a rank's live buffers) sent
    through `_json_value`, without looking its fields up again."""
    cls = type(items[0])
    names = tuple(f.name for f in fields(cls))
    if len(names) < 2:
        return [_json_value(item) for item in items]
    values_of = attrgetter(*names)
    out = []
    for item in items:
        if type(item) is not cls:
            out.append(_json_value(item))
            continue
        values = values_of(item)
        if _SCALAR_TYPES.issuperset(map(type, values)):
            out.append(dict(zip(names, [_round(v) if type(v) is float else v for v in values])))
        else:  # a field holds a list or a dataclass: that field alone goes through `_json_value`
            out.append(dict(zip(names, [v if type(v) in _PLAIN_TYPES else _json_value(v) for v in values])))
    return out


def _round(value: float) -> float:
    """Round to the nanosecond (1e-3 us) / 1e-9 for fractions: stable JSON."""
    return round(value, 9) if abs(value) < 1.0 else round(value, 3)


def format_us(us: float) -> str:
    """Fixed-precision time for the terminal: 12.345 ms, 678.9 us, 1.234 s."""
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} us"
