"""Read a timeline file (`commdsl simulate --trace`, `commdsl run --out`) back into a
`Timeline`, streamed and checked value by value.

The file is read a chunk at a time (`commdsl.jsonstream`): only the event being read
and the spans kept are held, so two 200 MB traces compare in bounded memory. The
strings that repeat from span to span (tracks, kinds, names, annotations and their
values) are kept once each. Every value is checked where it is read, and one that is
wrong (a time that is not a finite number or lies past the horizon, a rank outside the
world, an op id that is not a string, a size below zero, an integer of thousands of
digits) is a usage error naming the file, the line and column of its event, and which
event it is: never a Python error, never a value dropped. What one op's spans can be is
checked too: its op id names the rank (pid) it runs on, and it has one exec span and at
most one issue span (`Timeline` producers write no other). The meta values `commdsl
compare` computes with (the machine's rates, sample and iteration counts, memory peaks,
measured FLOP rates) are checked for their shape.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from commdsl.errors import SourceLoc, UsageError
from commdsl.files import decode_error_loc, exists, open_input, read_bytes
from commdsl.ir import Dtype, OpKind
from commdsl.jsonstream import JsonStreamError, ObjectStream, Place
from commdsl.limits import HORIZON_US, MAX_FLOPS, MAX_SIZE_BYTES, MAX_WORLD_SIZE
from commdsl.timeline import FLOP_RATE_META, FOLD_META, FORMAT_VERSION, MEMORY_PEAK_META, CounterSample, Flow, Span, SpanRole, Timeline

_HINT = "timelines come from `commdsl simulate --trace` or `commdsl run --out`"
_KINDS = frozenset(k.value for k in OpKind)
_ROLES = {r.value: r for r in SpanRole}
_SIZE_ARGS = {"bytes": MAX_SIZE_BYTES, "In msg nelems": MAX_SIZE_BYTES, "Out msg nelems": MAX_SIZE_BYTES, "Group size": MAX_WORLD_SIZE,
              "dst rank": MAX_WORLD_SIZE}  # fmt: skip
"""Annotations that are counts: whole numbers from 0 to their bound."""
_AMOUNT_ARGS = {"flops": MAX_FLOPS, "requested_duration_us": HORIZON_US}
"""Annotations that are amounts: finite numbers from 0 to their bound."""
_OP_ID = re.compile(r"(0|[1-9][0-9]{0,17}):(0|[1-9][0-9]{0,17})")
"""An op id as `commdsl.ir.Op.id` writes it: "rank:index", whole numbers in decimal."""
_DTYPES = frozenset(d.value for d in Dtype)
MAX_TEXT_CHARS = 1 << 16
"""Longest string a span's op id, name, track or annotation may be."""


class _Bad(Exception):
    """A value of the event being read is wrong: the message says which."""


def read_timeline(path: str | Path) -> Timeline:
    """Read and check the timeline file `path`."""
    display = str(path)
    if not exists(path):
        raise UsageError(f"no such timeline file: {display}")
    with open_input(path, display, "timeline") as f:
        stream = ObjectStream(f)
        reader = _Reader(display, stream.others)
        try:
            others = stream.members(frozenset({"traceEvents"}), reader.event)
        except JsonStreamError as e:
            raise UsageError(f"{display} is not a timeline JSON file: {e.message}", SourceLoc(display, e.line, e.column)) from None
        except UnicodeDecodeError as e:
            data = read_bytes(path, display, "timeline")
            at = data.find(e.object[e.start : e.end]) if isinstance(e.object, bytes) else -1
            loc = decode_error_loc(data, max(at, 0), display)
            raise UsageError("the timeline is not UTF-8 text", SourceLoc(display, loc.line, loc.column), hint="save the file as UTF-8") from None
    return reader.timeline(others)


class _Reader:
    """The spans, counters and track references of one file, as its events are read."""

    def __init__(self, display: str, others: dict):
        self.display = display
        self.others = others
        """The file's members other than traceEvents, as read so far: otherData (written
        first) names each span's track as it is read."""
        self.tracks: dict[int, list[str]] | None = None
        self.world = 0
        self.index = 0
        self.spans: list = []
        """Spans; in a file whose events come before otherData, tuples (op id, pid, tid,
        role, kind, name, start, end, args, place) whose tracks are resolved at the end."""
        self.counters: list[tuple] = []
        self.strings: dict = {}
        """Each string, annotation pair and span's annotations once: a trace repeats a few
        thousand of them (a pipeline's microbatch F[7] on every stage)."""
        self.annotations: dict[tuple, tuple] = {}
        """A span's args (their items and types) -> its annotations, checked (`_annotations`)."""
        self.seen: dict[SpanRole, set[str]] = {r: set() for r in SpanRole}
        """Per role, the op ids of the spans read: an op has one span of each at most."""

    def _once(self, value):
        return self.strings.setdefault(value, value)

    def event(self, _key: str, ev: object, place: Place) -> None:
        try:
            self._event(ev, place)
        except _Bad as e:
            raise self._error(f"event {self.index} of traceEvents: {e}", place) from None
        self.index += 1

    def _error(self, message: str, place: Place | None) -> UsageError:
        loc = SourceLoc(self.display, place.line, place.column) if place else None
        return UsageError(f"{self.display} is a malformed commdsl timeline: {message}", loc, hint=_HINT)

    def _event(self, ev: object, place: Place) -> None:
        if not isinstance(ev, dict):
            raise _Bad(f"an event is an object, not {_kind(ev)}")
        ph = ev.get("ph")
        if ph == "X":
            args = ev.get("args", {})
            if not isinstance(args, dict):
                raise _Bad(f"'args' is an object, not {_kind(args)}")
            op_id = _text(args.pop("op_id", None), "args.op_id")
            if _OP_ID.fullmatch(op_id) is None:
                raise _Bad(f"args.op_id {_shown(op_id)} is not an op id: \"<rank>:<index>\", two whole numbers (\"0:3\")")
            kind = _text(args.pop("kind", None), "args.kind")
            if kind not in _KINDS:
                raise _Bad(f"args.kind {kind!r} is not an op kind")
            role = _ROLES.get(args.pop("role", None))  # type: ignore[arg-type]
            if role is None:
                raise _Bad(f"args.role is one of {', '.join(_ROLES)}")
            pid, tid = _index(ev.get("pid"), "pid"), _index(ev.get("tid"), "tid")
            if op_id in self.seen[role]:  # compare would pair the last one read alone
                raise _Bad(f"a second {role.value} span of op {op_id!r}: an op has one exec span and at most one issue span")
            self.seen[role].add(op_id)
            ts = _time(ev.get("ts"), "ts", -HORIZON_US)
            dur = _time(ev.get("dur"), "dur", 0.0)
            name = _text(ev.get("name"), "name")
            kept = self._annotations(args)
            if self.tracks is None and "otherData" in self.others:
                self.world, self.tracks = self._layout()
            span = (self._once(op_id), pid, tid, role, self._once(kind), self._once(name), ts, ts + dur, kept, place)
            self.spans.append(self._span(span) if self.tracks is not None else span)
        elif ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or "value" not in args:
                raise _Bad("a counter event has args.value")
            value = args["value"]
            if not _number(value):
                raise _Bad(f"args.value is a finite number, not {_kind(value)}")
            self.counters.append((self._once(_text(ev.get("name"), "name")), _index(ev.get("pid"), "pid"), _time(ev.get("ts"), "ts", -HORIZON_US),
                                  float(value)))  # fmt: skip

    def _annotations(self, args: dict) -> tuple:
        """A span's annotations (`args` but op_id, kind and role), checked, and kept once:
        spans of one op kind repeat the same few (an event's args are looked up by their
        items and types, so a `true` is never taken for a 1 checked before)."""
        key = (tuple(args.items()), tuple(map(type, args.values())))
        try:
            kept = self.annotations.get(key)
        except TypeError:  # a list among the values (a measured trace's)
            key, kept = None, None
        if kept is None:
            kept = self._once(tuple(self._once((self._once(k), self._once(_arg(k, v)) if isinstance(v, str) else _arg(k, v)))
                                    for k, v in args.items()))  # fmt: skip
            if key is not None:
                self.annotations[key] = kept
        return kept

    def _layout(self) -> tuple[int, dict[int, list[str]]]:
        """The world size and the tracks of otherData.commdsl."""
        other = self.others.get("otherData")
        meta = other.get("commdsl") if isinstance(other, dict) else None
        if not isinstance(meta, dict) or meta.get("version") != FORMAT_VERSION:
            raise UsageError(f"{self.display} is not a commdsl timeline (no otherData.commdsl version {FORMAT_VERSION})", hint=_HINT)
        try:
            world = _index(meta.get("world_size"), "otherData.commdsl.world_size")
            if not 1 <= world <= MAX_WORLD_SIZE:
                raise _Bad(f"otherData.commdsl.world_size {world:,} is not from 1 to {MAX_WORLD_SIZE:,}")
            return world, _tracks(meta.get("tracks", {}), world)
        except _Bad as e:
            raise self._error(str(e), None) from None

    def _span(self, span: tuple) -> Span:
        op_id, pid, tid, role, kind, name, start, end, args, place = span
        names = self.tracks.get(pid)  # type: ignore[union-attr]
        if names is None or tid >= len(names):
            where = f"rank {pid} is outside the world of {self.world}" if pid >= self.world else f"rank {pid} has no track {tid}"
            raise self._error(f"a span of op {op_id!r}: pid/tid {pid}/{tid}: {where} (otherData.commdsl.tracks)", place)
        rank = op_id.partition(":")[0]
        if rank != str(pid):  # an op's spans are all on its own rank (checked after the world's bounds)
            raise self._error(f"a span of op {op_id!r} is on rank (pid) {pid}: an op of rank {rank} runs on that rank", place)
        return Span(op_id, pid, names[tid], role, kind, name, start, end, args)

    def timeline(self, others: dict) -> Timeline:
        if self.tracks is None:
            self.world, self.tracks = self._layout()
        meta = others["otherData"]["commdsl"]  # type: ignore[index]
        try:
            source, schedule = _text(meta.get("source"), "otherData.commdsl.source"), _text(meta.get("schedule"), "otherData.commdsl.schedule")
            extra = meta.get("meta", {})
            if not isinstance(extra, dict):
                raise _Bad(f"otherData.commdsl.meta is an object, not {_kind(extra)}")
            _meta(extra, self.world)
            flows = meta.get("flows", [])
            if not isinstance(flows, list) or not all(isinstance(f, list) and len(f) == 3 and all(isinstance(x, str) for x in f) for f in flows):
                raise _Bad("otherData.commdsl.flows is a list of [send op id, recv op id, name]")
        except _Bad as e:
            raise self._error(str(e), None) from None
        tl = Timeline(source, schedule, self.world, meta=extra, tracks=self.tracks)
        tl.spans = [s if isinstance(s, Span) else self._span(s) for s in self.spans]
        self.spans = []
        tl.counters = [CounterSample(name, pid if pid in self.tracks else -1, ts, value) for name, pid, ts, value in self.counters]
        tl.flows = [Flow(self._once(a), self._once(b), self._once(n)) for a, b, n in flows]
        return tl


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{what} is a string, not {_kind(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise _Bad(f"{what} is {len(value):,} characters long, more than {MAX_TEXT_CHARS:,}")
    return sys.intern(value) if len(value) < 64 else value


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _index(value: object, what: str) -> int:
    if type(value) is not int:
        raise _Bad(f"{what} is a whole number, not {_kind(value) if not isinstance(value, float) else value}")
    if not 0 <= value <= MAX_WORLD_SIZE * 64:
        raise _Bad(f"{what} {value:,} is out of range (0 to {MAX_WORLD_SIZE * 64:,})")
    return value


def _time(value: object, what: str, low: float) -> float:
    if not _number(value):
        raise _Bad(f"{what} is a finite number of microseconds, not {_kind(value)}")
    if not low <= value <= HORIZON_US:  # type: ignore[operator]
        raise _Bad(f"{what} {value:g} us is out of range ({low:g} to {HORIZON_US:g} us, the simulated horizon)")
    return float(value)  # type: ignore[arg-type]


def _arg(key: str, value: object) -> object:
    """An annotation's value, checked: counts and amounts in range, no list or object
    but a measured trace's lists of numbers, floats finite."""
    if key in _SIZE_ARGS:
        if type(value) is not int or not 0 <= value <= _SIZE_ARGS[key]:
            raise _Bad(f"args.{key} is a whole number from 0 to {_SIZE_ARGS[key]:,}, got {_shown(value)}")
    elif key in _AMOUNT_ARGS:
        if not _number(value) or not 0 <= value <= _AMOUNT_ARGS[key]:  # type: ignore[operator]
            raise _Bad(f"args.{key} is a finite number from 0 to {_AMOUNT_ARGS[key]:g}, got {_shown(value)}")
    elif isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise _Bad(f"args.{key} is {len(value):,} characters long, more than {MAX_TEXT_CHARS:,}")
    elif isinstance(value, list):
        if not all(_number(x) or x is None for x in value):
            raise _Bad(f"args.{key} is a list of numbers")
        return tuple(value)
    elif isinstance(value, dict):
        raise _Bad(f"args.{key} is a string, a number or a list of numbers, not an object")
    elif isinstance(value, float) and not math.isfinite(value):
        raise _Bad(f"args.{key} is not a finite number")
    return value


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else _kind(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _meta(meta: dict, world: int) -> None:
    """The values of a timeline's meta that `commdsl compare` computes with, checked for
    their shape (the rest is only shown)."""
    machine = _object(meta.get("machine", {}), "machine")
    if "name" in machine:
        _text(machine["name"], "otherData.commdsl.meta.machine.name")
    if machine.get("calibration") is not None:
        _object(machine["calibration"], "machine.calibration")
    device = _object(machine.get("device", {}), "machine.device")
    for dtype, tflops in _object(device.get("peak_tflops", {}), "machine.device.peak_tflops").items():
        _rate(tflops, f"machine.device.peak_tflops[{_shown(dtype)}]")
    for key in ("samples", "iters"):
        value = meta.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise _Bad(f"otherData.commdsl.meta.{key} is a whole number from 1, got {_shown(value)}")
    if "memory_peak_source" in meta:
        _text(meta["memory_peak_source"], "otherData.commdsl.meta.memory_peak_source")
    for rank, rates in _object(meta.get(FLOP_RATE_META, {}), FLOP_RATE_META).items():
        _rank_key(rank, f"otherData.commdsl.meta.{FLOP_RATE_META}", world)
        for dtype, tflops in _object(rates, f"{FLOP_RATE_META}.{rank}").items():
            if dtype not in _DTYPES:
                raise _Bad(f"otherData.commdsl.meta.{FLOP_RATE_META}.{rank} names {_shown(dtype)}, not a dtype ({', '.join(sorted(_DTYPES))})")
            _rate(tflops, f"{FLOP_RATE_META}.{rank}.{dtype}")
    if FOLD_META in meta:
        fold = _object(meta[FOLD_META], FOLD_META)
        _text(fold.get("axis"), f"otherData.commdsl.meta.{FOLD_META}.axis")
        for key in ("replicas", "stride", "block"):
            if type(fold.get(key)) is not int or not 1 <= fold[key] <= world:
                raise _Bad(f"otherData.commdsl.meta.{FOLD_META}.{key} is a whole number from 1 to {world}, got {_shown(fold.get(key))}")
        ranks = fold.get("ranks")
        if not isinstance(ranks, list) or not ranks or any(type(r) is not int or not 0 <= r < world for r in ranks):
            raise _Bad(f"otherData.commdsl.meta.{FOLD_META}.ranks is a list of ranks below {world}, got {_shown(ranks)}")
    for rank, peak in _object(meta.get(MEMORY_PEAK_META, {}), MEMORY_PEAK_META).items():
        _rank_key(rank, f"otherData.commdsl.meta.{MEMORY_PEAK_META}", world)
        if type(peak) is not int or not 0 <= peak <= MAX_SIZE_BYTES:
            raise _Bad(f"otherData.commdsl.meta.{MEMORY_PEAK_META}.{rank} is a whole number of bytes from 0 to {MAX_SIZE_BYTES:,}, "
                       f"got {_shown(peak)}")  # fmt: skip


def _object(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"otherData.commdsl.meta.{what} is an object, not {_kind(value)}")
    return value


def _rate(value: object, what: str) -> None:
    if not _number(value) or value < 0:  # type: ignore[operator]
        raise _Bad(f"otherData.commdsl.meta.{what} is a finite number of TFLOP/s from 0, got {_shown(value)}")


def _rank_key(key: str, what: str, world: int) -> None:
    if not (key.isascii() and key.isdigit() and len(key) <= 6 and int(key) < world):
        raise _Bad(f"{what} names rank {_shown(key)}, not one of the world's 0..{world - 1}")


def _tracks(value: object, world: int) -> dict[int, list[str]]:
    if not isinstance(value, dict):
        raise _Bad(f"otherData.commdsl.tracks is an object, not {_kind(value)}")
    out: dict[int, list[str]] = {}
    for key, names in value.items():
        _rank_key(key, "otherData.commdsl.tracks", world)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _Bad(f"otherData.commdsl.tracks[{key}] is a list of track names")
        out[int(key)] = [sys.intern(n) for n in names]
    return out
