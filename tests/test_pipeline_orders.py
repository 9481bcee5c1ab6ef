"""The pipeline schedules run their textbook order, move the right tensors, and batch
their steady-state P2P.

The expected orders are written here independently of the schedules:
  * 1F1B (PipeDream-Flush): rank r runs min(S - r - 1, M) forwards, then alternates one
    forward and one backward, then the remaining backwards;
  * GPipe: every forward, then every backward, in microbatch order;
  * interleaved 1F1B: Megatron-LM's forward_backward_pipelining_with_interleaving, as
    its loop structure and get_model_chunk_id / microbatch-id arithmetic compute it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule
from commdsl.ir import OpKind, Program
from commdsl.validate import validate_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_schedules import _cli, p2p_pairs, rendezvous_deadlock  # noqa: E402

# ---- independent reference orders -------------------------------------------------------------


def textbook_1f1b(stages: int, microbatches: int, rank: int) -> list[tuple]:
    warmup = min(stages - rank - 1, microbatches)
    order = [("F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", mb) for mb in range(microbatches - warmup, microbatches)]
    return order


def gpipe(stages: int, microbatches: int, rank: int) -> list[tuple]:
    return [("F", mb) for mb in range(microbatches)] + [("B", mb) for mb in range(microbatches)]


def megatron_interleaved(p: int, v: int, m: int, rank: int) -> list[tuple]:
    """Megatron-LM's interleaved order on pipeline rank `rank`: ("F"|"B", microbatch, chunk)."""

    def get_model_chunk_id(k, forward):
        model_chunk_id = (k % (p * v)) // p
        return model_chunk_id if forward else v - model_chunk_id - 1

    def get_microbatch_id_in_model_chunk(k):
        iteration_group_id = k // (p * v)
        return k % p + iteration_group_id * p

    total = m * v
    num_warmup = (p - rank - 1) * 2 + (v - 1) * p
    num_warmup = min(num_warmup, total)
    remaining = total - num_warmup

    def fwd(k):
        return ("F", get_microbatch_id_in_model_chunk(k), get_model_chunk_id(k, True))

    def bwd(k):
        return ("B", get_microbatch_id_in_model_chunk(k), get_model_chunk_id(k, False))

    order = [fwd(k) for k in range(num_warmup)]
    for k in range(remaining):
        order += [fwd(k + num_warmup), bwd(k)]
    order += [bwd(k) for k in range(remaining, total)]
    return order


def test_megatron_reference_on_a_known_case():
    """4 ranks, 2 chunks, 8 microbatches (Narayanan et al. 2021, fig. 4), rank 0:
    microbatches 0-3 through chunk 0, then through chunk 1, then (p - r - 1) * 2 +
    (v - 1) * p = 10 warm-up forwards, then the steady state's forward and the first
    backward (microbatch 0, chunk 1)."""
    ref = megatron_interleaved(4, 2, 8, 0)
    assert ref[:8] == [("F", mb, 0) for mb in range(4)] + [("F", mb, 1) for mb in range(4)]
    assert [step[0] for step in ref[:12]] == ["F"] * 11 + ["B"]
    assert ref[8:12] == [("F", 4, 0), ("F", 5, 0), ("F", 6, 0), ("B", 0, 1)]
    assert ref[-4:] == [("B", mb, 0) for mb in range(4, 8)]
    assert [step[0] for step in megatron_interleaved(4, 2, 8, 3)[:6]] == ["F"] * 4 + ["F", "B"]
    # Every (microbatch, chunk) runs forward once and backward once, backward after forward.
    for order in (megatron_interleaved(4, 2, 8, r) for r in range(4)):
        fw = [(mb, c) for k, mb, c in order if k == "F"]
        bw = [(mb, c) for k, mb, c in order if k == "B"]
        assert sorted(fw) == sorted(bw) == [(mb, c) for mb in range(8) for c in range(2)]
        assert all(order.index(("F", mb, c)) < order.index(("B", mb, c)) for mb, c in fw)


# ---- reading the schedules ---------------------------------------------------------------------------

_NAME = re.compile(r"^([FB])\[(\d+)(?:,(\d+))?\]$")


def compute_order(program: Program, rank: int) -> list[tuple]:
    out = []
    for op in program.ops[rank]:
        if op.kind is OpKind.COMPUTE:
            m = _NAME.match(op.name)
            assert m, f"unexpected compute op {op.name}"
            kind, mb, chunk = m.group(1), int(m.group(2)), m.group(3)
            out.append((kind, mb) if chunk is None else (kind, mb, int(chunk)))
    return out


def grid_orders(stdout: str) -> dict[int, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"rank (\d+)\s+\| (.*)$", line)
        if m:
            rows[int(m.group(1))] = m.group(2).split()
    return rows


def _label(step: tuple) -> str:
    return step[0] + ",".join(str(x) for x in step[1:])


PAIRS_1F1B = [(s, m) for s in range(1, 9) for m in [*range(1, 11), 13, 16, 31, 32]]
PAIRS_GPIPE = [(s, m) for s in range(1, 9) for m in (1, 2, 3, 5, 8, 13, 16, 32)]
TRIPLES_INTERLEAVED = [(p, v, m) for p in range(2, 9) for v in (1, 2, 3, 4) for m in (p, 2 * p, 3 * p)] + [(8, 4, 32)]


def _check_pipeline(program: Program, expected_for_rank) -> None:
    for rank in range(program.world_size):
        assert compute_order(program, rank) == expected_for_rank(rank), f"rank {rank}"
    validate_program(program)
    assert rendezvous_deadlock(program) is None
    for s, r in p2p_pairs(program):
        assert s.name == r.name, f"rank {s.rank} sends {s.name}, rank {r.rank} receives {r.name}"


@pytest.mark.parametrize("stages", range(1, 9))
def test_1f1b_order_is_textbook(stages):
    for s, m in PAIRS_1F1B:
        if s == stages:
            program = load_schedule("1f1b", {"stages": str(s), "microbatches": str(m)})
            _check_pipeline(program, lambda r: textbook_1f1b(s, m, r))


@pytest.mark.parametrize("stages", range(1, 9))
def test_gpipe_order_is_all_forwards_then_all_backwards(stages):
    for s, m in PAIRS_GPIPE:
        if s == stages:
            program = load_schedule("gpipe", {"stages": str(s), "microbatches": str(m)})
            _check_pipeline(program, lambda r: gpipe(s, m, r))


@pytest.mark.parametrize("stages", range(2, 9))
def test_interleaved_1f1b_order_is_megatrons(stages):
    for p, v, m in TRIPLES_INTERLEAVED:
        if p == stages:
            program = load_schedule("interleaved_1f1b", {"stages": str(p), "chunks": str(v), "microbatches": str(m)})
            _check_pipeline(program, lambda r: megatron_interleaved(p, v, m, r))


@pytest.mark.parametrize(
    "name,params,expected",
    [
        ("1f1b", {"stages": 5, "microbatches": 7}, lambda r: textbook_1f1b(5, 7, r)),
        ("1f1b", {"stages": 4, "microbatches": 2}, lambda r: textbook_1f1b(4, 2, r)),
        ("gpipe", {"stages": 3, "microbatches": 4}, lambda r: gpipe(3, 4, r)),
        ("interleaved_1f1b", {"stages": 4, "chunks": 2, "microbatches": 8}, lambda r: megatron_interleaved(4, 2, 8, r)),
    ],
)
def test_cli_grid_shows_the_order(name, params, expected, tmp_path):
    argv = ["show", name, "--no-listing"] + [x for k, v in params.items() for x in ("-p", f"{k}={v}")]
    result = subprocess.run(_cli() + argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = grid_orders(result.stdout)
    world = params["stages"]
    assert sorted(rows) == list(range(world))
    for rank in range(world):
        assert rows[rank] == [_label(step) for step in expected(rank)], f"rank {rank}"


# ---- the P2P of each pipeline schedule --------------------------------------------------------------


def _dataflow(program: Program, chunks: int | None) -> None:
    """Each forward receives its input before it runs and each backward its output
    gradient, except at the first / last (virtual) stage; each sent tensor was computed
    before it is sent. `chunks` is None for one stage per rank; then names are act[mb],
    grad[mb], else act[mb, s] / grad[mb, s] with s the consuming virtual stage."""
    p = program.world_size
    last = p * (chunks or 1) - 1

    def key(mb, stage):
        return f"{mb}" if chunks is None else f"{mb},{stage}"

    for rank in range(p):
        received, done = set(), set()
        for op in program.ops[rank]:
            if op.kind is OpKind.RECV:
                received.add(op.name)
            elif op.kind is OpKind.COMPUTE:
                kind, mb, *chunk = compute_order(program, rank)[len(done)]
                stage = (chunk[0] * p if chunk else 0) + rank
                if kind == "F" and stage > 0:
                    assert f"act[{key(mb, stage)}]" in received, f"rank {rank} runs F of {mb} before its input"
                if kind == "B" and stage < last:
                    assert f"grad[{key(mb, stage)}]" in received, f"rank {rank} runs B of {mb} before its gradient"
                done.add((kind, mb, stage))
            elif op.kind is OpKind.SEND:
                tensor, idx = op.name.rstrip("]").split("[")
                mb, *to = (int(x) for x in idx.split(","))
                if tensor == "act":
                    producer = ("F", mb, to[0] - 1 if to else rank)
                else:
                    producer = ("B", mb, to[0] + 1 if to else rank)
                assert producer in done, f"rank {rank} sends {op.name} before computing it"


@pytest.mark.parametrize(
    "name,params",
    [
        ("1f1b", {"stages": "4", "microbatches": "8"}),
        ("1f1b", {"stages": "6", "microbatches": "3"}),
        ("gpipe", {"stages": "4", "microbatches": "6"}),
        ("interleaved_1f1b", {"stages": "4", "chunks": "2", "microbatches": "8"}),
        ("interleaved_1f1b", {"stages": "2", "chunks": "3", "microbatches": "4"}),
        ("interleaved_1f1b", {"stages": "3", "chunks": "2", "microbatches": "3"}),
    ],
)
def test_tensors_flow_between_stages(name, params):
    program = load_schedule(name, params)
    _dataflow(program, int(params["chunks"]) if "chunks" in params else None)


def _batches(program: Program, rank: int) -> list[list]:
    out: dict[int, list] = {}
    for op in program.ops[rank]:
        if op.batch is not None:
            out.setdefault(op.batch, []).append(op)
    return list(out.values())


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (4, 4), (8, 16), (5, 3)])
def test_1f1b_steady_state_p2p_is_batched(stages, microbatches):
    """After each steady-state forward, a non-last rank sends the activation and receives
    a gradient from the next rank in one batch; after each steady-state backward, a
    non-first rank sends the gradient and receives the next input in one batch."""
    program = load_schedule("1f1b", {"stages": str(stages), "microbatches": str(microbatches)})
    for rank in range(stages):
        warmup = min(stages - rank - 1, microbatches)
        steady = microbatches - warmup
        batches = _batches(program, rank)
        to_next = [b for b in batches if {(o.kind, o.peer) for o in b} == {(OpKind.SEND, rank + 1), (OpKind.RECV, rank + 1)}]
        to_prev = [b for b in batches if {(o.kind, o.peer) for o in b} == {(OpKind.SEND, rank - 1), (OpKind.RECV, rank - 1)}]
        assert len(to_next) == (steady if rank < stages - 1 else 0), f"rank {rank}"
        assert len(to_prev) == (max(steady - 1, 0) if rank > 0 else 0), f"rank {rank}"
        assert len(batches) == len(to_next) + len(to_prev)
        # Each forward-side batch comes right after the forward whose output it sends.
        ops = program.ops[rank]
        for b in to_next:
            before = [o for o in ops[: b[0].index] if o.kind is OpKind.COMPUTE][-1]
            assert before.name.startswith("F[") and f"act{before.name[1:]}" == next(o.name for o in b if o.kind is OpKind.SEND)


@pytest.mark.parametrize("stages,chunks,microbatches", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (8, 2, 16)])
def test_interleaved_p2p_is_one_batch_per_step(stages, chunks, microbatches):
    """As in Megatron-LM: after every forward (warm-up), forward+backward pair (steady
    state) and backward (cool-down) a rank issues at most one batch_isend_irecv, and in
    the steady state such a batch sends to and receives from both ring neighbours."""
    program = load_schedule(
        "interleaved_1f1b", {"stages": str(stages), "chunks": str(chunks), "microbatches": str(microbatches)}
    )
    full_batches = 0
    for rank in range(stages):
        ops = program.ops[rank]
        unbatched = [o for o in ops if o.kind.is_p2p and o.batch is None]
        # Only the very first input is a plain recv (none on rank 0).
        assert [(o.kind, o.name) for o in unbatched] == ([] if rank == 0 else [(OpKind.RECV, f"act[0,{rank}]")])
        total = microbatches * chunks
        all_warmup = (stages - rank - 1) * 2 + (chunks - 1) * stages >= total
        segments: list[set[int]] = [set()]  # batches after each compute (and before the first)
        for op in ops:
            if op.kind is OpKind.COMPUTE:
                segments.append(set())
            elif op.kind.is_p2p and op.batch is not None:
                segments[-1].add(op.batch)
        for after, batches in enumerate(segments):
            # Megatron's one exception: with every forward in the warm-up, the last
            # forward's send and the first gradient's recv are two calls.
            allowed = 2 if all_warmup and after == total else 1
            assert len(batches) <= allowed, f"rank {rank}: several batches after compute #{after}"
        nxt, prv = (rank + 1) % stages, (rank - 1) % stages
        both = {(OpKind.SEND, nxt), (OpKind.RECV, prv), (OpKind.SEND, prv), (OpKind.RECV, nxt)}
        full_batches += sum({(o.kind, o.peer) for o in b} == both for b in _batches(program, rank))
    assert full_batches > 0


def test_gpipe_uses_plain_blocking_p2p():
    program = load_schedule("gpipe", {"stages": "4", "microbatches": "4"})
    p2p = [o for o in program.all_ops() if o.kind.is_p2p]
    assert p2p and all(o.batch is None and o.handle is None for o in p2p)
