"""A program simulated again on the same machine starts from the `Wiring` and hosts' first
pass its earlier run left (`commdsl.sim.simulate._run_reusing`): the same result as a
fresh machine gives, entries apart per network and fold, and gone with the program."""

from __future__ import annotations

import gc
import importlib
import weakref
from dataclasses import replace

import pytest

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import CommdslError, DeadlockError
from commdsl.machine import resolve_machine
from commdsl.resources import bundled_schedules
from commdsl.sim import simulate

MACHINE_FOR = {"memcpy_vs_nccl": "pcie-nvlink-pairs"}
"""Schedules written for one machine (as `tests/test_reference_results.py`)."""


def _outcome(result) -> tuple:
    raw = result.raw
    return (result.makespan_us, list(raw.issue_start), list(raw.issue_end), list(raw.start), list(raw.end), list(raw.cause),
            list(raw.state), list(raw.partner), list(raw.algos), list(raw.protos), result.critical_path)  # fmt: skip


def _fresh(name: str):
    return replace(resolve_machine(name))  # a copy: its own, empty memo


@pytest.mark.parametrize("name", sorted(bundled_schedules()))
def test_a_program_run_again_gives_what_a_fresh_machine_gives(name: str) -> None:
    """Every bundled schedule, simulated three times on one machine (the last two from the
    first's wiring), on both networks and unfolded, gives each time what a fresh machine
    gives; the entry the first run left is the one the next run used."""
    program = load_schedule(name, {})
    warm = _fresh(MACHINE_FOR.get(name, "h100-nvlink"))
    for network, fold in (("analytic", True), ("flow", True), ("analytic", False)):
        try:
            expected = _outcome(simulate(program, _fresh(warm.name), network, fold=fold))
        except CommdslError as e:
            with pytest.raises(type(e)):
                simulate(program, warm, network, fold=fold)
            continue
        assert _outcome(simulate(program, warm, network, fold=fold)) == expected, f"{name}/{network}/fold={fold}: first run"
        table = warm.memo[("wirings",)]
        ref, wiring, _ = table[(id(program), network, fold)]
        assert ref() is program
        for run in ("second", "third"):
            assert _outcome(simulate(program, warm, network, fold=fold)) == expected, f"{name}/{network}/fold={fold}: {run} run"
            assert table[(id(program), network, fold)][1] is wiring, "the run reused the wiring it found"


def test_the_entry_goes_with_the_program() -> None:
    machine = _fresh("h100-nvlink")
    program = load_schedule("1f1b", {})
    simulate(program, machine, "analytic")
    simulate(program, machine, "flow")
    table = machine.memo[("wirings",)]
    assert len(table) == 2
    gone = weakref.ref(program)
    del program
    gc.collect()
    assert gone() is None, "the table does not keep the program alive"
    assert table == {}


def test_a_deadlock_is_reported_every_time() -> None:
    """A schedule that cannot finish leaves no entry: the next call reports it again."""
    body = "if rank == 0:\n    all_reduce a 1MiB\n    all_reduce b 1MiB group=dp\nelse:\n    all_reduce b 1MiB group=dp\n    all_reduce a 1MiB\n"
    program = load_schedule_text(f"name: t\nworld: {{dp: 2}}\nprogram: |\n{_indent(body)}\n", "t.yaml", validate=False)
    machine = _fresh("h100-nvlink")
    for _ in range(2):
        with pytest.raises(DeadlockError):
            simulate(program, machine, "analytic")
    assert not machine.memo.get(("wirings",))


def _indent(text: str) -> str:
    return "".join("  " + line + "\n" for line in text.splitlines())


def test_a_large_program_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program past `REUSE_MAX_OPS` runs from scratch each time and leaves no entry."""
    simulate_module = importlib.import_module("commdsl.sim.simulate")  # the package's `simulate` is the function
    program = load_schedule("1f1b", {})
    monkeypatch.setattr(simulate_module, "REUSE_MAX_OPS", program.num_ops - 1)
    machine = _fresh("h100-nvlink")
    expected = _outcome(simulate(program, _fresh("h100-nvlink"), "analytic"))
    for _ in range(2):
        assert _outcome(simulate(program, machine, "analytic")) == expected
    assert not machine.memo.get(("wirings",))
