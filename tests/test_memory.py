"""Memory per rank: what a schedule declares (`alloc`/`free`), the peaks the simulator
predicts against the published ones, the trace's counter track, the out-of-memory
error, and compare's predicted-against-measured peaks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.comparison import compare_timelines
from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import MemoryExceededError
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.sim import simulate
from commdsl.sim.memory import MEMORY_TRACK
from commdsl.timeline import MEMORY_PEAK_META, Timeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_machine import GOOD  # noqa: E402

MiB = 2**20
NO_STATIC = {"weights": "0B", "optimizer": "0B"}
"""Weights, gradients and optimizer state take nothing: the peaks are activations only."""


def peaks(name: str, **params) -> list[float]:
    """Each rank's peak of declared memory, in units of `saved` (one stage's activations
    of one microbatch)."""
    overrides = {**NO_STATIC, "saved": "32MiB", **{k: str(v) for k, v in params.items()}}
    program = load_schedule(name, overrides)
    summary = simulate(program, resolve_machine("h100-nvlink"), "analytic").summary()
    return [m.peak_bytes / (32 * MiB) for m in summary.memory]


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (4, 2), (6, 6), (2, 9)])
def test_1f1b_holds_stages_minus_rank_microbatches(stages, microbatches):
    assert peaks("1f1b", stages=stages, microbatches=microbatches) == [min(stages - r, microbatches) for r in range(stages)]


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (3, 2)])
def test_gpipe_holds_every_microbatch(stages, microbatches):
    assert peaks("gpipe", stages=stages, microbatches=microbatches) == [microbatches] * stages


@pytest.mark.parametrize("stages,chunks,microbatches", [(4, 2, 8), (4, 3, 12), (2, 2, 4)])
def test_interleaved_1f1b_holds_its_warmup_plus_one(stages, chunks, microbatches):
    """Megatron's interleaving (Narayanan et al. 2021, 2.2): rank r holds the chunks of its
    (stages - r - 1) * 2 + (chunks - 1) * stages warm-up forwards and one more."""
    expected = [min((stages - r - 1) * 2 + (chunks - 1) * stages + 1, microbatches * chunks) for r in range(stages)]
    assert peaks("interleaved_1f1b", stages=stages, chunks=chunks, microbatches=microbatches) == expected


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (3, 6)])
def test_zb_h1_has_1f1bs_peak(stages, microbatches):
    """Qi et al. 2024, 3.1: ZB-H1 keeps 1F1B's peak. With W needing nothing of the
    activations (saved_w=0) the I's free as 1F1B's backwards do."""
    zb = peaks("interleaved_zb", stages=stages, chunks=1, microbatches=microbatches, saved_w="0B")
    assert zb == [min(stages - r, microbatches) for r in range(stages)]
    # The activations W keeps (saved_w) add on every rank that defers its W's.
    deferred = peaks("interleaved_zb", stages=stages, chunks=1, microbatches=microbatches)
    assert deferred[0] == zb[0] and all(d > z for d, z in zip(deferred[1:], zb[1:]))


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (4, 16), (2, 5)])
def test_zb_v_has_p_microbatches_on_every_rank(stages, microbatches):
    """Qi et al. 2024, 6: ZB-V's peak is p M_B, p microbatches of a rank's layers (two
    chunks each)."""
    assert peaks("zbv", stages=stages, microbatches=microbatches, saved_w="0B") == [2 * stages] * stages


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (4, 16), (8, 32), (2, 4)])
def test_dualpipev_holds_pp_plus_one_chunks(stages, microbatches):
    """DeepSeek-V3 report, Table 2 / the DualPipe README: activation memory PP + 1
    microbatch-chunks per device, PP = 2 * stages pipeline stages for DualPipeV."""
    assert peaks("dualpipev", stages=stages, microbatches=microbatches, saved_w="0B") == [2 * stages + 1] * stages


def test_static_memory_counts_once_and_stays():
    program = load_schedule("1f1b", {"stages": "2", "microbatches": "3"})
    summary = simulate(program, resolve_machine("h100-nvlink")).summary()
    static = (512 + 512 + 1024) * MiB
    assert [m.end_bytes for m in summary.memory] == [static, static]
    assert [m.peak_bytes for m in summary.memory] == [static + 2 * 64 * MiB, static + 64 * MiB]
    live = {g.first.split("[")[0]: g for g in summary.memory[0].live_at_peak}
    assert live["saved"].count == 2 and live["saved"].size_bytes == 128 * MiB
    assert live["optimizer"].statement.endswith("1f1b.yaml:63")
    assert summary.to_json()["memory"][0]["peak_bytes"] == static + 128 * MiB


def test_trace_has_a_memory_counter_per_rank_and_the_peaks(tmp_path):
    program = load_schedule("zbv", {"stages": "2", "microbatches": "4"})
    result = simulate(program, resolve_machine("h100-nvlink"))
    path = tmp_path / "t.json"
    result.timeline.write(path)
    tl = Timeline.read(path)
    peaks_meta = tl.meta[MEMORY_PEAK_META]
    for m in result.summary().memory:
        samples = [c for c in tl.counters if c.track == MEMORY_TRACK and c.rank == m.rank]
        assert samples[0].value == 0.0
        assert max(c.value for c in samples) == pytest.approx(m.peak_bytes / MiB)
        assert [c.ts_us for c in samples] == sorted(c.ts_us for c in samples)
        assert peaks_meta[str(m.rank)] == m.peak_bytes
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "C" and e["name"] == MEMORY_TRACK} == {0, 1}


def test_memory_lands_in_stream_order():
    """A free lands when the kernels before it on its stream are done: the buffer is
    live through the compute op it follows, on the simulated clock."""
    text = """
world: 1
params: {t: 5ms}
program: |
  alloc a 1MiB
  compute F t
  free a
  alloc b 2MiB
"""
    program = load_schedule_text(text, "order.yaml")
    result = simulate(program, resolve_machine("h100-nvlink"))
    (mem,) = result.summary().memory
    assert mem.peak_bytes == 2 * MiB and mem.end_bytes == 2 * MiB
    counters = [(c.ts_us, c.value) for c in result.timeline.counters if c.track == MEMORY_TRACK]
    assert counters[1] == (pytest.approx(counters[1][0]), 1.0) and counters[1][0] < 1.0
    assert counters[-1][0] == pytest.approx(5000.0, abs=10) and counters[-1][1] == 2.0


SMALL_GPU = GOOD.replace("  sm_count: 8\n", "  sm_count: 8\n  memory_gib: 1\n")
"""test_machine's small machine, with 1 GiB of device memory."""


def test_out_of_memory_names_the_alloc_and_its_line():
    program = load_schedule("gpipe", {"stages": "2", "microbatches": "8", "weights": "256MiB", "optimizer": "256MiB",
                                      "saved": "64MiB"})  # fmt: skip
    with pytest.raises(MemoryExceededError) as info:
        simulate(program, load_machine_text(SMALL_GPU, "small.yaml"))
    err = info.value
    # 768 MiB static, then the 5th microbatch's activations pass 1 GiB.
    assert "runs out of device memory at `alloc saved[4]`" in err.message and "the test of machine tiny has 1.00 GiB" in err.message
    assert err.exit_code == 5 and err.loc.file == "schedules/gpipe.yaml" and err.loc.text.strip() == "alloc saved[mb] saved"
    assert err.rank == 0


def test_out_of_memory_exits_5_from_the_cli(tmp_path):
    machine = tmp_path / "small.yaml"
    machine.write_text(SMALL_GPU)
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "simulate", "gpipe", "-p", "microbatches=16", "--machine",
                           str(machine)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.startswith("out of memory: rank 0 runs out of device memory at `alloc optimizer`")
    assert "--> schedules/gpipe.yaml:" in proc.stderr and "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "commdsl.cli", "simulate", "gpipe", "-p", "weights=1MiB", "-p", "optimizer=1MiB",
                         "-p", "saved=1MiB", "--machine", str(machine)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "memory (declared buffers" in ok.stdout


def test_a_machine_without_memory_sets_no_limit():
    machine = load_machine_text(SMALL_GPU.replace("  memory_gib: 1\n", ""), "nolimit.yaml")
    assert machine.device.memory_bytes is None
    simulate(load_schedule("gpipe", {"microbatches": "64"}), machine)


def test_compare_sets_predicted_against_measured_peaks(tmp_path):
    program = load_schedule("1f1b", {"stages": "2", "microbatches": "2"})
    predicted = simulate(program, resolve_machine("cpu-loopback")).timeline
    measured = Timeline("measured", predicted.schedule, predicted.world_size, list(predicted.spans), meta={
        MEMORY_PEAK_META: {"0": predicted.meta[MEMORY_PEAK_META]["0"], "1": predicted.meta[MEMORY_PEAK_META]["1"] + 64 * MiB},
        "memory_peak_source": "declared buffers (executor accounting)"})  # fmt: skip
    cmp = compare_timelines(predicted, measured)
    p0, p1 = predicted.meta[MEMORY_PEAK_META]["0"], predicted.meta[MEMORY_PEAK_META]["1"]
    assert cmp.memory_peaks == {0: (p0, p0), 1: (p1, p1 + 64 * MiB)}
    assert cmp.to_json()["memory_peak_bytes"]["1"] == {"predicted": p1, "measured": p1 + 64 * MiB}
    paths = tmp_path / "p.json", tmp_path / "m.json"
    predicted.write(paths[0])
    measured.write(paths[1])
    proc = subprocess.run([sys.executable, "-m", "commdsl.cli", "compare", *map(str, paths)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "memory peak per rank (measured: declared buffers (executor accounting))" in proc.stdout
    assert "   0    2176MiB   2176MiB  +0.0%" in proc.stdout
    assert "   1    2112MiB   2176MiB  -2.9%" in proc.stdout


def test_executor_accounting(tmp_path):
    """The executor's own accounting of its real buffers (CPU): peak, what is live then,
    and release at the end of the program."""
    torch = pytest.importorskip("torch")
    from commdsl.run.tensors import DeclaredMemory, declared_peak_bytes

    program = load_schedule("1f1b", {"stages": "2", "microbatches": "3", **NO_STATIC, "saved": "1MiB"})
    memory = DeclaredMemory(torch.device("cpu"))
    for op in program.ops[0]:
        if op.kind.value == "alloc":
            memory.alloc(op)
        elif op.kind.value == "free":
            memory.free(op)
    assert memory.peak_bytes == declared_peak_bytes(program, 0) == 2 * MiB
    assert sorted(n for n, _ in memory.live_at_peak) == ["grads", "optimizer", "saved[0]", "saved[1]", "weights"]
    assert memory.live_bytes == 0  # weights etc. are 0B here; every saved[] was freed
    memory.release_all()
    assert memory.live_bytes == 0


def test_schedules_declare_memory():
    for name in ("1f1b", "gpipe", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev"):
        program = load_schedule(name)
        assert any(op.kind.value == "alloc" for op in program.all_ops()), name
    assert Path(__file__).parent.joinpath("data", "pytorch_pipeline_orders.json").exists()
