"""Deadlock and mismatch detection: stop, report every stuck rank, exit code 3, never hang."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commdsl.cli import main
from commdsl.dsl import load_schedule_text
from commdsl.errors import DeadlockError, SourceLoc
from commdsl.ir import Group, Op, OpKind, Program, Transport
from commdsl.machine import resolve_machine
from commdsl.sim import check_deadlock, simulate


def load(program: str, world: str = "2", validate: bool = True, extra: str = ""):
    body = "\n".join("  " + line for line in program.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: {world}\nstreams: [s, t]\n{extra}program: |\n{body}\n", "t.yaml", validate=validate)


def deadlock_of(program) -> DeadlockError:
    with pytest.raises(DeadlockError) as info:
        simulate(program, resolve_machine("h100-nvlink"))
    assert info.value.exit_code == 3
    return info.value


HANG_000 = """
compute F 1ms
if rank == 1:
    recv act 1MiB from 0
compute G 1ms
"""


def test_blocking_recv_without_send_is_reported_with_rank_and_line():
    err = deadlock_of(load(HANG_000, validate=False))
    text = err.format()
    assert err.rank == 1 and err.loc.line == 7  # `recv act ...` (line 4 of the program block)
    assert "rank 1: recv act (op 1:1, t.yaml:7)" in text
    assert "rank 0 never issues a matching send to rank 1" in text
    assert "finished: rank 0" in text


HEAD_TO_HEAD = """
other = 1 - rank
send x 1MiB to other
recv y 1MiB from other
"""

HEAD_TO_HEAD_BATCHED = """
other = 1 - rank
batch:
    isend x 1MiB to other
    irecv y 1MiB from other
"""


def test_head_to_head_blocking_sends_deadlock():
    err = deadlock_of(load(HEAD_TO_HEAD))
    text = err.format()
    for rank in (0, 1):
        assert f"rank {rank}: send x (op {rank}:0, t.yaml:6) is active" in text
    assert "Ranks 0 and 1 are both blocked sending to each other (head to head)" in text
    assert "batch" in err.hint


def test_batched_head_to_head_does_not_deadlock():
    result = simulate(load(HEAD_TO_HEAD_BATCHED), resolve_machine("h100-nvlink"))
    assert result.makespan_us > 0
    check_deadlock(load(HEAD_TO_HEAD_BATCHED))


def test_collectives_in_different_order_on_two_groups_deadlock():
    prog = """
if rank == 0:
    all_reduce a 1MiB group=world
    all_reduce b 1MiB group=dp
else:
    all_reduce b 1MiB group=dp
    all_reduce a 1MiB group=world
"""
    text = deadlock_of(load(prog, world="{dp: 2}")).format()
    assert "rank 0: all_reduce a (op 0:0, t.yaml:6) is active and waits for 1 of 2 members of group world" in text
    assert "rank 1 has not reached it" in text and "stuck at all_reduce b (op 1:0, t.yaml:9)" in text


def test_collective_missing_a_member():
    text = deadlock_of(load("if rank != 2:\n    all_reduce a 1MiB", world="3", validate=False)).format()
    assert "waits for 1 of 3 members of group world (collective #1): rank 2 never issues it" in text
    assert "rank 0:" in text and "rank 1:" in text and "finished: rank 2" in text


def test_event_never_recorded_because_its_stream_is_stuck():
    prog = """
if rank == 0:
    recv x 1MiB from 1 on t
    record e on t
    wait e on s
    compute F 1ms on s
"""
    text = deadlock_of(load(prog, validate=False)).format()
    assert "stream s is stuck at wait_event e (op 0:2, t.yaml:8): event e is never recorded" in text


def test_host_blocked_in_wait_is_reported():
    prog = "if rank == 0:\n    h = irecv x 1MiB from 1\n    wait h on host"
    text = deadlock_of(load(prog, validate=False)).format()
    assert "the host is blocked in wait h (op 0:1, t.yaml:7), waiting for recv x (op 0:0, t.yaml:6) (active)" in text


def test_cli_simulate_and_check_exit_3_on_deadlock(tmp_path, capsys):
    path = tmp_path / "h2h.yaml"
    path.write_text("name: h2h\nworld: 2\nstreams: [s]\nprogram: |\n" + "\n".join("  " + x for x in HEAD_TO_HEAD.strip().splitlines()) + "\n")
    assert main(["simulate", str(path)]) == 3
    assert "head to head" in capsys.readouterr().err
    assert main(["check", str(path)]) == 3
    assert "deadlock:" in capsys.readouterr().err
    path.write_text(path.read_text().replace("send x 1MiB to other\n  recv y 1MiB from other", "batch:\n      isend x 1MiB to other\n      irecv y 1MiB from other"))
    assert main(["check", str(path)]) == 0


def test_cli_never_prints_a_traceback_on_deadlock(tmp_path):
    path = tmp_path / "h2h.yaml"
    path.write_text("name: h2h\nworld: 2\nstreams: [s]\nprogram: |\n" + "\n".join("  " + x for x in HEAD_TO_HEAD.strip().splitlines()) + "\n")
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "simulate", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("deadlock:")


# ---- never hang: random programs built directly as IR ---------------------------------

_LOC = SourceLoc("random.yaml", 1, 1, "")
WORLD = 3


def _random_program(draw_ops: list[list[tuple]]) -> Program:
    per_rank = []
    for rank, specs in enumerate(draw_ops):
        ops = []
        for spec in specs:
            i = len(ops)
            kind, arg = spec
            common = dict(rank=rank, index=i, loc=_LOC, stream="s")
            if kind == "compute":
                ops.append(Op(kind=OpKind.COMPUTE, name=f"c{i}", duration_us=float(arg), **common))
            elif kind in ("send", "recv"):
                peer = (rank + 1 + arg % (WORLD - 1)) % WORLD
                ops.append(Op(kind=OpKind(kind), name=f"m{i}", size_bytes=1 << 20, peer=peer, group="world", transport=Transport.NCCL, **common))
            elif kind == "all_reduce":
                ops.append(Op(kind=OpKind.ALL_REDUCE, name=f"a{i}", size_bytes=3 << 20, group="world", transport=Transport.NCCL, **common))
            elif kind == "batch":
                peer = (rank + 1 + arg % (WORLD - 1)) % WORLD
                for k in (OpKind.SEND, OpKind.RECV):
                    ops.append(Op(kind=k, name=f"b{i}", size_bytes=1 << 20, peer=peer, group="world", transport=Transport.NCCL,
                                  batch=i, rank=rank, index=len(ops), loc=_LOC, stream="s"))  # fmt: skip
        per_rank.append(tuple(ops))
    return Program("random", "", "random.yaml", (), WORLD, (), ("s",), (Group("world", "world", tuple(range(WORLD))),), tuple(per_rank))


_op = st.tuples(st.sampled_from(["compute", "send", "recv", "all_reduce", "batch"]), st.integers(0, 5))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_op, max_size=8), min_size=WORLD, max_size=WORLD))
def test_random_programs_finish_or_report_a_deadlock(specs):
    program = _random_program(specs)
    try:
        result = simulate(program, resolve_machine("h100-nvlink"))
    except DeadlockError as err:
        verdict = "deadlock"
        assert err.loc is not None and "rank" in err.message
    else:
        verdict = "ok"
        raw = result.raw
        assert all(raw.end[g] >= raw.start[g] for g in range(len(raw.ops)))
        assert len(result.timeline.exec_spans()) == program.num_ops
    # The verdict does not depend on durations: the timeless check agrees.
    try:
        check_deadlock(program)
        assert verdict == "ok"
    except DeadlockError:
        assert verdict == "deadlock"
