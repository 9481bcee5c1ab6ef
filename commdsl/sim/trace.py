"""The predicted timeline of a simulation: a `Timeline` in memory (`predicted_timeline`),
or the same Chrome trace streamed to a file from the per-op arrays (`write_trace`).

Both name and annotate each op's spans alike (`SpanNames`), so the file `write_trace`
writes is byte for byte what `predicted_timeline(result).write(...)` writes; but
`write_trace` holds no span objects: a few arrays of 4- and 8-byte entries per span and
per op, the events sorted a window of time at a time and formatted in batches from one
%-format per statement (`commdsl.timeline.SpanEncoder`), written as they are formatted.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import add, and_, attrgetter, eq, ge, gt, is_, sub
from pathlib import Path
from typing import TYPE_CHECKING

from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Protocol, Transport
from commdsl.sim.entities import ALGOS, PROTOS, RawResult, op_index_typecode
from commdsl.sim.memory import MEMORY_TRACK, memory_counters, memory_profile
from commdsl.sim.collector import gc_paused
from commdsl.timeline import (COMM_TRACK_PREFIX, FOLD_META, MEMORY_PEAK_META, CounterSample, DecimalTexts, Flow, Span, SpanEncoder,
                              SpanRole, Timeline, arrow_events, comm_span_args, counter_events, gloo_span_name, metadata_texts,
                              nccl_kernel_name, op_span_args, ordered_tracks, other_data, sign_clear, track_piece,
                              write_chrome_trace)  # fmt: skip

if TYPE_CHECKING:
    from commdsl.machine.model import Machine
    from commdsl.sim.result import SimOutcome

_MEMCPY_NAMES = {
    CopyDir.H2D: "Memcpy HtoD (Pinned -> Device)",
    CopyDir.D2H: "Memcpy DtoH (Device -> Pinned)",
    CopyDir.D2D: "Memcpy DtoD (Device -> Device)",
    CopyDir.PEER: "Memcpy PtoP (Device -> Device)",
}
"""Copy span names as the PyTorch profiler (CUPTI) writes them."""
_PEER_MEMCPY = _MEMCPY_NAMES[CopyDir.PEER]
_COMM_KINDS = frozenset(k for k in OpKind if k.is_comm)
_KIND_VALUE = {k: k.value for k in OpKind}

_WINDOW_SPANS = 1 << 13
"""Spans sorted at once by `write_trace` (about): its memory beyond the arrays."""
_NARROW = 1 << 16
"""Span formats and tracks `_SpanRuns` numbers in 2 bytes each (`_holding`)."""
_INDEX_TEXTS = 1 << 16
"""Op indexes whose decimal texts `write_trace` makes once (up to a rank's ops)."""


class SpanNames:
    """Each op's spans: tracks, names and annotations. Names and annotations repeat
    across ranks and iterations, so each is built once per statement and shared (this
    keeps a timeline within a few hundred bytes per op)."""

    def __init__(self, program: Program):
        self.group_size = {g.id: len(g.ranks) for g in program.groups}
        self._issue: dict[tuple, str] = {}
        self._exec: dict[tuple, tuple[str, tuple]] = {}

    def issue_name(self, op: Op) -> str:
        """The name of the host's span issuing `op`."""
        key = (op.kind, op.transport, op.copy_dir)
        name = self._issue.get(key)
        if name is None:
            name = self._issue[key] = _issue_name(op)
        return name

    @staticmethod
    def exec_key(op: Op, algo_index: int, proto_index: int) -> tuple[str, tuple]:
        """(track, key) of the op's EXEC span, given its `RawResult.algos` and `protos`
        entries: the key holds what the span's name and annotations depend on but the op's
        name, all of it fields of its statement (`op.spec`), its kind, algo and protocol."""
        kind = op.kind
        if _on_comm_queue(op):
            # dtype, reduce op, transport and algo are fixed per statement (its loc).
            return COMM_TRACK_PREFIX + op.group, (id(op.loc), op.size_bytes, op.group, op.dtype, ALGOS[algo_index].value, PROTOS[proto_index])
        track = HOST_STREAM if kind is OpKind.WAIT and op.stream == HOST_STREAM else op.stream
        # A copy's or memcpy transfer's peer is annotated and may differ from rank to rank.
        return track, (id(op.loc), op.size_bytes, op.flops, kind, op.peer, op.dest)

    def exec_span(self, op: Op, algo_index: int, proto_index: int) -> tuple[str, tuple[str, tuple]]:
        """(track, (name, args)) of the op's EXEC span, given its `RawResult.algos` and
        `protos` entries; the (name, args) pair is shared by the ops of one statement with
        one name (`exec_key`)."""
        track, key = self.exec_key(op, algo_index, proto_index)
        return track, self.exec_entry(op, key, algo_index, proto_index)

    def exec_entry(self, op: Op, key: tuple, algo_index: int, proto_index: int) -> tuple[str, tuple]:
        """(name, args) of the op's EXEC span, `key` its `exec_key`."""
        cached = self._exec.get((key, op.name))
        if cached is not None:
            return cached
        kind = op.kind
        if _on_comm_queue(op):
            algo, proto = ALGOS[algo_index].value, PROTOS[proto_index]
            extra = (("algo", algo),) if proto is None else (("algo", algo), ("proto", proto.value))
            cached = (_comm_name(op, algo, proto), comm_span_args(op, self.group_size[op.group]) + extra)
        elif kind is OpKind.COPY:
            cached = (_MEMCPY_NAMES[op.copy_dir], op_span_args(op))
        elif kind in _COMM_KINDS:  # a memcpy send or recv
            cached = (_PEER_MEMCPY, comm_span_args(op, self.group_size[op.group]))
        else:
            cached = (op.name, op_span_args(op))
        self._exec[(key, op.name)] = cached
        return cached


def predicted_timeline(result: SimOutcome) -> Timeline:
    """The predicted `Timeline` of `result` (spans, send->recv flows, link and memory
    counters, metadata)."""
    tl = build_timeline(result.program, result.machine, result.raw, result.network_meta, result.sampling)
    tl.counters.extend(CounterSample(*c) for c in _counters(result))
    tl.meta = _meta(result)
    return tl


def build_timeline(program: Program, machine: Machine, raw: RawResult, network_meta: dict, sampling: dict | None = None) -> Timeline:
    """The spans, flows and tracks of a simulation's timeline (no counters)."""
    tl = Timeline("predicted", program.name, program.world_size, meta=_base_meta(program, machine, network_meta, sampling))
    names = SpanNames(program)
    spans = tl.spans
    start, end, istart, iend, algos, protos = raw.start, raw.end, raw.issue_start, raw.issue_end, raw.algos, raw.protos
    exec_role, issue_role = SpanRole.EXEC, SpanRole.ISSUE
    for g, op in enumerate(raw.ops):
        op_id = op.id
        kind = _KIND_VALUE[op.kind]
        if iend[g] > istart[g]:
            spans.append(Span(op_id, op.rank, HOST_STREAM, issue_role, kind, names.issue_name(op), istart[g], iend[g]))
        track, (name, args) = names.exec_span(op, algos[g], protos[g])
        spans.append(Span(op_id, op.rank, track, exec_role, kind, name, start[g], end[g], args))
    tl.flows = [Flow(src, dst, name) for src, dst, name in _flows(raw)]
    tl.tracks = _known_tracks(program, _comm_tracks(raw))
    return tl


def write_trace(result: SimOutcome, path: str | Path, flag: str = "--trace", progress: Callable[[int, int], None] | None = None) -> None:
    """Write `result`'s predicted timeline as a Chrome trace to `path`, as
    `predicted_timeline(result).write(path, streams)` would, without building it: spans
    are grouped per track in arrays, sorted a window of time at a time and joined in
    batches from pieces of text built once per statement and name. `flag` names the
    file in a usage error; `progress`, if given, hears (spans written, spans in all)
    after each window."""
    # Paused collector: writing makes no reference cycles, but millions of short-lived
    # tuples would start collections that each walk every op of the program again.
    with gc_paused():
        _write_trace(result, path, flag, progress)


def _write_trace(result: SimOutcome, path: str | Path, flag: str, progress: Callable[[int, int], None] | None) -> None:
    program = result.program
    spans = _SpanRuns(result, SpanNames(program))
    tracks = ordered_tracks(spans.seen(), _known_tracks(program, spans.comm_tracks), program.streams)
    tid_of = {(r, t): i for r, t_names in tracks.items() for i, t in enumerate(t_names)}
    other = other_data("predicted", program.name, program.world_size, spans.makespan_us, tracks, _meta(result))
    times = DecimalTexts(3)
    events = chain(metadata_texts(tracks), spans.events(tid_of, times, progress), spans.arrows(tid_of, times),
                   counter_events(_counter_columns(result), max(tracks, default=-1) + 1))  # fmt: skip
    write_chrome_trace(path, flag, other=other, flows=spans.flow_entries(), events=events)


_KIND, _RANK, _INDEX = (attrgetter(a) for a in ("kind", "rank", "index"))
_OP_ID = "{}:{}".format
"""An op's id from its rank and index (`Op.id`)."""
_CHUNK = 1 << 14
"""Flows and counter samples encoded at once."""


class _SpanRuns:
    """Every span of a simulation as a code, g * 2 + role (0 EXEC, 1 ISSUE), grouped per
    track ("run") in arrays of codes and starts; per code, its event's pieces of text
    (`SpanEncoder.span_pieces`; its end is read from the ops' arrays); the comm queues of
    each rank; and the matched sends and their recvs, for flow arrows.

    The ops of a statement on a rank with one algo and protocol share their spec, so a
    "class" (spec, kind, algo, protocol) gives their EXEC track and
    `SpanNames.exec_key`, and (key, name) their pieces (`_Classes`): one pass over a
    rank's ops finds them (`_classify`), another sorts its spans into runs
    (`_rank_runs`), and only an op that starts a class or a name is looked at further."""

    def __init__(self, result: SimOutcome, names: SpanNames):
        program, raw = result.program, result.raw
        base, n = raw.base, len(raw.ops)
        self.end_of_role = (raw.end, raw.issue_end)
        """Per role (a code's lowest bit), the ends of the ops' spans: a code's end is
        end_of_role[code & 1][code >> 1]."""
        self.sign_clear = all(map(sign_clear, (raw.start, raw.issue_start, raw.end, raw.issue_end)))
        """No time is negative or -0.0: `DecimalTexts` may keep their texts."""
        self.width = max((len(r) for r in program.ops), default=0)
        """The most ops of a rank."""
        self.heads: list[str] = []
        """Per format, its `span_pieces` head after "},", which closes the event before."""
        self.middles: list[str] = []
        self.tails: list[str] = []
        self.format_of = array("H", bytes(4 * n))
        """Per code, the index of its pieces in heads, middles and tails (`_holding`)."""
        self.runs: dict[tuple[int, str], tuple[array, array]] = {}
        self.places: dict[tuple[int, str], int] = {}
        """(rank, track) of the ops' EXEC spans -> its number, for `place_of`."""
        self.place_of = array("H", bytes(2 * n))
        """Per op, the (rank, track) of its EXEC span, numbered (`places`; `_holding`)."""
        self.comm_tracks: dict[int, set[str]] = {}
        """Per rank, its comm queues (`_known_tracks`)."""
        known = _Classes(names, raw.algos, raw.protos, self._add)
        bounds = array("d", (math.inf, -math.inf))  # the first start and the last end of any span
        cls, formats = array("i"), array("i")  # per op of a rank (from 0)
        for rank, rank_ops in enumerate(program.ops):
            b, m = base[rank], len(rank_ops)
            for column in (cls, formats):
                column.extend(bytes(4 * max(m - len(column), 0)))
            _classify(rank_ops, b, raw.algos, raw.protos, known, cls, formats)
            present = sorted(set(cls[:m]))
            # The rank's tracks: the host's first (its ISSUE spans), then its classes' tracks.
            tracks = list(dict.fromkeys([HOST_STREAM, *map(known.track.__getitem__, present)]))
            track_of = array("i", bytes(4 * len(known.track)))  # class -> its track's number in tracks
            places = array("i", bytes(4 * len(known.track)))  # class -> its place
            for c in present:
                track_of[c] = tracks.index(known.track[c])
                places[c] = self._place(rank, known.track[c])
            self.comm_tracks[rank] = {known.track[c] for c in present if known.queue[c]}
            self.format_of = _holding(self.format_of, len(self.heads))
            self.format_of[2 * b : 2 * (b + m) : 2] = array(self.format_of.typecode, formats[:m])
            self.format_of[2 * b + 1 : 2 * (b + m) : 2] = array(self.format_of.typecode, map(known.issue.__getitem__, cls[:m]))
            self.place_of = _holding(self.place_of, len(self.places))
            self.place_of[b : b + m] = array(self.place_of.typecode, map(places.__getitem__, cls[:m]))
            codes, starts, ends = _rank_runs(cls, track_of, len(tracks), b, m, self.end_of_role, raw.start, raw.issue_start, bounds)
            for k, track in enumerate(tracks):
                lo = ends[k - 1] if k else 0
                if ends[k] > lo:
                    self.runs[(rank, track)] = (codes[lo : ends[k]], starts[lo : ends[k]])
        self.base = base
        self.makespan_us = bounds[1] - bounds[0] if self.runs else 0.0
        self.ops, self.start = raw.ops, raw.start
        self.sends, self.recvs = _matched_sends(raw)

    def _add(self, pieces: tuple[str, str, str] | None) -> int:
        # Predicted annotations never name op_id, nor hold lists: every span has pieces.
        assert pieces is not None
        head, middle, tail = pieces
        self.heads.append("}," + head)
        self.middles.append(middle)
        self.tails.append(tail)
        return len(self.heads) - 1

    def _place(self, rank: int, track: str) -> int:
        return self.places.setdefault((rank, track), len(self.places))

    def seen(self) -> dict[int, set[str]]:
        """Per rank, the tracks its spans are on."""
        out: dict[int, set[str]] = {}
        for rank, track in self.runs:
            out.setdefault(rank, set()).add(track)
        return out

    def events(self, tid_of: dict[tuple[int, str], int], times: DecimalTexts, progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """The spans' events in trace order, (start, rank, tid, op id, role), a window of
        about `_WINDOW_SPANS` at a time, each window's comma-separated; the runs and the
        arrays per code are consumed. `progress` hears (spans formatted, spans in all)
        after each window."""
        # A code less twice its rank's first op is the op's index x 2 + role: its "local" code.
        local_text = [str(i) for i in range(self.width) for _ in (0, 1)] if self.width <= _INDEX_TEXTS else None
        # Spans tied in time on one track are ordered by op id, as text ("0:10" before
        # "0:9"), then role: a local code's key is the rank of its index's text x 2 + role.
        key_of = array("i", bytes(8 * self.width))
        for position, index in enumerate(sorted(range(self.width), key=str)):
            key_of[2 * index], key_of[2 * index + 1] = 2 * position, 2 * position + 1
        runs = []
        firsts = array("i")  # per run, its rank's first code
        rank_texts, track_texts = [], []
        for rank, track in sorted(self.runs, key=lambda rt: (rt[0], tid_of[rt])):
            codes, starts = self.runs.pop((rank, track))
            runs.append(_in_time_order(codes, starts, 2 * self.base[rank], key_of))
            firsts.append(2 * self.base[rank])
            rank_texts.append(f"{rank}:")  # an op id is "rank:index"
            track_texts.append(track_piece(rank, tid_of[(rank, track)]))
        del key_of
        # The arrays per code go with the generator (the counters after the spans take memory of their own).
        texts = _EventTexts(self.heads, self.middles, self.tails, rank_texts, track_texts, local_text)
        format_of, ends = self.format_of, self.end_of_role
        del self.heads, self.middles, self.tails, self.format_of
        pos = [0] * len(runs)
        total, done = sum(len(r[0]) for r in runs), 0
        for bound in _windows([r[1] for r in runs]):
            w_codes, w_starts, w_runs = array("i"), array("d"), array("i")
            for k, (codes, starts) in enumerate(runs):
                p = pos[k]
                j = bisect_left(starts, bound, p)
                if j > p:
                    w_codes += codes[p:j]
                    w_starts += starts[p:j]
                    w_runs += array("i", (k,)) * (j - p)
                    pos[k] = j
            n = len(w_codes)
            if not n:
                continue
            # Stable: spans tied in time keep their runs' order (rank, tid), then their
            # order within the run (op id as text, role).
            order = sorted(range(n), key=w_starts.__getitem__)
            text = _window_text(order, w_codes, w_starts, w_runs, firsts, format_of, texts, ends, times, self.sign_clear)
            # Only the window's text is held while it is written, and not past it.
            del order, w_codes, w_starts, w_runs
            yield text
            del text
            done += n
            if progress is not None:
                progress(done, total)
        # The texts kept are spread over memory the windows' objects have freed, and would
        # keep the allocator from handing it back for the counters' arrays.
        times.clear()

    def flow_entries(self) -> Iterator[str]:
        """`otherData.commdsl.flows`'s entries of the matched sends, encoded."""
        ops = self.ops
        for lo in range(0, len(self.sends), _CHUNK):
            sends, recvs = map(ops.__getitem__, self.sends[lo : lo + _CHUNK]), map(ops.__getitem__, self.recvs[lo : lo + _CHUNK])
            a, b = list(sends), list(recvs)
            n = len(a)
            pieces: list[str | None] = [None] * (5 * n)
            pieces[0::5] = ['"],["'] * n
            pieces[1::5] = map(_OP_ID, map(_RANK, a), map(_INDEX, a))
            pieces[2::5] = ['","'] * n
            pieces[3::5] = map(_OP_ID, map(_RANK, b), map(_INDEX, b))
            pieces[4::5] = ['","p2p'] * n
            pieces[0] = '["'
            pieces.append('"]')
            yield "".join(pieces)  # type: ignore[arg-type]

    def arrows(self, tid_of: dict[tuple[int, str], int], times: DecimalTexts) -> Iterator[str]:
        """The flow arrows' events (`commdsl.timeline.arrow_events`), `_CHUNK` at a time;
        read once the flow entries are."""
        all_sends, all_recvs, place_of = self.sends, self.recvs, self.place_of
        del self.sends, self.recvs, self.place_of
        place_pid, place_tid = [rank for rank, _ in self.places], list(map(tid_of.__getitem__, self.places))
        start = self.start
        for lo in range(0, len(all_sends), _CHUNK):
            sends, recvs = all_sends[lo : lo + _CHUNK], all_recvs[lo : lo + _CHUNK]
            n = len(sends)
            a, b = list(map(place_of.__getitem__, sends)), list(map(place_of.__getitem__, recvs))
            yield arrow_events(list(range(lo, lo + n)), ["p2p"] * n,
                               list(map(place_pid.__getitem__, a)), list(map(place_tid.__getitem__, a)), list(map(start.__getitem__, sends)),
                               list(map(place_pid.__getitem__, b)), list(map(place_tid.__getitem__, b)), list(map(start.__getitem__, recvs)),
                               times)  # fmt: skip
        times.clear()  # as after the spans


class _Classes:
    """The classes of ops met so far (see `_SpanRuns`), each's EXEC track and formats."""

    def __init__(self, names: SpanNames, algos: bytearray, protos: bytearray, add: Callable[[tuple[str, str, str] | None], int]):
        self.names, self.algos, self.protos, self.add = names, algos, protos, add
        self.encoder = SpanEncoder()
        self.of: dict[tuple, int] = {}
        """(id of the op's spec, kind, algo, protocol) -> its class."""
        self.track: list[str] = []
        """Per class, its EXEC spans' track."""
        self.queue: list[bool] = []
        """Per class, whether that track is a comm queue."""
        self.key: list[int] = []
        """Per class, its `SpanNames.exec_key` key, as an index into `keys`."""
        self.issue: list[int] = []
        """Per class, the format of its ISSUE spans."""
        self.keys: list[tuple] = []
        self.key_index: dict[tuple, int] = {}
        self.issue_format: dict[tuple, int] = {}
        self.exec_format: list[dict[str, int]] = []
        """Per key index, op name -> the format of its EXEC spans."""

    def new(self, op: Op, g: int) -> int:
        """The class of `op` (number `g`), met first."""
        track, key = self.names.exec_key(op, self.algos[g], self.protos[g])
        c = self.of[(id(op.spec), op.kind, self.algos[g], self.protos[g])] = len(self.track)
        self.track.append(track)
        self.queue.append(_on_comm_queue(op))
        if key not in self.key_index:
            self.key_index[key] = len(self.keys)
            self.keys.append(key)
            self.exec_format.append({})
        self.key.append(self.key_index[key])
        issue = (op.kind, op.transport, op.copy_dir)
        if issue not in self.issue_format:
            self.issue_format[issue] = self.add(self.encoder.span_pieces(_KIND_VALUE[op.kind], "issue", self.names.issue_name(op), ()))
        self.issue.append(self.issue_format[issue])
        return c

    def new_format(self, c: int, op: Op, g: int) -> int:
        """The format of the EXEC span of `op` (number `g`, class `c`), its name met first
        in its class's key."""
        entry = self.names.exec_entry(op, self.keys[self.key[c]], self.algos[g], self.protos[g])
        f = self.exec_format[self.key[c]][op.name] = self.add(self.encoder.span_pieces(_KIND_VALUE[op.kind], "exec", *entry))
        return f


def _classify(rank_ops: tuple[Op, ...], b: int, algos: bytearray, protos: bytearray, known: _Classes, cls: array, formats: array) -> None:
    """Each op's class and the format of its EXEC span, into `cls` and `formats` (from 0,
    for the rank's ops numbered from `b`)."""
    of, key, exec_format = known.of, known.key, known.exec_format
    for i in range(len(rank_ops)):
        op = rank_ops[i]
        c = of.get((id(op.spec), op.kind, algos[b + i], protos[b + i]))
        if c is None:
            c = known.new(op, b + i)
        cls[i] = c
        f = exec_format[key[c]].get(op.name)
        if f is None:
            f = known.new_format(c, op, b + i)
        formats[i] = f


def _rank_runs(cls: array, track_of: array, tracks: int, b: int, m: int, ends: tuple[array, array], start: array, issue_start: array,
               bounds: array) -> tuple[array, array, array]:  # fmt: skip
    """A rank's spans grouped by track, in op order, its ops numbered from `b`, their
    classes `cls` and each class's track `track_of` (of `tracks`, the host's 0): (codes,
    starts, each track's end in them). Each op has its EXEC span; an op that its host
    issues for a time has an ISSUE span on track 0. `ends` are per role the ops' ends;
    `bounds` (first start, last end of any span) takes in the rank's spans."""
    end, issue_end = ends
    count_array = array("i", bytes(4 * (tracks + 1)))
    count = count_array  # compiled: a typed view of the array
    spans = 0
    for i in range(m):
        count[track_of[cls[i]] + 1] += 1
        if issue_end[b + i] > issue_start[b + i]:
            count[1] += 1
            spans += 1
    for k in range(tracks):
        count[k + 1] += count[k]
    code_array, start_array = array("i", bytes(4 * (m + spans))), array("d", bytes(8 * (m + spans)))
    codes, starts = code_array, start_array
    first, last = bounds[0], bounds[1]
    for i in range(m):
        g = b + i
        if issue_end[g] > issue_start[g]:
            j = count[0]
            codes[j], starts[j] = 2 * g + 1, issue_start[g]
            count[0] = j + 1
            first, last = min(first, issue_start[g]), max(last, issue_end[g])
        k = track_of[cls[i]]
        j = count[k]
        codes[j], starts[j] = 2 * g, start[g]
        count[k] = j + 1
        first, last = min(first, start[g]), max(last, end[g])
    bounds[0], bounds[1] = first, last
    return code_array, start_array, count_array[:tracks]


class _EventTexts:
    """The pieces of text the spans' events are joined from (`_window_text`)."""

    def __init__(self, heads: list[str], middles: list[str], tails: list[str], ranks: list[str], tracks: list[str], indexes: list[str] | None):
        self.heads, self.middles, self.tails = heads, middles, tails
        """Per format (`_SpanRuns.format_of`), its `SpanEncoder.span_pieces`, the head after
        "},", which closes the event before."""
        self.ranks = ranks
        """Per run, its rank's op id prefix ("rank:")."""
        self.tracks = tracks
        """Per run, its `track_piece`."""
        self.indexes = indexes
        """Per local code (index x 2 + role), the index's text; None for ranks too wide."""


def _window_text(order: list[int], codes: array, starts: array, runs: array, firsts: array, format_of: array, texts: _EventTexts,
                 ends: tuple[array, array], times: DecimalTexts, keep: bool) -> str:  # fmt: skip
    """A window's spans' events in `order` (indexes into codes, starts and runs: per span
    its code, start and run), comma-separated; `firsts` per run its rank's first code,
    `format_of` per code its format, `ends` per role the ops' ends; `keep`: no time of
    them is negative or -0.0 (`DecimalTexts.texts`)."""
    heads, middles, tails, ranks, tracks, indexes = texts.heads, texts.middles, texts.tails, texts.ranks, texts.tracks, texts.indexes
    exec_ends, issue_ends = ends
    pieces: list[str] = []
    for i in order:
        code, k, start = codes[i], runs[i], starts[i]
        f, local = format_of[code], code - firsts[k]
        end = issue_ends[code >> 1] if code & 1 else exec_ends[code >> 1]
        pieces.append(heads[f])
        pieces.append(ranks[k])
        pieces.append(indexes[local] if indexes is not None else str(local >> 1))
        pieces.append(middles[f])
        pieces.append(times.get(end - start) if keep else times.text(end - start))
        pieces.append(tails[f])
        pieces.append(tracks[k])
        pieces.append(times.get(start) if keep else times.text(start))
    pieces[0] = pieces[0][2:]
    pieces.append("}")
    return "".join(pieces)


def _holding(numbers: array, count: int) -> array:
    """`numbers` (unsigned 2-byte numbers, `_NARROW` of them: most schedules have fewer
    span formats and tracks), or a 4-byte copy where they must hold numbers up to
    `count` - 1 and cannot."""
    return array("i", numbers) if numbers.typecode == "H" and count > _NARROW else numbers


def _in_time_order(codes: array, starts: array, first_code: int, key_of: array) -> tuple[array, array]:
    """A track's codes and starts sorted by start, spans tied in start by their key
    (`key_of` the local code, code - `first_code`): they mostly come so."""
    if any(map(gt, starts, starts[1:])):
        by_start = sorted(range(len(starts)), key=starts.__getitem__)
        codes, starts = (array(a.typecode, map(a.__getitem__, by_start)) for a in (codes, starts))
    n = len(starts)
    ties = list(compress(range(n - 1), map(eq, starts, starts[1:])))
    if not ties:
        return codes, starts
    key = array("i", map(key_of.__getitem__, map(sub, codes, repeat(first_code))))
    done = 0
    for i in compress(ties, map(gt, map(key.__getitem__, ties), map(key.__getitem__, map(add, ties, repeat(1))))):
        if i < done:
            continue  # sorted with the tie before
        t = starts[i]
        lo, hi = i, i + 2
        while lo and starts[lo - 1] == t:
            lo -= 1
        while hi < n and starts[hi] == t:
            hi += 1
        tie = sorted(range(lo, hi), key=key.__getitem__)
        codes[lo:hi] = array(codes.typecode, map(codes.__getitem__, tie))
        key[lo:hi] = array(key.typecode, map(key.__getitem__, tie))
        done = hi
    return codes, starts


def _windows(runs: list[array]) -> list[float]:
    """Start times that cut the spans (each track's sorted starts) into windows of about
    `_WINDOW_SPANS`, the last bound past every start."""
    step = min(64, _WINDOW_SPANS)  # every step-th start of each track, sorted: about where the windows end
    sample = sorted(s for starts in runs for s in starts[::step])
    every = max(_WINDOW_SPANS // step, 1)
    bounds = sample[every::every]
    return [*bounds, float("inf")]


def _flows(raw: RawResult) -> Iterator[tuple[str, str, str]]:
    """(send op id, recv op id, "p2p") of every matched send, in op order."""
    ops = raw.ops
    for send, recv in zip(*_matched_sends(raw)):
        yield ops[send].id, ops[recv].id, "p2p"


def _matched_sends(raw: RawResult) -> tuple[array, array]:
    """Every send matched with a recv (global numbers, in op order), and its recv."""
    matched = map(and_, map(is_, map(_KIND, raw.ops), repeat(OpKind.SEND)), map(ge, raw.partner, repeat(0)))
    typecode = op_index_typecode(len(raw.ops))
    sends = array(typecode, compress(range(len(raw.ops)), matched))
    return sends, array(typecode, map(raw.partner.__getitem__, sends))


def _known_tracks(program: Program, comm_tracks: dict[int, set[str]]) -> dict[int, list[str]]:
    """Every rank shows its host, every declared stream (even if idle) and its comm
    queues (`comm_tracks`: per rank, those its ops run on)."""
    return {r: [HOST_STREAM, *program.streams, *sorted(comm_tracks.get(r, ()))] for r in range(program.world_size) if program.ops[r]}


def _comm_tracks(raw: RawResult) -> dict[int, set[str]]:
    """Per rank, the comm queues its ops run on."""
    out: dict[int, set[str]] = {}
    for op in raw.ops:
        if _on_comm_queue(op):
            out.setdefault(op.rank, set()).add(COMM_TRACK_PREFIX + op.group)
    return out


def _on_comm_queue(op: Op) -> bool:
    """The op runs on its group's comm queue (a memcpy send or recv runs on its stream)."""
    return op.kind in _COMM_KINDS and op.transport is not Transport.MEMCPY


def _base_meta(program: Program, machine: Machine, network_meta: dict, sampling: dict | None) -> dict:
    return {
        "params": dict(program.params),
        "machine": machine.to_json(),
        "network": network_meta,
        "streams": list(program.streams),
        **(sampling or {}),
    }


def _meta(result: SimOutcome) -> dict:
    """The timeline's metadata: params, machine, network model, streams, sampling, and
    each rank's memory peak where the schedule declares memory."""
    meta = _base_meta(result.program, result.machine, result.network_meta, result.sampling)
    fold = result.program.fold
    if fold is not None:  # the representative's ranks stand for every replica: `compare` unfolds them
        meta[FOLD_META] = {"axis": fold.axis, "replicas": fold.replicas, "stride": fold.stride, "block": fold.block,
                           "ranks": list(fold.ranks)}  # fmt: skip
    peaks = memory_profile(result.raw)
    if peaks:
        meta[MEMORY_PEAK_META] = {str(m.rank): m.peak_bytes for m in peaks}
    return meta


def _counters(result: SimOutcome) -> Iterator[tuple[str, int, float, float]]:
    """(track, rank, time, value): link utilisation (a separate "links" process, rank
    -1), then each rank's declared memory."""
    for tracks, ranks, times, values in _counter_columns(result):
        yield from zip(tracks, ranks, times, values)


def _counter_columns(result: SimOutcome) -> Iterator[tuple[Sequence[str], Sequence[int], Sequence[float], Sequence[float]]]:
    """`_counters` as `commdsl.timeline.counter_events`' chunks (tracks, ranks, times,
    values), about `_CHUNK` samples at a time."""
    if result.network_model is not None:
        tracks = _LinkTracks()
        for times, names, values in result.network_model.counter_columns(_CHUNK):
            yield list(map(tracks.__getitem__, names)), (-1,) * len(times), times, values
    ranks, times, values = memory_counters(result.raw)
    for lo in range(0, len(ranks), _CHUNK):
        hi = lo + _CHUNK
        yield [MEMORY_TRACK] * len(ranks[lo:hi]), ranks[lo:hi], times[lo:hi], values[lo:hi]


class _LinkTracks(dict):
    """A link's name -> the track of its utilisation counter."""

    def __missing__(self, name: str) -> str:
        track = self[name] = f"link {name} util"
        return track


def _comm_name(op: Op, algo: str, proto: Protocol | None) -> str:
    if op.transport is Transport.NCCL:
        # The protocol NCCL's model chose; without a model, the LL of the kernels NCCL
        # (2.19 and later) compiles for every collective and runs every protocol in.
        protocol = proto.value.upper() if proto is not None else "LL"
        # NCCL calls the pipelined chain of broadcast/reduce RING.
        return nccl_kernel_name(op, "ring" if algo == "chain" else algo if op.kind.is_collective else None, protocol)
    if op.transport is Transport.GLOO:
        return gloo_span_name(op)
    return _PEER_MEMCPY


def _issue_name(op: Op) -> str:
    if op.kind.is_comm:
        return f"{op.transport.value}:{op.kind.value}"
    if op.kind is OpKind.COMPUTE:
        return "cudaLaunchKernel"
    if op.kind is OpKind.COPY:
        return "cudaMemcpyPeerAsync" if op.copy_dir is CopyDir.PEER else "cudaMemcpyAsync"
    if op.kind is OpKind.RECORD:
        return "cudaEventRecord"
    return "cudaStreamWaitEvent"
