"""What the simulator works out per distinct shape of op or transfer on one machine, kept
for the next simulation on it.

A planner simulates thousands of candidate programs on a few machines, and their ops
repeat a few shapes: the same sends between the same ranks, the same compute. What a
shape costs (a send's `Transfer` and plan, its time alone on the links, the SMs its NCCL
kernel holds, whether a compute op is bound by its bytes) follows from the shape's
values and the machine alone, so it is worked out once per machine (`Machine.memo`), not
once per simulation.

Two kinds of table, each one dict in the machine's memo:

  * by value: the key is the shape's fields (never names a program gives, such as a
    group's name alone: the group's ranks too);
  * by identity: the key is `id()` of an object the first table made (a `Transfer`), and
    the entry holds that object, so its id cannot be reused while the entry is there.

A table that reaches `MAX_ENTRIES` starts over: a long sweep of ever new shapes keeps a
bounded memory, and an entry dropped is only worked out again.
"""

from __future__ import annotations

from commdsl.machine.model import Machine

MAX_ENTRIES = 1 << 16
"""Entries a table holds before it starts over (each is a few hundred bytes)."""


def shape_table(machine: Machine, key: tuple) -> dict:
    """The machine's table `key` (a tuple naming what it holds and what else its values
    depend on, such as the world size), emptied first where it is full."""
    memo = machine.memo
    table = memo.get(key)
    if table is None:
        table = memo[key] = {}
    elif len(table) >= MAX_ENTRIES:
        table.clear()
    return table
