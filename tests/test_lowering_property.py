"""Property: for any pipeline compute order that can run, the stage transfers the
loader places never deadlock.

Hypothesis draws a pipeline (ranks, stages per rank looped or in a V, microbatches,
which backwards split into I and W) and a random execution of it (any action whose
inputs are ready may run next); each rank's order is its share of that execution.
Written as PyTorch's compute-only CSV and imported, the schedule must load, keep the
order, and finish under the strict rendezvous model and in the simulator.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.dsl import load_schedule_text
from commdsl.interop.pipelining import parse_csv, schedule_text
from commdsl.sim import check_deadlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_pytorch_orders import actions  # noqa: E402
from test_schedules import rendezvous_deadlock  # noqa: E402


def random_execution(ranks: int, chunks: int, v_shape: bool, microbatches: int, split: set, seed: int) -> list[list[str]]:
    stages = ranks * chunks
    owner = [min(s, 2 * ranks - 1 - s) if v_shape else s % ranks for s in range(stages)]
    done: set[tuple[str, int, int]] = set()
    todo = []
    for s in range(stages):
        for mb in range(microbatches):
            todo.append(("F", s, mb))
            todo += [("I", s, mb), ("W", s, mb)] if (s, mb) in split else [("B", s, mb)]

    def ready(a):
        kind, s, mb = a
        if kind == "F":
            return s == 0 or ("F", s - 1, mb) in done
        if kind == "W":
            return ("I", s, mb) in done
        grad_ready = s == stages - 1 or ("B", s + 1, mb) in done or ("I", s + 1, mb) in done
        return ("F", s, mb) in done and grad_ready

    rng = random.Random(seed)
    rows: list[list[str]] = [[] for _ in range(ranks)]
    while todo:
        a = rng.choice([a for a in todo if ready(a)])
        todo.remove(a)
        done.add(a)
        rows[owner[a[1]]].append(f"{a[1]}{a[0]}{a[2]}")
    return rows


@st.composite
def pipelines(draw):
    ranks = draw(st.integers(1, 4))
    v_shape = draw(st.booleans())
    chunks = 2 if v_shape else draw(st.integers(1, 3))
    microbatches = draw(st.integers(1, 4))
    pairs = [(s, mb) for s in range(ranks * chunks) for mb in range(microbatches)]
    split = draw(st.sets(st.sampled_from(pairs))) if pairs else set()
    return random_execution(ranks, chunks, v_shape, microbatches, split, draw(st.integers(0, 2**32)))


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_stage_transfers_of_any_runnable_order_never_deadlock(rows):
    text = "\n".join(",".join(row) for row in rows) + "\n"
    program = load_schedule_text(schedule_text(parse_csv(text, "random.csv"), "random"), "random.yaml")
    assert [actions(program, r).split() for r in range(program.world_size)] == rows
    assert rendezvous_deadlock(program) is None
    check_deadlock(program)
