"""Read nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ... of NVIDIA/nccl-tests)
as users save it.

A run of a `*_perf` tool prints (src/common.cu, src/util.cu): `# nccl-tests version V
nccl-headers=H nccl-library=L`, `# Collective test starting: TOOL`, a header (`# nThread T
nGpus G minBytes ... graph: 0`), one `#  Rank N Group G Pid P on HOST device D [BUS] NAME`
line per rank, the column titles (`size count type redop root time algbw busbw #wrong`, out
of place then in place; older versions have no `root`, newer ones may add per-iteration
columns), one line per size, and a closing summary (`# Avg bus bandwidth`, `# Collective test
concluded`). One process may drive several GPUs (`-g N`) or each GPU has its own process
(MPI, srun).

A saved log carries more, all of it read past or used:

- text before a run: the launcher's echo of the command (`mpirun ... ./all_reduce_perf -b 8
  ...`: it names the tool), Slurm/MPI banners, ssh warnings, markdown code fences;
- `NCCL version 2.x.y+cudaZ` and NCCL_DEBUG=INFO/WARN lines, interleaved anywhere: the NCCL
  version (or RCCL's, `RCCL version : 2.22.3-...`, which tracks NCCL's), `NCCL_ALGO` /
  `NCCL_PROTO set by environment to ...` and the channel counts (`N coll channels, ... M p2p
  channels, K p2p channels per peer`) are taken from them;
- NCCL_COLLNET_ENABLE (CollNet, IB SHARP), from an INFO line, the echoed command
  (`-x NCCL_COLLNET_ENABLE=1`) or an environment dump before the run;
- a launcher's prefix on every line (`[1,0]<stdout>:` of mpirun --tag-output, `0: ` of srun
  --label), or a logger's (a timestamp of `kubectl logs --timestamps`): nccl-tests' lines are
  found after it, its rows inside a table; mpirun's own messages inside a table are text;
- several runs one after another (a sweep of ops or of GPU counts): each is a log of its own,
  and one that cannot be read is skipped and told, the others read; so is each block of rows
  of a run of several types or reductions (`-d all`, `-o all`), rows of a type commdsl has no
  dtype for read as the dtype of its element size (uint32 as int32, see `SAME_SIZE_TYPES`);
- a run without its closing summary (a paste that stops after the table): read where its last
  row is the last size of the sweep its header sets, else refused as cut off;
- no line naming the tool (nccl-tests before 2.13, the command not echoed): the columns say
  it where they fit one tool only (the `redop` word, the `root`, and busbw / algbw, the
  tool's bus factor on the run's GPU count; before 2.13 each tool had its own titles, see
  `_OLD_TITLES`, and alltoall printed its redop blank; before mid-2020 all_gather and
  reduce_scatter printed another algbw, see `_Reader._check_algbw`);
- nccl-tests' `#` lines with the `#` lost (a log pasted into markdown without a code fence,
  where `# nThread ...` became a heading);
- a log cut above its header: `# Rank` lines before the table are its ranks (rccl-tests may
  print them without a device name); a rank list with ranks missing (a wrapper's own header,
  a log abridged by hand) is read with the GPU count given, NCCL's, or its highest rank + 1;
- a table pasted without its header lines: NCCL's INFO line `comm 0x... rank R nranks N`, or
  else the echoed command that ran it (`-g 8` alone, `mpirun -np 2 ... -g 4`; see
  `_command_gpus`), gives its GPU count; what it does not say (the tool, the GPU count)
  must be given with the file (`TOOL:GPUS=FILE`), and the error names the line it stopped
  at. Such a table ends at the first line of other text (a grep of several logs is several
  tables).

Every value is checked where it is read, against the bounds of `commdsl.limits`; every
problem is a `LogError` naming the file and line. A result row is read as nccl-tests prints
it (ASCII digits, `_PRINTED`), each time against its algbw (`_agree`), each size once a sweep;
a line inside a table with the table's columns, mostly numbers, is a row (`_mangled_row`), so
a mangled one is an error, not text read past. A row whose `#wrong` is above 0 (the data
check failed) is skipped and told in `notes`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from commdsl.errors import LogError, SourceLoc, UsageError
from commdsl.files import is_file, read_text, source_lines
from commdsl.ir import Algo, Dtype, OpKind, Protocol
from commdsl.limits import MAX_MACHINE_TIME_US, MAX_SIZE_BYTES, MAX_WORLD_SIZE
from commdsl.machine.nccl import NCCL_ALGOS, PROTOCOLS
from commdsl.sim.collectives import bus_factor

TOOLS = {
    "all_reduce_perf": OpKind.ALL_REDUCE, "all_gather_perf": OpKind.ALL_GATHER, "reduce_scatter_perf": OpKind.REDUCE_SCATTER,
    "alltoall_perf": OpKind.ALL_TO_ALL, "sendrecv_perf": OpKind.SEND, "broadcast_perf": OpKind.BROADCAST,
    "reduce_perf": OpKind.REDUCE,
}  # fmt: skip
"""The nccl-tests tools read, and the op each times (sendrecv: every rank sends to the
next and receives from the previous at once)."""

OTHER_TOOLS = ("gather_perf", "scatter_perf", "hypercube_perf", "alltoallv_perf")
"""nccl-tests tools calibrate does not read: a log of one is refused by name."""

TYPES = {
    "float": Dtype.FP32, "half": Dtype.FP16, "bfloat16": Dtype.BF16, "double": Dtype.FP64, "int8": Dtype.INT8,
    "uint8": Dtype.UINT8, "int32": Dtype.INT32, "int64": Dtype.INT64, "f8e4m3": Dtype.FP8, "fp8_e4m3": Dtype.FP8,
}  # fmt: skip
"""nccl-tests' `-d` type names (src/common.cu `test_typenames`) that have a commdsl dtype."""

SAME_SIZE_TYPES = {
    "uint32": Dtype.INT32, "uint64": Dtype.INT64, "f8e5m2": Dtype.FP8, "fp8_e5m2": Dtype.FP8, "char": Dtype.INT8, "int": Dtype.INT32,
}  # fmt: skip
"""nccl-tests' (and rccl-tests') other type names, each with the commdsl dtype of its element
size (`char` and `int` are NCCL 1's int8 and int32). An op's time depends on its bytes and
its reduction, not on how the elements are read (NCCL reduces uint32 as it does int32, e5m2
as e4m3), so the rows are read as that dtype, and told; a type in neither list is a mangled
row, an error."""

REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum", "none")
"""What nccl-tests prints in the `redop` column (src/common.cu `test_opnames`; `none`: a tool
that does not reduce); old alltoall printed it blank."""

MAX_CHANNELS = 128
"""Most channels of one kind an INFO line may report: RCCL's MAXCHANNELS (NCCL's is 64)."""

MAX_DIGITS = 20
"""Most digits a whole number of a log may have (2^64 has 20): a longer one is refused
before it is converted."""

_HEADER = re.compile(r"#\s*nThread\s+(\S+)\s+nGpus\s+(\S+)(.*)$")
_GRAPH = re.compile(r"graph:\s*([^\s,;]+)")
"""`graph: 0`; a patched build may print another `key:value` after it (`graph: 0, parallel_init:0`)."""
_VALIDATION = re.compile(r"validation:\s*(\d{1,9})(?![^\s,;])")
_SWEEP = re.compile(r"minBytes\s+(\d{1,20})\s+maxBytes\s+(\d{1,20})\s+step:\s*(\d{1,20})\((factor|bytes)\)")
"""The sizes a run times: `minBytes 8 maxBytes 134217728 step: 2(factor)` (or `step: 1024(bytes)`)."""
_REDUCED_MAX = re.compile(r"#\s*Reducing maxBytes to (\d{1,20}) due to memory limitation")
"""nccl-tests' line after the header where the GPUs' memory cannot hold maxBytes (src/common.cu)."""
_RANK = re.compile(r"#\s+Rank\s+(\S+)\s+(?:Group\s+\S+\s+)?Pid\s+(\S+)\s+(?:on\s+(\S+)\s+)?device\s+(\S+)\s+\[([^\]]*)\]\s*(.*?)\s*$")
"""`#  Rank R Group G Pid P on HOST device D [BUS] NAME`; rccl-tests may print no NAME, and a
log pasted with its host names taken out has no `on HOST`."""
_TOOL = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_TESTS_VERSION = re.compile(r"#\s*nccl-tests version \S+.*?nccl-library=(\d{1,8})\b")
_NCCL_VERSION = re.compile(r"NCCL version (\d{1,4}\.\d{1,4}\.\d{1,4})")
_RCCL_VERSION = re.compile(r"RCCL version\s*:?\s*(\d{1,4}\.\d{1,4}\.\d{1,4})")
"""RCCL's version, as rccl-tests prints it with NCCL_DEBUG=VERSION (`RCCL version : 2.22.3-develop:f5b15f2`)
or RCCL's INFO line (`RCCL version 2.18.3+hip6.0`): its numbers track the NCCL release it follows."""
_ENV = re.compile(r"NCCL_(ALGO|PROTO) set by environment to (\S+)")
T = TypeVar("T")

NCCL_FUNCTIONS = {"broadcast": OpKind.BROADCAST, "reduce": OpKind.REDUCE, "allgather": OpKind.ALL_GATHER,
                  "reducescatter": OpKind.REDUCE_SCATTER, "allreduce": OpKind.ALL_REDUCE}
"""NCCL's collectives as NCCL_ALGO / NCCL_PROTO name them (init.cc `ncclFuncStr`, any case)."""
ALGO_NAMES = {a.value.replace("_", ""): a for a in NCCL_ALGOS}
"""NCCL_ALGO's names (init.cc `ncclAlgoStr`, lower case) of each algorithm."""
PROTO_NAMES = {p.value: p for p in PROTOCOLS}
"""NCCL_PROTO's names (`ncclProtoStr`, lower case) of each protocol."""
_CHANNELS = re.compile(r"\b(\d+) coll channels,(?: (\d+) collnet channels,)?(?: (\d+) nvls channels,)? (\d+) p2p channels,"
                       r" (\d+) p2p channels per peer")  # fmt: skip
_NRANKS = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank \d{1,6} n[Rr]anks (\d+)\b")
"""NCCL's INFO lines that give a communicator's size: `... comm 0x... rank 0 nranks 16 ... Init
COMPLETE` (and `Destroy COMPLETE`), `comm 0x... rank 0 nRanks 16 nNodes 2 ...` (2.19+)."""
_COLLNET = re.compile(r"\bNCCL_COLLNET_ENABLE(?:\s+set by environment to\s+|\s*=\s*)[\"']?(\d)\b")
"""NCCL_COLLNET_ENABLE as NCCL's INFO line reports it or a command line / environment dump sets it."""
_PREFIX = re.compile(r"^(?:\[[^\]]{0,40}\](?![$#%>](?:\s|$))(?:<std(?:out|err)>)?:?\s*|\d{1,6}:\s+)")
"""What a launcher puts before a line: `[1,0]<stdout>:` (mpirun --tag-output), `[1,0]:`,
`[0] `, `12: ` (srun --label); not a shell prompt in brackets (`[root@host dir]# cmd`)."""
_MPI_TAG = re.compile(r"\[\d{1,6},\d{1,6}\]<std(?:out|err)>:")
"""mpirun --tag-output's tag, which it repeats inside a line nccl-tests wrote in several parts."""
_SHELL_ENV = re.compile(r"(?:^|[\s;])(?:(export)\s+)?NCCL_(ALGO|PROTO)=(\"[^\"]*\"|'[^']*'|[^\s;]*)|(?:^|[\s;])unset\s+NCCL_(ALGO|PROTO)\b")
"""NCCL_ALGO / NCCL_PROTO as a shell line sets them: `export NCCL_ALGO=Ring` (every later run),
`NCCL_ALGO=Ring ./all_reduce_perf`, `mpirun -x NCCL_ALGO=Ring ...` (the next run), `unset`."""
_BARE_COMMENT = re.compile(r"(?:nThread\s+\S+\s+nGpus\s|Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s|Using devices\b|size\s+count\s+type\s"
                           r"|\(B\)\s+\(elements\)|Out of bounds values\s*:|Avg bus bandwidth\s*:|Collective test (?:starting|concluded):)")
"""nccl-tests' own `#` lines with the `#` lost: a log pasted into markdown (GitHub issues, READMEs)
without a code fence turns `# nThread ...` into a heading and drops the `#`."""
_EMBEDDED = re.compile(r"#\s*(?:nccl-tests version\s|Collective test (?:starting|concluded):|nThread\s+\S+\s+nGpus\s"
                       r"|Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s|Using devices\b|size\s+count\s+type\s|\(B\)\s+\(elements\)"
                       r"|Out of bounds values\s*:\s*\d|Avg bus bandwidth\s*:\s*[-+.\d])")
"""nccl-tests' own `#` lines after other text on the line: a logger's prefix (a timestamp of
`kubectl logs --timestamps`, `ts`, a function name of an instrumented build)."""
_EMBEDDED_ROW = re.compile(r"(?<!\S)\d{1,20}\s+\d{1,20}\s+[A-Za-z][A-Za-z0-9_]*\s")
"""A result row (size, count, type) after such a prefix, inside a table."""
_NUMBER = re.compile(r"[-+]?(?:\d|\.\d)[\d.]*(?:\s|$)")
"""How a result line starts: a size, maybe mangled (a sign, a fraction), then a space; not a
timestamp, nor mpirun's `3 more processes have sent help message ...` (see `_line`)."""
_TIME_COLUMNS = ("time", "cputime")
_PRINTED = re.compile(r"[0-9]+(?:\.[0-9]{1,2})?|[0-9](?:\.[0-9])?e\+[0-9]{2,3}")
"""A time, algbw or busbw as nccl-tests prints it (src/util.cu `getFloatStr`: `%.2f`, `%.1f`
or `%.0f`, then `%.1e` / `%.0e` for a value too wide for its column; before 2.14 `%.2f` and
the like): ASCII digits, no sign, an exponent only above the column's width."""
_WRONG = re.compile(r"[0-9]+|[0-9](?:\.[0-9]+)?e\+[0-9]{2,3}")
"""`#wrong` as nccl-tests prints it (`%6g` of a count); `N/A` where the data is not checked (`-c 0`)."""
_MIN_ALGBW = 0.5
"""Least algbw (GB/s) of a result whose busbw / algbw ratio is read: both columns have two
decimals, so a smaller one says little of the ratio."""
_REDUCING = frozenset({"all_reduce_perf", "reduce_scatter_perf", "reduce_perf", "sendrecv_perf"})
"""The tools whose `redop` column names a reduction (`sum`); the others print `none`
(nccl-tests src/*.cu: `TimeTest(..., "none", root)`). sendrecv prints the op it was given."""
_ROOTED = frozenset({"broadcast_perf", "reduce_perf"})
_UNCHECKED_IN_PLACE = frozenset({"alltoall_perf", "sendrecv_perf"})
"""The tools that never check their in-place results (alltoall.cu, sendrecv.cu: `reportErrors =
in_place ? 0 : 1`, since each was added): with the data checked, their in-place `#wrong` is
N/A, every other tool's a count."""
"""The tools whose `root` column names a rank; the others print -1."""
_OLD_TITLES = {
    "all_reduce_perf": ("redop",), "reduce_scatter_perf": ("redop",), "alltoall_perf": ("redop",), "reduce_perf": ("redop", "root"),
    "broadcast_perf": ("root",), "all_gather_perf": (), "sendrecv_perf": (),
}  # fmt: skip
"""Which of `redop` and `root` each tool's column titles had before nccl-tests 2.13 gave every
tool both (src/*.cu up to 2022: all_gather and sendrecv neither, broadcast `root` alone,
reduce both, the others `redop`; alltoall printed its `redop` blank)."""
_OLD_ALGBW = ("all_gather_perf", "reduce_scatter_perf")
"""The tools whose algbw was (size - count x type size) / time before nccl-tests ec1b5e2 (June
2020), busbw the same (`_Reader._check_algbw`)."""



@dataclass(frozen=True)
class Point:
    """One size of a log."""

    size_bytes: int
    """nccl-tests' size column: the largest buffer (as commdsl's `size_bytes`)."""
    time_us: float
    """Out-of-place time per op, microseconds (what the simulator predicts)."""
    in_place_us: float | None
    """In-place time per op, microseconds (None: not run)."""
    line: int


@dataclass(frozen=True)
class Channels:
    """NCCL's channel counts, as an NCCL_DEBUG=INFO log reports them at init."""

    coll: int
    """Channels of ring and tree collectives (`N coll channels`)."""
    nvls: int | None
    """Channels of NVLS collectives (None: the NCCL version does not report them; 0: no NVLS)."""
    p2p: int
    """Channels of point-to-point transfers (`M p2p channels`)."""
    p2p_per_peer: int
    """Most channels one peer pair uses (`K p2p channels per peer`)."""


@dataclass(frozen=True)
class NcclTestsLog:
    """One run of an nccl-tests tool, as its log records it."""

    path: str
    """The file, with `:LINE` of the run's first line when the file holds several runs."""
    tool: str
    op: OpKind
    ranks: int
    """GPUs in the run (the `# Rank` lines, or the GPU count given with a headerless table)."""
    gpus_per_process: int
    """GPUs one thread drives (nGpus); the thread launches each op on all of them in turn."""
    nodes: int | None
    """Distinct hosts of the ranks (None: not said, a table without its header)."""
    ranks_per_node: int | None
    """GPUs of the run on each host (None: not said)."""
    graph: bool
    """Ops were launched from CUDA graphs (`-G N`): no per-op host launch."""
    dtype: Dtype
    device: str
    """The GPUs' name as nccl-tests prints it (`NVIDIA H100 80GB HBM3`); "" when not said."""
    points: tuple[Point, ...]
    algos: frozenset[Algo] | None
    """What NCCL_ALGO, as the log's NCCL INFO lines report it, enables for the run's
    collective (NCCL's own syntax: `ring`, `^nvls`, `tree;allgather:ring`); None: not
    reported, all of NCCL's algorithms, or a point-to-point run (NCCL_ALGO does not apply)."""
    protos: frozenset[Protocol] | None
    """The same of NCCL_PROTO."""
    nccl_version: str | None = None
    """NCCL's version (`NCCL version 2.24.3+cuda12.6`, or nccl-tests' `nccl-library=22403`)."""
    channels: Channels | None = None
    """NCCL's channel counts from the INFO lines; None: not reported."""
    line: int = 1
    """The run's first line in the file."""
    collnet: bool | None = None
    """CollNet (in-network reduction, IB SHARP) as the log says: NCCL_COLLNET_ENABLE from an
    INFO line, the echoed command or an environment dump; None: not said."""
    file: str = ""
    """The file, as the user named it (`path` without the run's line)."""


@dataclass(frozen=True)
class Given:
    """What the command line says about a log that the log may not (`TOOL[:GPUS]=FILE`)."""

    tool: str | None = None
    ranks: int | None = None


def parse_given(arg: str) -> tuple[Given, str]:
    """`TOOL=FILE`, `TOOL:GPUS=FILE` or `FILE`: what is given, and the file."""
    name, sep, rest = arg.partition("=")
    if not sep:
        return Given(), arg
    tool, colon, gpus = name.partition(":")
    if _tool_name(tool) is None:
        return Given(), arg  # a file whose name holds "="
    ranks = None
    if colon:
        if not (gpus.isascii() and gpus.isdigit()) or len(gpus) > MAX_DIGITS or not 1 <= int(gpus) <= MAX_WORLD_SIZE:
            raise UsageError(f"{name}=...: the GPU count after '{tool}:' must be a whole number from 1 to {MAX_WORLD_SIZE}, got {gpus!r}",
                             hint=f"e.g. {tool}:8={rest}")  # fmt: skip
        ranks = int(gpus)
    return Given(_tool_name(tool), ranks), rest


def read_logs(args: list[str], notes: list[str] | None = None) -> list[NcclTestsLog]:
    """Each argument is a log file, or `TOOL=FILE` / `TOOL:GPUS=FILE` for one that does not
    say which tool wrote it (or how many GPUs ran it); a file with several runs gives a log
    per run. Runs that failed before their first result, runs on 1 GPU, and runs that cannot
    be read in a file whose other runs can, are skipped and told in `notes`."""
    logs = []
    for arg in args:
        given, path = parse_given(arg)
        if not is_file(path):
            raise UsageError(f"cannot read nccl-tests log {path}: {'not a regular file' if _exists(path) else 'no such file'}",
                             hint="pass the text file nccl-tests' output was saved to")  # fmt: skip
        runs = parse_logs(read_text(path, path, LogError, "nccl-tests log"), path, given, notes)
        # A run on one GPU moves nothing between GPUs (NCCL copies within the GPU, or nothing
        # in place): nothing of the cluster to fit. Skipped and told, as a failed run is.
        for run in runs:
            if run.ranks == 1 and notes is not None:
                notes.append(f"skipped {run.path}: {run.tool} on 1 GPU moves no data between GPUs")
        if all(run.ranks == 1 for run in runs):
            raise LogError(f"every run of {path} is on 1 GPU: it moves no data between GPUs, nothing to fit",
                           SourceLoc(path, runs[0].line, 1, ""), hint="pass logs of runs on 2 GPUs or more")  # fmt: skip
        logs += [run for run in runs if run.ranks > 1]
    devices = {log.device for log in logs if log.device}
    if len(devices) > 1:
        raise LogError(f"the logs come from different GPUs ({', '.join(sorted(devices))}); calibrate one machine at a time",
                       hint="pass the logs of one cluster")  # fmt: skip
    return logs


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def parse_log(text: str, path: str = "<log>", given: Given | str | None = None) -> NcclTestsLog:
    """The one run of a log (see `parse_logs`); a log of several runs is an error."""
    logs = parse_logs(text, path, given)
    if len(logs) > 1:
        raise LogError(f"{len(logs)} runs in one log where one was expected", SourceLoc(path, logs[1].line, 1, ""))
    return logs[0]


def parse_logs(text: str, path: str = "<log>", given: Given | str | None = None, notes: list[str] | None = None) -> list[NcclTestsLog]:
    """Every run of an nccl-tests log with results, in order (see the module doc). `given`:
    what the command line says of runs that do not (a tool name alone is a `Given` of it);
    `notes` hears of runs skipped because they failed before their first result, or because
    they cannot be read (with why) where the log's other runs can; a log none of whose runs
    can be read is an error, the first run's."""
    if isinstance(given, str) or given is None:
        given = Given(_tool_name(given) if given else None)
    return _Reader(source_lines(text), path, given, notes).read()


def _tool_name(word: str | None) -> str | None:
    """The tool a program name is (`all_reduce_perf`, `./build/all_reduce_perf_mpi`), or None."""
    if not word:
        return None
    base = word.strip("'\"").rsplit("/", 1)[-1]
    if base.endswith("_mpi"):
        base = base[: -len("_mpi")]
    return base if base in TOOLS or base in OTHER_TOOLS else None


@dataclass
class _Run:
    """A run being read."""

    line: int
    """Its first line (the header, or the first line of a headerless table), 1-based."""
    header: bool
    tool: str | None = None
    tool_line: int = 0
    threads: int = 1
    gpus: int = 1
    graph: bool = False
    ranks: dict[int, tuple[str | None, str, str]] = field(default_factory=dict)
    """Rank: (host, device name, pid); the host None where the rank line has none."""
    listed_gpus: dict[tuple[str, str, str], tuple[int, int]] = field(default_factory=dict)
    """(host, device index, bus id) of each rank line that names its host: (rank, line)."""
    columns: tuple[str, ...] | None = None
    titled: bool = False
    """The columns are the log's own titles (not guessed from a row)."""
    points: list[Point] = field(default_factory=list)
    dtype: Dtype | None = None
    algo_lists: dict[OpKind, frozenset[Algo]] | None = None
    """NCCL_ALGO per collective (`parse_nccl_list`); None: not said."""
    proto_lists: dict[OpKind, frozenset[Protocol]] | None = None
    version: str | None = None
    channels: Channels | None = None
    closed: bool = False
    failure: str | None = None
    """The first line saying the test failed (`Test NCCL failure ...`)."""
    last: int = 0
    """The last line read into it."""
    collnet: bool | None = None
    """NCCL_COLLNET_ENABLE as the lines before or in the run set it (None: not said)."""
    redops: set[str] = field(default_factory=set)
    """The `redop` column's words (`none`, `sum`, ...): what tells a reducing tool from another."""
    roots: set[int] = field(default_factory=set)
    """The `root` column's values (-1: no root; broadcast and reduce name one)."""
    command_gpus: tuple[int, int] | None = None
    """The GPUs, and GPUs per thread, the echoed command that ran it says (`-g 8` alone: 8 and
    8; `mpirun -np 2 ... -g 4`: 8 and 4)."""
    nranks: int | None = None
    """The communicator's size as NCCL's INFO lines report it (`comm 0x... rank 0 nranks 16 ...`);
    what a table without its rank lines says of its GPU count."""
    bandwidths: list[tuple[float, float]] = field(default_factory=list)
    """(algbw, busbw) of out-of-place results of at least `_MIN_ALGBW` GB/s: their ratio is the tool's bus factor."""
    block: tuple[object, ...] | None = None
    """(dtype, redop, root) of its rows: a run of several types (`-d all`) or reductions (`-o all`)
    prints one block of rows for each, read as a run of its own."""
    origin: int | None = None
    """The first line of the run this one goes on from (`-d all`, `-o all`); None: not one."""
    mapped: tuple[int, str] | None = None
    """(line, type) of its first row of a type read as the dtype of its size (`SAME_SIZE_TYPES`)."""
    sweep: tuple[int, int, int, bool] | None = None
    """(minBytes, maxBytes, step, step is a factor) as its header (and `Reducing maxBytes`) says."""
    last_size: int | None = None
    """The size of its last row, read or skipped: where a run without its summary stopped."""
    validation: int | None = None
    """The header's `validation:` (`-c`); 0: the data was not checked, whatever #wrong says."""
    bw_formula: str | None = None
    """How its algbw is of its time (`_timed`): "size" (algbw = size / time), "old" (all_gather
    and reduce_scatter before mid-2020: the bytes but one rank's / time); None: not told yet."""
    old_bw_line: int = 0
    """The first row whose algbw is of the old formula only (0: none)."""
    refused: LogError | None = None
    """Why the run cannot be read (the first error in it): its other lines are read past, and a
    file of several runs reads the others."""
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Size: (line, column) of the rows of its sweep so far (nccl-tests times each size once a sweep)."""
    wrong: int = 0
    """The line of its first row that failed nccl-tests' data check (#wrong > 0; skipped); 0: none."""
    empty_rows: int = 0
    """Rows of size 0 (skipped: they time no data)."""
    in_place_checked: set[bool] = field(default_factory=set)
    """Of rows whose out-of-place data was checked (#wrong a count): whether the in-place one
    was too (a count) or not (N/A), which tells alltoall and sendrecv from the rest."""

    def lists_for(self, op: OpKind) -> tuple[frozenset[Algo] | None, frozenset[Protocol] | None]:
        """What NCCL_ALGO and NCCL_PROTO enable for the run's collective; None where they
        are not said, leave it everything, or do not apply (point-to-point ops)."""

        def enabled(lists: dict | None, names: dict) -> frozenset | None:
            chosen = lists.get(op) if lists is not None else None
            return None if chosen == frozenset(names.values()) else chosen

        return enabled(self.algo_lists, ALGO_NAMES), enabled(self.proto_lists, PROTO_NAMES)


class _Reader:
    def __init__(self, lines: tuple[str, ...], path: str, given: Given, notes: list[str] | None):
        self.lines = lines
        self.path = path
        self.given = given
        self.runs: list[_Run] = []
        self.run: _Run | None = None
        # What the text between runs says of the next one.
        self.next_tool: tuple[str, int] | None = None
        self.next_version: str | None = None
        self.next_collnet: bool | None = None
        self.next_ranks: dict[int, tuple[str | None, str, str]] = {}
        """`# Rank` lines outside a run (the log was cut above them): the ranks of the table that follows."""
        self.next_gpus: dict[tuple[str, str, str], tuple[int, int]] = {}
        self.next_nranks: int | None = None
        self.next_command_gpus: tuple[int, int] | None = None
        self.env_lists: dict[str, dict | None] = {}
        """NCCL_ALGO / NCCL_PROTO ("ALGO", "PROTO") as `export` set them: every later run's."""
        self.next_lists: dict[str, dict | None] = {}
        """The same as a command sets them for the run it starts (`NCCL_ALGO=Ring ./...`, `-x`)."""
        self.command: list[str] = []
        """The words of the command line being read (a command continued with `\\` spans lines)."""
        self.continues = False
        self.tool_at: int | None = None
        """Where in `command` the nccl-tests tool it runs is (None: it names none yet)."""
        self.notes = notes
        """Hears of the runs that ended before their first result (a sweep's failed test)."""
        self.told: set[tuple[str, str]] = set()
        """The NCCL_ALGO / NCCL_PROTO settings `notes` heard of."""
        self.rccl_told = False
        """Whether `notes` heard that the version is RCCL's (every run of rccl-tests prints it)."""

    def loc(self, i: int, col: int = 1) -> SourceLoc:
        return SourceLoc(self.path, i + 1, col, self.lines[i] if i < len(self.lines) else "")

    def read(self) -> list[NcclTestsLog]:
        for i, raw in enumerate(self.lines):
            stripped = raw.strip()
            if not stripped:
                continue
            line = _PREFIX.sub("", stripped, count=1)
            if _MPI_TAG.search(line):
                # mpirun --tag-output tags each write: nccl-tests prints a row in several
                line = " ".join(_MPI_TAG.sub(" ", line).split())
            if not line:
                continue
            col = raw.find(line) + 1 if line in raw else 1
            if _BARE_COMMENT.match(line):
                line, col = "# " + line, col - 2  # read as nccl-tests printed it; columns still count in the file's line
            elif not line.startswith("#") and "NCCL INFO" not in line and "NCCL WARN" not in line:
                cut = self._embedded(line)
                line, col = line[cut:], col + cut
            try:
                self._line(i, line, col)
            except LogError as e:
                self._refuse(e)
        run = self.run
        if run is not None and not run.closed:
            if not run.points and self.runs[:-1]:
                self._failed(run)  # the last run of a sweep failed; the others stand
            elif run.points and run.refused is None and self._whole(run):
                run.closed = True  # else refused as cut off (`_finish`)
        if not self.runs:
            raise LogError("not nccl-tests output: no `# nThread ... nGpus ...` header and no result table",
                           SourceLoc(self.path, 1, 1, self.lines[0] if self.lines else ""),
                           hint="pass the output of nccl-tests *_perf runs (all_reduce_perf, ...)")  # fmt: skip
        bare = [run for run in self.runs if not run.header and not run.ranks and not run.nranks and run.origin is None]
        if self.given.ranks is not None and len(bare) > 1:
            raise LogError(f"{len(bare)} result tables without a header or rank lines (lines {', '.join(str(r.line) for r in bare[:6])}): "
                           f"the GPU count given ({self.given.ranks}) cannot tell which runs it is of",
                           SourceLoc(self.path, bare[1].line, 1, self.lines[bare[1].line - 1]),
                           hint="save each run to a file of its own and give each its GPU count")  # fmt: skip
        logs, refused = [], []
        for run in self.runs:
            told = len(self.notes) if self.notes is not None else 0
            try:
                if run.refused is not None:
                    raise run.refused
                logs.append(self._finish(run))
            except LogError as e:
                refused.append((run, e))
                if self.notes is not None:
                    del self.notes[told:]  # what reading the refused run noted: its refusal says it
        if refused and not logs:
            raise refused[0][1]
        for run, e in refused:
            # A file of several runs (a sweep) reads those it can: each refused one is told, with why.
            if self.notes is not None:
                where = f" at line {e.loc.line}" if e.loc is not None else ""
                self.notes.append(f"skipped {self.path}:{run.line}: {'the ' + run.tool if run.tool else 'a'} run refused{where}: "
                                  f"{e.message}" + (f"; {e.hint}" if e.hint else ""))  # fmt: skip
        return logs

    def _refuse(self, e: LogError) -> None:
        """Take an error at a line of the open run as that run's (`_Run.refused`): the run's
        other lines are read past, and the file's other runs read; an error between runs is the
        file's, raised."""
        run = self.run
        if run is None or run.closed:
            raise e
        run.refused = run.refused or e

    def _whole(self, run: _Run) -> bool:
        """Whether a run without its closing summary finished all the same: its last row is the
        last size of the sweep its header sets (a paste that stops after the table); told."""
        last = _last_sizes(run.sweep) if run.sweep is not None else None
        # Tools that share a size among the ranks print it rounded down to whole elements per
        # rank (all_gather, alltoall, ...): at most the size of the loop, above the one before.
        if last is None or run.last_size is None or not last[0] < run.last_size <= last[1]:
            return False
        if self.notes is not None:
            self.notes.append(f"{self.path}:{run.line}: no closing `# Avg bus bandwidth` summary after the run's last row (line "
                              f"{run.last}), but that row's size {run.last_size} is the last of the sweep its header sets "
                              f"(maxBytes {run.sweep[1]}): read as a whole run")  # fmt: skip
        return True

    def _short_of(self, run: _Run) -> str:
        """Where a cut-off run stopped in its sweep, as a message adds it ("" where not said)."""
        last = _last_sizes(run.sweep) if run.sweep is not None else None
        if last is None or run.last_size is None or run.last_size >= last[1]:
            return ""
        return f" (its last row is of size {run.last_size}; its header's sweep goes on to {last[1]})"

    def _embedded(self, line: str) -> int:
        """Where nccl-tests' own text starts on a line that a logger prefixed (0: at its start)."""
        m = _EMBEDDED.search(line, 1)
        if m:
            return m.start()
        run = self.run
        if run is not None and not run.closed and run.columns is not None:
            m = _EMBEDDED_ROW.search(line)
            if m:
                return m.start()
        return 0

    def _line(self, i: int, line: str, col: int) -> None:
        run = self.run
        continued, self.continues = self.continues, False
        if "NCCL INFO" in line or "NCCL WARN" in line or _NCCL_VERSION.match(line) or _RCCL_VERSION.match(line):
            self._nccl(i, line, col)
            return
        open_table = run is not None and not run.closed and run.columns is not None
        words = line.split(None, 2)
        if open_table and (_NUMBER.match(line) and not (len(words) > 1 and words[1].isalpha()) or _mangled_row(run.columns, line)):
            # (`3 more processes have sent help message ...` of mpirun is text, not a row)
            self._result(i, line, col)
            return
        if open_table and not run.header and (run.points or run.refused) and (not line.startswith("#") or _RANK.match(line)):
            # A table without its header ends at the first other line (text, or the rank list of
            # another run): rows after it are another run's (a grep of several logs, say).
            run.closed = True
        if line.startswith("#"):
            self._comment(i, line, col)
            return
        tokens = line.split()
        if (run is None or run.closed) and len(tokens) >= 8 and tokens[0].isdigit() and tokens[1].isdigit():
            self._start(i, header=False)  # a table pasted without its header
            self.run.columns = ()
            self._result(i, line, col)
            return
        if run is not None and not run.closed and run.failure is None and "failure" in line.lower():
            run.failure = line[:120]  # nccl-tests' "Test NCCL failure common.cu:401 '...'", told if the run has no results
        self._collnet(line)
        self._shell_env(i, line)
        # Other text (a command echo, a banner, a warning, a code fence, an env dump): read past,
        # except a command that runs an nccl-tests tool, which names the next run's tool.
        # A command may go on over lines (`\`): its words are gathered (up to _COMMAND_WORDS, so
        # that no file of continued lines makes reading slow) and its GPU count read again as
        # options after the tool come in.
        prev = self.command if continued else []
        if not continued:
            self.tool_at = None
        if len(prev) >= _COMMAND_WORDS:
            return
        words = (prev + tokens)[:_COMMAND_WORDS]
        self.command, self.continues = words, line.endswith("\\")
        for k in range(len(prev), len(words)):
            tool = _tool_name(words[k]) if self.tool_at is None else None
            if tool is not None and run is not None and not run.closed and not run.points:
                # A command that runs a tool while a run waits for its first result: that run
                # is over (it hung, or was stopped), and the command starts the next.
                self._failed(run)
                run = None
            if tool is not None and (run is None or run.closed):
                self.next_tool, self.tool_at = (tool, i + 1), k
        if self.tool_at is not None and (run is None or run.closed):
            self.next_command_gpus = _command_gpus(words, self.tool_at)

    def _shell_env(self, i: int, line: str) -> None:
        """Take NCCL_ALGO / NCCL_PROTO from a shell line that sets them (`_SHELL_ENV`): an
        `export` for every later run, a command's own setting for the run it starts; `unset`
        drops both. A value NCCL would refuse is told, and its runs are NCCL's own choice."""
        for m in _SHELL_ENV.finditer(line):
            if m.group(4):  # unset
                self.env_lists.pop(m.group(4), None)
                self.next_lists.pop(m.group(4), None)
                continue
            which, value = m.group(2), m.group(3).strip("\"'")
            lists = self._nccl_list(i, which, value) if value else None
            (self.env_lists if m.group(1) else self.next_lists)[which] = lists

    def _nccl_list(self, i: int, which: str, value: str) -> dict | None:
        """NCCL_ALGO / NCCL_PROTO's value read as NCCL reads it; None (told once) where NCCL or
        commdsl would not take it."""
        known = ALGO_NAMES if which == "ALGO" else PROTO_NAMES
        try:
            return parse_nccl_list(value, known)
        except ValueError as e:
            # What NCCL itself refuses (its run fails) or a name commdsl does not know:
            # told, and the run simulated with NCCL's own choice.
            if self.notes is not None and (which, value) not in self.told:
                self.told.add((which, value))  # every rank prints it: told once
                self.notes.append(f"{self.path}:{i + 1}: NCCL_{which} {_short(value)} not read: {e} (it takes "
                                  f"{', '.join(known)}); the run is simulated with NCCL's own choice")  # fmt: skip
            return None

    def _collnet(self, line: str) -> bool:
        """Take NCCL_COLLNET_ENABLE from a line that sets or reports it, for the open run,
        else the next."""
        m = _COLLNET.search(line)
        if m is None:
            return False
        run = self.run
        if run is not None and not run.closed:
            run.collnet = m.group(1) != "0"
        else:
            self.next_collnet = m.group(1) != "0"
        return True

    def _nccl(self, i: int, line: str, col: int) -> None:
        run = self.run
        target_open = run is not None and not run.closed
        m = _NCCL_VERSION.search(line) or _RCCL_VERSION.search(line)
        if m:
            if target_open:
                run.version = m.group(1)
            else:
                self.next_version = m.group(1)
            if m.re is _RCCL_VERSION and self.notes is not None and not self.rccl_told:
                self.rccl_told = True
                self.notes.append(f"{self.path}:{i + 1}: RCCL {m.group(1)} (rccl-tests, AMD GPUs): read as the NCCL version "
                                  "it tracks")  # fmt: skip
            return
        if self._collnet(line):
            return
        m = _NRANKS.search(line)
        if m and (target_open or not self.runs):
            # The communicator's size, for a table without rank lines. Lines after a run (its
            # teardown) are not the next run's; communicators of different sizes say nothing (0).
            nranks = self._int(m.group(1), "nranks", i, col + m.start(1), 1, MAX_WORLD_SIZE)
            have = run.nranks if target_open else self.next_nranks
            nranks = nranks if have in (None, nranks) else 0
            if target_open:
                run.nranks = nranks
            else:
                self.next_nranks = nranks
            return
        if not target_open:
            return  # NCCL's lines after a run (teardown) say nothing of the next
        m = _ENV.search(line)
        if m:
            lists = self._nccl_list(i, m.group(1), m.group(2).rstrip("."))  # NCCL ends some of these lines with a period
            if m.group(1) == "ALGO":
                run.algo_lists = lists
            else:
                run.proto_lists = lists
            return
        m = _CHANNELS.search(line)
        if m:
            # NCCL prints its ring/tree channel count as the "collnet channels" too (init.cc),
            # so that count says nothing of CollNet.
            counts = []
            for k, name in enumerate(("coll", "collnet", "nvls", "p2p", "p2p per peer"), 1):
                lo = 0 if name in ("collnet", "nvls") else 1  # no NVLS (CollNet) is 0; NCCL runs one channel of the others at least
                word = m.group(k)
                counts.append(None if word is None else self._int(word, f"{name} channels", i, col + m.start(k), lo, MAX_CHANNELS))
            coll, _, nvls, p2p, per_peer = counts
            new = Channels(coll, nvls, p2p, per_peer)
            # Every rank reports them; NCCL agrees on one count across ranks, so the least is kept.
            run.channels = new if run.channels is None else Channels(
                min(run.channels.coll, coll), None if nvls is None or run.channels.nvls is None else min(run.channels.nvls, nvls),
                min(run.channels.p2p, p2p), min(run.channels.p2p_per_peer, per_peer))  # fmt: skip

    def _start(self, i: int, header: bool) -> None:
        run = self.run
        if run is not None and not run.header and run.points:
            run.closed = True  # a pasted table has no summary: the next run ends it
        if run is not None and not run.closed:
            if not run.points:
                self._failed(run)
            elif run.refused is None and not self._whole(run):
                run.refused = LogError(f"a new run starts here but the run of line {run.line} has no closing `# Avg bus bandwidth` "
                                       f"summary: it was cut off{self._short_of(run)}", self.loc(i),
                                       hint="rerun the cut-off test, or cut its lines out")  # fmt: skip
            run.closed = True
        self.run = _Run(i + 1, header)
        self.runs.append(self.run)
        if self.next_tool is not None:
            self.run.tool, self.run.tool_line = self.next_tool
        self.run.version = self.next_version  # a run's own: the next prints its own, or none
        self.run.collnet = self.next_collnet
        lists = {**self.env_lists, **self.next_lists}
        self.run.algo_lists, self.run.proto_lists = lists.get("ALGO"), lists.get("PROTO")
        if not header:
            self.run.ranks, self.run.listed_gpus = self.next_ranks, self.next_gpus
            self.run.nranks, self.run.command_gpus = self.next_nranks, self.next_command_gpus
        self.next_tool, self.next_ranks, self.next_gpus, self.next_nranks, self.next_command_gpus = None, {}, {}, None, None
        self.next_version, self.next_lists = None, {}

    def _no_results(self, run: _Run) -> LogError | None:
        """Why a run without results has none where its rows were all skipped: they failed
        nccl-tests' data check (the error at the first); None: it had no rows."""
        if run.wrong:
            return LogError(f"every result of the run of line {run.line} failed nccl-tests' data check (#wrong above 0): nothing to fit",
                           self.loc(run.wrong - 1), hint="the GPUs or the network corrupted data; fix the cluster and rerun the test")  # fmt: skip

    def _failed(self, run: _Run) -> None:
        """End a run that ended before its first result: dropped and told, as it measured
        nothing; kept, refused, where its rows were all skipped (`_no_results`) or it is refused."""
        run.closed = True
        run.refused = run.refused or self._no_results(run)
        if run.refused is not None:
            return
        self.runs.remove(run)
        what = f"{self.path}:{run.line}: {run.tool or 'a run'} ended before its first result" + (f" ({run.failure})" if run.failure else "")
        if self.notes is not None:
            self.notes.append(f"skipped {what}")

    def _comment(self, i: int, line: str, col: int) -> None:
        m = _TOOL.match(line)
        if m:
            tool = _tool_name(m.group(1))
            if tool is None:
                raise LogError(f"nccl-tests tool '{m.group(1)}' is not one calibrate reads (it reads: {', '.join(TOOLS)})", self.loc(i))
            self.next_tool = (tool, i + 1)
            return
        m = _TESTS_VERSION.match(line)
        if m:
            code = int(m.group(1))  # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9
            self.next_version = f"{code // 10000}.{code // 100 % 100}.{code % 100}" if code >= 20900 else None
            return
        m = _HEADER.match(line)
        if m:
            self._start(i, header=True)
            run = self.run
            run.threads = self._int(m.group(1), "nThread", i, col + m.start(1), 1, MAX_WORLD_SIZE)
            run.gpus = self._int(m.group(2), "nGpus", i, col + m.start(2), 1, MAX_WORLD_SIZE)
            g = _GRAPH.search(line, m.start(3))
            if g:
                run.graph = self._int(g.group(1), "graph", i, col + g.start(1), 0, 1 << 30) > 0
            v = _VALIDATION.search(line, m.start(3))
            if v:
                run.validation = int(v.group(1))
            s = _SWEEP.search(line, m.start(3))
            if s:
                run.sweep = (int(s.group(1)), int(s.group(2)), int(s.group(3)), s.group(4) == "factor")
            return
        run = self.run
        m = _REDUCED_MAX.match(line)
        if m and run is not None and not run.closed and run.sweep is not None:
            low, _, step, factor = run.sweep
            high = int(m.group(1))
            run.sweep = (min(low, high), high, step, factor)  # nccl-tests lowers minBytes with it
            return
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            if run is None or run.closed or run.columns is not None:
                self._start(i, header=False)  # column titles pasted without the header above them
                run = self.run
            run.columns, run.titled = tuple(tokens), True
            if not any(t in _TIME_COLUMNS for t in tokens) or "type" not in tokens:
                raise LogError("column titles without `time` and `type`: not nccl-tests' table", self.loc(i, col))
            return
        m = _RANK.match(line)
        if run is None or run.closed:
            if m:  # the rank list of a run whose header was cut off: kept for the table that follows
                self._rank(i, col, m, self.next_ranks, self.next_gpus)
            return  # other comments before any run, or between runs (`# Collective test concluded`)
        if line.startswith("# Avg bus bandwidth"):
            run.closed = True
            run.last = i + 1
            if run.refused is None and (run.columns is None or not run.points):
                hint = "the run failed, or its rows were cut out of the log; rerun it, or save the whole table"
                run.refused = self._no_results(run) or LogError("a closing summary with no results before it", self.loc(i), hint=hint)
            return
        if m and run.refused is None:
            self._rank(i, col, m, run.ranks, run.listed_gpus)

    def _rank(self, i: int, col: int, m: re.Match[str], ranks: dict[int, tuple[str | None, str, str]],
              gpus: dict[tuple[str, str, str], tuple[int, int]]) -> None:  # fmt: skip
        """Take one `# Rank R ... on HOST device D [BUS] NAME` line into `ranks` (and its GPU into `gpus`)."""
        r = self._int(m.group(1), "rank", i, col + m.start(1), 0, MAX_WORLD_SIZE - 1,
                      hint=f"a run has at most {MAX_WORLD_SIZE} ranks (commdsl.limits.MAX_WORLD_SIZE)")  # fmt: skip
        if r in ranks:
            host, _, pid = ranks[r]
            if r == 0 and len(ranks) == 1 and (host, pid) != (m.group(3), m.group(2)):
                # nccl-tests without MPI support, started by mpirun or srun: every process runs the
                # test alone on its GPU and calls itself rank 0 (nccl-tests' README, "MPI=1").
                raise LogError(f"rank 0 is listed by two processes (pid {pid} on {host}, pid {m.group(2)} on {m.group(3)}): each "
                               "ran its own test on 1 GPU, not one test across them (nccl-tests built without MPI support and "
                               "started by mpirun or srun?)", self.loc(i),
                               hint="build nccl-tests with `make MPI=1` and rerun, or run one process with -g N")  # fmt: skip
            raise LogError(f"rank {r} is listed twice (mixed runs in one file?)", self.loc(i))
        if len(ranks) >= MAX_WORLD_SIZE:
            raise LogError(f"more than {MAX_WORLD_SIZE} ranks: the most a run may have (commdsl.limits.MAX_WORLD_SIZE)", self.loc(i))
        self._int(m.group(4), "device", i, col + m.start(4), 0, MAX_WORLD_SIZE)
        host, device, bus = m.group(3), m.group(4), m.group(5).strip()
        if host is not None and bus:
            # Two ranks on one host with the same device and bus id share one GPU (several
            # processes given the same CUDA device): their times are not of as many GPUs.
            if (host, device, bus) in gpus:
                other, line = gpus[(host, device, bus)]
                raise LogError(f"ranks {other} and {r} run on one GPU (device {device} [{bus}] of host {host}; rank {other} at "
                               f"line {line}): the timings are of ranks sharing a GPU, not of a GPU each", self.loc(i),
                               hint="give each rank its own GPU (CUDA_VISIBLE_DEVICES, the launcher's GPU binding) and rerun")  # fmt: skip
            gpus[(host, device, bus)] = (r, i + 1)
        ranks[r] = (host, m.group(6), m.group(2))

    def _result(self, i: int, line: str, col: int) -> None:
        run = self.run
        if run.refused is not None:
            run.last = i + 1  # a row of a run that cannot be read: read past
            return
        tokens = line.split()
        starts = _starts(line)
        columns = run.columns or _guess_columns(tokens)
        if not run.columns:
            run.columns = columns
        need = len(columns)
        if len(tokens) == need - 1 and run.titled and "redop" in columns and _is_number(tokens[columns.index("redop")]):
            k = columns.index("redop")  # alltoall before nccl-tests 2.13 printed its redop blank
            tokens.insert(k, "")
            starts.insert(k, starts[k])
        if len(tokens) < need:
            raise LogError(f"a cut-off result line: {len(tokens)} columns, the table has {need} ({' '.join(columns)})", self.loc(i),
                           hint="the log is truncated or mangled; rerun the test or drop the line")  # fmt: skip

        def at(k: int) -> int:
            return col + starts[k]

        size = self._int(tokens[0], "size", i, at(0), 0, MAX_SIZE_BYTES)
        count = self._int(tokens[1], "count", i, at(1), 0, MAX_SIZE_BYTES)
        t = columns.index("type")
        type_name = tokens[t]
        dtype = TYPES.get(type_name) or SAME_SIZE_TYPES.get(type_name)
        if dtype is None:
            raise LogError(f"type {_short(type_name)!r} is not one nccl-tests prints ({', '.join(TYPES)}, {', '.join(SAME_SIZE_TYPES)})",
                           self.loc(i, at(t)), hint="the row is mangled; rerun the test or drop the line")  # fmt: skip
        redop = tokens[columns.index("redop")] if "redop" in columns else None
        if redop is not None and redop not in (*REDOPS, ""):  # "": old alltoall's blank (see above)
            k = columns.index("redop")
            raise LogError(f"redop {_short(redop)!r} is not one nccl-tests prints ({', '.join(REDOPS)})", self.loc(i, at(k)))
        root = None
        if "root" in columns:
            k = columns.index("root")
            root = self._int(tokens[k], "root", i, at(k), -1, MAX_WORLD_SIZE - 1)
        block = (type_name,) + tuple(v for v in (redop, root) if v is not None)  # the name: uint32 and int32 are blocks of their own
        if run.block is not None and block != run.block:
            run = self._split(i, run, block)  # `-d all` / `-o all`: the rows of the next type or reduction
        run.block, run.dtype = block, dtype
        if type_name in SAME_SIZE_TYPES:
            run.mapped = run.mapped or (i, type_name)
        run.last_size = size
        if size > 0:
            self._new_size(i, run, size, at(0))
        # all_gather and reduce_scatter before mid-2020 (titles without root) printed another algbw (`_timed`)
        old = "root" not in columns and run.titled and (run.tool or self.given.tool) in (None, *_OLD_ALGBW)
        moved = size - count * dtype.itemsize if old else None
        groups = [self._timed(i, tokens, columns, k, size, at, moved) for k, c in enumerate(columns) if c in _TIME_COLUMNS][:2]
        groups += [(None, None, None)] * (2 - len(groups))
        (time, bandwidths, checked), (in_place, _, checked_in_place) = groups
        wrong, wrong_in_place = (w if w is not None and w != "N/A" and float(w) > 0 else None for w in (checked, checked_in_place))
        if time is None and in_place is None:
            raise LogError("no time on this result line (N/A out of place and in place)", self.loc(i, at(0)))
        run.last = i + 1
        if wrong or wrong_in_place:
            # nccl-tests' check of the data failed: the time is of an op that went wrong.
            run.wrong = run.wrong or i + 1
            if self.notes is not None:
                where = " and ".join(f"{w} {what}" for w, what in ((wrong, "out of place"), (wrong_in_place, "in place")) if w)
                self.notes.append(f"{self.path}:{i + 1}: the result of size {size} skipped: nccl-tests found wrong elements (#wrong {where})")
            return
        # What the row says of its tool, for a log that does not name it (`_infer_tool`).
        if redop is not None:
            run.redops.add(redop)
        if root is not None:
            run.roots.add(root)
        if bandwidths is not None and bandwidths[0] >= _MIN_ALGBW:
            run.bandwidths.append(bandwidths)
        if checked not in (None, "N/A") and checked_in_place is not None and run.validation != 0:
            # (with `validation: 0` some versions print 0 in both columns: it says nothing)
            run.in_place_checked.add(checked_in_place != "N/A")
        if size > 0:
            # Out of place is what a schedule's op does; a run of in-place ops only times that.
            run.points.append(Point(size, time if time is not None else in_place, in_place, i + 1))
        else:
            run.empty_rows += 1  # nothing moved (a count that rounds to 0 per rank): no time to fit

    def _new_size(self, i: int, run: _Run, size: int, col: int) -> None:
        """Take a row's size into its sweep: nccl-tests times each size once a sweep, so a size
        twice is a mangled log (or two merged), except where `-N` (run_cycles) starts the sweep
        again from its first size."""
        if size in run.sizes:
            first, last = next(iter(run.sizes)), next(reversed(run.sizes))
            if size != first or last == size:
                line, column = run.sizes[size]
                raise LogError(f"size {size} is listed twice in the run: first at line {line}", self.loc(i, col),
                               hint="nccl-tests times each size once; the log is mangled or holds two runs' rows: cut the wrong ones out",
                               related=(("first here", self.loc(line - 1, column)),))  # fmt: skip
            run.sizes = {}  # -N: the next sweep
        run.sizes[size] = (i + 1, col)

    def _timed(self, i: int, tokens: list[str], columns: tuple[str, ...], k: int, size: int, at: Callable[[int], int],
               moved: int | None = None) -> tuple[float | None, tuple[float, float] | None, str | None]:  # fmt: skip
        """The time of column `k` (None: N/A), its (algbw, busbw) and its `#wrong` (the word: a
        count, or N/A where the data was not checked; None: no such column, or no time), each
        in nccl-tests' form; a time must agree with its algbw (`_agree`): algbw = size / time,
        or, where `moved` is given (`_result`), algbw = moved / time as all_gather and
        reduce_scatter printed it before mid-2020, the same in every row of the run. A time's
        columns are the first of each name after it."""
        word = tokens[k]
        if word == "N/A":
            return None, None, None
        time = self._time(word, size, i, at(k))
        own: dict[str, int] = {}
        for j in range(k + 1, len(columns)):
            if columns[j] in _TIME_COLUMNS:
                break
            own.setdefault(columns[j], j)
        bandwidths = []
        for name in ("algbw", "busbw"):
            j = own.get(name)
            if j is not None and not (_PRINTED.fullmatch(tokens[j]) and math.isfinite(float(tokens[j]))):
                raise LogError(f"{name} {_short(tokens[j])!r} is not a bandwidth as nccl-tests prints it (GB/s, digits and "
                               "a decimal point)", self.loc(i, at(j)), hint="the row is mangled; rerun the test or drop the line")  # fmt: skip
            bandwidths.append(None if j is None else float(tokens[j]))
        j = own.get("algbw")
        # A cputime column (-C 1) is the host's time; algbw is of the GPU's.
        if j is not None and columns[k] == "time":
            self._check_algbw(i, size, word, tokens[j], moved, at(k))
        j = own.get("#wrong")
        if j is not None and tokens[j] != "N/A":
            if not _WRONG.fullmatch(tokens[j]):
                raise LogError(f"#wrong {_short(tokens[j])!r} is not a count of wrong elements as nccl-tests prints it "
                               "(a whole number, or N/A)", self.loc(i, at(j)))  # fmt: skip
        wrong = tokens[j] if j is not None else None
        both = (bandwidths[0], bandwidths[1]) if None not in bandwidths else None
        return time, both, wrong

    def _check_algbw(self, i: int, size: int, time: str, algbw: str, moved: int | None, col: int) -> None:
        """A row's time against its algbw (see `_timed`): an error where they disagree."""
        run = self.run
        # Before nccl-tests ec1b5e2 (June 2020) all_gather and reduce_scatter printed algbw =
        # busbw = count x type size x (nranks - 1) / time, `count` being each rank's part: the
        # size less one rank's part (`moved`). The time is the op's all the same.
        fits = {"size": _agree(size, time, algbw), "old": moved is not None and moved >= 0 and _agree(moved, time, algbw)}
        if fits["size"] != fits["old"]:  # the row tells the formulas apart (small ones fit both)
            formula = "size" if fits["size"] else "old"
            if run.bw_formula not in (None, formula):
                said = {"size": "size / time", "old": "(size - count x type size) / time"}
                raise LogError(f"time {time} us and algbw {algbw} GB/s agree with algbw = {said[formula]}, where the rows above have "
                               f"algbw = {said[run.bw_formula]}", self.loc(i, col),
                               hint="the row is mangled, or the table mixes two runs' rows; rerun the test or drop the line")  # fmt: skip
            run.bw_formula = formula
            if formula == "old":
                run.old_bw_line = run.old_bw_line or i + 1
        if not (fits["size"] or fits["old"]):
            t = float(time)
            also = (f", or {moved} B (the size less one rank's part) as all_gather and reduce_scatter printed it before mid-2020"
                    if moved is not None and moved > 0 else "")  # fmt: skip
            raise LogError(f"time {time} us and algbw {algbw} GB/s disagree: {size} B in {time} us is "
                           f"{size / (t * 1e3):.4g} GB/s (nccl-tests prints algbw = size / time{also})", self.loc(i, col),
                           hint="the row is mangled; rerun the test or drop the line")  # fmt: skip

    def _bare_hint(self, hint: str) -> str:
        """What to do of a table that does not say its tool or GPU count: with the file's other
        runs, a GPU count given with the file would be theirs too."""
        if len(self.runs) == 1:
            return hint
        return (f"the file has {len(self.runs)} runs: cut this table out, or save it to a file of its own and pass that as "
                "TOOL:GPUS=TABLE (e.g. all_reduce_perf:8=table.txt)")

    def _split(self, i: int, run: _Run, block: tuple[object, ...]) -> _Run:
        """End `run` at line `i` (0-based), where its rows turn to another type or reduction,
        and go on with a run of the same GPUs and settings for the rows from there."""
        run.closed = True
        new = replace(run, line=i + 1, points=[], dtype=None, redops=set(), roots=set(), bandwidths=[], block=None, mapped=None,
                      closed=False, last=0, failure=None, sizes={}, wrong=0)  # fmt: skip
        self.runs.append(new)
        self.run = new
        if self.notes is not None and run.origin is None:
            self.notes.append(f"{self.path}:{run.line}: the run times several types or reductions (-d all, -o all): the rows of "
                              "each are read as a run of its own, named by their first line")  # fmt: skip
        new.origin = run.origin or run.line
        return new

    def _partial(self, run: _Run, count: int, top: int, source: str) -> None:
        """Check and tell the GPU count of a run whose rank list has ranks missing, as `source`
        says it: the count given, NCCL's, the command's, or the highest rank listed + 1."""
        if count < top:
            raise LogError(f"rank {top - 1} is listed, and the run has {count} GPUs as {source}", self.loc(run.line - 1),
                           hint=f"give the run's GPU count: TOOL:GPUS=FILE, e.g. all_reduce_perf:{top}={self.path}")  # fmt: skip
        if self.notes is not None:
            listed = ", ".join(map(str, sorted(run.ranks)[:8])) + (", ..." if len(run.ranks) > 8 else "")
            self.notes.append(f"{self.path}:{run.line}: the rank list names only ranks {listed}: read as {count} GPUs, as {source}, "
                              "the nodes not said")  # fmt: skip

    def _infer_tool(self, run: _Run, ranks: int, fits: list[str]) -> str | None:
        """The tool of a run that does not name it, where its columns (`fits`) fit one tool
        only and say enough (some results of at least `_MIN_ALGBW` GB/s); told in `notes`."""
        if len(fits) != 1 or not run.bandwidths:
            return None
        tool = fits[0]
        if self.notes is not None:
            said = _columns_said(run)
            factor = 1.0 if run.bw_formula == "old" else bus_factor(TOOLS[tool], ranks)
            self.notes.append(f"{self.path}:{run.line}: the log does not name its tool; read as {tool} from its columns "
                              f"({said + ', ' if said else ''}busbw = {factor:.4g} x algbw on {ranks} GPUs)")  # fmt: skip
        return tool

    def _time(self, word: str, size: int, i: int, col: int) -> float:
        try:
            v = float(word) if len(word) <= 40 else math.nan
        except ValueError:
            raise LogError(f"time {_short(word)!r} is not a number", self.loc(i, col)) from None
        if not math.isfinite(v) or v < 0.0 or (v == 0.0 and size > 0):
            raise LogError(f"time {_short(word)} us: times are positive finite numbers", self.loc(i, col))
        if v > MAX_MACHINE_TIME_US:
            raise LogError(f"time {_short(word)} us is above the limit of {MAX_MACHINE_TIME_US:g} us (commdsl.limits.MAX_MACHINE_TIME_US)", self.loc(i, col))
        if not _PRINTED.fullmatch(word):  # float() also reads `1_000`, `+5`, `1e-300` and other scripts' digits
            raise LogError(f"time {_short(word)!r} is not a time as nccl-tests prints it (us, digits and at most two decimals)",
                           self.loc(i, col), hint="the row is mangled; rerun the test or drop the line")  # fmt: skip
        return v

    def _int(self, word: str, what: str, i: int, col: int, lo: int, hi: int, hint: str | None = None) -> int:
        digits = word[1:] if word.startswith("-") else word  # nccl-tests prints no `+`
        if not digits.isdigit() or not digits.isascii():
            raise LogError(f"{what} {_short(word)!r} is not a whole number", self.loc(i, col))
        if len(digits) > MAX_DIGITS or not lo <= int(word) <= hi:
            raise LogError(f"{what} {_short(word)} is out of range: it must be from {lo} to {hi}", self.loc(i, col), hint=hint)
        return int(word)

    def _finish(self, run: _Run) -> NcclTestsLog:
        path = self.path if len(self.runs) == 1 else f"{self.path}:{run.line}"

        def at(line: int) -> SourceLoc:
            return SourceLoc(self.path, line, 1, self.lines[line - 1] if 0 < line <= len(self.lines) else "")

        end = run.last or run.line
        why = self._no_results(run) if not run.points else None
        if why is not None:
            raise why
        if run.mapped is not None and self.notes is not None:
            line, name = run.mapped
            self.notes.append(f"{self.path}:{line + 1}: rows of type {name} read as {run.dtype.value}, its element size (commdsl has "
                              f"no {name}; an op's time is of its bytes and reduction)")  # fmt: skip
        if run.empty_rows and run.points and self.notes is not None:
            self.notes.append(f"{self.path}:{run.line}: {run.empty_rows} row(s) of size 0 skipped (they move no data)")
        if not run.closed:
            if not run.points:
                failure = f": {run.failure}" if run.failure else ""
                raise LogError(f"no results: the run of line {run.line} ends before its first result line{failure}", at(len(self.lines)),
                               hint="the run failed or the log is cut off")  # fmt: skip
            if run.header:
                raise LogError(f"truncated: the run of line {run.line} ends at line {end} without nccl-tests' closing "
                               f"`# Avg bus bandwidth` summary{self._short_of(run)}", at(len(self.lines)),
                               hint="the run did not finish; rerun it, or cut the log after its last whole line and add the summary")  # fmt: skip
        given = self.given
        tool = run.tool
        if given.tool is not None and tool is not None and given.tool != tool:
            raise LogError(f"the log is {tool}'s, not {given.tool}'s as the command line says", at(run.tool_line))
        tool = tool or given.tool
        # The run lists its ranks (`# Rank` lines); a table without them has only what the
        # command line or NCCL says.
        said = run.nranks or None
        # (a header whose rank lines were cut out, given its GPU count, reads as a table without them)
        listed = bool(run.ranks) or (run.header and given.ranks is None and said is None)
        # A rank list with ranks missing (a wrapper's own header, a log abridged by hand) does not
        # say the GPU count: the count given overrides it, or NCCL's, or, without nccl-tests'
        # header (which lists every rank), the highest rank listed + 1 (`_partial`).
        top = max(run.ranks) + 1 if run.ranks else 0
        partial = top > len(run.ranks) and (given.ranks is not None or said is not None or not run.header)
        listed = listed and not partial
        if not listed and given.ranks is not None and said is not None and given.ranks != said:
            raise LogError(f"the run has {said} GPUs (NCCL's INFO lines: nranks {said}), not {given.ranks} as the command line says",
                           at(run.line))  # fmt: skip
        command = run.command_gpus or (None, 1)
        ranks_known = len(run.ranks) if listed else given.ranks or said or command[0] or (top if partial else None)
        if partial:
            source = ("the command line gives" if given.ranks is not None else f"NCCL's INFO lines say (nranks {said})" if said
                      else "the command that ran it says" if command[0] else "the highest rank listed + 1")  # fmt: skip
            self._partial(run, ranks_known, top, source)
        elif not listed and given.ranks is None and ranks_known is not None and self.notes is not None:
            source = f"NCCL's INFO lines say (nranks {said})" if said else "the command that ran it says"
            self.notes.append(f"{self.path}:{run.line}: a table without rank lines; read as {ranks_known} GPUs, as {source}")
        fits = _tools_fitting(run, ranks_known) if ranks_known else list(TOOLS)
        if tool is None and ranks_known:
            tool = self._infer_tool(run, ranks_known, fits)
        elif run.tool is None and tool in TOOLS and ranks_known and run.bandwidths and tool not in fits:
            # The first field that is not the named tool's decides, and the message names it.
            fit = f"; its columns fit {_either(fits)}" if fits else f"; its columns fit no nccl-tests tool on {ranks_known} GPUs"
            hint = (f"name the tool that wrote it, e.g. {fits[0]}={self.path}" if fits else
                    "check the tool and the GPU count (TOOL:GPUS=FILE); a fork of nccl-tests may print its columns otherwise")  # fmt: skip
            raise LogError(f"the run of line {run.line} is not {tool}'s, as the command line says: {_misfit(run, tool, ranks_known)}{fit}",
                           at(run.line), hint=hint)  # fmt: skip
        if tool is None and not listed and ranks_known is None:
            raise LogError(f"a result table without nccl-tests' header (line {run.line}): the log does not say which tool wrote it "
                           "or how many GPUs ran it", at(run.line), hint=self._bare_hint(f"name both: TOOL:GPUS=FILE, e.g. all_reduce_perf:8={self.path}"))  # fmt: skip
        if tool is None:
            said = f"; its columns fit {_either(fits)}" if 1 < len(fits) < len(TOOLS) else ""
            example = fits[0] if fits else "all_reduce_perf"
            hint = (f"name it: TOOL=FILE, e.g. {example}={self.path}" if len(self.runs) == 1 else
                    f"a tool named for the file is every run's: save the run of line {run.line} to a file of its own and name it, "
                    f"e.g. {example}=PART")  # fmt: skip
            raise LogError(f"cannot tell which nccl-tests tool wrote the run of line {run.line} (no `# Collective test starting:` "
                           f"line, no command naming it{said})", at(run.line), hint=hint)  # fmt: skip
        if tool not in TOOLS:
            raise LogError(f"nccl-tests tool '{tool}' is not one calibrate reads (it reads: {', '.join(TOOLS)})", at(run.tool_line or run.line))
        if not listed:
            if ranks_known is None:
                raise LogError(f"a result table without nccl-tests' header (line {run.line}): the log does not say how many GPUs ran it",
                               at(run.line), hint=self._bare_hint(f"name the tool and the GPU count: {tool}:GPUS=FILE, e.g. {tool}:8={self.path}"))  # fmt: skip
            per_thread = command[1] if command[0] == ranks_known else 1  # `-g` of the command that ran these GPUs
            if partial and run.header and ranks_known % run.gpus == 0:
                per_thread = run.gpus
            names = {name for _, name, _ in run.ranks.values()}  # a partial list's GPUs
            device = names.pop() if len(names) == 1 else ""
            return NcclTestsLog(path, tool, TOOLS[tool], ranks_known, per_thread, None, None, run.graph, run.dtype, device,
                                tuple(run.points), *run.lists_for(TOOLS[tool]), run.version, run.channels, run.line, run.collnet, self.path)  # fmt: skip
        ranks = run.ranks
        if not ranks:
            raise LogError("no `# Rank N ... on HOST device D` lines: cannot tell the GPUs", at(run.line),
                           hint=f"give the GPU count: TOOL:GPUS=FILE, e.g. {tool}:8={self.path}")  # fmt: skip
        n = len(ranks)
        if max(ranks) != n - 1:
            missing = sorted(set(range(max(ranks) + 1)) - set(ranks))[:10]
            raise LogError(f"ranks {missing} are missing from the rank list (ranks 0..{max(ranks)})", at(run.line),
                           hint=f"if the log was abridged, give the run's GPU count: TOOL:GPUS=FILE, e.g. {tool}:{max(ranks) + 1}={self.path}")  # fmt: skip
        if given.ranks is not None and given.ranks != n:
            raise LogError(f"the run has {n} GPUs, not {given.ranks} as the command line says", at(run.line))
        if said is not None and said != n:
            raise LogError(f"the run lists {n} ranks, and NCCL's INFO lines say its communicator has {said} (nranks {said})", at(run.line),
                           hint="lines of another run mixed in, or a run of split communicators (NCCL_TESTS_SPLIT): calibrate reads "
                                "runs of one communicator of all the ranks")  # fmt: skip
        devices = {name for _, name, _ in ranks.values()}
        if len(devices) > 1:
            raise LogError(f"the run mixes GPUs ({', '.join(sorted(devices))})", at(run.line))
        per_thread = run.gpus
        if n % per_thread:
            raise LogError(f"{n} ranks is not a multiple of nGpus {per_thread} (each thread drives nGpus GPUs): mixed runs?", at(run.line))
        per_process: dict[tuple[str | None, str], int] = {}
        per_host: dict[str | None, int] = {}
        for host, _, pid in ranks.values():
            per_process[(host, pid)] = per_process.get((host, pid), 0) + 1
            per_host[host] = per_host.get(host, 0) + 1
        if not run.header and len(set(per_process.values())) == 1:
            per_thread = next(iter(per_process.values()))  # no header (cut above the rank lines): each process drives its ranks
        if any(c != per_thread * run.threads for c in per_process.values()):
            counts = sorted(set(per_process.values()))
            raise LogError(f"processes drive different numbers of GPUs ({', '.join(map(str, counts))}; nThread x nGpus is "
                           f"{per_thread * run.threads}): mixed runs?", at(run.line))  # fmt: skip
        nodes: int | None = len(per_host)
        if None in per_host:
            # Rank lines without their hosts (taken out before the log was shared): one process
            # runs on one host; the hosts of several are not said.
            nodes = 1 if len(per_process) == 1 else None
            if nodes is None and self.notes is not None:
                self.notes.append(f"{self.path}:{run.line}: the rank lines name no hosts: read as {n} GPUs of "
                                  f"{len(per_process)} processes, the nodes not said")  # fmt: skip
        elif len(set(per_host.values())) > 1:
            counts = ", ".join(f"{h}: {c}" for h, c in sorted(per_host.items())[:8])
            raise LogError(f"the hosts run different numbers of GPUs ({counts}): calibrate reads runs with the same GPUs on every node",
                           at(run.line))  # fmt: skip
        per_node = n // nodes if nodes else None
        return NcclTestsLog(path, tool, TOOLS[tool], n, per_thread, nodes, per_node, run.graph, run.dtype, devices.pop(),
                            tuple(run.points), *run.lists_for(TOOLS[tool]), run.version, run.channels, run.line, run.collnet, self.path)  # fmt: skip


def parse_nccl_list(value: str, known: dict[str, T]) -> dict[OpKind, frozenset[T]]:
    """NCCL_ALGO or NCCL_PROTO as NCCL reads it (tuning.cc `parseList`): per collective,
    what it enables. `ring,tree` enables those for every collective, `^nvls` all but NVLS;
    `;`-separated entries after the first name their collective (`allreduce:tree`) and
    replace its list; names in any case. `known` maps lower-case names to values. A
    ValueError says what NCCL refuses (a later entry without its collective, an unknown
    collective or name)."""
    out = {op: frozenset(known.values()) for op in NCCL_FUNCTIONS.values()}
    for index, entry in enumerate(x for x in value.split(";") if x):
        prefix, colon, names = entry.partition(":")
        if not colon:
            if index:
                raise ValueError(f"'{entry}' names no collective, as every entry after the first must")
            ops, names = tuple(out), prefix
        elif prefix.lower() in NCCL_FUNCTIONS:
            ops = (NCCL_FUNCTIONS[prefix.lower()],)
        else:
            raise ValueError(f"'{prefix}' is no collective of NCCL's ({', '.join(NCCL_FUNCTIONS)})")
        exclude = names.startswith("^")
        chosen = set()
        for name in (x for x in names.removeprefix("^").split(",") if x):
            if name.lower() not in known:
                raise ValueError(f"'{name}' is not one of its names")
            chosen.add(known[name.lower()])
        enabled = frozenset(v for v in known.values() if (v in chosen) != exclude)
        for op in ops:
            out[op] = enabled
    return out


def _tools_fitting(run: _Run, ranks: int) -> list[str]:
    """The tools whose output a run's columns fit on `ranks` GPUs (`_misfit`)."""
    return [tool for tool in TOOLS if _misfit(run, tool, ranks) is None]


def _misfit(run: _Run, tool: str, ranks: int) -> str | None:
    """Why a run's columns are not `tool`'s output on `ranks` GPUs, the first field that says
    so, as a message quotes it; None where they fit it: the `redop` word (a reduction or
    `none`; blank: old alltoall's), titles of before 2.13 (each tool had its own), the `root`
    (a rank or -1), whether the in-place results were checked, the algbw of before mid-2020,
    and every busbw / algbw ratio (the tool's bus factor, within the columns' rounding)."""
    if "" in run.redops and tool != "alltoall_perf":
        return "its redop is blank, as only alltoall_perf printed it (before nccl-tests 2.13)"
    words = run.redops - {""}
    if words and (words != {"none"}) != (tool in _REDUCING):
        does = "reduces (it prints the reduction, e.g. sum)" if tool in _REDUCING else "does not reduce (it prints none)"
        return f"its redop is {'/'.join(sorted(words))}, and {tool} {does}"
    kept = tuple(t for t in ("redop", "root") if t in (run.columns or ()))
    if run.titled and kept != ("redop", "root") and _OLD_TITLES[tool] != kept:
        return (f"its column titles are nccl-tests' before 2.13 with {' and '.join(kept) or 'neither redop nor root'}, and "
                f"{tool}'s had {' and '.join(_OLD_TITLES[tool]) or 'neither'}")  # fmt: skip
    if run.roots and (max(run.roots) >= 0) != (tool in _ROOTED):
        return f"its root is {max(run.roots)}, and {tool} " + ("names a root rank" if tool in _ROOTED else "has none (it prints -1)")
    if len(run.in_place_checked) == 1 and (True in run.in_place_checked) == (tool in _UNCHECKED_IN_PLACE):
        if True in run.in_place_checked:
            return f"its in-place #wrong is a count (the results checked), and {tool} never checks them (it prints N/A)"
        return f"its in-place #wrong is N/A where the out-of-place one is a count, and {tool} checks both"
    old = run.bw_formula == "old"
    if old and tool not in _OLD_ALGBW:
        return (f"its algbw is (size - count x type size) / time (line {run.old_bw_line}), as only {' and '.join(_OLD_ALGBW)} "
                "printed it (before mid-2020)")  # fmt: skip
    f = 1.0 if old else bus_factor(TOOLS[tool], ranks)  # (busbw was algbw then)
    for algbw, busbw in run.bandwidths:
        if abs(busbw - f * algbw) > _bus_slack(f, busbw):
            return f"busbw / algbw is {busbw / algbw:.4g} (busbw {busbw:g}, algbw {algbw:g}), and {tool}'s on {ranks} GPUs is {f:.4g}"
    return None


def _last_sizes(sweep: tuple[int, int, int, bool]) -> tuple[int, int] | None:
    """The last two sizes a sweep times (0 before the first), as nccl-tests steps them
    (src/common.cu: from minBytes while at most maxBytes, times the factor or plus the step);
    None where it would not end."""
    low, high, step, factor = sweep
    if low > high or step < 1 or (factor and (step < 2 or low < 1)):
        return None
    if not factor:
        k = (high - low) // step
        return (low + (k - 1) * step if k else 0), low + k * step
    before, size = 0, low
    while size * step <= high:
        before, size = size, size * step
    return before, size


def _bus_slack(factor: float, busbw: float) -> float:
    """How far a printed busbw may be from the bus factor x the printed algbw: nccl-tests
    computes busbw from the unrounded algbw and rounds each to two decimals (half a unit in
    the last place each, the algbw's times the factor), and a value too wide for its column
    loses decimals (the relative part)."""
    return 0.005 * (1.0 + factor) + 0.0005 * busbw + 1e-9


def _columns_said(run: _Run) -> str:
    """What a run's columns say of its tool besides busbw / algbw, as a message quotes it."""
    parts = []
    if run.titled and not {"redop", "root"} <= set(run.columns or ()):
        kept = [t for t in ("redop", "root") if t in (run.columns or ())]
        parts.append(f"titles of before nccl-tests 2.13 with {' and '.join(kept) or 'neither redop nor root'}")
    if run.redops:
        parts.append(f"redop {'/'.join(sorted(w or 'blank' for w in run.redops))}")
    if len(run.in_place_checked) == 1:
        parts.append("in-place results checked" if True in run.in_place_checked else "in-place #wrong N/A")
    if run.bw_formula == "old":
        parts.append("algbw = (size - count x type size) / time, as before mid-2020")
    return ", ".join(parts)


def _either(tools: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return f"{', '.join(tools[:-1])} or {tools[-1]}" if len(tools) > 1 else "".join(tools)


_COMMAND_WORDS = 256
"""Most words of a command continued over lines that are kept (a real one has a few dozen)."""
_LAUNCHERS = {"mpirun": ("-np", "-n", "--np", "--n"), "mpiexec": ("-np", "-n", "--np", "--n"), "orterun": ("-np", "-n", "--np"),
              "srun": ("-n", "--ntasks")}  # fmt: skip
"""Launchers and their options for the number of processes they start."""
_PROMPT = re.compile(r"(?:\S*[$#>%]|sudo|env|time|[A-Za-z_][A-Za-z0-9_]*=\S*)")
"""What may stand before a tool that runs as one process: a shell prompt (`$`, `root@host:~#`,
a markdown quote `>`), `sudo`, `env`, `time`, environment settings (`NCCL_ALGO=Ring`)."""


def _command_gpus(words: list[str], k: int) -> tuple[int, int] | None:
    """The GPUs a command running an nccl-tests tool (`words[k]`) starts, and those each
    thread drives (`-g`): processes x `-t` threads x `-g` GPUs, the processes from the
    launcher's count (`mpirun -np 2`, `srun -n 8`) or 1 with no launcher; None where the
    command does not say (a launcher without a count, another program before the tool, a
    value that is not a number)."""
    before, after = words[:k], words[k + 1 :]
    launchers = [w.rsplit("/", 1)[-1] for w in before if w.rsplit("/", 1)[-1] in _LAUNCHERS]
    if launchers:
        procs = _option(before, _LAUNCHERS[launchers[0]])
    else:
        procs = "1" if all(_PROMPT.fullmatch(w) for w in before) else None
    values = [procs, _option(after, ("-t", "--nthreads")) or "1", _option(after, ("-g", "--ngpus")) or "1"]
    if any(v is None or not (v.isascii() and v.isdigit()) or len(v) > 6 or int(v) < 1 for v in values):
        return None
    n = math.prod(int(v) for v in values)
    return (n, int(values[2])) if n <= MAX_WORLD_SIZE else None


def _option(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` in `words`: `-g 8`, `-g8`, `--ngpus=8`; None if absent."""
    for j, w in enumerate(words):
        for name in names:
            if w == name:
                return words[j + 1] if j + 1 < len(words) else None
            if w.startswith(name + "=") or (len(name) == 2 and w.startswith(name) and w[2:].isdigit()):
                return w[len(name) :].lstrip("=")
    return None


def _mangled_row(columns: tuple[str, ...], line: str) -> bool:
    """Whether a line inside a table that does not start with a size is a result row all the
    same (a size `1.3e8`, `nan`, `0x10`): it has the table's columns (one fewer: old alltoall's
    blank redop) and most of its words after the type hold digits. mpirun's and other programs'
    messages inside a table have few numbers."""
    tokens = line.split()
    t = columns.index("type") if "type" in columns else 2
    rest = tokens[t + 1 :]
    numbers = sum(any(c.isdigit() for c in word) for word in rest)
    return bool(columns) and len(tokens) >= len(columns) - 1 and numbers > len(rest) / 2


def _agree(size: int, time: str, algbw: str) -> bool:
    """Whether a time (us) and its algbw (GB/s) agree as nccl-tests prints them: algbw = size /
    time / 1e3, each rounded to the digits printed (`_half_unit`)."""
    t, a = float(time), float(algbw)
    dt, da = _half_unit(time), _half_unit(algbw)
    lo = size / ((t + dt) * 1e3) - da
    hi = size / ((t - dt) * 1e3) + da if t > dt else math.inf
    return lo * (1 - 1e-9) <= a <= hi * (1 + 1e-9)


def _half_unit(word: str) -> float:
    """Half the last digit of a number as printed (`12.34`: 0.005; `1.2e+07`: 50000): how far
    the printed value may be from the value."""
    mantissa, _, exponent = word.partition("e")
    return 0.5 * 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))


def _is_number(word: str) -> bool:
    try:
        return len(word) <= 40 and math.isfinite(float(word))
    except ValueError:
        return False


def _starts(line: str) -> list[int]:
    """The offset of each whitespace-separated token of `line`."""
    return [m.start() for m in re.finditer(r"\S+", line)]


def _guess_columns(tokens: list[str]) -> tuple[str, ...]:
    """The columns of a table pasted without its titles, from its first row: eight timing
    columns (time, algbw, busbw, #wrong, out of place then in place) after `size count type`
    and what the row has between: a word (`redop`), a whole number (`root`) or both; a row of
    other length reads as nccl-tests' current columns."""
    between = tokens[3:-8] if len(tokens) in (11, 12, 13) else ["sum", "-1"]
    head = ("size", "count", "type") + tuple("root" if word.lstrip("-").isdigit() else "redop" for word in between)
    return head + ("time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")


def _short(word: str) -> str:
    """A word of the log as a message quotes it: a long one clipped, with its length."""
    return word if len(word) <= 30 else f"{word[:12]}... ({len(word)} characters)"
