"""The machine's shape tables (`commdsl.sim.shape_memo`): what one simulation works out
per shape is reused by the next on the same machine, and never changes its result."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import commdsl
from commdsl.sim import shape_memo

ROOT = Path(__file__).resolve().parents[1]


def _pipeliner():
    spec = importlib.util.spec_from_file_location("auto_pipeliner_memo", ROOT / "examples" / "auto_pipeliner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _outcome(result) -> tuple:
    raw = result.raw
    return (result.makespan_us, list(raw.issue_start), list(raw.issue_end), list(raw.start), list(raw.end), list(raw.cause),
            list(raw.algos), list(raw.protos))  # fmt: skip


@pytest.mark.parametrize("network", ["analytic", "flow"])
def test_a_warm_machine_gives_what_a_fresh_one_gives(network: str) -> None:
    """Programs of other stage counts (the same group names over other ranks, other sizes)
    simulated one after another on one machine give, each, what a fresh machine gives."""
    pipeliner = _pipeliner()
    programs = [pipeliner.candidate(stages, 6)[1] for stages in (4, 2, 8, 3)]
    warm = replace(commdsl.load_machine("dgx-h100"))
    for program in programs:
        fresh = replace(commdsl.load_machine("dgx-h100"))
        assert _outcome(commdsl.simulate(program, warm, network=network)) == _outcome(commdsl.simulate(program, fresh, network=network))
    assert warm.memo[("transfers",)], "the machine keeps the transfers it has seen"


def test_a_full_table_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table at `MAX_ENTRIES` is emptied when next asked for, and the simulation it
    serves still gives the same result."""
    monkeypatch.setattr(shape_memo, "MAX_ENTRIES", 3)
    program = _pipeliner().candidate(4, 4)[1]
    machine = replace(commdsl.load_machine("dgx-h100"))
    first = _outcome(commdsl.simulate(program, machine, network="analytic"))
    assert len(machine.memo[("transfers",)]) > 3
    table = shape_memo.shape_table(machine, ("transfers",))
    assert table == {}
    assert _outcome(commdsl.simulate(program, machine, network="analytic")) == first
