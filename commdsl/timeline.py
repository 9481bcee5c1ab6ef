"""Timeline: what the simulator predicts and the executor measures, and its file format.

Both producers emit the same `Timeline`: spans keyed by op id ("rank:index"), so
`commdsl compare` pairs predicted and measured ops by identity, never by timestamp.

The file format is Chrome-trace JSON, which Perfetto and chrome://tracing open:
pid = rank, tid = a track (the host, each stream, each group's comm queue), complete
events (`ph: "X"`) for spans with the op id and kind in `args`, flow events from each
send to its recv, and counter events (`ph: "C"`) for link utilisation. Everything
commdsl needs to read a timeline back lives in `args` and `otherData.commdsl`.
Output is deterministic: the same timeline gives byte-identical files.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TextIO

from commdsl.errors import UsageError
from commdsl.files import output_file
from commdsl.ir import HOST_STREAM, Op, OpKind

FORMAT_VERSION = 1

FLOP_RATE_META = "flop_block_tflops"
"""Measured timelines' meta key: per rank, per dtype of its FLOP-sized ops, the rate
(TFLOP/s) of the executor's FLOP block timed at start-up (what `peak_tflops` of a
calibrated machine is)."""

FOLD_META = "fold"
"""Predicted timelines' meta key, where the program was folded (`commdsl.ir.Fold`): the
folded axis, its replicas, the stride between them, the block and the representative's
ranks, whose spans stand for every replica's (`commdsl compare` unfolds them)."""

MEMORY_PEAK_META = "memory_peak_bytes"
"""Timelines' meta key: per rank, its peak of declared memory (`alloc`/`free`), in bytes:
predicted by the simulator, measured by the executor (on a GPU,
torch.cuda.max_memory_allocated over the measured iterations)."""

REQUESTED_DURATION_ARG = "requested_duration_us"
"""Measured timelines' span arg of a compute op with an explicit duration: the duration
it asked for (`commdsl.comparison.duration_drifts` sets the measured one against it)."""

COMM_TRACK_PREFIX = "comm:"
"""Track of a group's comm queue on a rank: "comm:" + group id."""


class SpanRole(str, enum.Enum):
    EXEC = "exec"
    """The op running: on its stream, its group's comm queue, or the host for host work.
    Exactly one EXEC span per op; `compare` pairs these."""
    ISSUE = "issue"
    """The host issuing the op (launch overhead, or time blocked in a host-blocking call)."""


@dataclass(frozen=True, slots=True)
class Span:
    op_id: str
    """"rank:index" of the op (see `commdsl.ir.Op.id`)."""
    rank: int
    track: str
    """"host", a stream name, or "comm:<group id>"."""
    role: SpanRole
    kind: str
    """The op's `OpKind` value."""
    name: str
    """Display name (op name, or the NCCL kernel name for comm kernels)."""
    start_us: float
    end_us: float
    args: tuple[tuple[str, object], ...] = ()
    """Extra annotations (bytes, flops, source line, NCCL fields), in a fixed order."""

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class Flow:
    """An arrow between two spans, e.g. from a send to its recv."""

    src_op: str
    dst_op: str
    name: str = "p2p"


@dataclass(frozen=True, slots=True)
class CounterSample:
    track: str
    """Counter name, e.g. "link nvlink0->1 util"."""
    rank: int
    """Process the counter is shown under (-1: a separate "links" process)."""
    ts_us: float
    value: float


@dataclass
class Timeline:
    source: str
    """"predicted" or "measured"."""
    schedule: str
    world_size: int
    spans: list[Span] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    """JSON-able extras: params, machine, network model, run settings."""
    tracks: dict[int, list[str]] = field(default_factory=dict)
    """Per rank, the track names in display order (filled by `order_tracks` if empty)."""

    def exec_spans(self) -> dict[str, Span]:
        return {s.op_id: s for s in self.spans if s.role is SpanRole.EXEC}

    @property
    def makespan_us(self) -> float:
        """First start to last end over all ranks (EXEC and ISSUE spans)."""
        if not self.spans:
            return 0.0
        return max(s.end_us for s in self.spans) - min(s.start_us for s in self.spans)

    # ---- Chrome trace -----------------------------------------------------------

    def order_tracks(self, streams: tuple[str, ...] = ()) -> dict[int, list[str]]:
        """Track order per rank: host, declared streams, then comm queues, then others."""
        seen: dict[int, set[str]] = {}
        for s in self.spans:
            seen.setdefault(s.rank, set()).add(s.track)
        return ordered_tracks(seen, self.tracks, streams)

    def to_chrome_trace(self, streams: tuple[str, ...] = ()) -> dict:
        """The Chrome trace as a dict (what `write` writes, key order aside)."""
        tracks = self.order_tracks(streams)
        tid_of = {(r, t): i for r, names in tracks.items() for i, t in enumerate(names)}
        events: list[dict] = metadata_events(tracks)
        exec_by_op: dict[str, Span] = {}
        for s in sorted(self.spans, key=lambda s: (s.start_us, s.rank, tid_of[(s.rank, s.track)], s.op_id, s.role.value)):
            if s.role is SpanRole.EXEC:
                exec_by_op[s.op_id] = s
            args = {"op_id": s.op_id, "kind": s.kind, "role": s.role.value}
            args.update(s.args)
            events.append({
                "ph": "X", "name": s.name, "cat": s.kind, "pid": s.rank, "tid": tid_of[(s.rank, s.track)],
                "ts": _ts(s.start_us), "dur": _ts(s.end_us - s.start_us), "args": args,
            })  # fmt: skip
        for i, f in enumerate(self.flows):
            a, b = exec_by_op.get(f.src_op), exec_by_op.get(f.dst_op)
            if a is None or b is None:
                continue
            events.append({"ph": "s", "id": i, "name": f.name, "cat": "flow", "pid": a.rank, "tid": tid_of[(a.rank, a.track)], "ts": _ts(a.start_us)})
            events.append({"ph": "f", "bp": "e", "id": i, "name": f.name, "cat": "flow", "pid": b.rank, "tid": tid_of[(b.rank, b.track)], "ts": _ts(max(b.start_us, a.start_us))})
        links_pid = max(tracks, default=-1) + 1
        if self.counters:
            events.append(_links_process(links_pid))
        for c in self.counters:
            pid = c.rank if c.rank >= 0 else links_pid
            events.append({"ph": "C", "name": c.track, "pid": pid, "tid": 0, "ts": _ts(c.ts_us), "args": {"value": round(c.value, 6)}})
        data = other_data(self.source, self.schedule, self.world_size, self.makespan_us, tracks, self.meta)
        data["flows"] = [[f.src_op, f.dst_op, f.name] for f in self.flows]
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"commdsl": data}}

    def write(self, path: str | Path, streams: tuple[str, ...] = (), *, flag: str = "timeline") -> None:
        """Write the Chrome trace; `flag` names the file in a usage error (e.g. "--trace")."""
        tracks = self.order_tracks(streams)
        tid_of = {(r, t): i for r, names in tracks.items() for i, t in enumerate(names)}
        exec_by_op: dict[str, tuple[int, int, float]] = {}
        encoder = SpanEncoder()

        def spans() -> Iterator[str]:
            for s in sorted(self.spans, key=lambda s: (s.start_us, s.rank, tid_of[(s.rank, s.track)], s.op_id, s.role.value)):
                tid = tid_of[(s.rank, s.track)]
                if s.role is SpanRole.EXEC:
                    exec_by_op[s.op_id] = (s.rank, tid, s.start_us)
                yield encoder.event(s.kind, s.role.value, s.name, s.args, s.op_id, s.rank, tid, s.start_us, s.end_us)

        def arrows() -> Iterator[str]:  # read once the spans are: their EXEC spans are known then
            times = DecimalTexts(3)
            flows = enumerate(self.flows)
            while chunk := list(islice(flows, _CHUNK)):
                found = [(i, f.name, exec_by_op.get(f.src_op), exec_by_op.get(f.dst_op)) for i, f in chunk]
                columns = [(i, name, *a, *b) for i, name, a, b in found if a is not None and b is not None]
                if columns:
                    yield arrow_events(*map(list, zip(*columns)), times)

        links_pid = max(tracks, default=-1) + 1
        counters = ((c.track, c.rank, c.ts_us, c.value) for c in self.counters)
        write_chrome_trace(path, flag, other=other_data(self.source, self.schedule, self.world_size, self.makespan_us, tracks, self.meta),
                           flows=flow_entries((f.src_op, f.dst_op, f.name) for f in self.flows),
                           events=chain(metadata_texts(tracks), spans(), arrows(), counter_events(counter_columns(counters), links_pid)))  # fmt: skip

    @classmethod
    def read(cls, path: str | Path) -> Timeline:
        """Read a timeline written by `write` (predicted or measured), streamed and
        checked value by value (`commdsl.timeline_reader`)."""
        from commdsl.timeline_reader import read_timeline  # it imports this module

        return read_timeline(path)

    @classmethod
    def from_chrome_trace(cls, data: dict, origin: str = "<trace>") -> Timeline:
        meta = data.get("otherData", {}).get("commdsl") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or meta.get("version") != FORMAT_VERSION:
            raise UsageError(f"{origin} is not a commdsl timeline (no otherData.commdsl version {FORMAT_VERSION})")
        tracks = {int(r): list(t) for r, t in meta.get("tracks", {}).items()}
        tl = cls(meta["source"], meta["schedule"], meta["world_size"], meta=meta.get("meta", {}), tracks=tracks)
        for ev in data.get("traceEvents", []):
            ph = ev.get("ph")
            if ph == "X":
                args = dict(ev.get("args", {}))
                op_id, kind, role = args.pop("op_id"), OpKind(args.pop("kind")).value, args.pop("role")
                rank = ev["pid"]
                track = tracks[rank][ev["tid"]]
                tl.spans.append(Span(op_id, rank, track, SpanRole(role), kind, ev["name"], ev["ts"], ev["ts"] + ev["dur"], tuple(args.items())))
            elif ph == "C":
                tl.counters.append(CounterSample(ev["name"], ev["pid"] if ev["pid"] in tracks else -1, ev["ts"], ev["args"]["value"]))
        # Flow arrows are stored by op id too: Chrome's s/f events only bind to positions.
        tl.flows = [Flow(src, dst, name) for src, dst, name in meta.get("flows", [])]
        return tl


def ordered_tracks(seen: dict[int, set[str]], known: dict[int, list[str]], streams: tuple[str, ...]) -> dict[int, list[str]]:
    """Per rank that has spans (`seen`: the tracks they are on), its tracks in display
    order: the `known` order first, then the host, declared streams, comm queues, others."""
    out = {}
    for rank, names in seen.items():
        first = known.get(rank, [])
        rest = sorted(names - set(first) - {HOST_STREAM} - set(streams), key=lambda t: (t.startswith(COMM_TRACK_PREFIX), t))
        order = [HOST_STREAM] + [s for s in streams if s in names] + rest
        out[rank] = first + [t for t in order if t not in first and (t in names or t == HOST_STREAM)]
    return out


def metadata_events(tracks: dict[int, list[str]]) -> list[dict]:
    """The trace's process and thread names and sort order (`ph: "M"`)."""
    events = []
    for rank in sorted(tracks):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for t, name in enumerate(tracks[rank]):
            label = name if name == HOST_STREAM or name.startswith(COMM_TRACK_PREFIX) else f"stream {name}"
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": t, "args": {"name": label}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": t, "args": {"sort_index": t}})
    return events


def _links_process(pid: int) -> dict:
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "links"}}


def other_data(source: str, schedule: str, world_size: int, makespan_us: float, tracks: dict[int, list[str]], meta: dict) -> dict:
    """A trace's `otherData.commdsl` but its "flows"."""
    return {
        "version": FORMAT_VERSION,
        "source": source,
        "schedule": schedule,
        "world_size": world_size,
        "makespan_us": _ts(makespan_us),
        "tracks": {str(r): t for r, t in sorted(tracks.items())},
        "meta": meta,
    }


def _dumps(value: object) -> str:
    """JSON as trace files hold it: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_KEPT_TYPES = frozenset({str, int, float, type(None)})
"""What a span's annotations may be for `SpanEncoder.span_pieces` to stand for them."""


class SpanEncoder:
    """Encodes spans as complete events (`ph: "X"`), byte for byte as `_dumps` encodes
    `to_chrome_trace`'s, from three pieces of text built once per (kind, role, name,
    args) (`span_pieces`): an event is those pieces with its op id, times, pid and tid
    between them, so a million spans of a few hundred statements cost a few lookups
    each, and a batch of them one `str.join` (`commdsl.sim.trace`)."""

    def __init__(self) -> None:
        self._pieces: dict[tuple, tuple[str, str, str] | None] = {}

    def span_pieces(self, kind: str, role: str, name: str, args: tuple[tuple[str, object], ...]) -> tuple[str, str, str] | None:
        """(head, middle, tail) of the span's event, which is head + op id + middle +
        duration + tail + `track_piece(pid, tid)` + start + "}", the op id as it is (a
        `plain_id`) and the times as `DecimalTexts(3)` writes them; None where no pieces
        stand for it: an annotation named op_id, or other than a string, a number or
        None (a measured trace's lists), or a name other than a string."""
        try:
            fields = {"kind": kind, "role": role}
            fields.update(args)
        except (TypeError, ValueError):
            return None
        if "op_id" in fields or type(name) is not str or not _all_of(str, list(fields)) or not all(type(x) in _KEPT_TYPES for x in fields.values()):
            return None
        # Values equal as keys (1 and 1.0; 0.0 and -0.0) must not share texts: the key has
        # each float's text too (bools, equal to 0 and 1, have no pieces).
        key = (kind, role, name, args, tuple(float.__repr__(x) for x in fields.values() if type(x) is float))
        found = self._pieces.get(key)
        if found is not None:
            return found
        items = sorted(fields.items())  # the keys sort around "op_id", which goes between head and middle
        before = "".join(f"{json_text(k)}:{json_text(v)}," for k, v in items if k < "op_id")
        after = "".join(f",{json_text(k)}:{json_text(v)}" for k, v in items if k > "op_id")
        head = '{"args":{' + before + '"op_id":"'
        middle = '"' + after + '},"cat":' + json_text(kind) + ',"dur":'
        tail = ',"name":' + json_text(name) + ',"ph":"X","pid":'
        found = self._pieces[key] = (head, middle, tail)
        return found

    def event(self, kind: str, role: str, name: str, args: tuple, op_id: str, pid: int, tid: int, start_us: float, end_us: float) -> str:
        """One span's event."""
        pieces = self.span_pieces(kind, role, name, args)
        dur, ts = _ts(end_us - start_us), _ts(start_us)
        if pieces is None or not plain_id(op_id) or type(pid) is not int or type(tid) is not int:
            fields = {"op_id": op_id, "kind": kind, "role": role}
            fields.update(args)
            return _dumps({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": fields})
        head, middle, tail = pieces
        return "".join((head, op_id, middle, json_text(dur), tail, track_piece(pid, tid), json_text(ts), "}"))


def json_text(value: object) -> str:
    """`value` as `_dumps` writes it; strings, integers and floats without the encoder's
    set-up (the same functions it calls)."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    return _dumps(value)


def track_piece(pid: int, tid: int) -> str:
    """The text between an event's "pid": and its time: `pid,"tid":tid,"ts":`."""
    return f'{pid},"tid":{tid},"ts":'


class _TrackPieces(dict):
    """(pid, tid) -> its `track_piece`, each made once."""

    def __missing__(self, place: tuple[int, int]) -> str:
        text = self[place] = track_piece(*place)
        return text


def plain_id(op_id: object) -> bool:
    """An op id that JSON writes as it is (no character to escape)."""
    return isinstance(op_id, str) and op_id.isascii() and op_id.isprintable() and '"' not in op_id and "\\" not in op_id


_DECIMALS_KEPT = 1 << 14
"""Texts a `DecimalTexts` keeps before it starts afresh."""


_THOUSANDTHS = tuple(f".{r:03d}".rstrip("0") if r else ".0" for r in range(1000))
"""The decimals of a repr() of a float rounded to 3 decimals, by its thousandths."""


class DecimalTexts:
    """Floats -> the JSON text of each rounded to `digits` decimals (`_dumps(round(x,
    digits))`), the texts of the last `_DECIMALS_KEPT` distinct floats kept: a trace's
    durations and values are a few hundred distinct numbers, its times repeat across
    ranks. `get` reads one, `texts` a batch.

    -0.0 and 0.0 are one key to a dict but have two texts: `texts` keeps the texts of a
    batch only where no float of it has its sign bit set (`sign_clear`)."""

    def __init__(self, digits: int):
        self.digits = digits
        """Decimals each float is rounded to."""
        self.kept: dict[float, str] = {}
        """Float -> its text, for the floats met since the last `clear`."""

    def get(self, x: float) -> str:
        """The text of `x` (not -0.0: its text would be kept for 0.0), kept."""
        text = self.kept.get(x)
        if text is None:
            if len(self.kept) >= _DECIMALS_KEPT:
                self.kept.clear()
            text = self.kept[x] = self.text(x)
        return text

    def text(self, x: float) -> str:
        """The text of `x`, not kept."""
        if self.digits == 3 and type(x) is float:
            text = thousandths_text(x)
            if text is not None:
                return text
        rounded = round(x, self.digits)
        # A finite float's JSON is its repr (one call less than `json_text`).
        return float.__repr__(rounded) if type(rounded) is float and rounded - rounded == 0.0 else json_text(rounded)

    def texts(self, values: Iterable[float], signs_clear: bool) -> Iterator[str]:
        """The texts of `values` (floats); kept only where `signs_clear`: none of them is
        negative or -0.0 (`sign_clear`)."""
        return map(self.get if signs_clear else self.text, values)

    def clear(self) -> None:
        """Forget the texts kept (to hand their memory back)."""
        self.kept.clear()


def thousandths_text(x: float) -> str | None:
    """The JSON text of `round(x, 3)` where `x` is positive, below 10**12 and not halfway
    between two thousandths once multiplied by 1000; else None."""
    # x * 1000 rounded to a float lies on the same side of every half-integer (which
    # floats below 2**52 hold) as the exact product: unless it is one, round() of it is
    # the integer of round(x, 3)'s decimals. Below 10**15 those are at most 15 digits,
    # which repr() writes back as they are.
    y = x * 1000.0
    if not 0.0 < y < 1e15:
        return None
    whole = int(y)
    if y - whole == 0.5:
        return None
    thousandths = whole + 1 if y - whole > 0.5 else whole
    return f"{thousandths // 1000}{_THOUSANDTHS[thousandths % 1000]}"


def sign_clear(values: array) -> bool:
    """No double of `values` (an array of them) has its sign bit set: none is negative or -0.0."""
    top = values.tobytes()[values.itemsize - 1 :: values.itemsize] if sys.byteorder == "little" else values.tobytes()[:: values.itemsize]
    return not top or max(top) < 0x80


def _all_of(kind: type, xs: Sequence[object]) -> bool:
    """Every one of `xs` is exactly of type `kind`."""
    return set(map(type, xs)) <= {kind}


def write_chrome_trace(path: str | Path, flag: str, *, other: dict, flows: Iterable[str], events: Iterable[str]) -> None:
    """Write a Chrome trace piece by piece, as `_dumps(Timeline.to_chrome_trace())`
    writes it whole: `other` is `otherData.commdsl` but its "flows", whose entries
    `flows` gives encoded (`flow_entries`), and `events` the encoded events in trace
    order (read after the flows), each item one or more, comma-separated. A failure to
    write is a usage error naming `flag` and the file."""
    with output_file(path, flag) as out:
        out.write('{"displayTimeUnit":"ms","otherData":{"commdsl":{"flows":[')
        _write_joined(out, flows)
        out.write("]," + _dumps(other)[1:] + '},"traceEvents":[')
        _write_joined(out, events)
        out.write("]}\n")


_CHUNK = 1 << 14
"""Counter samples and flow arrows encoded at once."""
_WRITE_CHARS = 1 << 20
"""Characters of events joined into one write."""


def flow_entries(flows: Iterable[tuple[str, str, str]]) -> Iterator[str]:
    """`otherData.commdsl.flows`'s entries, [send op id, recv op id, name], encoded."""
    names = _Names()
    for src, dst, name in flows:
        yield f'["{src}","{dst}",{names[name]}]' if plain_id(src) and plain_id(dst) else _dumps([src, dst, name])


class _Names(dict):
    """A name -> its JSON text, each encoded once."""

    def __missing__(self, name: str) -> str:
        text = self[name] = _dumps(name)
        return text


def _write_joined(out: TextIO, items: Iterable[str]) -> None:
    """Write `items` (each one or more comma-separated events) separated by commas,
    about `_WRITE_CHARS` at a time."""
    pending: list[str] = []
    size = 0
    sep = ""
    for item in items:
        pending.append(item)
        size += len(item)
        if size >= _WRITE_CHARS:
            out.write(sep)  # apart: a window of spans is megabytes, joined with it a copy
            out.write(item if len(pending) == 1 else ",".join(pending))  # one item: no copy
            pending, size, sep = [], 0, ","
    if pending:
        out.write(sep)
        out.write(",".join(pending))


def metadata_texts(tracks: dict[int, list[str]]) -> Iterator[str]:
    """`metadata_events`, encoded."""
    return map(_dumps, metadata_events(tracks))


def arrow_events(ids: Sequence[int], names: Sequence[str], a_pids: Sequence[int], a_tids: Sequence[int], a_starts: Sequence[float],
                 b_pids: Sequence[int], b_tids: Sequence[int], b_starts: Sequence[float], times: DecimalTexts) -> str:  # fmt: skip
    """Flow arrows' events, comma-separated: per flow its id, its name, the (pid, tid,
    start) of its send's EXEC span (where it starts, `ph: "s"`) and of its recv's (where
    it ends, `ph: "f"`, not before its start). `times` is a `DecimalTexts(3)`."""
    b_starts = list(map(max, b_starts, a_starts))
    if not (_all_of(int, ids) and _all_of(str, names) and _all_of(int, a_pids + a_tids + b_pids + b_tids)
            and _all_of(float, a_starts) and _all_of(float, b_starts)):  # fmt: skip
        return ",".join(
            _dumps({"ph": "s", "id": i, "name": name, "cat": "flow", "pid": a_pid, "tid": a_tid, "ts": _ts(a)})
            + ","
            + _dumps({"ph": "f", "bp": "e", "id": i, "name": name, "cat": "flow", "pid": b_pid, "tid": b_tid, "ts": _ts(b)})
            for i, name, a_pid, a_tid, a, b_pid, b_tid, b in zip(ids, names, a_pids, a_tids, a_starts, b_pids, b_tids, b_starts))  # fmt: skip
    n = len(ids)
    id_texts = list(map(str, ids))
    name_texts = list(map(_Names().__getitem__, names))
    pieces: list[str | None] = [None] * (10 * n)
    pieces[0::10] = ['},{"cat":"flow","id":'] * n
    pieces[1::10] = id_texts
    pieces[2::10] = map(',"name":{},"ph":"s","pid":'.format, name_texts)
    places = _TrackPieces()
    pieces[3::10] = map(places.__getitem__, zip(a_pids, a_tids))
    pieces[4::10] = times.texts(a_starts, sign_clear(array("d", a_starts)))
    pieces[5::10] = ['},{"bp":"e","cat":"flow","id":'] * n
    pieces[6::10] = id_texts
    pieces[7::10] = map(',"name":{},"ph":"f","pid":'.format, name_texts)
    pieces[8::10] = map(places.__getitem__, zip(b_pids, b_tids))
    pieces[9::10] = times.texts(b_starts, sign_clear(array("d", b_starts)))
    pieces[0] = '{"cat":"flow","id":'
    pieces.append("}")
    return "".join(pieces)  # type: ignore[arg-type]


def counter_events(chunks: Iterable[tuple[Sequence[str], Sequence[int], Sequence[float], Sequence[float]]], links_pid: int) -> Iterator[str]:
    """Counter events (`ph: "C"`), after the links process's name if there are any,
    a chunk at a time: each chunk (tracks, ranks, times, values), a rank -1 for the
    links process (`links_pid`)."""
    first = True
    times, values = DecimalTexts(3), DecimalTexts(6)
    middles = _CounterMiddles(links_pid)
    for tracks, ranks, ts, vs in chunks:
        n = len(tracks)
        if not n:
            continue
        if first:
            yield _dumps(_links_process(links_pid))
            first = False
        if not (_all_of(str, tracks) and _all_of(int, ranks) and _all_of(float, ts) and _all_of(float, vs)):
            yield ",".join(_dumps({"ph": "C", "name": t, "pid": r if r >= 0 else links_pid, "tid": 0, "ts": _ts(x), "args": {"value": round(v, 6)}})
                           for t, r, x, v in zip(tracks, ranks, ts, vs))  # fmt: skip
            continue
        pieces: list[str | None] = [None] * (4 * n)
        pieces[0::4] = ['},{"args":{"value":'] * n
        pieces[1::4] = values.texts(vs, sign_clear(array("d", vs)))
        pieces[2::4] = map(middles.__getitem__, zip(tracks, ranks))
        pieces[3::4] = times.texts(ts, sign_clear(array("d", ts)))
        pieces[0] = '{"args":{"value":'
        pieces.append("}")
        yield "".join(pieces)  # type: ignore[arg-type]


def counter_columns(counters: Iterable[tuple[str, int, float, float]]) -> Iterator[tuple[tuple, tuple, tuple, tuple]]:
    """(track, rank, time, value) samples as `counter_events`' chunks, `_CHUNK` at a time."""
    it = iter(counters)
    while chunk := list(islice(it, _CHUNK)):
        yield tuple(zip(*chunk))  # type: ignore[misc]


class _CounterMiddles(dict):
    """(track, rank) -> the text of a counter event between its value and its time."""

    def __init__(self, links_pid: int):
        super().__init__()
        self.links_pid = links_pid

    def __missing__(self, key: tuple[str, int]) -> str:
        track, rank = key
        text = self[key] = '},"name":' + json_text(track) + ',"ph":"C","pid":' + track_piece(rank if rank >= 0 else self.links_pid, 0)
        return text



def _ts(us: float) -> float:
    """Microseconds rounded to the nanosecond, so output is stable across platforms."""
    return round(us, 3)


_NCCL_KERNEL = {
    OpKind.ALL_REDUCE: "AllReduce", OpKind.ALL_GATHER: "AllGather", OpKind.REDUCE_SCATTER: "ReduceScatter",
    OpKind.BROADCAST: "Broadcast", OpKind.REDUCE: "Reduce", OpKind.ALL_TO_ALL: "SendRecv",
    OpKind.GATHER: "SendRecv", OpKind.SCATTER: "SendRecv", OpKind.SEND: "SendRecv", OpKind.RECV: "SendRecv",
    OpKind.BARRIER: "AllReduce",
}  # fmt: skip

_PROFILER_COLLECTIVE = {
    OpKind.ALL_REDUCE: "allreduce", OpKind.ALL_GATHER: "all_gather_into_tensor",
    OpKind.REDUCE_SCATTER: "reduce_scatter_tensor", OpKind.BROADCAST: "broadcast", OpKind.REDUCE: "reduce",
    OpKind.ALL_TO_ALL: "all_to_all", OpKind.GATHER: "gather", OpKind.SCATTER: "scatter",
    OpKind.SEND: "send", OpKind.RECV: "recv", OpKind.BARRIER: "barrier",
}  # fmt: skip


def nccl_kernel_name(op: Op, algo: str | None = None, protocol: str = "LL") -> str:
    """The device-kernel name the PyTorch profiler shows for an NCCL op, e.g.
    `ncclDevKernel_AllReduce_Sum_f32_RING_LL`. Tools that pick NCCL kernels out of
    profiler traces by this prefix work on commdsl traces too."""
    base = _NCCL_KERNEL[op.kind]
    if base == "SendRecv":
        return "ncclDevKernel_SendRecv"
    parts = ["ncclDevKernel", base]
    if base not in ("AllGather", "Broadcast"):
        # Only reducing kernels carry the reduce op and element type in their name.
        parts += [op.reduce_op.value.capitalize() if op.reduce_op else "Sum", _nccl_dtype(op)]
    if algo:
        parts.append(algo.upper())
    parts.append(protocol)
    return "_".join(parts)


def gloo_span_name(op: Op) -> str:
    """The span name of a comm op run by gloo, e.g. `gloo:all_reduce` (gloo has no device
    kernels to name)."""
    return f"gloo:{op.kind.value}"


def _nccl_dtype(op: Op) -> str:
    return {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "fp64": "f64", "int8": "i8", "uint8": "u8",
            "int32": "i32", "int64": "i64", "fp8": "f8e4m3", "int16": "i16", "bool": "u8"}[op.dtype.value]  # fmt: skip


def comm_span_args(op: Op, group_size: int) -> tuple[tuple[str, object], ...]:
    """Annotations named as the PyTorch profiler's `record_param_comms` names them."""
    itemsize = op.dtype.itemsize
    nelems = op.size_bytes // itemsize if itemsize else 0
    if op.kind in (OpKind.ALL_GATHER, OpKind.GATHER):
        in_elems, out_elems = nelems // max(group_size, 1), nelems
    elif op.kind in (OpKind.REDUCE_SCATTER, OpKind.SCATTER):
        in_elems, out_elems = nelems, nelems // max(group_size, 1)
    else:
        in_elems = out_elems = nelems
    return (
        ("Collective name", _PROFILER_COLLECTIVE[op.kind]),
        ("Group size", group_size),
        ("Process Group Name", op.group),
        ("In msg nelems", in_elems),
        ("Out msg nelems", out_elems),
        ("dtype", op.dtype.value),
        ("bytes", op.size_bytes),
        ("name", op.name),
        ("source", f"{op.loc.file}:{op.loc.line}"),
    )


def op_span_args(op: Op) -> tuple[tuple[str, object], ...]:
    """Annotations for a non-comm op's span."""
    out: list[tuple[str, object]] = []
    if op.size_bytes:
        out.append(("bytes", op.size_bytes))
    if op.flops is not None:
        out.append(("flops", op.flops))
    if op.dest is not None:  # a peer copy
        out.append(("dst rank", op.peer))
        out.append(("dest", op.dest))
    out.append(("name", op.name))
    out.append(("source", f"{op.loc.file}:{op.loc.line}"))
    return tuple(out)
