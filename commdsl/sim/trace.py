"""The predicted timeline of a simulation: a `Timeline` in memory (`predicted_timeline`),
or the same Chrome trace streamed to a file from the per-op arrays (`write_trace`).

Both name and annotate each op's spans alike (`SpanNames`), so the file `write_trace`
writes is byte for byte what `predicted_timeline(result).write(...)` writes; but
`write_trace` holds no span objects: a few arrays of 4- and 8-byte entries per span and
per op, the events sorted a window of time at a time and formatted in batches from one
%-format per statement (`commdsl.timeline.SpanEncoder`), written as they are formatted.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import compress, repeat
from operator import gt, rshift, sub
from pathlib import Path
from typing import TYPE_CHECKING

from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Protocol, Transport
from commdsl.sim.entities import ALGOS, PROTOS, RawResult
from commdsl.sim.memory import memory_counters, memory_profile
from commdsl.sim.simulate import gc_paused
from commdsl.timeline import (COMM_TRACK_PREFIX, MEMORY_PEAK_META, CounterSample, Flow, Span, SpanEncoder, SpanRole, Timeline,
                              comm_span_args, format_spans, gloo_span_name, nccl_kernel_name, op_span_args, ordered_tracks,
                              other_data, write_chrome_trace)  # fmt: skip

if TYPE_CHECKING:
    from commdsl.machine.model import Machine
    from commdsl.sim.simulate import SimResult

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

_WINDOW_SPANS = 1 << 14
"""Spans sorted at once by `write_trace` (about): its memory beyond the arrays."""


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
    def exec_track(op: Op) -> str:
        """The track of the op's EXEC span: its group's comm queue, or its stream."""
        if op.kind in _COMM_KINDS and op.transport is not Transport.MEMCPY:  # memcpy runs on its stream
            return COMM_TRACK_PREFIX + op.group
        return HOST_STREAM if op.kind is OpKind.WAIT and op.stream == HOST_STREAM else op.stream

    def exec_span(self, op: Op, algo_index: int, proto_index: int) -> tuple[str, tuple[str, tuple]]:
        """(track, (name, args)) of the op's EXEC span, given its `RawResult.algos` and
        `protos` entries; the (name, args) pair is shared by the ops of one statement."""
        kind = op.kind
        if kind in _COMM_KINDS and op.transport is not Transport.MEMCPY:  # memcpy runs on its stream
            algo = ALGOS[algo_index].value
            proto = PROTOS[proto_index]
            # dtype, reduce op, transport and algo are fixed per statement (its loc).
            key = (id(op.loc), op.name, op.size_bytes, op.group, op.dtype, algo, proto)
            cached = self._exec.get(key)
            if cached is None:
                extra = (("algo", algo),) if proto is None else (("algo", algo), ("proto", proto.value))
                cached = self._exec[key] = (_comm_name(op, algo, proto), comm_span_args(op, self.group_size[op.group]) + extra)
            return COMM_TRACK_PREFIX + op.group, cached
        track = HOST_STREAM if kind is OpKind.WAIT and op.stream == HOST_STREAM else op.stream
        key = (id(op.loc), op.name, op.size_bytes, op.flops, kind)
        cached = self._exec.get(key)
        if cached is None:
            if kind is OpKind.COPY:
                cached = (_MEMCPY_NAMES[op.copy_dir], op_span_args(op))
            elif kind in _COMM_KINDS:  # a memcpy send or recv
                cached = (_PEER_MEMCPY, comm_span_args(op, self.group_size[op.group]))
            else:
                cached = (op.name, op_span_args(op))
            self._exec[key] = cached
        return track, cached


def predicted_timeline(result: SimResult) -> Timeline:
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
    tl.tracks = _known_tracks(program, raw)
    return tl


def write_trace(result: SimResult, path: str | Path, flag: str = "--trace", progress: Callable[[int, int], None] | None = None) -> None:
    """Write `result`'s predicted timeline as a Chrome trace to `path`, as
    `predicted_timeline(result).write(path, streams)` would, without building it: spans
    are grouped per track in arrays, sorted a window of time at a time and formatted in
    batches from one format per statement. `flag` names the file in a usage error;
    `progress`, if given, hears (spans written, spans in all) after each window."""
    # Paused collector: writing makes no reference cycles, but millions of short-lived
    # tuples would start collections that each walk every op of the program again.
    with gc_paused():
        _write_trace(result, path, flag, progress)


def _write_trace(result: SimResult, path: str | Path, flag: str, progress: Callable[[int, int], None] | None) -> None:
    program, raw = result.program, result.raw
    names = SpanNames(program)
    spans = _SpanRuns(result, names)
    tracks = ordered_tracks(spans.seen(), _known_tracks(program, raw), program.streams)
    tid_of = {(r, t): i for r, t_names in tracks.items() for i, t in enumerate(t_names)}
    ops, base, start = raw.ops, raw.base, raw.start

    def exec_of(op_id: str) -> tuple[int, int, float]:
        rank, _, index = op_id.partition(":")
        g = base[int(rank)] + int(index)
        return int(rank), tid_of[(int(rank), names.exec_track(ops[g]))], start[g]

    other = other_data("predicted", program.name, program.world_size, spans.makespan_us, tracks, _meta(result))
    write_chrome_trace(path, flag, tracks=tracks, other=other, flows=lambda: _flows(raw), spans=spans.events(tid_of, progress),
                       exec_of=exec_of, counters=_counters(result))  # fmt: skip


class _SpanRuns:
    """Every span of a simulation as a code, g * 2 + role (0 EXEC, 1 ISSUE), grouped per
    track ("run") in arrays of codes, starts and keys within the track; per code, its
    end and its event's format (`SpanEncoder.span_format`)."""

    def __init__(self, result: SimResult, names: SpanNames):
        program, raw = result.program, result.raw
        base, n = raw.base, len(raw.ops)
        algos, protos = raw.algos, raw.protos
        encoder = SpanEncoder()
        # Per code: start, end (the op's, or its issue span's).
        start = array("d", bytes(16 * n))  # only to fill each run's starts
        start[0::2], start[1::2] = raw.start, raw.issue_start
        self.end = array("d", bytes(16 * n))
        self.end[0::2], self.end[1::2] = raw.end, raw.issue_end
        # Spans tied in time on one track are ordered by op id, as text ("0:10" before
        # "0:9"), then role: a code's key is the rank of its op index's decimal text x 2 + role.
        width = max((len(r) for r in program.ops), default=0)
        lex = array("i", bytes(8 * width))
        for position, index in enumerate(sorted(range(width), key=str)):
            lex[2 * index], lex[2 * index + 1] = 2 * position, 2 * position + 1
        # Pass over the ops: each EXEC span's track and format (one per statement and name),
        # and which ops the host issues with a span of their own (C-level).
        self.formats: list[str] = []
        exec_format_of = array("i", bytes(4 * n))
        exec_format: dict[int, int] = {}
        issue_format: dict[tuple, int] = {}
        issue_of: dict[int, int] = {}
        """EXEC format -> the format of its ops' ISSUE spans (its statement's kind and transport)."""
        self.runs: dict[tuple[int, str], tuple[array, array, array]] = {}
        for rank, rank_ops in enumerate(program.ops):
            b, m = base[rank], len(rank_ops)
            codes: dict[str, array] = {}
            issued = array("q", compress(range(2 * b + 1, 2 * (b + m) + 1, 2), map(gt, raw.issue_end[b : b + m], raw.issue_start[b : b + m])))
            if issued:
                codes[HOST_STREAM] = issued
            for g, op in enumerate(rank_ops, b):
                track, entry = names.exec_span(op, algos[g], protos[g])
                # An entry is one statement's (so one kind's), and lives in `names`: its id stays its.
                f = exec_format.get(id(entry))
                if f is None:
                    kind = _KIND_VALUE[op.kind]
                    f = exec_format[id(entry)] = self._add(encoder.span_format(kind, "exec", *entry))
                    k = (op.kind, op.transport, op.copy_dir)
                    if k not in issue_format:
                        issue_format[k] = self._add(encoder.span_format(kind, "issue", names.issue_name(op), ()))
                    issue_of[f] = issue_format[k]
                exec_format_of[g] = f
                run = codes.get(track)
                if run is None:
                    run = codes[track] = array("q")
                run.append(2 * g)
            for track, run in codes.items():
                starts = array("d", map(start.__getitem__, run))
                self.runs[(rank, track)] = (run, starts, array("i", map(lex.__getitem__, map(sub, run, repeat(2 * b)))))
        self.format_of = array("i", bytes(8 * n))
        """Per code, the index of its format in `formats`."""
        self.format_of[0::2] = exec_format_of
        self.format_of[1::2] = array("i", map(issue_of.__getitem__, exec_format_of))
        self.base = base
        if self.runs:
            first = min(min(starts) for _, starts, _ in self.runs.values())
            last = max(max(map(self.end.__getitem__, codes)) for codes, _, _ in self.runs.values())
            self.makespan_us = last - first
        else:
            self.makespan_us = 0.0

    def _add(self, fmt: str | None) -> int:
        # Predicted annotations never name op_id, nor hold lists: every span has a format.
        assert fmt is not None
        self.formats.append(fmt)
        return len(self.formats) - 1

    def seen(self) -> dict[int, set[str]]:
        """Per rank, the tracks its spans are on."""
        out: dict[int, set[str]] = {}
        for rank, track in self.runs:
            out.setdefault(rank, set()).add(track)
        return out

    def events(self, tid_of: dict[tuple[int, str], int], progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """The spans' events in trace order, (start, rank, tid, op id, role), a window of
        about `_WINDOW_SPANS` at a time, each window's comma-separated; the runs are
        consumed. `progress` hears (spans formatted, spans in all) after each window."""
        runs = []
        for rank, track in sorted(self.runs, key=lambda rt: (rt[0], tid_of[rt])):
            codes, starts, keys = self.runs.pop((rank, track))
            if any(map(float.__gt__, starts, starts[1:])):  # a track's spans mostly come in order
                by_start = sorted(range(len(starts)), key=starts.__getitem__)
                codes, starts, keys = (array(a.typecode, map(a.__getitem__, by_start)) for a in (codes, starts, keys))
            runs.append((rank, tid_of[(rank, track)], codes, starts, keys))
        formats, format_of, end = self.formats, self.format_of, self.end
        pos = [0] * len(runs)
        total, done = sum(len(r[2]) for r in runs), 0
        for bound in _windows([r[3] for r in runs]):
            batch: list[tuple] = []
            for k, (rank, tid, codes, starts, keys) in enumerate(runs):
                p = pos[k]
                j = bisect_left(starts, bound, p)
                if j > p:
                    batch.extend(zip(starts[p:j], repeat(k), keys[p:j], codes[p:j], repeat(rank), repeat(tid)))
                    pos[k] = j
            if not batch:
                continue
            batch.sort()
            done += len(batch)
            starts, _, _, codes, pids, tids = zip(*batch)
            del batch
            # g - base of the rank: the op's index, for its id "rank:index".
            indexes = map(sub, map(rshift, codes, repeat(1)), map(self.base.__getitem__, pids))
            formatted = map(formats.__getitem__, map(format_of.__getitem__, codes))
            yield format_spans(formatted, pids, indexes, tids, starts, map(end.__getitem__, codes))
            if progress is not None:
                progress(done, total)


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
    ops, partner = raw.ops, raw.partner
    send = OpKind.SEND
    for g, op in enumerate(ops):
        if op.kind is send and partner[g] >= 0:
            yield op.id, ops[partner[g]].id, "p2p"


def _known_tracks(program: Program, raw: RawResult) -> dict[int, list[str]]:
    """Every rank shows its host, every declared stream (even if idle) and its comm queues."""
    comm_tracks: dict[int, set[str]] = {}
    for op in raw.ops:
        if op.kind in _COMM_KINDS and op.transport is not Transport.MEMCPY:
            comm_tracks.setdefault(op.rank, set()).add(COMM_TRACK_PREFIX + op.group)
    return {r: [HOST_STREAM, *program.streams, *sorted(comm_tracks.get(r, ()))] for r in range(program.world_size) if program.ops[r]}


def _base_meta(program: Program, machine: Machine, network_meta: dict, sampling: dict | None) -> dict:
    return {
        "params": dict(program.params),
        "machine": machine.to_json(),
        "network": network_meta,
        "streams": list(program.streams),
        **(sampling or {}),
    }


def _meta(result: SimResult) -> dict:
    """The timeline's metadata: params, machine, network model, streams, sampling, and
    each rank's memory peak where the schedule declares memory."""
    meta = _base_meta(result.program, result.machine, result.network_meta, result.sampling)
    peaks = memory_profile(result.raw)
    if peaks:
        meta[MEMORY_PEAK_META] = {str(m.rank): m.peak_bytes for m in peaks}
    return meta


def _counters(result: SimResult) -> Iterator[tuple[str, int, float, float]]:
    """(track, rank, time, value): link utilisation (a separate "links" process, rank
    -1), then each rank's declared memory."""
    if result.network_model is not None:
        tracks: dict[str, str] = {}
        for t, name, v in result.network_model.counter_samples():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = f"link {name} util"
            yield track, -1, t, v
    for c in memory_counters(result.raw):
        yield c.track, c.rank, c.ts_us, c.value


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
