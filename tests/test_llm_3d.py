"""The bundled `llm_3d` schedule: a transformer step over a TP x PP x DP mesh. It checks and
simulates for each pipeline family and data-parallel style; its compute adds up to the
FLOP count of the model's shapes (derived here independently, from the whole model); its
declared memory per rank follows the params; its bad params end in their message."""

from __future__ import annotations

import math

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule
from commdsl.errors import ScheduleError
from commdsl.ir import OpKind
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.sim.memory import memory_profile

SMALL = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "vocab": 512, "seq": 64, "microbatches": 4,
         "tp": 2, "pp": 2, "dp": 2}  # fmt: skip
"""A small model on 8 ranks: every kind of communication, in a second or two."""


def load(**params):
    return load_schedule("llm_3d", {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in {**SMALL, **params}.items()})


def model_flops(p: dict) -> float:
    """One step's FLOPs from the whole model's shapes: 3 x (2 x matmul params x tokens)
    + 3 x the attention's 4 b s^2 h per layer (Narayanan et al. 2021), the LM head
    counted with the matmul params."""
    h, ffn, heads, kv, layers = p["hidden"], p.get("ffn", 4 * p["hidden"]), p["heads"], p["kv_heads"], p["layers"]
    mlp = p.get("mlp_matrices", 2)
    layer_params = 2 * h * h + 2 * h * (h // heads * kv) + mlp * h * ffn
    sequences = p["dp"] * p["microbatches"] * p.get("micro_batch", 1)
    tokens = sequences * p["seq"]
    matmul_params = layers * layer_params + p["vocab"] * h  # the embedding is a lookup, the head a matmul
    return 3 * 2 * matmul_params * tokens + 3 * 4 * sequences * p["seq"] ** 2 * h * layers


def compute_flops(program) -> float:
    return sum(op.spec.flops or 0 for op in program.all_ops() if op.kind is OpKind.COMPUTE)


FAMILIES = [pytest.param(g, id="gpipe" if g else "1f1b") for g in (True, False)]
STYLES = [pytest.param(f, id="fsdp" if f else "ddp") for f in (True, False)]


@pytest.mark.parametrize("gpipe", FAMILIES)
@pytest.mark.parametrize("fsdp", STYLES)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_checks_and_simulates_for_each_family_and_dp_style(capsys, gpipe, fsdp, sequence_parallel):
    params = {**SMALL, "gpipe": gpipe, "fsdp": fsdp, "sequence_parallel": sequence_parallel}
    args = [f"-p{k}={str(v).lower()}" for k, v in params.items()]
    assert main(["check", "llm_3d", *args]) == 0
    assert main(["simulate", "llm_3d", *args, "--machine", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "llm_3d on dgx-h100" in out and "8 ranks" in out
    program = load(gpipe=gpipe, fsdp=fsdp, sequence_parallel=sequence_parallel)
    kinds = {op.kind for op in program.all_ops()}
    tp_kinds = {OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER} if sequence_parallel else {OpKind.ALL_REDUCE}
    assert tp_kinds <= kinds and {OpKind.SEND, OpKind.RECV} <= kinds
    dp_kind = OpKind.REDUCE_SCATTER if fsdp else OpKind.ALL_REDUCE
    dp_groups = {g.id for g in program.groups if g.family == "dp"}
    dp_ops = [op for op in program.ops[0] if op.spec.stream == "comm" and op.kind.is_comm]
    assert {op.kind for op in dp_ops} == ({OpKind.ALL_GATHER, dp_kind} if fsdp else {dp_kind})
    assert {op.spec.group for op in dp_ops} <= dp_groups


@pytest.mark.parametrize("params", [
    {},
    {"sequence_parallel": True, "fsdp": True},
    {"gpipe": True, "tp": 1, "pp": 4, "dp": 1, "layers": 8, "mlp_matrices": 3, "ffn": 688, "micro_batch": 2},
    {"pp": 1, "tp": 4, "dp": 2, "kv_heads": 4, "seq": 128},
], ids=["default", "sp-fsdp", "gpipe-swiglu", "no-pipeline"])  # fmt: skip
def test_compute_flops_match_the_formula(params):
    program = load(**params)
    assert compute_flops(program) == pytest.approx(model_flops({**SMALL, **params}), rel=1e-12)


def test_flops_scale_with_the_shapes():
    # Tokens scale every term; the sequence length also scales the attention's s^2 term.
    base = compute_flops(load())
    assert compute_flops(load(microbatches=8)) == pytest.approx(2 * base)
    assert compute_flops(load(seq=128)) > 2 * base
    assert compute_flops(load(tp=1, dp=4)) == pytest.approx(2 * base)  # twice the replicas, same ranks


def peaks(program) -> list[int]:
    result = simulate(program, resolve_machine("h100-nvlink"))
    return [m.peak_bytes for m in memory_profile(result.raw)]


def stage_params(p: dict, stage: int) -> int:
    h, heads, kv, tp, pp = p["hidden"], p["heads"], p["kv_heads"], p["tp"], p["pp"]
    layer = (2 * h * h + 2 * h * (h // heads * kv)) // tp + p.get("mlp_matrices", 2) * h * p.get("ffn", 4 * h) // tp
    vocab = p["vocab"] * h // tp
    return p["layers"] // pp * layer + vocab * ((stage == 0) + (stage == pp - 1))


def saved_per_microbatch(p: dict, stage: int) -> int:
    tokens, h, tp = p["seq"] * p.get("micro_batch", 1), p["hidden"], p["tp"]
    layer = math.ceil(tokens * h * (10 + 24 / tp))  # flash attention: no scores kept
    logits = 4 * tokens * p["vocab"] // tp if stage == p["pp"] - 1 else 0
    return p["layers"] // p["pp"] * layer + logits


@pytest.mark.parametrize("gpipe", FAMILIES)
def test_ddp_memory_per_rank_follows_the_params(gpipe):
    # DDP: 18 bytes per parameter of the rank's share, plus the activations of the
    # microbatches in flight: all of them in GPipe, pp - stage in 1F1B.
    p = {**SMALL, "gpipe": gpipe}
    program = load(gpipe=gpipe)
    got = peaks(program)
    for rank, peak in enumerate(got):
        stage = rank // (p["tp"] * p["dp"])
        in_flight = p["microbatches"] if gpipe else min(p["pp"] - stage, p["microbatches"])
        assert peak == 18 * stage_params(p, stage) + in_flight * saved_per_microbatch(p, stage), f"rank {rank}"
    # Twice the layers: twice the static part and the layers' activations.
    doubled = peaks(load(gpipe=gpipe, layers=8))
    assert all(b > a for a, b in zip(got, doubled))


def allocs(program, rank: int) -> dict[str, int]:
    return {op.name: op.spec.size_bytes for op in program.ops[rank] if op.kind is OpKind.ALLOC}


@pytest.mark.parametrize("dp", [2, 4])
def test_fsdp_shards_the_static_memory(dp):
    # FSDP keeps 16 bytes per parameter of its 1/dp shard, and each layer's bf16 weights
    # and gradients unsharded (padded to a multiple of dp elements) during the step.
    p = {**SMALL, "dp": dp, "tp": 1, "kv_heads": 2}
    program = load(fsdp=True, dp=dp, tp=1)
    h, layer = p["hidden"], stage_params({**p, "vocab": 0}, 1) // (p["layers"] // p["pp"])
    padded = math.ceil(layer / dp) * dp
    for rank in (0, len(program.ops) - 1):
        stage = rank // dp
        got = allocs(program, rank)
        assert got["shard_state"] == math.ceil(stage_params(p, stage) / dp) * 16
        layers = [name for name in got if name.startswith("full_w[")]
        assert len(layers) == p["layers"] // p["pp"] and all(got[name] == 2 * padded for name in layers)
        assert got["full_w_vocab"] == 2 * math.ceil(p["vocab"] * h / dp) * dp
    assert all(f < d for f, d in zip(peaks(program), peaks(load(dp=dp, tp=1))))


@pytest.mark.parametrize("params, message", [
    ({"layers": 3}, "layers must be a multiple of pp"),
    ({"heads": 6}, "hidden must be a multiple of heads"),
    ({"kv_heads": 1}, "kv_heads, ffn and vocab must be multiples of tp"),
    ({"sequence_parallel": True, "seq": 63}, "seq must be a multiple of tp"),
    ({"mlp_matrices": 4}, "mlp_matrices is 2 (GELU MLP) or 3 (SwiGLU)"),
    ({"microbatches": 0}, "must be at least 1"),
])  # fmt: skip
def test_bad_params_end_in_their_message(params, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(**params)
