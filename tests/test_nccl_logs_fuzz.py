"""Seeded fuzz of nccl-tests logs (issue 43): 10,000 mutations of the fixture logs, each
read as `calibrate --from-nccl-tests` reads it. A mutated log may be accepted or refused
with a `CommdslError` whose message fits a screen and points inside the file; any other
exception (a traceback for the user) is a failure, and what is accepted must hold values
within commdsl.limits."""

from __future__ import annotations

import math
import random
from pathlib import Path

from commdsl.calibrate.nccl_logs import Given, parse_logs
from commdsl.errors import CommdslError
from commdsl.files import source_lines
from commdsl.limits import MAX_MACHINE_TIME_US, MAX_SIZE_BYTES, MAX_WORLD_SIZE

DATA = Path(__file__).parent / "data"
BASES = {p.name: p.read_text() for d in ("nccl_logs", "nccl_tests") for p in sorted((DATA / d).iterdir())}
NAMES = sorted(BASES)
CASES = 10_000
SEED = 43

VALUES = [
    "1" + "0" * 5000, "-1", "0", "-0", "inf", "-inf", "nan", "NaN", "1e300", "1e-300", "70000", "65536", "4294967296", "N/A",
    "\u0661\u0662", "\uff11", "1_000", "0x10", "+8", "8.5", "", "#", "float", "quad", "-1e5", "9" * 25, "None",
]  # fmt: skip
LINES = [
    "NCCL version 2.99.99+cuda99.9", "node:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring,Tree",
    "node:1:1 [0] NCCL INFO NCCL_PROTO set by environment to ^LL128", "node:1:1 [0] NCCL WARN Cuda failure 'out of memory'",
    "node:1:1 [0] NCCL INFO 99999 coll channels, 0 nvls channels, 99999 p2p channels, 99999 p2p channels per peer",
    "+ mpirun -np 8 ./build/alltoall_perf -b 8 -e 1G -g 1", "```", "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 graph: 1",
    "#  Rank 99999 Group  0 Pid 1 on h device 0 [0000:00:00] NVIDIA H100 80GB HBM3",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong",
    "# Avg bus bandwidth    : 0", "# Collective test starting: gather_perf", "           8             2     float     sum      -1",
    "node:1:1 [0] NCCL INFO comm 0x5f00 rank 0 nranks 99999 cudaDev 0 busId 18000 - Init COMPLETE", "nThread 1 nGpus 99999 minBytes 8",
    "2026-01-01T00:00:00.5Z # nThread 1 nGpus 2 minBytes 8 maxBytes 8", "[h:00017] 3 more processes have sent help message x.txt",
    "mpirun -np 99999 \\", "./build/all_reduce_perf -b 8 -g 70000 -t 0", "#  Rank  0 Group  0 Pid 1 on h device 0 [0000:00:00]",
    "          16             4    uint64     sum      -1     9.00    0.00    0.00      0     9.00    0.00    0.00      0",
]  # fmt: skip


def _mutate(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    kind = rng.choice(["line", "token", "byte", "insert", "prefix", "mix"])
    if kind == "line":
        op = rng.choice(["delete", "duplicate", "swap", "truncate", "cut"])
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines[i:i] = [lines[i]] * rng.choice([1, 2, 50])
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "truncate":
            lines = lines[:i]
        else:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        return "\n".join(lines)
    if kind == "token":
        words = list(re_tokens(lines[i]))
        if not words:
            return text
        s, e = rng.choice(words)
        lines[i] = lines[i][:s] + rng.choice(VALUES) + lines[i][e:]
        return "\n".join(lines)
    if kind == "byte":
        pos = rng.randrange(len(text) + 1)
        noise = "".join(chr(rng.randrange(0x2FFF)) for _ in range(rng.randint(1, 4)))
        return text[:pos] + noise + text[pos:]
    if kind == "insert":
        lines.insert(i, rng.choice(LINES))
        return "\n".join(lines)
    if kind == "prefix":
        prefix = rng.choice(["[1,0]<stdout>:", "0: ", "[0] ", "> ", "\t", "| "])
        return "\n".join(prefix + line for line in lines)
    other = BASES[rng.choice(NAMES)].split("\n")
    j = rng.randrange(len(other))
    return "\n".join(lines[:i] + other[j : j + rng.randint(1, 20)] + lines[i:])


def re_tokens(line: str):
    start = None
    for k, c in enumerate(line + " "):
        if c.isspace():
            if start is not None:
                yield start, k
                start = None
        elif start is None:
            start = k


def _problem(text: str, given: Given) -> str | None:
    try:
        logs = parse_logs(text, "fuzz.log", given)
    except CommdslError as err:
        formatted = err.format()
        if len(formatted.splitlines()) > 30 or len(formatted) > 4000:
            return f"a message of {len(formatted)} characters"
        if err.loc is not None:
            lines = source_lines(text) or ("",)
            if err.loc.file != "fuzz.log" or not 1 <= err.loc.line <= len(lines) or not 1 <= err.loc.column <= len(lines[err.loc.line - 1]) + 1:
                return f"{err.message[:80]!r} points at {err.loc}, outside the file ({len(lines)} lines)"
        return None
    except Exception as e:  # the bug the fuzz exists to find
        return f"{type(e).__name__}: {str(e)[:200]}"
    for log in logs:
        if not 1 <= log.ranks <= MAX_WORLD_SIZE or not log.points or log.ranks % log.gpus_per_process:
            return f"accepted a run of {log.ranks} ranks, {len(log.points)} points"
        for p in log.points:
            if not 0 < p.size_bytes <= MAX_SIZE_BYTES or not 0 < p.time_us <= MAX_MACHINE_TIME_US or not math.isfinite(p.time_us):
                return f"accepted the point {p}"
    return None


def test_mutated_logs_are_read_or_refused_with_a_commdsl_error():
    failures = []
    for case in range(CASES):
        rng = random.Random(SEED * 1_000_003 + case)
        name = rng.choice(NAMES)
        given = Given("all_reduce_perf", 8) if rng.random() < 0.3 else Given()
        text = _mutate(rng, BASES[name])
        problem = _problem(text, given)
        if problem:
            failures.append(f"case {case} ({name}): {problem}")
    assert not failures, "\n".join(failures[:20])
