"""Reading PyTorch profiler (Kineto) traces: one JSON per rank, as `torch.profiler`'s
`export_chrome_trace` and `tensorboard_trace_handler` write them (`.json` or `.json.gz`).

A trace folder becomes a `KinetoJob`: per rank, one profiler step's
  * ranges: `user_annotation` (host `record_function`) and `gpu_user_annotation` (the
    same ranges projected by CUDA's profiler onto the streams that ran their kernels);
  * communication: NCCL kernels (their `Collective name`, `In msg nelems`, `dtype` and
    `Process Group Ranks` args, which PyTorch's profiler gives NCCL kernels since 2.2),
    and on CPU the `gloo:<collective>` ranges gloo's worker threads record (their
    `Input Dims` and `Input type`; gloo names no process group);
  * kernels (GPU compute) and copies (`gpu_memcpy`, with their bytes), each with the
    host's call that launched it (`cudaLaunchKernel`, `cudaMemcpyAsync`, ...: the
    `cuda_runtime` event of the same `correlation` id);
  * the host's blocking calls (`cudaStreamSynchronize`, ...: `BLOCKING_CALLS`).
Times are microseconds on the trace's clock. Device work is assigned to the step whose
host range launched it (its launch call), since a GPU runs it after the host moved on.

Formats read: Kineto `schemaVersion` 1 traces of torch 2.x's profiler (the traces that
HTA's test data holds, with and without `distributedInfo.pg_config`, NCCL 2.17 args;
torch 2.13's CPU traces with gloo ranges; ROCm's, whose copies may give their size on the
HIP call only), and torch 1.8 / 1.9's with their older event categories (`OLD_CATEGORIES`). Anything else (another tool's Chrome trace, a
commdsl timeline, a truncated or corrupt file) is a `TraceError` naming the file.
"""

from __future__ import annotations

import enum
import json
import math
import re
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from commdsl.dsl.values import format_bytes
from commdsl.errors import UsageError
from commdsl.ir import CopyDir, Dtype, HostMemory, OpKind
from commdsl.limits import MAX_TRACE_BYTES, MAX_WORLD_SIZE

STEP_RANGE = re.compile(r"ProfilerStep#(\d{1,18})")
"""The range `torch.profiler.profile.step` (and `commdsl run --profile`) puts around a step."""

TRACE_SUFFIXES = (".json", ".json.gz")
"""The files of a trace folder that are read; a rank's is known by its `distributedInfo.rank`,
not its name: `rank-0.pt.trace.json`, `rank0.pt.trace.json` (an older `run --profile`) and
`<worker>.<timestamp>.pt.trace.json[.gz]` (`tensorboard_trace_handler`) all read."""

TRACE_FILE = "rank-{rank}.pt.trace.json"
"""A rank's trace as commdsl writes it (`simulate --trace-dir`, `run --trace-dir`, `run
--profile`): HTA's examples and test data name per-rank traces `rank-<r>...`."""

TRACE_HEAD_BYTES = 1 << 16
"""How much of a file `is_trace_path` reads to find Kineto's leading `schemaVersion`."""

NCCL_COLLECTIVE: dict[str, OpKind] = {
    "allreduce": OpKind.ALL_REDUCE, "all_reduce": OpKind.ALL_REDUCE, "allreduce_coalesced": OpKind.ALL_REDUCE,
    "allgather": OpKind.ALL_GATHER, "all_gather": OpKind.ALL_GATHER, "_allgather_base": OpKind.ALL_GATHER,
    "all_gather_into_tensor": OpKind.ALL_GATHER, "allgather_into_tensor_coalesced": OpKind.ALL_GATHER,
    "reduce_scatter": OpKind.REDUCE_SCATTER, "_reduce_scatter_base": OpKind.REDUCE_SCATTER,
    "reduce_scatter_tensor": OpKind.REDUCE_SCATTER, "reduce_scatter_tensor_coalesced": OpKind.REDUCE_SCATTER,
    "broadcast": OpKind.BROADCAST, "reduce": OpKind.REDUCE, "gather": OpKind.GATHER, "scatter": OpKind.SCATTER,
    "all_to_all": OpKind.ALL_TO_ALL, "alltoall": OpKind.ALL_TO_ALL, "alltoall_base": OpKind.ALL_TO_ALL,
    "all_to_allv": OpKind.ALL_TO_ALL, "send": OpKind.SEND, "recv": OpKind.RECV, "barrier": OpKind.BARRIER,
}  # fmt: skip
"""`Collective name` of the profiler's NCCL kernel args (and of `record_param_comms`)."""

NCCL_KERNEL_COLLECTIVE: dict[str, OpKind | None] = {
    "AllReduce": OpKind.ALL_REDUCE, "AllGather": OpKind.ALL_GATHER, "ReduceScatter": OpKind.REDUCE_SCATTER,
    "Broadcast": OpKind.BROADCAST, "Reduce": OpKind.REDUCE, "SendRecv": None,
}  # fmt: skip
"""The collective in an NCCL kernel's name (`ncclKernel_AllReduce_RING_LL_Sum_float`,
`ncclDevKernel_SendRecv`), for traces whose kernels carry no args; None: a send or a recv
(one kernel runs both)."""

NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")

GLOO_RANGE = re.compile(r"gloo:([a-z_]+)")

NCCL_RANGE = re.compile(r"nccl:([a-z_]+)")
"""The host range ProcessGroupNCCL records around a collective's launch (`nccl:all_reduce`,
with `Input Dims` and `Input type` under `record_shapes`): what an NCCL kernel without
args (a profiler before torch 2.2) ran, and its size."""

_CUPTI_COPY = {CopyDir.H2D: "HtoD", CopyDir.D2H: "DtoH", CopyDir.D2D: "DtoD", CopyDir.PEER: "PtoP"}
"""Copy direction -> CUPTI's word for it in a copy's name."""
_CUPTI_MEMORY = {HostMemory.PINNED: "Pinned", HostMemory.PAGEABLE: "Pageable"}
"""Host memory -> CUPTI's word for it in a copy's name."""
_MEMCPY_NAME = re.compile(r"Memcpy (HtoD|DtoH|DtoD|PtoP) \((\w+) -> (\w+)\)")


def memcpy_name(copy_dir: CopyDir, host_memory: HostMemory | None) -> str:
    """The name CUPTI gives a copy: `Memcpy HtoD (Pinned -> Device)`."""
    host = _CUPTI_MEMORY[host_memory or HostMemory.PINNED]
    source, dest = {CopyDir.H2D: (host, "Device"), CopyDir.D2H: ("Device", host)}.get(copy_dir, ("Device", "Device"))
    return f"Memcpy {_CUPTI_COPY[copy_dir]} ({source} -> {dest})"


def memcpy_kind(name: str) -> tuple[CopyDir, str | None] | None:
    """A copy's direction and (host copies) CUPTI's word for its host memory, from the
    name CUPTI gives it; None for a name of another shape."""
    m = _MEMCPY_NAME.fullmatch(name)
    if m is None:
        return None
    copy_dir = next(d for d, word in _CUPTI_COPY.items() if word == m.group(1))
    host = m.group(2) if copy_dir is CopyDir.H2D else m.group(3) if copy_dir is CopyDir.D2H else None
    return copy_dir, host


def host_memory_of(word: str) -> HostMemory | None:
    """CUPTI's word for a copy's host memory as a `HostMemory`; None for another kind
    (managed memory, arrays)."""
    return next((m for m, w in _CUPTI_MEMORY.items() if w == word), None)

OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
"""The event categories of torch 1.8 / 1.9's profiler and the names later ones give them
(`ProfilerStep#N` and record_function ranges were `Operator` events then)."""

ROOTED = frozenset({OpKind.BROADCAST, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER})
"""Collectives with a root."""

BLOCKING_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
"""CUDA runtime calls that hold the host until device work ends: their host time is
waiting, not the framework's own."""

GLOO_RUNS_FOR: dict[OpKind, frozenset[OpKind]] = {OpKind.ALL_REDUCE: frozenset({OpKind.REDUCE_SCATTER})}
"""Collectives gloo runs as another one, by the range it records: torch 2.13's
ProcessGroupGloo runs `reduce_scatter_tensor` as an all_reduce of the whole input (its
range is `gloo:all_reduce` with the input's dims; seen in `commdsl run --profile` traces)."""

TORCH_TYPE_DTYPE = {
    "float": Dtype.FP32, "double": Dtype.FP64, "c10::Half": Dtype.FP16, "c10::BFloat16": Dtype.BF16,
    "long int": Dtype.INT64, "int": Dtype.INT32, "short int": Dtype.INT16, "signed char": Dtype.INT8,
    "unsigned char": Dtype.UINT8, "bool": Dtype.BOOL, "c10::Float8_e4m3fn": Dtype.FP8, "c10::Float8_e5m2": Dtype.FP8,
}  # fmt: skip
"""The dtype of the `Input type` names torch's profiler records (C++ type names)."""

NCCL_DTYPE = {
    "Float": Dtype.FP32, "Double": Dtype.FP64, "Half": Dtype.FP16, "BFloat16": Dtype.BF16, "Long": Dtype.INT64,
    "Int": Dtype.INT32, "Short": Dtype.INT16, "Char": Dtype.INT8, "Byte": Dtype.UINT8, "Bool": Dtype.BOOL,
    "Float8_e4m3fn": Dtype.FP8, "Float8_e5m2": Dtype.FP8,
}  # fmt: skip
"""The dtype of the `dtype` names of NCCL kernel args (torch's ScalarType names)."""


class TraceError(UsageError):
    """A file given as a profiler trace that is not one (exit code 2)."""

    kind = "trace error"


class Place(str, enum.Enum):
    HOST = "host"
    """A host thread (CPU work, and on CPU-only runs everything)."""
    DEVICE = "device"
    """A GPU stream."""


@dataclass(frozen=True)
class TraceRange:
    """A named range of one rank's step: a `record_function` range, a kernel or a copy."""

    name: str
    track: str
    """"thread <tid>" on the host, "stream <id>" on a GPU."""
    place: Place
    start_us: float
    end_us: float
    size_bytes: int = 0
    """A copy's bytes (0 for the rest)."""
    launch: tuple[float, float] | None = None
    """The start and end of the host's call that launched a kernel or copy (its
    `cuda_runtime` event); None where the trace has none (CPU ranges, older profilers)."""

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class TraceComm:
    """A communication op as the trace shows it: an NCCL kernel or a gloo range."""

    name: str
    kinds: frozenset[OpKind]
    """What it can be: one kind, or {send, recv} for an NCCL SendRecv kernel without args."""
    in_bytes: int | None
    """Bytes of its input (as `In msg nelems` x dtype, or gloo's `Input Dims`); None: unknown."""
    dtype: Dtype | None
    """Its elements' type where the trace names it."""
    group: tuple[int, ...] | None
    """Its process group's ranks where the trace names them."""
    track: str
    place: Place
    start_us: float
    end_us: float
    issued_us: float
    """When the host issued it: the launch (`cuda_runtime`, by correlation) of an NCCL
    kernel, the start of a gloo range (gloo's workers take a group's ops in issue order)."""
    runs_for: frozenset[OpKind] = frozenset()
    """Other collectives the backend runs as this one (`GLOO_RUNS_FOR`)."""
    launch: tuple[float, float] | None = None
    """The start and end of the host's call that launched an NCCL kernel; None for gloo
    ranges and kernels without a launch event."""
    peer: int | None = None
    """The other rank of a send or recv (a global rank), as the profiler's `Dst Rank` /
    `Src Rank` args name it; None where the trace does not."""
    splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """An all_to_all with uneven splits (`all_to_all_single` with split sizes): the bytes it
    sends to and receives from each member of its group, in group order, from the kernel's
    `In split size` / `Out split size` args (rows of its tensors); None for an even one or
    where the trace does not give them."""
    root: int | None = None
    """A broadcast's, reduce's, gather's or scatter's root as its rank in the op's group:
    the `Rank` arg of the `record_param_comms` op around its launch, which
    ProcessGroupNCCL records as `opts.rootRank` for rooted collectives; None where the
    trace has no such op (its CPU ops not recorded)."""

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class RankTrace:
    """One rank's trace, cut to one profiler step."""

    path: str
    rank: int
    world_size: int
    backend: str
    profiler: str
    """What wrote it, as the trace says (schema version, trace id)."""
    step: str
    """The step's range name (`ProfilerStep#7`), or "" for a trace without steps."""
    step_start_us: float
    step_end_us: float
    """The step's span: its host range, widened to the device work it launched."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Process group name -> ranks (`distributedInfo.pg_config`)."""
    ranges: list[TraceRange] = field(default_factory=list)
    comms: list[TraceComm] = field(default_factory=list)
    kernels: list[TraceRange] = field(default_factory=list)
    """GPU compute kernels (neither NCCL nor copies)."""
    copies: list[TraceRange] = field(default_factory=list)
    host_blocks: list[TraceRange] = field(default_factory=list)
    """The host's blocking calls (`BLOCKING_CALLS`) in the step."""
    host_end_us: float | None = None
    """Where the step's host range ends (its `ProfilerStep#N`); None for a trace without steps."""
    unsized_copies: int = 0
    """Copies whose bytes the trace does not give (neither on the copy nor on its runtime
    call); their size reads as 0."""

    @property
    def step_us(self) -> float:
        return self.step_end_us - self.step_start_us

    @property
    def holds_work(self) -> bool:
        """Whether the step holds anything to replay or compare (a kernel, copy, comm or range)."""
        return bool(self.kernels or self.copies or self.comms or self.ranges)


@dataclass
class KinetoJob:
    """Every rank's trace of a job, cut to the same profiler step."""

    folder: str
    ranks: dict[int, RankTrace]
    world_size: int

    @property
    def step_us(self) -> float:
        """The step's time: first start to last end over the ranks."""
        return max(r.step_end_us for r in self.ranks.values()) - min(r.step_start_us for r in self.ranks.values())

    def require_every_rank(self, purpose: str) -> None:
        """Refuse a job some rank's trace is missing from: `purpose` ("a replay", "a
        comparison") would take that rank for one that did no work."""
        _require_ranks(self.folder, set(self.ranks), self.world_size, purpose)


def _require_ranks(folder: str, present: set[int], world_size: int, purpose: str) -> None:
    """Refuse a folder of the traces of some ranks of a job only (see `KinetoJob.require_every_rank`)."""
    missing = sorted(set(range(world_size)) - present)
    if missing:
        raise TraceError(f"{folder} holds the traces of ranks {sorted(present)} of a job of {world_size} ranks; "
                         f"ranks {missing[:8]}{'...' if len(missing) > 8 else ''} are missing",
                         hint=f"{purpose} needs every rank's trace of the same step (one file per rank in the folder)")  # fmt: skip


IMPORTED_HOST_GAP = "gap"
"""The name `import kineto` gives the host's time between launch calls (`host gap[k]`)."""

MAX_OP_NAME = 40
"""Longest op name taken from a range or kernel (the rest is cut)."""


def op_identifier(text: str) -> str:
    """A schedule op name from a range or kernel name: letters, digits and _ only."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:MAX_OP_NAME].strip("_") or "op"
    return name if not name[0].isdigit() else f"k_{name}"


def kernel_identifier(signature: str) -> str:
    """A kernel's function name without return type, namespaces, template and arguments
    (`void at::native::vectorized_elementwise_kernel<4, ...>(...)` -> its last name)."""
    head = signature.split("(")[0].split("<")[0].split()
    return op_identifier(head[-1].split("::")[-1] if head else signature)


def kernel_op_names(trace: RankTrace) -> list[str]:
    """The op name `import kineto` gives each of the trace's kernels (`trace.kernels`, in
    order), by which `compare` finds them again: the innermost device range around it on
    its stream (`gpu_user_annotation`), else its function's name."""
    annotations = [r for r in trace.ranges if r.place is Place.DEVICE]
    out = []
    for k in trace.kernels:
        inner = [a for a in annotations if a.track == k.track and a.start_us <= k.start_us and k.end_us <= a.end_us]
        out.append(op_identifier(min(inner, key=lambda a: a.duration_us).name) if inner else kernel_identifier(k.name))
    return out


def trace_files(path: str | Path) -> list[Path]:
    """The trace files of a folder (`*.json`, `*.json.gz`), or the one file named."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise TraceError(f"{path}: the folder holds no profiler traces (*.json, *.json.gz)")
        return files
    if p.is_file():
        return [p]
    raise UsageError(f"no such trace file or folder: {path}")


def load_trace(path: str | Path) -> dict:
    """The JSON of one profiler trace (gzip or not), checked to be a Kineto trace."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise _too_big(p, p.stat().st_size)
        raw = p.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read trace {p}: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(raw, p)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        truncated = " (it ends early: truncated?)" if e.pos >= len(raw.rstrip()) else ""
        raise TraceError(f"{p} is not a JSON profiler trace: {e.msg} at line {e.lineno} column {e.colno}{truncated}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{p} is not a JSON profiler trace: byte {e.start} is not UTF-8") from None
    except RecursionError:
        raise TraceError(f"{p} is not a profiler trace: its JSON nests too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise TraceError(f"{p} is not a profiler trace: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p} is not a Kineto trace: no traceEvents list",
                         hint="give the JSON files torch.profiler writes (export_chrome_trace, tensorboard_trace_handler)")  # fmt: skip
    if isinstance(data.get("otherData"), dict) and "commdsl" in data["otherData"]:
        raise TraceError(f"{p} is a commdsl timeline, not a profiler trace", hint="give it as a file, not in a trace folder")
    if "schemaVersion" not in data and not any(e.get("cat") == "Trace" for e in data["traceEvents"][:1000] if isinstance(e, dict)):
        raise TraceError(f"{p} is a Chrome trace but not a PyTorch profiler (Kineto) trace: it has no schemaVersion",
                         hint="traces come from torch.profiler (export_chrome_trace, tensorboard_trace_handler)")  # fmt: skip
    for e in data["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") in OLD_CATEGORIES:
            e["cat"] = OLD_CATEGORIES[e["cat"]]
    return data


def _gunzip(raw: bytes, p: Path) -> bytes:
    """The bytes of a gzip file (of one or more members), decompressed no further than
    `MAX_TRACE_BYTES`: a small file that inflates without end is refused, not read."""
    out = bytearray()
    rest = raw
    while rest:
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
        try:
            out += inflate.decompress(rest, MAX_TRACE_BYTES + 1 - len(out))
        except zlib.error as e:
            raise TraceError(f"{p}: a gzip file that does not decompress ({e})") from None
        if len(out) > MAX_TRACE_BYTES:
            raise _too_big(p, None)
        if not inflate.eof:
            raise TraceError(f"{p}: a gzip file that does not decompress (it ends early: truncated?)")
        rest = inflate.unused_data.lstrip(b"\0")  # members may be followed by zero padding
    return bytes(out)


def _too_big(p: Path, size_bytes: int | None) -> TraceError:
    size = "decompresses to" if size_bytes is None else f"is {format_bytes(size_bytes)},"
    return TraceError(f"{p} {size} more than the {format_bytes(MAX_TRACE_BYTES)} a profiler trace may hold (docs/limits.md)",
                      hint="profile fewer steps (torch.profiler's schedule, active=1) or fewer events (record_shapes=False)")


def is_trace_path(path: str | Path) -> bool:
    """Whether `path` is a folder, or a file holding a Kineto trace rather than a commdsl
    timeline (which keeps its meta in `otherData.commdsl`)."""
    p = Path(path)
    if p.is_dir():
        return True
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(2)
        start = head + f.read(TRACE_HEAD_BYTES)
    # Kineto writes its schemaVersion first; a commdsl timeline has none.
    return head == b"\x1f\x8b" or b'"schemaVersion"' in start


def read_job(path: str | Path, step: int | None = None, purpose: str | None = None) -> KinetoJob:
    """Every rank's trace in `path` (a folder, or one file), cut to profiler step `step`
    (its number in `ProfilerStep#N`); None: the last step of every rank's trace that holds
    work. With a `purpose` ("a replay"), a folder with ranks missing is refused before any
    trace is cut to its step (`KinetoJob.require_every_rank`)."""
    files = trace_files(path)
    traces = [(f, load_trace(f)) for f in files]
    ranks: dict[int, tuple[Path, dict]] = {}
    world = 0
    sized: tuple[Path, int] | None = None  # the first trace that names its job's world size
    for f, data in traces:
        info = _distributed_info(data, f)
        if "world_size" in info:
            size = _count(info["world_size"], "distributedInfo.world_size", f, 1)
            if sized is not None and size != sized[1]:
                raise TraceError(f"{sized[0]} is a trace of a job of {sized[1]} ranks, {f} of a job of {size}: the folder "
                                 "holds traces of different jobs", hint="one job's traces in the folder, one per rank")  # fmt: skip
            sized = sized or (f, size)
        rank = info.get("rank", 0 if len(traces) == 1 else None)
        if rank is None:
            raise TraceError(f"{f}: the trace names no rank (distributedInfo.rank)", hint="profile with torch.distributed initialised")
        rank = _count(rank, "distributedInfo.rank", f, 0)
        if rank in ranks:
            raise TraceError(f"{f} and {ranks[rank][0]} are both rank {rank}'s trace", hint="one trace per rank in the folder")
        ranks[rank] = (f, data)
        world = max(world, _count(info.get("world_size", 1), "distributedInfo.world_size", f, 1))
    if purpose is not None:
        _require_ranks(str(path), set(ranks), max(world, max(ranks, default=0) + 1), purpose)
    steps = [set(_steps(data)) for _, data in ranks.values()]
    common = set.intersection(*steps) if steps else set()
    if step is not None and step not in common:
        raise UsageError(f"--step {step}: not a profiler step of every rank's trace (common steps: {sorted(common) or 'none'})")
    if step is None and not common and any(steps):
        raise TraceError(f"{path}: the ranks' traces share no profiler step (ProfilerStep#N)")
    # By default the last step that holds work: the profiler's last step is often cut off
    # (the `prof.step()` after the loop's last iteration opens a step that holds only the
    # exit's synchronize).
    candidates = [step] if step is not None else sorted(common, reverse=True) or [None]
    for chosen in candidates:
        out = {r: _rank_trace(str(f), data, r, world, chosen) for r, (f, data) in sorted(ranks.items())}
        if any(t.holds_work for t in out.values()):
            break
    else:
        out = {r: _rank_trace(str(f), data, r, world, candidates[0]) for r, (f, data) in sorted(ranks.items())}
    return KinetoJob(str(path), out, max(world, max(out) + 1))


def _distributed_info(data: dict, f: str | Path) -> dict:
    """The trace's `distributedInfo` ({} where it has none)."""
    info = data.get("distributedInfo")
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise TraceError(f"{f}: distributedInfo is {type(info).__name__}, not an object (rank, world_size, pg_config)")
    return info


def _is_rank(value: object) -> bool:
    """Whether `value` is a rank number: an int (not a bool) from 0 below `MAX_WORLD_SIZE`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_WORLD_SIZE


def _count(value: object, what: str, f: str | Path, least: int) -> int:
    """A rank or a rank count of the trace, checked: an integer from `least` below
    `MAX_WORLD_SIZE` (a rank) or up to it (a count)."""
    most = MAX_WORLD_SIZE - 1 if least == 0 else MAX_WORLD_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise TraceError(f"{f}: {what} is {json.dumps(value)[:40]}, not an integer from {least} to {most}")
    return value


def _group_ranks(value: object, what: str, f: str | Path) -> tuple[int, ...]:
    """A process group's ranks as the trace lists them, checked."""
    if not isinstance(value, list):
        raise TraceError(f"{f}: {what} is {json.dumps(value)[:40]}, not a list of ranks")
    return tuple(_count(r, what, f, 0) for r in value)


def _steps(data: dict) -> list[int]:
    out = []
    for e in data["traceEvents"]:
        if isinstance(e, dict) and e.get("ph") == "X":
            m = STEP_RANGE.fullmatch(str(e.get("name", "")))
            if m and e.get("cat") in ("user_annotation", "cpu_op", "python_function"):
                out.append(int(m.group(1)))
    return out


def _number(e: dict, key: str, f: str) -> float:
    v = e.get(key)
    # (an integer past a float's range would overflow math.isfinite)
    finite = isinstance(v, float) and math.isfinite(v) or isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**1023
    if not finite:
        raise TraceError(f"{f}: an event ({e.get('name')!r}) has no numeric '{key}'")
    if key == "dur" and v < 0:
        raise TraceError(f"{f}: an event ({e.get('name')!r}) at ts {e.get('ts')} has a negative duration (dur {v})")
    return float(v)


def _rank_trace(f: str, data: dict, rank: int, world: int, step: int | None) -> RankTrace:
    info = _distributed_info(data, f)
    groups = {}
    pg_config = info.get("pg_config") or []
    if not isinstance(pg_config, list):
        raise TraceError(f"{f}: distributedInfo.pg_config is {type(pg_config).__name__}, not a list of process groups")
    for pg in pg_config:
        if isinstance(pg, dict) and pg.get("ranks") is not None:
            groups[str(pg.get("pg_name"))] = _group_ranks(pg["ranks"], f"the ranks of process group {pg.get('pg_name')!r}", f)
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    name = f"ProfilerStep#{step}" if step is not None else ""
    lo, hi = -math.inf, math.inf
    if step is not None:
        marks = [e for e in events if e.get("name") == name and e.get("cat") != "gpu_user_annotation"]
        lo = _number(marks[0], "ts", f)
        hi = lo + _number(marks[0], "dur", f)
    # Device work belongs to the step whose host range launched it.
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("cat") == "cuda_runtime" and isinstance(e.get("args"), dict) and _is_key(e["args"].get("correlation"))}  # fmt: skip
    launched = {c for c, e in launches.items() if lo <= _number(e, "ts", f) <= hi}
    nccl_ranges = sorted((e for e in events if e.get("cat") == "user_annotation" and NCCL_RANGE.fullmatch(str(e.get("name", "")))),
                         key=lambda e: -_number(e, "ts", f))  # innermost (latest start) first  # fmt: skip
    params = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name") == "record_param_comms"
                     and isinstance(e.get("args"), dict)), key=lambda e: -_number(e, "ts", f))  # innermost first  # fmt: skip
    trace = RankTrace(f, rank, world, str(info.get("backend", "")), _profiler(data), name, lo, hi, groups,
                      host_end_us=hi if step is not None else None)  # fmt: skip
    device_lo, device_hi = math.inf, -math.inf
    annotations = []
    for e in events:
        cat, ename = e.get("cat"), str(e.get("name", ""))
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        ts = _number(e, "ts", f)
        end = ts + _number(e, "dur", f)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            correlation = args.get("correlation") if _is_key(args.get("correlation")) else None
            if step is not None and correlation not in launched:
                continue
            device_lo, device_hi = min(device_lo, ts), max(device_hi, end)
            track = f"stream {args.get('stream', e.get('tid'))}"
            launch = launches.get(correlation)
            issued = _number(launch, "ts", f) if launch is not None else ts
            call = (issued, issued + _number(launch, "dur", f)) if launch is not None else None
            host = next((r for r in nccl_ranges if launch is not None and r.get("tid") == launch.get("tid")
                         and _number(r, "ts", f) <= issued <= _number(r, "ts", f) + _number(r, "dur", f)), None)  # fmt: skip
            comm = _nccl_comm(ename, args, track, ts, end, issued, groups, host)
            if comm is not None:
                if len(comm.kinds) == 1 and next(iter(comm.kinds)) in ROOTED and launch is not None:
                    comm = replace(comm, root=_root(comm, launch, params, f))
                trace.comms.append(replace(comm, launch=call))
            elif cat == "kernel":
                trace.kernels.append(TraceRange(ename, track, Place.DEVICE, ts, end, launch=call))
            elif cat == "gpu_memcpy":
                size = _copy_bytes(args.get("bytes"), e, f)
                if size is None and launch is not None and isinstance(launch.get("args"), dict):
                    size = _launch_bytes(launch["args"].get("size"))  # ROCm's copies: the size is on the HIP call
                trace.unsized_copies += size is None
                trace.copies.append(TraceRange(ename, track, Place.DEVICE, ts, end, size or 0, call))
        elif cat == "cuda_runtime" and ename in BLOCKING_CALLS and lo <= ts and end <= hi:
            trace.host_blocks.append(TraceRange(ename, f"thread {e.get('tid')}", Place.HOST, ts, end))
        elif cat == "gpu_user_annotation":
            annotations.append(TraceRange(ename, f"stream {e.get('tid')}", Place.DEVICE, ts, end))
        elif cat == "user_annotation" and lo <= ts and end <= hi and ename != name and not NCCL_RANGE.fullmatch(ename):
            m = GLOO_RANGE.fullmatch(ename)
            if m:
                comm = _gloo_comm(m.group(1), ename, args, f"thread {e.get('tid')}", ts, end)
                if comm is not None:
                    trace.comms.append(comm)
                    continue
            trace.ranges.append(TraceRange(ename, f"thread {e.get('tid')}", Place.HOST, ts, end))
    # A device range belongs to the step if it overlaps the device work the step launched.
    trace.ranges += [a for a in annotations if step is None or (a.start_us < device_hi and a.end_us > device_lo)]
    if device_hi > device_lo:
        trace.step_start_us = min(trace.step_start_us, device_lo) if step is not None else device_lo
        trace.step_end_us = max(trace.step_end_us, device_hi) if step is not None else device_hi
    if step is None:
        spans = [(x.start_us, x.end_us) for x in (*trace.ranges, *trace.comms, *trace.kernels, *trace.copies)]
        trace.step_start_us = min((s for s, _ in spans), default=0.0)
        trace.step_end_us = max((e for _, e in spans), default=0.0)
    for xs in (trace.ranges, trace.comms, trace.kernels, trace.copies, trace.host_blocks):
        xs.sort(key=lambda x: (x.start_us, x.end_us, x.name))
    return trace


def _root(comm: TraceComm, launch: dict, params: list[dict], f: str) -> int | None:
    """A rooted collective's root (its rank in the op's group) from the innermost
    `record_param_comms` op of the same collective around its launch on the launching
    thread; None where there is none."""
    at = _number(launch, "ts", f)
    kind = next(iter(comm.kinds))
    for e in params:
        start = _number(e, "ts", f)
        if e.get("tid") == launch.get("tid") and start <= at <= start + _number(e, "dur", f):
            if NCCL_COLLECTIVE.get(str(e["args"].get("Collective name"))) is not kind:
                return None
            root = e["args"].get("Rank")
            return root if _is_rank(root) else None
    return None


def _is_key(value: object) -> bool:
    """Whether a `correlation` id can key a launch (an integer or a string, as profilers write it)."""
    return isinstance(value, (int, str))


def _copy_bytes(value: object, e: dict, f: str) -> int | None:
    """A copy's `bytes` arg (None where the trace leaves it out)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{f}: the copy {e.get('name')!r} at ts {e.get('ts')} has bytes {json.dumps(value)[:40]}, not a count of bytes")
    return value


def _launch_bytes(value: object) -> int | None:
    """The `size` arg of a copy's runtime call (`hipMemcpyWithStream`: a decimal string or
    an integer); None where it is neither."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 18:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _profiler(data: dict) -> str:
    parts = [f"Kineto schemaVersion {data.get('schemaVersion', '?')}"]
    if data.get("trace_id"):
        parts.append(f"trace_id {data['trace_id']}")
    nccl = (data.get("distributedInfo") or {}).get("nccl_version")
    if nccl:
        parts.append(f"NCCL {nccl}")
    return ", ".join(parts)


def _ranks_arg(value: object) -> tuple[int, ...] | None:
    """An NCCL kernel's `Process Group Ranks` (a list, or a list written as a string);
    None where it is neither or holds something other than ranks."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(map(_is_rank, value)):
        return tuple(value)
    return None


def _nccl_comm(name: str, args: dict, track: str, ts: float, end: float, issued: float,
               groups: dict[str, tuple[int, ...]], host: dict | None) -> TraceComm | None:  # fmt: skip
    """An NCCL kernel as a comm: what it ran from its args (torch >= 2.2), else from the
    `nccl:<collective>` range around its launch (`host`), else from its name."""
    m = NCCL_KERNEL.match(name)
    if not m:
        return None
    collective = args.get("Collective name")
    ranged = NCCL_COLLECTIVE.get(NCCL_RANGE.fullmatch(str(host["name"])).group(1)) if host is not None else None
    if isinstance(collective, str) and collective in NCCL_COLLECTIVE:
        kinds = frozenset({NCCL_COLLECTIVE[collective]})
    elif ranged is not None and host is not None:
        in_bytes, dtype = _input_bytes(ranged, host.get("args") if isinstance(host.get("args"), dict) else {})
        return TraceComm(name, frozenset({ranged}), in_bytes, dtype, None, track, Place.DEVICE, ts, end, issued)
    elif m.group(1) in NCCL_KERNEL_COLLECTIVE:
        k = NCCL_KERNEL_COLLECTIVE[m.group(1)]
        kinds = frozenset({OpKind.SEND, OpKind.RECV}) if k is None else frozenset({k})
    else:
        kinds = frozenset()  # an NCCL kernel of a kind commdsl does not model: listed, never paired
    nelems, dtype = args.get("In msg nelems"), NCCL_DTYPE.get(str(args.get("dtype")))
    in_bytes = int(nelems) * dtype.itemsize if isinstance(nelems, int) and dtype else None
    group = _ranks_arg(args.get("Process Group Ranks"))
    if group is None and str(args.get("Process Group Name")) in groups:
        group = groups[str(args.get("Process Group Name"))]
    # torch's profiler names a send's destination and a recv's source (global ranks).
    peer = args.get("Dst Rank") if kinds == {OpKind.SEND} else args.get("Src Rank") if kinds == {OpKind.RECV} else None
    peer = peer if _is_rank(peer) else None
    splits = None
    if kinds == {OpKind.ALL_TO_ALL} and dtype is not None:
        out_nelems = args.get("Out msg nelems")
        ins, outs = _splits_arg(args.get("In split size")), _splits_arg(args.get("Out split size"))
        if ins and outs and isinstance(nelems, int) and isinstance(out_nelems, int) and sum(ins) > 0 and sum(outs) > 0:
            # Splits count rows of the tensors: a row holds nelems / rows elements.
            splits = (tuple(n * nelems // sum(ins) * dtype.itemsize for n in ins),
                      tuple(n * out_nelems // sum(outs) * dtype.itemsize for n in outs))  # fmt: skip
    return TraceComm(name, kinds, in_bytes, dtype, group, track, Place.DEVICE, ts, end, issued, peer=peer, splits=splits)


def _splits_arg(value: object) -> tuple[int, ...] | None:
    """An NCCL kernel's `In split size` / `Out split size` (a list of row counts, or one
    written as a string); None where it is empty (an even all_to_all) or not such a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        return tuple(value)
    return None


def _gloo_comm(collective: str, name: str, args: dict, track: str, ts: float, end: float) -> TraceComm | None:
    kind = NCCL_COLLECTIVE.get(collective)
    if kind is None:
        return None
    in_bytes, dtype = _input_bytes(kind, args)
    return TraceComm(name, frozenset({kind}), in_bytes, dtype, None, track, Place.HOST, ts, end, ts, GLOO_RUNS_FOR.get(kind, frozenset()))


def _input_bytes(kind: OpKind, args: dict) -> tuple[int | None, Dtype | None]:
    """The input bytes and dtype of a comm range's first input (`Input Dims`, `Input type`,
    recorded under `record_shapes`); (None, None) where the range does not give them."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and isinstance(types, list) and types:
        dtype = TORCH_TYPE_DTYPE.get(str(types[0]))
        if dtype and all(isinstance(d, int) for d in dims[0]):
            return math.prod(dims[0]) * dtype.itemsize, dtype
        return None, dtype
    return (0, None) if kind is OpKind.BARRIER else (None, None)
