"""PyTorch profiler (Kineto) traces of a timeline: one JSON per rank, as
`torch.profiler` with `tensorboard_trace_handler` writes them, so that Holistic Trace
Analysis (HTA), Perfetto and other tools built on the profiler's format read a
predicted or a measured commdsl timeline like a real job's traces.

Each rank's file holds:

  * `distributedInfo`: backend, rank, world size, and every process group with its
    ranks (`pg_config`, named by the schedule's group ids);
  * `deviceProperties`: the rank's device (name, memory, SM count where known);
  * on the host thread (pid: a process per rank, tid: its main thread): a
    `user_annotation` per op issued, named as the schedule names it (`F[3]`), holding
    the CUDA runtime call (`cuda_runtime`: `cudaLaunchKernel`, `cudaMemcpyAsync`,
    `cudaEventRecord`, `cudaStreamWaitEvent`, `cudaStreamSynchronize`) and, for
    communication, the `record_param_comms` CPU op with the collective's args;
  * on the device (pid: the rank's local device index, tid: a stream id): a `kernel`
    per compute op and per communication op, a `gpu_memcpy` per copy, each with a
    `gpu_user_annotation` of the op's name over it; NCCL kernels are named as NCCL
    2.19+ names them (`ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned
    long, ncclWork*)`) and carry the args the profiler gives them (`Collective name`,
    `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Name`,
    `Process Group Ranks`);
  * `correlation` ids linking each runtime call to its kernel, and the profiler's
    `ac2g` flow events (launch to kernel).

Streams are numbered as CUPTI numbers them in a typical PyTorch trace: the schedule's
first stream is 7 (the default stream), the others and each process group's NCCL
stream (the timeline's `comm:<group>` tracks: PyTorch runs a group's collectives on a
stream of its own) follow from 13. Times are the timeline's, in microseconds with
nanosecond decimals.

On gloo a communication op runs no device kernel; its span is written as the NCCL
kernel the op would launch, without the algorithm and protocol NCCL picks at run time
(`ncclDevKernel_AllReduce_Sum_f32_LL`), so that tools which find communication kernels
by name see it as one; `distributedInfo.backend` says gloo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from commdsl.errors import UsageError
from commdsl.files import check_output_folder, output_file
from commdsl.interop.kineto_read import TRACE_FILE, memcpy_name
from commdsl.ir import HOST_STREAM, CopyDir, Op, OpKind, Program, Transport
from commdsl.machine.model import DeviceKind
from commdsl.timeline import Span, SpanRole, Timeline, comm_span_args, nccl_kernel_name

if TYPE_CHECKING:
    from commdsl.machine.model import Machine

SCHEMA_VERSION = 1
"""The profiler's `schemaVersion`."""

DEFAULT_STREAM_ID = 7
"""CUPTI's id of the legacy default stream, the stream most PyTorch kernels run on."""

FIRST_SIDE_STREAM_ID = 13
"""The id the first stream PyTorch creates usually gets in a trace."""

NCCL_KERNEL_SIGNATURE = "(ncclDevComm*, unsigned long, ncclWork*)"
"""The parameter list CUPTI appends to every NCCL device kernel's name."""

HOST_PID_BASE = 100_000
"""A rank's host process id is this plus the rank (a trace needs a pid; the run's own are
not kept)."""

LAUNCH_CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaEventRecord": 135,
               "cudaStreamWaitEvent": 147, "cudaStreamSynchronize": 131}  # fmt: skip
"""CUPTI's callback id of each runtime call written (`cbid` in the profiler's args)."""

_TORCH_DTYPE = {"fp32": "Float", "fp16": "Half", "bf16": "BFloat16", "fp64": "Double", "int8": "Char", "uint8": "Byte",
                "int32": "Int", "int64": "Long", "int16": "Short", "bool": "Bool", "fp8": "Float8_e4m3fn"}  # fmt: skip
"""commdsl dtype -> the name `record_param_comms` gives it (c10's ScalarType)."""



@dataclass(frozen=True)
class TraceDevice:
    """The device each rank's trace names (`deviceProperties`)."""

    name: str
    """Device name, e.g. "H100 SXM5 80GB", or "cpu"."""
    per_node: int
    """Devices per node: rank r runs on local device r % per_node."""
    memory_bytes: int | None = None
    sm_count: int | None = None


def machine_device(machine: Machine) -> tuple[str, TraceDevice]:
    """The backend and device a predicted trace names: NCCL on a GPU machine's devices,
    gloo on a CPU machine's."""
    spec = machine.device
    per_node = machine.topology.gpus_per_node if machine.topology is not None else max(machine.num_devices, 1)
    backend = "nccl" if spec.kind is DeviceKind.GPU else "gloo"
    return backend, TraceDevice(spec.name, per_node, spec.memory_bytes, spec.sm_count if spec.kind is DeviceKind.GPU else None)


def torch_device(device_type: str, world_size: int) -> TraceDevice:
    """The device a measured trace names: the CUDA device's name, memory and SMs as torch
    reports them (device_type "cuda", all ranks' devices alike; a node's devices are the
    ones torch sees), or "cpu" (every rank on one node)."""
    if device_type != "cuda":
        return TraceDevice("cpu", world_size)
    import torch

    props = torch.cuda.get_device_properties(0)
    return TraceDevice(props.name, max(torch.cuda.device_count(), 1), props.total_memory, props.multi_processor_count)


def runtime_call(kind: OpKind) -> str | None:
    """The CUDA runtime call that issues an op of `kind`; None for host work and for the
    caching allocator's alloc/free, which call nothing."""
    if kind is OpKind.COMPUTE or kind.is_comm:
        return "cudaLaunchKernel"
    return {OpKind.COPY: "cudaMemcpyAsync", OpKind.RECORD: "cudaEventRecord", OpKind.WAIT_EVENT: "cudaStreamWaitEvent",
            OpKind.WAIT: "cudaStreamWaitEvent", OpKind.SYNCHRONIZE: "cudaStreamSynchronize"}.get(kind)  # fmt: skip


def stream_ids(timeline: Timeline, program: Program) -> dict[str, int]:
    """Device track -> Kineto stream id: the first declared stream is the default stream
    (7), the other tracks follow from 13 in the timeline's track order."""
    tracks = [t for names in timeline.order_tracks(program.streams).values() for t in names if t != HOST_STREAM]
    ordered = list(dict.fromkeys([s for s in program.streams if s != HOST_STREAM] + tracks))
    return {t: DEFAULT_STREAM_ID if i == 0 else FIRST_SIDE_STREAM_ID + i - 1 for i, t in enumerate(ordered)}


def write_kineto_traces(timeline: Timeline, program: Program, folder: str | Path, *, backend: str, device: TraceDevice,
                        flag: str = "--trace-dir", progress: Callable[[int, int], None] | None = None) -> list[Path]:  # fmt: skip
    """Write `timeline` (predicted or measured, of `program`) into `folder` (made if
    missing) as one Kineto trace per rank, `rank-<r>.pt.trace.json`; return the paths.
    `flag` names the folder in a usage error; `progress` hears (ranks written, ranks)."""
    check_output_folder(flag, str(folder))
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot make {flag} {folder}: {e.strerror or e}") from None
    streams = stream_ids(timeline, program)
    by_rank: dict[int, list[Span]] = {r: [] for r in range(timeline.world_size)}
    for s in timeline.spans:
        by_rank.setdefault(s.rank, []).append(s)
    paths = []
    for rank in range(timeline.world_size):
        path = out / TRACE_FILE.format(rank=rank)
        doc = rank_trace(rank, by_rank[rank], program, streams, backend=backend, device=device, source=timeline.source)
        with output_file(path, flag) as f:
            write_document(doc, f)
        paths.append(path)
        if progress is not None:
            progress(rank + 1, timeline.world_size)
    return paths


def write_document(doc: dict, out: TextIO) -> None:
    """Write a trace document laid out as the profiler lays it out: one top-level key per
    line, one event per line, `": "` after keys (HTA finds a file's rank by matching
    `"rank": N` line by line)."""
    out.write("{")
    for i, (key, value) in enumerate(doc.items()):
        out.write(f'{"," if i else ""}\n  {json.dumps(key)}: ')
        if key == "traceEvents":
            out.write("[")
            out.write(",".join(f"\n  {json.dumps(e)}" for e in value))
            out.write("\n  ]")
        else:
            out.write(json.dumps(value))
    out.write("\n}\n")


def rank_trace(rank: int, spans: list[Span], program: Program, streams: dict[str, int], *, backend: str,
               device: TraceDevice, source: str) -> dict:  # fmt: skip
    """One rank's trace as the profiler's JSON document; `source` is the timeline's
    ("predicted": each comm op ran on the transport it declares; "measured": on the
    run's backend)."""
    run_on = Transport(backend)

    def transport_of(op: Op) -> Transport:
        return (op.transport or run_on) if source == "predicted" else run_on

    local = rank % device.per_node
    properties = {"id": local, "name": device.name}
    if device.memory_bytes is not None:
        properties["totalGlobalMem"] = device.memory_bytes
    if device.sm_count is not None:
        properties["numSms"] = device.sm_count
    return {
        "schemaVersion": SCHEMA_VERSION,
        "deviceProperties": [properties],
        "distributedInfo": {
            "backend": backend, "rank": rank, "world_size": program.world_size, "pg_count": len(program.groups),
            "pg_config": [{"pg_name": g.id, "pg_desc": g.family, "backend_config": backend, "pg_size": len(g.ranks),
                           "ranks": list(g.ranks)} for g in program.groups],
        },  # fmt: skip
        "traceEvents": list(_events(rank, local, spans, program, streams, transport_of)),
        "displayTimeUnit": "ms",
        "traceName": f"commdsl {program.name} rank {rank}",
    }


def _events(rank: int, device: int, spans: list[Span], program: Program, streams: dict[str, int],
            transport_of: Callable[[Op], Transport]) -> Iterator[dict]:  # fmt: skip
    pid, tid = HOST_PID_BASE + rank, HOST_PID_BASE + rank
    ops = program.ops[rank]
    issue = {s.op_id: s for s in spans if s.role is SpanRole.ISSUE and s.track == HOST_STREAM}
    device_spans = sorted((s for s in spans if s.role is SpanRole.EXEC and s.track != HOST_STREAM), key=lambda s: (s.start_us, s.op_id))
    used_streams = sorted({streams[s.track] for s in device_spans})
    yield {"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": f"commdsl rank {rank}"}}
    yield {"name": "process_labels", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"labels": "CPU"}}
    yield {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": "thread 1 (python)"}}
    yield {"name": "process_name", "ph": "M", "ts": 0, "pid": device, "tid": 0, "args": {"name": "python"}}
    yield {"name": "process_labels", "ph": "M", "ts": 0, "pid": device, "tid": 0, "args": {"labels": f"GPU {device}"}}
    for sid in used_streams:
        yield {"name": "thread_name", "ph": "M", "ts": 0, "pid": device, "tid": sid, "args": {"name": f"stream {sid} "}}
    if spans:
        # One profiler step over the whole timeline: HTA's critical path analyses a step.
        first, last = min(s.start_us for s in spans), max(s.end_us for s in spans)
        yield _complete("user_annotation", "ProfilerStep#0", pid, tid, first, last, {"External id": 0})
    correlation_of: dict[str, int] = {}
    for n, s in enumerate(sorted(issue.values(), key=lambda s: (s.start_us, s.op_id)), start=1):
        op = ops[_index(s.op_id)]
        call = runtime_call(op.kind)
        yield _complete("user_annotation", op.name, pid, tid, s.start_us, s.end_us, {"External id": n})
        if op.kind.is_comm:
            yield _complete("cpu_op", "record_param_comms", pid, tid, s.start_us, s.end_us,
                            {"External id": n, **_comm_args(op, program)})  # fmt: skip
        if call is not None:
            correlation_of[s.op_id] = n
            yield _complete("cuda_runtime", call, pid, tid, s.start_us, s.end_us, {"External id": n, "cbid": LAUNCH_CBID[call], "correlation": n})
    for s in device_spans:
        op = ops[_index(s.op_id)]
        if not (op.kind is OpKind.COMPUTE or op.kind is OpKind.COPY or op.kind.is_comm) or s.end_us <= s.start_us:
            continue  # records, waits, allocs: no device work
        sid = streams[s.track]
        n = correlation_of.get(s.op_id, 0)
        args: dict[str, object] = {"External id": n, "queued": 0, "device": device, "context": 1, "stream": sid, "correlation": n}
        transport = transport_of(op) if op.kind.is_comm else None
        if op.kind is OpKind.COPY or transport is Transport.MEMCPY:  # a send/recv over memcpy is a peer copy
            cat, name = "gpu_memcpy", memcpy_name(op.copy_dir or (CopyDir.PEER if transport else CopyDir.D2D), op.host_memory)
            args["bytes"] = op.size_bytes
            args["memory bandwidth (GB/s)"] = op.size_bytes / ((s.end_us - s.start_us) * 1e3)
        elif op.kind.is_comm:
            cat, name = "kernel", _nccl_kernel(op, s, transport) + NCCL_KERNEL_SIGNATURE
            args.update(_comm_args(op, program))
        else:
            cat, name = "kernel", op.name
        yield _complete(cat, name, device, sid, s.start_us, s.end_us, args)
        yield _complete("gpu_user_annotation", op.name, device, sid, s.start_us, s.end_us, {"External id": n})
        if n:
            launch = issue[s.op_id]
            yield {"ph": "s", "id": n, "pid": pid, "tid": tid, "ts": _ts(launch.start_us), "cat": "ac2g", "name": "ac2g"}
            yield {"ph": "f", "id": n, "pid": device, "tid": sid, "ts": _ts(s.start_us), "cat": "ac2g", "name": "ac2g", "bp": "e"}


def _complete(cat: str, name: str, pid: int, tid: int, start_us: float, end_us: float, args: dict) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": _ts(start_us), "dur": _ts(end_us - start_us), "args": args}


def _ts(us: float) -> float:
    """Microseconds with nanosecond decimals, as the profiler writes them."""
    return round(us, 3)


def _index(op_id: str) -> int:
    """The op's index on its rank, from its id "rank:index"."""
    return int(op_id.partition(":")[2])


def _nccl_kernel(op: Op, span: Span, transport: Transport) -> str:
    """The NCCL kernel's name: the span's where NCCL ran the op (the simulator and the
    executor name those spans as the profiler names the kernel), else the kernel the op
    would launch, without the algorithm and protocol NCCL picks at run time."""
    if transport is Transport.NCCL:
        return span.name
    return nccl_kernel_name(op, None, "").rstrip("_")


def _comm_args(op: Op, program: Program) -> dict[str, object]:
    """The args the profiler gives an NCCL kernel and `record_param_comms`."""
    group = program.group(op.group) if op.group is not None else None
    ranks = list(group.ranks) if group is not None else sorted({op.rank, op.peer if op.peer is not None else op.rank})
    args = dict(comm_span_args(op, len(ranks)))
    out: dict[str, object] = {
        "Collective name": args["Collective name"], "In msg nelems": args["In msg nelems"],
        "Out msg nelems": args["Out msg nelems"], "Group size": len(ranks), "dtype": _TORCH_DTYPE[op.dtype.value],
        "In split size": "[]", "Out split size": "[]",
        "Process Group Name": op.group if op.group is not None else "p2p",
        "Process Group Description": group.family if group is not None else "p2p",
        "Process Group Ranks": json.dumps(ranks), "Rank": op.rank,
    }  # fmt: skip
    if op.kind in (OpKind.SEND, OpKind.RECV) and op.peer is not None:
        # As torch's profiler gives a send or recv: `Rank` is the peer's rank in the
        # group, `Dst Rank` / `Src Rank` its global rank.
        out["Rank"] = ranks.index(op.peer)
        out["Dst Rank" if op.kind is OpKind.SEND else "Src Rank"] = op.peer
    return out
