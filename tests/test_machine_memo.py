"""What the simulator keeps per machine (`Machine.memo`, `nccl_flows.machine_links`): made
once per machine and world size, shared by every simulation on that machine, never part
of the machine's value, and never a change to a result."""

from __future__ import annotations

import pickle

import pytest

import commdsl
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.sim.nccl_flows import machine_links


def test_the_links_are_made_once_per_machine_and_world_size():
    machine = resolve_machine("dgx-h100")
    fabric, flows = machine_links(machine, 8)
    assert flows is not None
    assert machine_links(machine, 8) == (fabric, flows)
    assert machine_links(machine, 8)[0] is fabric and machine_links(machine, 8)[1] is flows
    assert machine_links(machine, 4)[0] is not fabric
    other = resolve_machine("dgx-h100")  # an equal machine keeps its own
    assert other == machine and machine_links(other, 8)[0] is not fabric
    assert machine_links(resolve_machine("h100-nvlink"), 4)[1] is None  # no `nccl:`


def test_the_memo_is_not_part_of_the_machine():
    machine = resolve_machine("dgx-h100")
    machine_links(machine, 8)
    assert machine.memo
    copy = pickle.loads(pickle.dumps(machine))
    assert copy == machine and hash(copy) == hash(machine)
    assert "memo" not in copy.__dict__ and copy.memo == {}
    assert machine.with_nodes(2).memo == {}


@pytest.mark.parametrize("network", ["analytic", "flow"])
def test_a_simulation_on_a_used_machine_equals_one_on_a_fresh_machine(network):
    program = commdsl.load("1f1b", stages=8, microbatches=8)
    used = resolve_machine("dgx-h100")
    # Other shapes first: the memo then holds routes, choices and loads the program also uses.
    simulate(commdsl.load("1f1b", stages=8, microbatches=3, act="3MiB"), used, network)
    simulate(program, used, network)
    again = simulate(program, used, network)
    fresh = simulate(program, resolve_machine("dgx-h100"), network)
    assert again.makespan_us == fresh.makespan_us
    for column in ("issue_start", "issue_end", "start", "end", "cause"):
        assert list(getattr(again.raw, column)) == list(getattr(fresh.raw, column)), column
    assert again.summary().to_json() == fresh.summary().to_json()
