"""Read nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ... of NVIDIA/nccl-tests).

A log is the text one run of a `*_perf` tool prints: a header (`# nThread 1 nGpus 8
minBytes ... graph: 0`, one `#  Rank  N Group G Pid P on HOST device D [BUS] NAME` line per
rank), the column titles, one line per size (`size count type redop root`, then `time
algbw busbw #wrong` out of place and in place), and a closing summary (`# Avg bus
bandwidth`). One process may drive several GPUs (`-g N`) or each GPU has its own
process (MPI, srun); lines may carry an MPI prefix (`[1,0]<stdout>:`). NCCL_DEBUG=INFO
lines in the log are skipped, except those saying NCCL_ALGO / NCCL_PROTO were set.

Every problem (another tool's output, a cut-off log, a line that is not a result, two
runs in one file) is a `LogError` naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from commdsl.errors import LogError, SourceLoc, UsageError
from commdsl.ir import Algo, Dtype, OpKind, Protocol
from commdsl.machine.nccl import NCCL_ALGOS, PROTOCOLS

TOOLS = {
    "all_reduce_perf": OpKind.ALL_REDUCE, "all_gather_perf": OpKind.ALL_GATHER, "reduce_scatter_perf": OpKind.REDUCE_SCATTER,
    "alltoall_perf": OpKind.ALL_TO_ALL, "sendrecv_perf": OpKind.SEND, "broadcast_perf": OpKind.BROADCAST,
    "reduce_perf": OpKind.REDUCE,
}  # fmt: skip
"""The nccl-tests tools read, and the op each times (sendrecv: every rank sends to the
next and receives from the previous at once)."""

TYPES = {
    "float": Dtype.FP32, "half": Dtype.FP16, "bfloat16": Dtype.BF16, "double": Dtype.FP64, "int8": Dtype.INT8,
    "uint8": Dtype.UINT8, "int32": Dtype.INT32, "int64": Dtype.INT64, "f8e4m3": Dtype.FP8, "fp8_e4m3": Dtype.FP8,
}  # fmt: skip
"""nccl-tests' `-d` type names (src/common.cu `test_typenames`) that have a commdsl dtype."""

_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+).*?(?:graph:\s*(\d+))?\s*$")
_RANK = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.+?)\s*$")
_TOOL = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_ENV = re.compile(r"NCCL_(ALGO|PROTO) set by environment to (\S+)")
_PREFIX = re.compile(r"^(?:\[[^\]]*\](?:<std(?:out|err)>:)?\s*|\S+:\s+(?=\d))")
"""What MPI or a launcher puts before a line: `[1,0]<stdout>:`, `[0] `, `host: `."""


@dataclass(frozen=True)
class Point:
    """One size of a log."""

    size_bytes: int
    """nccl-tests' size column: the largest buffer (as commdsl's `size_bytes`)."""
    time_us: float
    """Out-of-place time per op, microseconds (what the simulator predicts)."""
    in_place_us: float | None
    line: int


@dataclass(frozen=True)
class NcclTestsLog:
    """One parsed log."""

    path: str
    tool: str
    op: OpKind
    ranks: int
    """GPUs in the run (the `# Rank` lines)."""
    gpus_per_process: int
    """`nGpus`: GPUs one process (one thread) drives; the host launches for all of them."""
    nodes: int
    """Distinct hosts of the ranks."""
    graph: bool
    """Ops were launched from CUDA graphs (`-G N`): no per-op host launch."""
    dtype: Dtype
    device: str
    """The GPUs' name as nccl-tests prints it (`NVIDIA H100 80GB HBM3`)."""
    points: tuple[Point, ...]
    algos: frozenset[Algo] | None
    """NCCL_ALGO as the log's NCCL INFO lines report it; None: not reported."""
    protos: frozenset[Protocol] | None


def read_logs(args: list[str]) -> list[NcclTestsLog]:
    """Each argument is a log file, or `TOOL=FILE` for a log without nccl-tests' header
    line naming its tool (nccl-tests before 2.13)."""
    logs = []
    for arg in args:
        tool = None
        name, sep, rest = arg.partition("=")
        if sep and name in TOOLS:
            tool, arg = name, rest
        try:
            text = Path(arg).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read nccl-tests log {arg}: {e}") from None
        logs.append(parse_log(text, arg, tool))
    devices = {log.device for log in logs}
    if len(devices) > 1:
        raise LogError(f"the logs come from different GPUs ({', '.join(sorted(devices))}); calibrate one machine at a time",
                       hint="pass the logs of one cluster")  # fmt: skip
    return logs


def parse_log(text: str, path: str = "<log>", tool: str | None = None) -> NcclTestsLog:
    """One nccl-tests log (see the module doc); `tool` when the log does not name it."""
    lines = text.splitlines()

    def loc(i: int, col: int = 1) -> SourceLoc:
        return SourceLoc(path, i + 1, col, lines[i] if i < len(lines) else "")

    header: tuple[int, int, bool, int] | None = None  # nThread, nGpus, graph, line
    ranks: dict[int, tuple[str, str, int]] = {}
    has_root = True
    columns_seen = False
    points: list[Point] = []
    algos = protos = None
    dtype = None
    closed = False
    for i, raw in enumerate(lines):
        line = _PREFIX.sub("", raw.strip(), count=1) if raw.strip() else ""
        if not line:
            continue
        m = _ENV.search(line)
        if m:
            names = [x for x in re.split(r"[,;]", m.group(2)) if x and ":" not in x and not x.startswith("^")]
            if m.group(1) == "ALGO":
                known = {a.value.replace("_", ""): a for a in NCCL_ALGOS}
                algos = frozenset(known[n.lower()] for n in names if n.lower() in known) or None
            else:
                protos = frozenset(p for p in PROTOCOLS if p.value in {n.lower() for n in names}) or None
            continue
        if "NCCL INFO" in line or "NCCL WARN" in line:
            continue
        if not line.startswith("#"):
            if header is None:
                raise LogError("not nccl-tests output: this line comes before nccl-tests' `# nThread ... nGpus ...` header", loc(i),
                               hint="pass the output of one nccl-tests *_perf run")  # fmt: skip
            if closed:
                raise LogError("a result line after the run's closing summary (two runs in one file?)", loc(i))
            point, dt = _result(line, has_root, lambda col: loc(i, col))
            if dtype is not None and dt is not dtype:
                raise LogError(f"type {dt.value} after {dtype.value}: one run times one type", loc(i))
            dtype = dt
            if point[0] > 0:
                points.append(Point(point[0], point[1], point[2], i + 1))
            continue
        m = _TOOL.match(line)
        if m:
            if m.group(1) not in TOOLS:
                raise LogError(f"nccl-tests tool '{m.group(1)}' is not one calibrate reads (it reads: {', '.join(TOOLS)})", loc(i))
            if tool is not None and tool != m.group(1):
                raise LogError(f"the log is {m.group(1)}'s, not {tool}'s", loc(i))
            tool = m.group(1)
            continue
        m = _HEADER.match(line)
        if m:
            if header is not None:
                raise LogError(f"a second run's header (first at line {header[3]}): one log per file", loc(i))
            header = (int(m.group(1)), int(m.group(2)), bool(int(m.group(3) or 0)), i + 1)
            continue
        m = _RANK.match(line)
        if m:
            r = int(m.group(1))
            if r in ranks:
                raise LogError(f"rank {r} is listed twice (mixed runs in one file?)", loc(i))
            ranks[r] = (m.group(3), m.group(5), int(m.group(2)))
            continue
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            columns_seen = True
            has_root = "root" in tokens
            continue
        if line.startswith("# Avg bus bandwidth") or line.startswith("# Out of bounds"):
            closed = True
    return _finish(path, lines, tool, header, ranks, columns_seen, points, dtype, algos, protos, closed)


def _result(line: str, has_root: bool, loc) -> tuple[tuple[int, float, float | None], Dtype]:
    """(size, out-of-place us, in-place us) and the type of one result line."""
    tokens = line.split()
    need = (5 if has_root else 4) + 4
    if len(tokens) < need:
        raise LogError(f"a cut-off result line: {len(tokens)} columns, nccl-tests writes {need + 4} "
                       "(size count type redop [root] and time algbw busbw #wrong twice)", loc(1),
                       hint="the log is truncated or mangled; rerun the test or drop the line")  # fmt: skip
    try:
        size = int(tokens[0])
        int(tokens[1])
    except ValueError:
        raise LogError(f"not a result line: size and count must be whole numbers, got {tokens[0]!r} {tokens[1]!r}", loc(1)) from None
    type_name = tokens[2]
    if type_name not in TYPES:
        raise LogError(f"type '{type_name}' has no commdsl dtype (known: {', '.join(TYPES)})", loc(line.index(type_name) + 1))
    t = 5 if has_root else 4
    times = []
    for k in (t, t + 4):
        word = tokens[k] if k < len(tokens) else "N/A"
        if word == "N/A":
            times.append(None)
            continue
        try:
            v = float(word)
        except ValueError:
            raise LogError(f"time {word!r} is not a number", loc(line.index(word) + 1)) from None
        if not v > 0.0 and size > 0:
            raise LogError(f"time {word} us of a {size}-byte op: times are positive", loc(line.index(word) + 1))
        times.append(v)
    if times[0] is None:
        raise LogError("no out-of-place time on this line", loc(1))
    return (size, times[0], times[1]), TYPES[type_name]


def _finish(path, lines, tool, header, ranks, columns_seen, points, dtype, algos, protos, closed) -> NcclTestsLog:
    def at(line: int) -> SourceLoc:
        return SourceLoc(path, line, 1, lines[line - 1] if 0 < line <= len(lines) else "")

    last = len(lines)
    if header is None:
        raise LogError("not nccl-tests output: no `# nThread ... nGpus ...` header", at(1),
                       hint="pass the output of one nccl-tests *_perf run (all_reduce_perf, ...)")  # fmt: skip
    if tool is None:
        raise LogError("cannot tell which nccl-tests tool wrote this log (no `# Collective test starting:` line)", at(1),
                       hint=f"name it: TOOL=FILE, e.g. all_reduce_perf={path}")  # fmt: skip
    if not ranks:
        raise LogError("no `# Rank N ... on HOST device D` lines: cannot tell the GPUs", at(header[3]))
    if sorted(ranks) != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        raise LogError(f"ranks {missing} are missing from the rank list (ranks 0..{max(ranks)})", at(header[3]))
    devices = {name for _, name, _ in ranks.values()}
    if len(devices) > 1:
        raise LogError(f"the run mixes GPUs ({', '.join(sorted(devices))})", at(header[3]))
    n = len(ranks)
    gpus = header[1]
    if n % gpus:
        raise LogError(f"{n} ranks is not a multiple of nGpus {gpus} (each process drives nGpus GPUs): mixed runs?", at(header[3]))

    per_process: dict[tuple[str, int], int] = {}
    for host, _, pid in ranks.values():
        per_process[(host, pid)] = per_process.get((host, pid), 0) + 1
    if any(c != gpus for c in per_process.values()):
        counts = sorted(set(per_process.values()))
        raise LogError(f"processes drive different numbers of GPUs ({', '.join(map(str, counts))}; nGpus is {gpus}): mixed runs?", at(header[3]))
    if not columns_seen or not points:
        raise LogError("no results: the log ends before its first result line", at(last), hint="the run failed or the log is cut off")
    if not closed:
        raise LogError(f"truncated: the log ends after line {last} without nccl-tests' closing `# Avg bus bandwidth` summary",
                       at(last), hint="the run did not finish; rerun it, or cut the log after its last whole line and add the summary")  # fmt: skip
    hosts = {host for host, _, _ in ranks.values()}
    return NcclTestsLog(path, tool, TOOLS[tool], n, gpus, len(hosts), header[2], dtype, devices.pop(), tuple(points), algos, protos)
