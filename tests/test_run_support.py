"""Helpers for the executor tests (no tests here): launch real torchrun, read timelines,
and check a measured timeline against the execution semantics of docs/simulator.md."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule
from commdsl.ir import COLLECTIVE_KINDS, HOST_STREAM, OpKind, Program
from commdsl.timeline import COMM_TRACK_PREFIX, SpanRole, Timeline

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
SLACK_US = 1.0
"""Timestamps are written rounded to the nanosecond; orderings allow this much."""


@dataclass
class Launch:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, args: list[str], *, timeout_s: float = 120, cwd: Path | None = None,
             module: str = "commdsl.run", env: dict[str, str] | None = None) -> Launch:  # fmt: skip
    """`torchrun --nproc_per_node=N -m MODULE ARGS` in its own process group, killed as a
    whole on timeout so no worker outlives the test; `env` adds environment variables."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", module, *args]  # fmt: skip
    return run_in_group(cmd, timeout_s=timeout_s, cwd=cwd, env={"PYTHONWARNINGS": "ignore", **(env or {})})


def run_in_group(cmd: list[str], *, timeout_s: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> Launch:
    """Run `cmd` in its own process group, killed as a whole on timeout so that no
    process it started outlives the test; `env` adds environment variables."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd or REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, **(env or {})))  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:6])} ... did not finish within {timeout_s}s:\n{out}\n{err}")
    return Launch(proc.returncode, out, err, time.monotonic() - start)


def processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (to find orphans)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def assert_semantics(program: Program, tl: Timeline) -> None:
    """The measured timeline has one EXEC span per op and respects the semantics."""
    spans = tl.exec_spans()
    expected_ids = {op.id for op in program.all_ops()}
    assert set(spans) == expected_ids, f"missing {sorted(expected_ids - set(spans))[:5]}, extra {sorted(set(spans) - expected_ids)[:5]}"
    assert sum(1 for s in tl.spans if s.role is SpanRole.EXEC) == len(expected_ids), "more than one EXEC span per op"
    for s in spans.values():
        assert s.end_us >= s.start_us

    # Same-stream ops run one after another, in program order, never overlapping.
    for rank_ops in program.ops:
        by_stream: dict[str, list] = {}
        for op in rank_ops:
            track = spans[op.id].track
            if track != HOST_STREAM and not track.startswith(COMM_TRACK_PREFIX):
                assert track == op.stream
                by_stream.setdefault(track, []).append(spans[op.id])
        for stream, seq in by_stream.items():
            for a, b in zip(seq, seq[1:]):
                assert b.start_us >= a.end_us - SLACK_US, f"{a.op_id} and {b.op_id} overlap on stream {stream}"

    # A recv ends after its send starts.
    for op in program.all_ops():
        if op.kind is OpKind.RECV:
            sends = [f.src_op for f in tl.flows if f.dst_op == op.id]
            assert len(sends) == 1, f"recv {op.id} has no flow from its send"
            assert spans[op.id].end_us >= spans[sends[0]].start_us - SLACK_US, f"recv {op.id} ends before its send starts"

    # A collective ends after its last member started it (per kind: who must wait for whom).
    by_group: dict[str, dict[int, list]] = {}
    for op in program.all_ops():
        if op.kind in COLLECTIVE_KINDS:
            by_group.setdefault(op.group, {}).setdefault(op.rank, []).append(op)
    for group, per_rank in by_group.items():
        for k, ops in enumerate(zip(*per_rank.values())):
            starts = {op.rank: spans[op.id].start_us for op in ops}
            for op in ops:
                end = spans[op.id].end_us
                kind = op.kind
                if kind in (OpKind.BROADCAST, OpKind.SCATTER):
                    needed = [op.root]  # a receiver needs the root; the root may finish early
                elif kind in (OpKind.REDUCE, OpKind.GATHER):
                    needed = list(starts) if op.rank == op.root else [op.rank]
                else:
                    needed = list(starts)
                for r in needed:
                    assert end >= starts[r] - SLACK_US, f"{op.kind.value} {op.id} ends before rank {r} started it"


def load(path: str | Path, params: dict[str, str] | None = None) -> Program:
    return load_schedule(str(path), params or {})


def test_flop_sized_compute_runs_in_the_ops_dtype():
    import torch

    from commdsl.errors import SourceLoc
    from commdsl.ir import Dtype, Op, OpKind
    from commdsl.run.compute import Kernels
    from commdsl.run.config import DurationMode

    kernels = Kernels(torch.device("cpu"), DurationMode.BUSY)

    def op(dtype: Dtype) -> Op:
        return Op(0, 0, OpKind.COMPUTE, "F", "compute", SourceLoc("t.yaml", 1, 1), flops=2 * 256**3 * 3, dtype=dtype)

    assert kernels.spec(op(Dtype.BF16)).dtype is torch.bfloat16
    assert kernels.spec(op(Dtype.FP64)).dtype is torch.float64
    assert kernels.spec(op(Dtype.INT8)).dtype is torch.float32  # no int8 matmul: the device default
    spec = kernels.spec(op(Dtype.BF16))
    assert spec.repeats == 3 and spec.side == 256
    kernels.prepare("compute", spec)
    kernels.run("compute", spec)
    assert kernels._outputs[("compute", 256, torch.bfloat16)].dtype is torch.bfloat16


def assert_durations_kept_or_warned(stdout: str, tl: Timeline) -> None:
    """Every rank's compute with explicit durations ran within the tolerance of its
    requested durations, or the run's summary warned about that rank (the machine running
    the tests may be busy: both are right, silence about a miss is not)."""
    from commdsl.comparison import duration_drifts

    drifts = duration_drifts(tl)
    assert drifts, "no compute op with a requested duration in the measured timeline"
    for d in drifts:
        if d.drifted:
            assert f"warning: rank {d.rank}: its compute ops with an explicit duration ran x{d.median_ratio:.2f}" in stdout
    assert "of the requested durations (median; 10% is tolerated)" in stdout


def commdsl_frames(stderr: str) -> list[str]:
    """Traceback lines (`File "...", line N`) in commdsl's own code: torchrun prints a
    traceback of its failed launch, whose frames are torch's (and whose paths may well
    contain "commdsl", e.g. a venv's folder)."""
    import commdsl

    package = str(Path(commdsl.__file__).resolve().parent) + "/"
    return [ln for ln in stderr.splitlines() if ln.strip().startswith("File") and package in ln]


# ---- what one rank reads of another's bytes -----------------------------------------------


class _Payload:
    """A class a malicious pickle names: its reduce calls os.system."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("evil", [_Payload(), {"x": _Payload()}, [1, (2, _Payload())]], ids=["top", "in a dict", "nested"])
def test_bytes_from_another_rank_cannot_name_a_function(evil):
    import pickle

    from commdsl.run.backend import loads_from_rank

    with pytest.raises(pickle.UnpicklingError, match="names posix.system|names nt.system"):
        loads_from_rank(pickle.dumps(evil))


def test_what_ranks_exchange_reads_back_through_the_guarded_unpickler():
    import pickle

    import torch

    from commdsl.run.backend import loads_from_rank

    program = load_schedule("collectives")
    op = program.ops[0][0]
    t = torch.zeros(4)
    ipc_args = (type(t), t.size(), t.stride(), 0, type(t._typed_storage()), t.dtype, 0, b"\x01" * 64, 16, 0, False, b"r", 0, b"e", True)
    for obj in (op, op.kind, {"host": "n0", "times": [1.5, 2.5]}, ipc_args):
        assert loads_from_rank(pickle.dumps(obj)) == obj
    with pytest.raises(pickle.UnpicklingError, match="commdsl.run.backend.loads_from_rank"):
        loads_from_rank(pickle.dumps(loads_from_rank))  # a commdsl function, not a record
