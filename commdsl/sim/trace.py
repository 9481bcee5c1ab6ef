"""The predicted timeline of a simulation: a `Timeline` in memory (`predicted_timeline`),
or the same Chrome trace streamed to a file from the per-op arrays (`write_trace`).

Both name and annotate each op's spans alike (`SpanNames`), so the file `write_trace`
writes is byte for byte what `predicted_timeline(result).write(...)` writes; but
`write_trace` holds no span objects: a few arrays of 8-byte entries per span, the events
sorted window by window and written as they are encoded (`commdsl.timeline.SpanEncoder`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Protocol, Transport
from commdsl.sim.entities import ALGOS, PROTOS, RawResult
from commdsl.sim.memory import memory_counters, memory_profile
from commdsl.timeline import (COMM_TRACK_PREFIX, MEMORY_PEAK_META, CounterSample, Flow, Span, SpanEncoder, SpanRole, Timeline,
                              comm_span_args, gloo_span_name, nccl_kernel_name, op_span_args, ordered_tracks, other_data,
                              span_event, write_chrome_trace)  # fmt: skip

if TYPE_CHECKING:
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

_WINDOW_SPANS = 1 << 16
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
    tl.counters.extend(_counters(result))
    tl.meta = _meta(result)
    return tl


def build_timeline(program: Program, machine, raw: RawResult, network_meta: dict, sampling: dict | None = None) -> Timeline:
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


def write_trace(result: SimResult, path: str | Path, flag: str = "--trace") -> None:
    """Write `result`'s predicted timeline as a Chrome trace to `path`, as
    `predicted_timeline(result).write(path, streams)` would, without building it: spans
    are grouped per track (8-byte entries), sorted a window of time at a time and
    encoded from one template per statement. `flag` names the file in a usage error."""
    program, raw = result.program, result.raw
    ops, base = raw.ops, raw.base
    start, end, istart, iend, algos, protos = raw.start, raw.end, raw.issue_start, raw.issue_end, raw.algos, raw.protos
    names = SpanNames(program)
    encoder = SpanEncoder()
    # Index of each op within its rank -> the rank of its decimal string among them: spans
    # tied in time on one track are ordered by op id ("0:10" before "0:9"), then role.
    width = max((len(r) for r in program.ops), default=0)
    unlex = sorted(range(width), key=str)
    lex = array("q", bytes(8 * width))
    for position, index in enumerate(unlex):
        lex[index] = position
    # Pass 1: per track, each span's start and its key within the track, lex * 2 + role;
    # per op, the template of its EXEC span.
    runs: dict[tuple[int, str], tuple[array, array]] = {}
    templates: list[tuple[str, str, str] | None] = []
    template_of: dict[tuple[int, str], int] = {}
    entry_of = array("q", bytes(8 * len(ops)))
    first = min(start, default=0.0)
    last = max(end, default=0.0)
    for g, op in enumerate(ops):
        rank = op.rank
        sub = lex[g - base[rank]] * 2
        s = istart[g]
        if iend[g] > s:
            run = runs.get((rank, HOST_STREAM))
            if run is None:
                run = runs[(rank, HOST_STREAM)] = (array("d"), array("q"))
            run[0].append(s)
            run[1].append(sub + 1)
            first = min(first, s)
            last = max(last, iend[g])
        track, entry = names.exec_span(op, algos[g], protos[g])
        kind = _KIND_VALUE[op.kind]
        key = (id(entry), kind)
        t = template_of.get(key)
        if t is None:
            t = template_of[key] = len(templates)
            templates.append(encoder.template(kind, "exec", entry[0], entry[1]))
        entry_of[g] = t
        run = runs.get((rank, track))
        if run is None:
            run = runs[(rank, track)] = (array("d"), array("q"))
        run[0].append(start[g])
        run[1].append(sub)
    seen: dict[int, set[str]] = {}
    for rank, track in runs:
        seen.setdefault(rank, set()).add(track)
    tracks = ordered_tracks(seen, _known_tracks(program, raw), program.streams)
    tid_of = {(r, t): i for r, t_names in tracks.items() for i, t in enumerate(t_names)}
    # Each track's spans by start (they mostly are: a stream runs in order).
    order = sorted(runs, key=lambda rt: (rt[0], tid_of[rt]))
    info = []
    for rank, track in order:
        starts, subs = runs.pop((rank, track))
        if any(map(float.__gt__, starts, starts[1:])):
            by_start = sorted(range(len(starts)), key=starts.__getitem__)
            starts, subs = array("d", (starts[i] for i in by_start)), array("q", (subs[i] for i in by_start))
        info.append((rank, tid_of[(rank, track)], base[rank], starts, subs))
    span2 = 2 * max(width, 1)

    def spans() -> Iterator[str]:
        issue_templates: dict[tuple, tuple[str, str, str] | None] = {}
        pos = [0] * len(info)
        for bound in _windows(info):
            batch = []
            for k, (_, _, _, starts, subs) in enumerate(info):
                p = pos[k]
                if p == len(starts):
                    continue
                j = bisect_left(starts, bound, p)
                kbase = k * span2
                batch.extend(zip(starts[p:j], [kbase + sub for sub in subs[p:j]]))
                pos[k] = j
            batch.sort()
            for s, ck in batch:
                k, sub = divmod(ck, span2)
                rank, tid, b, _, _ = info[k]
                index = unlex[sub >> 1]
                g = b + index
                op_id = f"{rank}:{index}"
                if sub & 1:
                    op = ops[g]
                    key = (op.kind, op.transport, op.copy_dir)
                    t = issue_templates.get(key, False)
                    if t is False:
                        t = issue_templates[key] = encoder.template(_KIND_VALUE[op.kind], "issue", names.issue_name(op), ())
                    yield span_event(t, op_id, rank, tid, s, iend[g])
                else:
                    t = templates[entry_of[g]]
                    if t is None:
                        op = ops[g]
                        _, (name, args) = names.exec_span(op, algos[g], protos[g])
                        yield encoder.event(_KIND_VALUE[op.kind], "exec", name, args, op_id, rank, tid, s, end[g])
                    else:
                        yield span_event(t, op_id, rank, tid, s, end[g])

    def exec_of(op_id: str) -> tuple[int, int, float]:
        rank, _, index = op_id.partition(":")
        g = base[int(rank)] + int(index)
        op = ops[g]
        track, _ = names.exec_span(op, algos[g], protos[g])
        return op.rank, tid_of[(op.rank, track)], start[g]

    makespan_us = last - first if ops else 0.0
    write_chrome_trace(path, flag, tracks=tracks,
                       other=other_data("predicted", program.name, program.world_size, makespan_us, tracks, _meta(result)),
                       flows=lambda: _flows(raw), spans=spans(), exec_of=exec_of, counters=_counters(result))  # fmt: skip


def _windows(info: list) -> list[float]:
    """Start times that cut the spans (each track's sorted starts) into windows of about
    `_WINDOW_SPANS`, the last bound past every start."""
    step = min(64, _WINDOW_SPANS)  # every step-th start of each track, sorted: about where the windows end
    sample = sorted(s for *_, starts, _ in info for s in starts[::step])
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


def _base_meta(program: Program, machine, network_meta: dict, sampling: dict | None) -> dict:
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


def _counters(result: SimResult) -> Iterator[CounterSample]:
    """Link utilisation (a separate "links" process, rank -1) then each rank's declared memory."""
    if result.network_model is not None:
        tracks: dict[str, str] = {}
        for t, name, v in result.network_model.counter_samples():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = f"link {name} util"
            yield CounterSample(track, -1, t, v)
    yield from memory_counters(result.raw)


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
