"""Rank templates (commdsl/dsl/spmd.py): a program that never reads its rank is expanded
for rank 0 and copied to the other ranks. Each case loads the program twice: as it is
(copied), and with a line that reads `rank` and changes nothing (every rank expanded),
and the two must give the same program, or the same error at the same place."""

from __future__ import annotations

import pytest

from commdsl.dsl import load_schedule_text
from commdsl.errors import CommdslError

HEAD = """\
name: t
params: {n: 3}
world: {pp: 2, dp: 4}
streams: [compute, comm]
groups:
  pairs: [[0, 1], [2, 3], [4, 5], [6, 7]]
  odd: [[0, 1, 2], [3, 4, 5, 6, 7]]
  low: [0, 1]
program: |
"""


def _text(lines: list[str], *, read_rank: bool) -> str:
    # `_r = rank`, last, reads the rank (so every rank is expanded) and changes nothing.
    body = lines + (["_r = rank"] if read_rank else [])
    return HEAD + "".join(f"  {line}\n" for line in body)


def _load(lines: list[str], *, read_rank: bool, max_ops: int = 5_000_000):
    try:
        return load_schedule_text(_text(lines, read_rank=read_rank), "t.yaml", max_ops=max_ops).to_json()
    except CommdslError as err:
        return ("error", type(err).__name__, err.format())


PROGRAMS = {
    "world_collectives": ["for i in range(n):", "    compute F[i] 1ms", "    all_reduce g[i] 4MiB"],
    "mesh_axis_groups": ["for i in range(n):", "    h[i] = all_reduce g[i] 4MiB group=dp on comm", "    compute B[i] 2ms",
                         "for i in range(n):", "    wait h[i]", "all_gather p 8MiB group=pp"],
    "custom_groups": ["all_reduce x 4MiB group=pairs", "barrier group=pairs"],
    "groups_of_other_sizes": ["all_gather x 60B group=odd"],
    "split_fails_in_a_larger_group": ["all_gather x 12B group=odd"],
    "not_a_member": ["compute F 1ms", "all_reduce x 4MiB group=low"],
    "events_and_memory": ["alloc buf 1GiB", "compute F 1ms", "record done", "wait done on comm", "all_reduce g 4MiB on comm",
                          "free buf", "synchronize"],
    "warning_names_its_rank": ["h = all_reduce g 4MiB", "compute F 1ms"],
    "rooted_collective": ["broadcast w 4MiB src=0", "reduce r 4MiB dst=1 group=pairs"],
    "send_to_a_fixed_rank": ["send x 4MiB to 1"],
    "plain_if": ["if world_size > 1:", "    compute F 1ms"],
    "blocks_and_loops": ["def step(i):", "    compute F[i] 1ms", "    all_reduce g[i] bf16[1024] op=avg group=dp",
                         "for i in range(n):", "    step(i)"],
}


@pytest.mark.parametrize("lines", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_copied_ranks_equal_expanded_ranks(lines):
    assert _load(lines, read_rank=False) == _load(lines, read_rank=True)


@pytest.mark.parametrize("max_ops", [1, 6, 7, 20, 23, 24, 25])
def test_op_limit_trips_at_the_same_op(max_ops):
    lines = ["for i in range(n):", "    all_reduce g[i] 4MiB group=dp"]
    # The `_r = rank` line makes no op, so both count alike; 3 ops a rank, 8 ranks.
    copied, expanded = _load(lines, read_rank=False, max_ops=max_ops), _load(lines, read_rank=True, max_ops=max_ops)
    assert copied == expanded
    assert isinstance(copied, tuple) == (max_ops < 24)  # an error, or the program


def test_a_rank_free_program_is_copied():
    """The template is really used: the program that does not read its rank is not
    expanded per rank (its ranks share rank 0's op names and indices, object for object)."""
    program = load_schedule_text(_text(PROGRAMS["world_collectives"], read_rank=False), "t.yaml")
    first, last = program.ops[0], program.ops[-1]
    assert all(a.name is b.name and a.index is b.index and a.spec is b.spec for a, b in zip(first, last))
    assert [op.rank for op in last] == [7] * len(last)
