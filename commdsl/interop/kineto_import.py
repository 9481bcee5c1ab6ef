"""A job's profiler traces as a schedule: `commdsl import kineto DIR -o job.yaml`.

Per rank, the step's device-side work in stream order (`KinetoJob` from kineto_read):
on GPUs the kernels, copies and NCCL kernels of each CUDA stream; on CPU the ranges of
each worker thread (the outermost ones, those that wrap no gloo range) and gloo's ranges.
  * compute runs its measured duration, named after the innermost range around it
    (`gpu_user_annotation` on its stream) or else its kernel;
  * copies keep their bytes and direction; memsets run their measured duration;
  * collectives and P2P come from the NCCL kernels' args (kind, size, dtype, group
    ranks; a rooted one's root from `record_param_comms`) or gloo's ranges, each waited
    on its stream (async: the host goes on); an uneven all_to_all is a batch of sends and
    receives where the trace gives its splits, else its group's mean, noted;
  * a cross-stream dependency (an op starting within `tolerance_us` of another
    stream's op ending, after its own stream went idle) becomes `record` / `wait`;
  * host gaps (`host gap[k] ...`, the schedule's host waiting before it issues an op):
    where the trace has the op's launch call (`cuda_runtime`, by correlation id), the
    host's own time between the end of the previous launch call and the start of this
    one, less the time it spent blocked in a synchronize (which becomes `synchronize`);
    the launch call itself is left out, as the machine's `kernel_launch_us` /
    `comm_launch_us` model it (a call longer than `LAUNCH_CALL_US` keeps the rest). The
    ops are issued in their launch order. Where an op has no launch call (CPU traces,
    older profilers), any other idle time of its stream before it is the host not
    having launched it yet, and the host waits as long. The host's time after its last
    launch to its step range's end is the last gap.
Simulated on a machine like the traced one, the schedule's makespan is the trace's step
time give or take the machine's model of communication (docs/interop.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from commdsl.interop.kineto_read import (IMPORTED_HOST_GAP, ROOTED, KinetoJob, Place, RankTrace, TraceComm, TraceError, TraceRange,
                                         host_memory_of, kernel_op_names, memcpy_kind, op_identifier)  # fmt: skip
from commdsl.ir import CopyDir, Dtype, HostMemory, OpKind

DEFAULT_TOLERANCE_US = 20.0
"""An op that starts within this long of another stream's op ending, after its own
stream went idle, waited for it (a dependency); a later start is a host gap."""

MIN_GAP_US = 1.0
"""Host time between launch calls shorter than this is carried on to the next gap, so
that a gap line is not written before nearly every op (the total is kept)."""

LAUNCH_CALL_US = 10.0
"""A launch call's usual length (cudaLaunchKernel, cudaMemcpyAsync: a few microseconds):
a call that held the host longer keeps the rest as the host's time before the launch;
the machine's `kernel_launch_us` stands for the call itself."""

@dataclass
class _Work:
    """One device-side op of a rank, in its stream."""

    stream: str
    start_us: float
    end_us: float
    name: str
    statement: str
    """The op statement without its name and stream (`compute {name} 35.2us`)."""
    waits_on: list[int] = field(default_factory=list)
    """Indices (in the rank's list) of ops on other streams this one waited for."""
    p2p: bool = False
    blocks_host: bool = False
    """A copy with pageable host memory: the host is held until it ends."""
    batch: list[_Work] = field(default_factory=list)
    """P2P ops that ran at once with this one on its stream (batch_isend_irecv): one unit."""
    launch: tuple[float, float] | None = None
    """The host's launch call (start, end) where the trace has it (a batch: its first
    call's start to its last call's end)."""

    def issue_key(self) -> tuple[float, float]:
        """Where the op comes in the host's order: its launch call, else its start."""
        return (self.launch[0] if self.launch else self.start_us, self.start_us)


def _stream(track: str) -> str:
    kind, _, ident = track.partition(" ")
    return ("s" if kind == "stream" else "t") + re.sub(r"[^A-Za-z0-9_]", "_", ident)


def _size(n: int) -> str:
    return f"{n}B"


def _us(x: float) -> str:
    return f"{max(x, 0.0):.3f}us"


def _comm_statement(c: TraceComm, rank: int, trace: RankTrace, world: int, group_name: str, even_bytes: dict[tuple[int, float], int],
                    notes: list[str]) -> str:  # fmt: skip
    if len(c.kinds) != 1:
        raise TraceError(f"{trace.path}: {c.name} at {c.start_us - trace.step_start_us:.1f} us into the step has no args "
                         "saying whether it sends or receives (a profiler before torch 2.2 records none)",
                         hint="profile with torch >= 2.2, whose NCCL kernels carry 'Collective name'")  # fmt: skip
    kind = next(iter(c.kinds))
    if c.in_bytes is None:
        raise TraceError(f"{trace.path}: {c.name} at {c.start_us - trace.step_start_us:.1f} us into the step gives no size",
                         hint="profile with torch >= 2.2 (its NCCL kernels carry 'In msg nelems') or with record_shapes=True "
                              "(the nccl:<collective> range around the launch carries its input's dims)")  # fmt: skip
    size = len(c.group) if c.group else world
    if kind in (OpKind.ALL_GATHER, OpKind.GATHER):
        total = c.in_bytes * size  # commdsl's size: the gathered output
    else:
        total = c.in_bytes
    dtype = f" dtype={c.dtype.value}" if c.dtype is not None and total % c.dtype.itemsize == 0 else " dtype=uint8"
    if kind in (OpKind.SEND, OpKind.RECV):
        members = c.group or tuple(range(world))
        others = [c.peer] if c.peer is not None else [r for r in members if r != rank]
        if c.peer is not None and (c.peer == rank or c.peer not in members):
            raise TraceError(f"{trace.path}: {c.name} at {c.start_us - trace.step_start_us:.1f} us into the step names rank "
                             f"{c.peer} as its peer, which is {'itself' if c.peer == rank else f'not in its group {list(members)}'}")  # fmt: skip
        if len(others) != 1:
            raise TraceError(f"{trace.path}: {c.name} at {c.start_us - trace.step_start_us:.1f} us into the step: the trace names "
                             f"no peer, and its group has {len(members)} ranks")  # fmt: skip
        verb = "isend" if kind is OpKind.SEND else "irecv"
        where = "to" if kind is OpKind.SEND else "from"
        return f"{verb} {{name}} {_size(total)} {where} {others[0]} group={group_name}{dtype}"
    if kind is OpKind.BARRIER:
        return f"barrier group={group_name}"
    if kind in ROOTED:
        members = c.group or tuple(range(world))
        if c.root is None or c.root >= len(members):
            raise TraceError(f"{trace.path}: {c.name} at {c.start_us - trace.step_start_us:.1f} us into the step: the trace does not "
                             f"name the {kind.value}'s root" + ("" if c.root is None else f" (its rank {c.root} is not in its group {list(members)})"),
                             hint="profile with the CPU activity (ProfilerActivity.CPU): the record_param_comms op around the "
                                  "launch names the root")  # fmt: skip
        where = "src" if kind in (OpKind.BROADCAST, OpKind.SCATTER) else "dst"
        return f"{kind.value} {{name}} {_size(total)} {where}={members[c.root]} group={group_name}{dtype}"
    if kind is OpKind.ALL_TO_ALL and (rank, c.start_us) in even_bytes:
        # An uneven all_to_all_single whose splits the trace does not give: the even
        # all_to_all of its group's mean input, said in the schedule's header.
        notes.append(f"{c.name} at {c.start_us - trace.step_start_us:.1f} us into rank {rank}'s step: an all_to_all of {total} B "
                     f"that does not split evenly over {size} ranks, and the trace gives no split sizes: replayed as an even one "
                     f"of {even_bytes[rank, c.start_us]} B, its group's mean")  # fmt: skip
        total = even_bytes[rank, c.start_us]
    return f"{kind.value} {{name}} {_size(total)} group={group_name}{dtype}"


def _even_all_to_alls(job: KinetoJob) -> dict[tuple[int, float], int]:
    """The bytes an uneven all_to_all without split sizes is replayed with, by (rank, its
    start): the k-th such op of a group on every member gets the members' mean input,
    whole chunks, so that the group's ranks issue the same collective."""
    by_group: dict[tuple[tuple[int, ...] | None, int], list[tuple[int, TraceComm]]] = {}
    for rank, trace in job.ranks.items():
        seen: dict[tuple[int, ...] | None, int] = {}
        for c in sorted(trace.comms, key=lambda c: (c.start_us, c.end_us)):
            if c.kinds == {OpKind.ALL_TO_ALL} and c.splits is None and c.in_bytes is not None:
                k = seen[c.group] = seen.get(c.group, -1) + 1
                by_group.setdefault((c.group, k), []).append((rank, c))
    out = {}
    for (group, _), ops in by_group.items():
        chunk = len(group or range(job.world_size)) * max(c.dtype.itemsize if c.dtype else 1 for _, c in ops)
        if any(c.in_bytes % chunk for _, c in ops) or len({c.in_bytes for _, c in ops}) > 1:
            mean = sum(c.in_bytes for _, c in ops) // len(ops)
            out.update({(rank, c.start_us): max(mean - mean % chunk, chunk) for rank, c in ops})
    return out


def _uneven_all_to_all(c: TraceComm, rank: int, stream: str, members: tuple[int, ...], group_name: str) -> _Work | None:
    """An all_to_all with the split sizes the trace gives (`TraceComm.splits`) as NCCL runs
    it: one batch of a send to and a receive from each other member (its own split is a
    local copy); None where the splits do not list every member."""
    sends, recvs = c.splits or ((), ())
    if not len(sends) == len(recvs) == len(members):
        return None
    dtype = f" dtype={c.dtype.value}" if c.dtype is not None else ""
    parts = [_Work(stream, c.start_us, c.end_us, "all_to_all", f"{verb} {{name}} {_size(n)} {where} {m} group={group_name}{dtype}",
                   p2p=True, launch=c.launch)
             for verb, where, split in (("isend", "to", sends), ("irecv", "from", recvs))
             for m, n in zip(members, split) if m != rank and n > 0]  # fmt: skip
    if not parts:
        return None
    parts[0].batch = parts[1:]
    return parts[0]


def _copy(c: TraceRange) -> _Work:
    """A copy from the name CUPTI gave it: its direction and host memory (`from host
    memory=pageable`); a copy between devices, or a name of another shape, is a
    device-memory copy."""
    words, pageable = "", False
    kind = memcpy_kind(c.name)
    if kind is not None and kind[0] in (CopyDir.H2D, CopyDir.D2H):
        copy_dir, word = kind
        # Managed memory or a CUDA array (no such buffer in the language) is written as
        # pinned, the copy engines' own case; docs/interop.md says so.
        pageable = host_memory_of(word) is HostMemory.PAGEABLE
        words = (" from host" if copy_dir is CopyDir.H2D else " to host") + (" memory=pageable" if pageable else "")
    # A copy of bytes that are not whole fp32 elements (a bool or int8 `.item()`, an odd slice) is one of bytes.
    dtype = "" if c.size_bytes % Dtype.FP32.itemsize == 0 else " dtype=uint8"
    return _Work(_stream(c.track), c.start_us, c.end_us, "copy", f"copy {{name}} {_size(c.size_bytes)}{words}{dtype}", blocks_host=pageable,
                 launch=c.launch)  # fmt: skip


def _device_work(trace: RankTrace, world: int, groups: dict[tuple[int, ...], str], even_bytes: dict[tuple[int, float], int],
                 notes: list[str]) -> list[_Work]:  # fmt: skip
    out: list[_Work] = []
    gpu = bool(trace.kernels or trace.copies or any(c.place is Place.DEVICE for c in trace.comms))
    if gpu:
        for k, label in zip(trace.kernels, kernel_op_names(trace)):
            out.append(_Work(_stream(k.track), k.start_us, k.end_us, label, f"compute {{name}} {_us(k.duration_us)}", launch=k.launch))
        for c in trace.copies:
            out.append(_copy(c))
    else:
        host = [r for r in trace.ranges if r.place is Place.HOST]
        for r in host:
            wraps_comm = any(c.track == r.track and r.start_us <= c.start_us and c.end_us <= r.end_us for c in trace.comms)
            inside = any(o is not r and o.track == r.track and o.start_us <= r.start_us and r.end_us <= o.end_us
                         and (o.start_us, -o.end_us) != (r.start_us, -r.end_us) for o in host)  # fmt: skip
            if not wraps_comm and not inside:
                out.append(_Work(_stream(r.track), r.start_us, r.end_us, op_identifier(r.name), f"compute {{name}} {_us(r.duration_us)}"))
    batch_end: dict[str, tuple[_Work, float]] = {}
    for c in sorted(trace.comms, key=lambda c: (c.start_us, c.end_us)):
        group = groups[c.group] if c.group and c.group in groups else "world"
        if c.splits is not None:
            uneven = _uneven_all_to_all(c, trace.rank, _stream(c.track), c.group or tuple(range(world)), group)
            if uneven is not None:
                out.append(uneven)
                batch_end.pop(uneven.stream, None)  # a unit of its own: later sends do not join it
                continue
        w = _Work(_stream(c.track), c.start_us, c.end_us, op_identifier(f"{next(iter(c.kinds)).value}" if len(c.kinds) == 1 else "p2p"),
                  _comm_statement(c, trace.rank, trace, world, group, even_bytes, notes), p2p=c.kinds <= {OpKind.SEND, OpKind.RECV},
                  launch=c.launch)  # fmt: skip
        lead = batch_end.get(w.stream)
        if w.p2p and lead is not None and w.start_us < lead[1]:  # it began before the last P2P on its stream ended
            lead[0].batch.append(w)
            if lead[0].launch and w.launch:
                lead[0].launch = (min(lead[0].launch[0], w.launch[0]), max(lead[0].launch[1], w.launch[1]))
            batch_end[w.stream] = (lead[0], max(lead[1], w.end_us))
            continue
        if w.p2p:
            batch_end[w.stream] = (w, w.end_us)
        else:
            batch_end.pop(w.stream, None)
        out.append(w)
    out.sort(key=lambda w: (w.start_us, w.end_us))
    return out


def _dependencies(work: list[_Work], t0: float, tolerance_us: float) -> None:
    """Mark the cross-stream waits the trace shows (see the module docstring); a stream
    is idle from `t0` until its first op."""
    last_end: dict[str, float] = {}
    for i, w in enumerate(work):
        idle_from = last_end.get(w.stream, t0)
        if w.start_us - idle_from > tolerance_us:
            ended = [j for j in range(i) if work[j].stream != w.stream and w.start_us - tolerance_us <= work[j].end_us <= w.start_us]
            if ended:
                w.waits_on.append(max(ended, key=lambda j: work[j].end_us))
        last_end[w.stream] = max(last_end.get(w.stream, t0), w.end_us)


def _issue_order(work: list[_Work]) -> list[int]:
    """The ops' indices in the order the host issues them: by launch call (`issue_key`),
    an op held back until the op before it on its stream and the ops it waits for are
    issued (a launch order that disagrees with the device's, e.g. across host threads)."""
    before: dict[int, list[int]] = {}
    last_on: dict[str, int] = {}
    for i, w in enumerate(work):
        before[i] = [*w.waits_on, *([last_on[w.stream]] if w.stream in last_on else [])]
        last_on[w.stream] = i
    issued: set[int] = set()
    order: list[int] = []
    held: list[int] = []
    for i in sorted(range(len(work)), key=lambda i: work[i].issue_key()):
        held.append(i)
        ready = next((j for j in held if all(d in issued for d in before[j])), None)
        while ready is not None:
            held.remove(ready)
            order.append(ready)
            issued.add(ready)
            ready = next((j for j in held if all(d in issued for d in before[j])), None)
    return order + held


def _waited_stream(block: TraceRange, work: list[_Work]) -> str | None:
    """The stream a blocking call waited for: that of the device op that ended last
    while the call held the host; None if none ended then (the call did not wait)."""
    ended = [w for w in work if block.start_us < w.end_us <= block.end_us]
    return max(ended, key=lambda w: w.end_us).stream if ended else None


def _rank_program(trace: RankTrace, work: list[_Work], t0: float, tolerance_us: float) -> tuple[list[str], int]:
    """The rank's statements: ops in the host's issue order, with host gaps, synchronize,
    events and waits; and how many ops got their host gap from a launch call."""
    lines: list[str] = []
    counts: dict[str, int] = {}
    recorded = {j for w in work for j in w.waits_on}
    last_end: dict[str, float] = {}
    host_us = 0.0  # where the replay's host is on the trace's clock (from t0)
    owed_us = 0.0  # host time between launch calls not yet written as a gap (under MIN_GAP_US)
    gaps = 0
    from_launch = 0

    def gap(until_us: float, last: bool = False) -> None:
        """The replay's host waits until `until_us`; a gap is written once `MIN_GAP_US` is owed (the last: whatever is)."""
        nonlocal gaps, host_us, owed_us
        owed_us += max(until_us - host_us, 0.0)
        host_us = max(host_us, until_us)
        if owed_us >= MIN_GAP_US or last and owed_us > 0.0:
            lines.append(f"host {IMPORTED_HOST_GAP}[{gaps}] {_us(owed_us)}")
            gaps += 1
            owed_us = 0.0

    blocks = [(b, _waited_stream(b, work)) for b in trace.host_blocks]
    blocks = [(b, s) for b, s in blocks if s is not None]  # a call that returned at once is the host's own time

    def synchronize_until(at_us: float) -> None:
        """Write the blocking calls that began by `at_us` (trace clock)."""
        nonlocal host_us
        while blocks and blocks[0][0].start_us <= at_us:
            block, stream = blocks.pop(0)
            gap(block.start_us - t0)
            lines.append("synchronize" if block.name == "cudaDeviceSynchronize" else f"synchronize {stream}")
            host_us = max(host_us, block.end_us - t0)

    for i in _issue_order(work):
        w = work[i]
        synchronize_until(w.issue_key()[0])
        at = w.start_us - t0
        idle_from = last_end.get(w.stream, 0.0)
        # Launched, yet started late on an idle stream with nothing to wait for: the
        # stream was busy with work the step does not hold (the step before's), so the
        # op keeps its start, as without a launch call.
        late = at - idle_from > tolerance_us and not w.waits_on and w.launch is not None and w.start_us - w.launch[1] > tolerance_us
        if w.launch is not None and not late:
            # The call is the machine's launch cost; a call that held the host longer (a
            # module loaded on first use, a full launch queue) keeps the rest as host time.
            gap(max(w.launch[0], w.launch[1] - LAUNCH_CALL_US) - t0)
            host_us = max(host_us, w.launch[1] - t0)
            from_launch += 1
        else:
            explained = at - idle_from <= tolerance_us or bool(w.waits_on)
            # The replay's host moves only by its gaps: ops it issues early wait on their streams.
            if not explained and at - host_us > tolerance_us:
                gap(at)
        for j in w.waits_on:
            lines.append(f"wait ev[{j}] on {w.stream}")
        stmts = []
        for member in (w, *w.batch):
            k = counts[member.name] = counts.get(member.name, -1) + 1
            stmts.append(member.statement.format(name=f"{member.name}[{k}]"))
        if w.batch or (w.p2p and len(stmts) == 1):
            lines.append(f"on {w.stream}:")
            lines.append(f"    c[{i}] = batch:" if w.batch else f"    c[{i}] = {stmts[0]}")
            lines += [f"        {x}" for x in stmts] if w.batch else []
            lines.append(f"    wait c[{i}]")
        elif stmts[0].startswith(("compute", "copy", "barrier")):
            lines.append(f"{stmts[0]} on {w.stream}")
        else:
            lines.append(f"c[{i}] = {stmts[0]} on {w.stream}")
            lines.append(f"wait c[{i}] on {w.stream}")
        if w.blocks_host:  # the replay's host, as the traced one, goes on when the copy ends
            host_us = max(host_us, w.end_us - t0)
        if i in recorded:
            lines.append(f"record ev[{i}] on {w.stream}")
        last_end[w.stream] = max(idle_from, max(m.end_us for m in (w, *w.batch)) - t0)
    # The host's work after its last launch, to the end of its step's range: the step's
    # time holds it (an optimizer's host side, a CUDA graph's replay, logging).
    synchronize_until(math.inf)
    if trace.host_end_us is not None:
        gap(trace.host_end_us - t0, last=True)
    return lines, from_launch


def schedule_text(job: KinetoJob, name: str, tolerance_us: float = DEFAULT_TOLERANCE_US, notes: list[str] | None = None) -> str:
    """The schedule (YAML text) that replays `job`'s step (see the module docstring).
    What the replay takes other than the trace has it is appended to `notes` (and said in
    the schedule's header)."""
    notes = [] if notes is None else notes
    job.require_every_rank("a replay")
    world = job.world_size
    group_ranks = sorted({c.group for t in job.ranks.values() for c in t.comms if c.group and len(c.group) < world})
    groups = {g: f"g{i}" for i, g in enumerate(group_ranks)}
    t0 = min(t.step_start_us for t in job.ranks.values())
    bodies, streams = [], set()
    ops = from_launch = 0
    even_bytes = _even_all_to_alls(job)
    for rank, trace in sorted(job.ranks.items()):
        work = _device_work(trace, world, groups, even_bytes, notes)
        _dependencies(work, t0, tolerance_us)
        streams |= {w.stream for w in work}
        lines, launched = _rank_program(trace, work, t0, tolerance_us)
        bodies.append((rank, lines))
        ops, from_launch = ops + len(work), from_launch + launched
    step = next(iter(job.ranks.values())).step or "the whole trace"
    unsized = sum(t.unsized_copies for t in job.ranks.values())
    if unsized:
        notes.append(f"{unsized} copies give no size in the traces (on the copy or its runtime call): written as 0 B")
    if not streams:
        raise TraceError(f"{job.folder}: {step} of the traces holds nothing to replay (no kernel, copy, communication "
                         "or range in it)", hint="profile the step with the activities it ran (ProfilerActivity.CPU, CUDA)")  # fmt: skip
    out = [f"name: {name}",
           f"# Replays {step} of the profiler traces in {job.folder}: per rank, its device-side work in stream",
           "# order with measured compute durations, copies and communication from the trace, cross-stream",
           "# waits, and host gaps (commdsl import kineto; docs/interop.md): the gaps before",
           f"# {from_launch} of {ops} ops are the host's time between launch calls, the rest its streams' idle time.",
           *[f"# Note: {note}." for note in notes],
           f"world: {world}",
           f"streams: [{', '.join(sorted(streams))}]"]  # fmt: skip
    if groups:
        out.append("groups:")
        out += [f"  {n}: [{', '.join(map(str, g))}]" for g, n in groups.items()]
    out.append("program: |")
    for rank, lines in bodies:
        out.append(f"  {'if' if rank == 0 else 'elif'} rank == {rank}:")
        out += [f"      {line}" for line in lines] or ["      pass"]
    return "\n".join(out) + "\n"
