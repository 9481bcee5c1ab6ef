"""Every bundled schedule, with small params, runs under real torchrun on gloo with
--check, and its measured timeline has one span per op and respects the semantics."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from commdsl.ir import OpKind
from commdsl.resources import bundled_schedules
from commdsl.run.compute import MATMUL_DTYPES
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.timeline import FLOP_RATE_META, MEMORY_PEAK_META, Timeline

try:
    from test_run_support import REPO, assert_semantics, load, torchrun
except ImportError:
    from tests.test_run_support import REPO, assert_semantics, load, torchrun

MAX_RANKS = 4

SMALL = {
    "1f1b": "stages=2 microbatches=3 act=16KiB t_fwd=1ms t_bwd=1ms",
    "collectives": "ranks=3 tensor=12KiB skew=1ms",
    "ddp_overlap": "ranks=2 steps=1 layers=4 layer_grad=16KiB t_fwd=1ms t_bwd=1ms t_opt=1ms",
    "fsdp": "ranks=2 layers=2 layer_params=16KiB t_fwd=1ms t_bwd=1ms t_opt=1ms",
    "gpipe": "stages=2 microbatches=3 act=16KiB t_fwd=1ms t_bwd=1ms",
    "llm_3d": "layers=2 hidden=64 heads=2 kv_heads=2 vocab=64 seq=16 microbatches=2 tp=1 pp=2 dp=2 bucket_layers=1",
    "interleaved_1f1b": "stages=2 chunks=2 microbatches=4 act=16KiB t_fwd=1ms t_bwd=1ms",
    "looped_bfs": "stages=2 chunks=2 microbatches=2 act=16KiB t_fwd=1ms t_bwd=1ms",
    "interleaved_zb": "stages=2 chunks=2 microbatches=4 act=16KiB t_fwd=1ms t_bwd_in=1ms t_bwd_w=1ms",
    "zbv": "stages=2 microbatches=3 act=16KiB t_fwd=1ms t_bwd_in=1ms t_bwd_w=1ms",
    "dualpipev": "stages=2 microbatches=4 act=16KiB t_fwd=1ms t_bwd_in=1ms t_bwd_w=1ms",
    "memcpy_vs_nccl": "gpus=2 copies=4 msg=64KiB t_compute=2ms",
    "p2p": "pairs=1 msg=16KiB t_compute=1ms t_host=1ms",
    "stream_overlap": "ranks=1 batches=2 batch=64KiB t_step=2ms t_prep=1ms",
    "tp_mlp": "dp=2 tp=2 blocks=1 tokens=64 hidden=64",
}
"""Small params per bundled schedule; schedules not listed get theirs shrunk generically."""

MEMORY_MACHINE = {"llm_3d": "h100-nvlink"}
"""The machine a schedule's predicted memory peak comes from where cpu-loopback lacks the
rate of its FLOP-sized ops (llm_3d computes in bf16)."""

_SIZE = re.compile(r"^\d+(\.\d+)?(KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)$")
_TIME = re.compile(r"^\d+(\.\d+)?(ns|us|ms|s)$")


def small_params(name: str) -> dict[str, str]:
    if name in SMALL:
        return dict(kv.split("=", 1) for kv in SMALL[name].split())
    info = json.loads(subprocess.run([sys.executable, "-m", "commdsl.cli", "check", "--json", name], cwd=REPO,
                                     capture_output=True, text=True, timeout=60, check=True).stdout)  # fmt: skip
    out = {}
    for key, value in info["params"].items():
        if _SIZE.match(value):
            out[key] = "16KiB"
        elif _TIME.match(value):
            out[key] = "1ms"
    return out


@pytest.mark.parametrize("name", bundled_schedules())
def test_bundled_schedule_runs_with_check(tmp_path, name):
    params = small_params(name)
    program = load(name, params)
    if program.world_size > MAX_RANKS:
        pytest.skip(f"{name} has {program.world_size} ranks with small params; CI runs up to {MAX_RANKS}")
    out = tmp_path / "measured.json"
    args = [name, *(f"-p{k}={v}" for k, v in params.items()), "--check", "--warmup", "0", "--iters", "1", "--out", str(out)]
    run = torchrun(program.world_size, args)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "all correct" in run.stdout
    measured = Timeline.read(out)
    assert_semantics(program, measured)
    # Every rank times its FLOP block at start-up in the dtypes of its FLOP-sized ops
    # (tp_mlp's matmuls), for `compare` to set against the machine file's rate.
    flop_dtypes = {str(r): {op.dtype.value for op in ops if op.kind is OpKind.COMPUTE and op.duration_us is None
                            and op.flops and op.dtype in MATMUL_DTYPES} for r, ops in enumerate(program.ops)}  # fmt: skip
    rates = measured.meta.get(FLOP_RATE_META, {})
    assert {r: set(by) for r, by in rates.items()} == (flop_dtypes if any(flop_dtypes.values()) else {})
    assert all(t > 0 for by in rates.values() for t in by.values())
    # The buffers a schedule declares are allocated for real; on one stream the
    # executor's accounting peaks where the simulation does.
    if any(op.kind is OpKind.ALLOC for op in program.all_ops()):
        # (a machine with the schedule's FLOP rates: declared memory does not depend on it)
        predicted = simulate(program, resolve_machine(MEMORY_MACHINE.get(name, "cpu-loopback"))).timeline
        assert measured.meta[MEMORY_PEAK_META] == predicted.meta[MEMORY_PEAK_META]
    else:
        assert MEMORY_PEAK_META not in measured.meta
