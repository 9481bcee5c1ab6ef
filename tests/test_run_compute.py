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


def test_every_compute_thread_runs_one_intra_op_thread(monkeypatch):
    """Without OMP_NUM_THREADS (torchrun sets none for one rank), each stream thread's
    intra-op team once took every core: concurrent teams fought over the cores (10 ms
    ops took 27-40 ms) and calibration, on another thread, misjudged their speed. Every
    thread that runs compute, the stream threads and calibration's, runs one intra-op
    thread; the main thread keeps torch's default. (How long ops take is a figure:
    bench/duration_accuracy.py.)"""
    import threading

    from commdsl.run.compute import compute_threads
    from commdsl.run.config import RunConfig
    from commdsl.run.executor import RankSetup, make_executor

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu = torch.device("cpu")
    assert compute_threads(cpu) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert compute_threads(cpu) is None  # the user's (or torchrun's) setting stands
    monkeypatch.delenv("OMP_NUM_THREADS")

    program = load_schedule_text("name: t\nworld: 1\nstreams: [a, b]\nprogram: |\n  compute X 1ms\n  compute Y 1ms on b\n", "t.yaml")
    kernels = Kernels(cpu, DurationMode.BUSY, compute_threads(cpu))
    executor = make_executor(RankSetup(program, 0, "gloo", cpu, {}, None, RunConfig("t.yaml"), kernels, None))
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def probe(name: str):
        def task() -> None:
            with lock:
                seen[name] = torch.get_num_threads()

        return task

    main_threads = torch.get_num_threads()
    try:
        for name, stream in executor.streams.items():
            stream.submit(probe(name))
            stream.drain()
        kernels._on_compute_thread(probe("calibration"))
    finally:
        executor.close()
    assert seen == {"a": 1, "b": 1, "calibration": 1}
    assert torch.get_num_threads() == main_threads
