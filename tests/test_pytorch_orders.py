"""The pipeline schedules run torch.distributed.pipelining's orders, and their transfers
never deadlock.

tests/data/pytorch_pipeline_orders.json holds, for each schedule class of torch 2.13
and every (stages, chunks, microbatches) of a grid, either every rank's compute order
or the error PyTorch raises (tests/make_pytorch_pipeline_orders.py regenerates it
where torch is installed). These tests need no torch: they compare the bundled
schedules with the table, rank by rank, on every combination the table accepts with
stages * chunks * microbatches <= GRID_LIMIT (and the largest one of each family),
check that they refuse what PyTorch refuses, and that their transfers cannot
deadlock. Where torch is installed, the table itself is checked against it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule
from commdsl.errors import ScheduleError
from commdsl.ir import OpKind, Program
from commdsl.sim import check_deadlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_schedules import p2p_pairs, rendezvous_deadlock  # noqa: E402

TABLE = json.loads((Path(__file__).parent / "data" / "pytorch_pipeline_orders.json").read_text())
FAMILIES = TABLE["families"]
V_SHAPED = {"zbv", "dualpipev"}
"""Families with exactly two stages per rank: their schedules have no `chunks` param."""
GRID_LIMIT = 24
"""Combinations with stages * chunks * microbatches up to this are all tested."""


def _key(key: str) -> tuple[int, int, int]:
    p, v, m = key.split(",")
    return int(p), int(v), int(m)


def covered(family: str) -> list[tuple[int, int, int]]:
    """The accepted combinations the tests run: the small ones, and the largest one."""
    accepted = sorted(_key(k) for k in FAMILIES[family]["accepted"])
    small = [c for c in accepted if c[0] * c[1] * c[2] <= GRID_LIMIT]
    largest = max(accepted, key=lambda c: (c[0] * c[1] * c[2], c))
    return small + ([largest] if largest not in small else [])


def params(family: str, p: int, v: int, m: int) -> dict[str, str]:
    out = {"stages": str(p), "microbatches": str(m)}
    if family not in V_SHAPED:
        out["chunks"] = str(v)
    return out


def actions(program: Program, rank: int) -> str:
    """A rank's compute order in PyTorch's notation (`3F0 3I0 3W0 ...`), from the IR."""
    return " ".join(f"{op.stage}{op.action.letter}{op.microbatch}" for op in program.ops[rank] if op.kind is OpKind.COMPUTE)


CASES = [(family, *c) for family in sorted(FAMILIES) for c in covered(family)]


def test_the_grid_is_what_the_report_says():
    """The table covers every family on 1..8 stages, and the tests a few hundred combinations."""
    assert set(FAMILIES) == {"looped_bfs", "interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev"}
    assert TABLE["torch"] == "2.13.0"
    for family in FAMILIES:
        assert {_key(k)[0] for k in FAMILIES[family]["accepted"]} == set(range(1, 9))
    assert len(CASES) >= 390


@pytest.mark.parametrize("family,stages,chunks,microbatches", CASES, ids=[f"{f}-{p}x{v}x{m}" for f, p, v, m in CASES])
def test_order_is_pytorchs_and_transfers_cannot_deadlock(family, stages, chunks, microbatches):
    program = load_schedule(family, params(family, stages, chunks, microbatches))  # validates P2P matching too
    expected = FAMILIES[family]["accepted"][f"{stages},{chunks},{microbatches}"]
    assert program.world_size == stages
    for rank in range(stages):
        assert actions(program, rank) == expected[rank], f"rank {rank}"
    stuck = rendezvous_deadlock(program)
    assert stuck is None, f"stuck at {stuck}"
    for send, recv in p2p_pairs(program):
        assert send.name == recv.name, f"rank {send.rank} sends {send.name}, rank {recv.rank} receives {recv.name}"


SIMULATED = [c for c in CASES if c[1] * c[2] * c[3] <= 16 or c[1] == 8]


@pytest.mark.parametrize("family,stages,chunks,microbatches", SIMULATED, ids=[f"{f}-{p}x{v}x{m}" for f, p, v, m in SIMULATED])
def test_the_simulator_runs_it_to_the_end(family, stages, chunks, microbatches):
    check_deadlock(load_schedule(family, params(family, stages, chunks, microbatches)))


REJECTED = [(family, *_key(k)) for family in sorted(FAMILIES) for k in FAMILIES[family]["rejected"]
            if family not in V_SHAPED or _key(k)[1] == 2]  # fmt: skip


@pytest.mark.parametrize("family,stages,chunks,microbatches", REJECTED, ids=[f"{f}-{p}x{v}x{m}" for f, p, v, m in REJECTED])
def test_refuses_what_pytorch_refuses(family, stages, chunks, microbatches):
    with pytest.raises(ScheduleError, match="assertion failed"):
        load_schedule(family, params(family, stages, chunks, microbatches))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the table is checked against torch where torch is installed")
def test_the_table_is_what_torch_builds():
    import torch

    import make_pytorch_pipeline_orders as make
    from torch.distributed.pipelining import schedules

    if torch.__version__.split("+")[0] != TABLE["torch"]:
        pytest.skip(f"the table comes from torch {TABLE['torch']}, this is {torch.__version__}")
    for family, (cls_name, _) in make.FAMILIES.items():
        cls = getattr(schedules, cls_name)
        for key in list(FAMILIES[family]["accepted"])[::37]:
            p, v, m = _key(key)
            assert make.order(cls(make.stand_ins(p, v), m), p) == FAMILIES[family]["accepted"][key], (family, key)
        for key in list(FAMILIES[family]["rejected"])[::11]:
            p, v, m = _key(key)
            with pytest.raises((ValueError, AssertionError, RuntimeError)):
                cls(make.stand_ins(p, v), m)
