"""How the executor sizes compute ops (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from commdsl.dsl import load_schedule_text
from commdsl.run.compute import DURATION_BLOCKS_CPU, FLOP_BLOCK_CPU, FLOP_BLOCK_CUDA, Kernels
from commdsl.ir import Dtype
from commdsl.run.config import DurationMode


def _op(line: str):
    program = load_schedule_text(f"name: t\nworld: 1\nstreams: [s]\nprogram: |\n  {line}\n", "t.yaml")
    return program.ops[0][0]


def test_a_duration_is_bulk_multiplies_then_small_ones_for_the_remainder():
    k = Kernels(torch.device("cpu"), DurationMode.BUSY)
    bulk, tail = DURATION_BLOCKS_CPU
    k.cal_us = {bulk: 300.0, tail: 5.0}
    spec = k.spec(_op("compute F 10ms"))
    assert (spec.side, spec.repeats, spec.tail_side, spec.tail_repeats) == (bulk, 33, tail, 20)  # 9900 + 100 us
    short = k.spec(_op("compute F 120us"))
    assert (short.repeats, short.tail_repeats) == (0, 24)


@pytest.mark.parametrize(("device", "block"), [("cpu", FLOP_BLOCK_CPU), ("cuda", FLOP_BLOCK_CUDA)])
def test_flop_sized_work_repeats_the_device_block(device, block):
    # Calibration takes the compute rate at this very block (peak_tflops), so the
    # executor must run FLOP-sized ops as repeats of it, in the op's dtype.
    k = Kernels(torch.device(device), DurationMode.BUSY)
    spec = k.spec(_op(f"compute F {10 * 2 * block**3}FLOP dtype=bf16"))
    assert (spec.side, spec.repeats, spec.dtype) == (block, 10, torch.bfloat16)
    small = k.spec(_op(f"compute F {2 * (block // 2) ** 3}FLOP"))
    assert (small.side, small.repeats) == (block // 2, 1)


@pytest.mark.parametrize("line", ["compute F 1ms", "compute F 250us"])
def test_calibrated_kernels_run_and_cover_the_duration(line):
    k = Kernels(torch.device("cpu"), DurationMode.BUSY, threads=1)
    us = k.calibrate(rounds=2, round_us=500.0)
    assert us > 0 and set(k.cal_us) == set(DURATION_BLOCKS_CPU)
    spec = k.spec(_op(line))
    k.prepare("s", spec)
    k.run("s", spec)  # runs the work it sized
    planned = spec.repeats * k.cal_us[spec.side] + spec.tail_repeats * k.cal_us[spec.tail_side]
    target = _op(line).duration_us
    assert abs(planned - target) <= k.cal_us[spec.tail_side]


def test_flop_block_rate_at_start_up():
    """The rate `commdsl compare` sets against the machine file's: the FLOP block's, in
    each dtype asked for, timed on a compute thread as calibration times it."""
    k = Kernels(torch.device("cpu"), DurationMode.BUSY, threads=1)
    rates = k.flop_block_tflops([Dtype.FP32, Dtype.BF16], rounds=2, round_us=500.0)
    assert set(rates) == {Dtype.FP32, Dtype.BF16} and all(0 < r < 1000 for r in rates.values())
    assert k.flop_block_tflops([]) == {}


def test_sleep_mode_sleeps():
    k = Kernels(torch.device("cpu"), DurationMode.SLEEP)
    assert k.spec(_op("compute F 2ms")).sleep_s == pytest.approx(0.002)
