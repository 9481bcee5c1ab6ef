"""Copies into another rank's buffer, for real: two gloo ranks under torchrun copy into
each other's shared-memory buffers (`commdsl.run.peer`), `--check` verifies what landed
on the destination, and memcpy sends and recvs run on their streams, matched by tag."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from commdsl.dsl import load_schedule_text
from commdsl.ir import Dtype
from commdsl.run.check import Checker, Fill
from commdsl.run.peer import Landing, PeerBuffers, landings
from commdsl.run.tensors import estimate_bytes
from commdsl.timeline import Timeline

try:
    from test_run_support import assert_semantics, torchrun
except ImportError:
    from tests.test_run_support import assert_semantics, torchrun

COPIES = """\
name: peer_copies
world: 2
streams: [compute, s1, s2]
program: |
  # Each rank copies into the other's buffers: under their own names, and into ones it names.
  other = 1 - rank
  for i in range(3):
      copy act[i] 24KiB to other on s1
      copy grad[i] bf16[3000] to other into peer_grad[i] on s2
  synchronize
  barrier
  compute use 1ms
  # memcpy sends and recvs run on their streams: rank 1 posts its recvs on the streams in
  # the other order, and the messages still match first in, first out.
  if rank == 0:
      send a 8KiB to 1 transport=memcpy on s1
      send b 8KiB to 1 transport=memcpy on s2
  else:
      recv a 8KiB from 0 transport=memcpy on s2
      recv b 8KiB from 0 transport=memcpy on s1
"""


def _our_files() -> set[str]:
    folder = Path("/dev/shm")
    return {p.name for p in folder.iterdir() if p.name.startswith("commdsl-peer-")} if folder.is_dir() else set()


def test_copies_to_another_rank_land_for_real_and_check_on_the_destination(tmp_path):
    schedule = tmp_path / "peer_copies.yaml"
    schedule.write_text(COPIES)
    before = _our_files()
    out = tmp_path / "measured.json"
    run = torchrun(2, [str(schedule), "--check", "--warmup", "1", "--iters", "2", "--out", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    # 12 copies landing (6 per rank), 2 sends, 2 recvs, 2 barrier ops.
    assert "check: 18 communication results on 2 rank(s): all correct" in run.stdout, run.stdout
    program = load_schedule_text(COPIES, str(schedule))
    tl = Timeline.read(out)
    assert_semantics(program, tl)
    copies = [dict(s.args) | {"rank": s.rank, "track": s.track} for s in tl.exec_spans().values()]
    copies = [c for c in copies if c.get("dest") in ("act[0]", "peer_grad[0]")]
    assert {(c["rank"], c["track"], c["dst rank"]) for c in copies} == {(0, "s1", 1), (1, "s1", 0), (0, "s2", 1), (1, "s2", 0)}
    assert _our_files() <= before, "the shared-memory files are removed once every rank has mapped them"


def test_landing_buffers_are_shared_pages_between_two_mappings():
    program = load_schedule_text(COPIES, "peer_copies.yaml")
    dest, src = PeerBuffers(program, 1, torch.device("cpu"), per_op=False), PeerBuffers(program, 0, torch.device("cpu"), per_op=False)
    landing = landings(program, per_op=False)[1][1]
    assert landing == Landing(1, ("peer_grad[0]", "bf16", 3000), Dtype.BF16, 3000)
    mine, path = dest._export(landing)
    try:
        theirs = src._import(landing, path)
        theirs.copy_(torch.arange(3000, dtype=torch.bfloat16))  # the source writes...
        assert torch.equal(mine, torch.arange(3000, dtype=torch.bfloat16))  # ...into the destination's memory
    finally:
        dest.close()
    assert not os.path.exists(path)


def test_a_landing_buffer_goes_where_there_is_room_or_stops_with_a_message(monkeypatch, tmp_path):
    """A landing buffer larger than a full /dev/shm (64 MB in many containers) used to be
    mapped there anyway, and the first copy into it killed the rank with SIGBUS."""
    import tempfile
    from types import SimpleNamespace

    import pytest

    from commdsl.errors import UsageError
    from commdsl.run import peer

    program = load_schedule_text(COPIES, "peer_copies.yaml")
    landing = landings(program, per_op=False)[1][1]  # 6000 bytes
    free = {}
    monkeypatch.setattr(peer, "_SHM_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(peer.os, "statvfs", lambda f: SimpleNamespace(f_bavail=free[f], f_frsize=1))
    dest = PeerBuffers(program, 1, torch.device("cpu"), per_op=False)
    try:
        free.update({str(tmp_path / "shm"): 5999, str(tmp_path / "tmp"): 10**9})  # no room in shm: the temp folder
        _, path = dest._export(landing)
        assert Path(path).parent == tmp_path / "tmp"
        free[str(tmp_path / "shm")] = 6000
        _, path = dest._export(landing)
        assert Path(path).parent == tmp_path / "shm"
        free.update({str(tmp_path / "shm"): 100, str(tmp_path / "tmp"): 200})
        with pytest.raises(UsageError) as err:
            dest._export(landing)
        assert f"no room for a 5.86KiB landing buffer of peer copies: {tmp_path / 'shm'} has 100B free, {tmp_path / 'tmp'} has 200B free" in str(err.value)
    finally:
        dest.close()


def test_landing_keys_name_one_buffer_per_name_or_per_copy_when_checking():
    program = load_schedule_text(COPIES, "peer_copies.yaml")
    shared = landings(program, per_op=False)
    assert [land.key for land in shared[0]] == [("act[0]", "fp32", 6144), ("peer_grad[0]", "bf16", 3000), ("act[1]", "fp32", 6144),
                                                ("peer_grad[1]", "bf16", 3000), ("act[2]", "fp32", 6144), ("peer_grad[2]", "bf16", 3000)]  # fmt: skip
    assert [land.key for land in landings(program, per_op=True)[0]] == [(1, i) for i in range(6)]
    # Each rank allocates what its copies read and what lands in its buffers.
    assert estimate_bytes(program, 0, per_op=False) == 3 * (24576 + 6000) * 2 + 2 * 2 * 8192


def test_a_copy_that_did_not_land_is_a_check_failure():
    program = load_schedule_text(COPIES, "peer_copies.yaml")
    checker = Checker(program, 1, Fill())
    (first, *_) = checker.arrivals
    assert first.op.rank == 0 and first.op.name == "act[0]"
    assert checker.verify_arrival(first, first.out.clone()) is None
    why = checker.verify_arrival(first, torch.zeros_like(first.out))
    assert why is not None and why.startswith("rank 1: act[0], written by copy act[0] (op 0:0) of rank 0 at peer_copies.yaml:")
    assert "6144 of 6144 elements wrong" in why
