"""End to end on 2 gloo ranks: calibrate -> simulate -> run -> compare, as a user would."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.calibrate.executor_probes import PROBE_ITERS
from commdsl.calibrate.fit import fit_linear
from commdsl.calibrate.main import NOISE_PIECES, OVERLAP_OPS, OVERLAP_PIECES, PASSES
from commdsl.dsl import load_schedule
from commdsl.ir import Dtype, OpKind, ReduceOp, Transport
from commdsl.machine import load_machine
from commdsl.machine.model import CpuContention, DeviceKind
from commdsl.progress import PROGRESS_INTERVAL_ENV
from commdsl.run.compute import FLOP_BLOCK_CPU
from commdsl.timeline import FLOP_RATE_META, Timeline

SMALL = ["-p", "stages=2", "-p", "microbatches=3", "-p", "act=64KiB", "-p", "t_fwd=2ms", "-p", "t_bwd=4ms"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _commdsl(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))  # fmt: skip


@pytest.fixture(scope="module")
def machine_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "machine.yaml"
    raw = out.with_name("raw.json")
    proc = _commdsl("calibrate", "-n", "2", "--out", str(out), "--raw", str(raw), "--max-size", "256KiB", "--repeats", "2",
                    "--warmup", "1", "--matmul-sizes", "32,64,96", "--warm-up", "0.5", timeout=300,
                    env={PROGRESS_INTERVAL_ENV: "0.5"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fit quality" in proc.stdout and "R²" in proc.stdout and "p2p" in proc.stdout
    # Piped output gets a progress line every interval (0.5 s here), on stderr.
    assert re.search(r"^commdsl calibrate: .*: \d+ of \d+ steps \(\d+%\), ", proc.stderr, re.M), proc.stderr[-3000:]
    assert "warming up: 0.5 s of matrix multiplies on every rank" in proc.stdout
    data = json.loads(raw.read_text())
    assert len(data["p2p_us"]) == 5  # 1, 4, 16, 64, 256 KiB
    assert set(data["collectives_us"]) >= {"all_reduce", "all_gather", "broadcast"}
    # How fast each pass ran, per family: printed, kept raw and in the machine file's header.
    assert set(data["pass_ratios"]) == {"communication", "matmul"}
    assert all(len(r) == PASSES and all(x > 0 for x in r) for r in data["pass_ratios"].values())
    assert f"speed of the {PASSES} passes" in proc.stdout
    assert "# Passes, time over the pooled time (median over points): communication " in out.read_text()
    # Interference is measured per comm op inside the executor (the overlap probe); the
    # fp32 all_reduce's factors are the machine-wide ones.
    by_op = {(e["kind"], e["dtype"]): e for e in data["interference_by_op"]}
    assert set(by_op) == {(k.value, d.value if d else "any") for k, d in OVERLAP_OPS} | {("copy", "any")}
    for e in by_op.values():
        assert e["comm_alone_us"] > 0 and e["comm_beside_us"] > 0
        assert e["comm_compute_slowdown"] >= 1 and e["compute_comm_slowdown"] >= 1
    all_reduce = by_op[("all_reduce", "fp32")]
    assert data["compute_slowdown_under_comm"] == all_reduce["comm_compute_slowdown"]
    assert data["comm_slowdown_under_compute"] == all_reduce["compute_comm_slowdown"]
    # Copies' factors come from the same probe, with a copy from host instead of a comm op.
    assert data["compute_slowdown_under_copy"] == by_op[("copy", "any")]["comm_compute_slowdown"]
    assert data["copy_slowdown_under_compute"] == by_op[("copy", "any")]["compute_comm_slowdown"]
    # all_reduce and reduce_scatter are also timed with op=avg, in fp32 and bf16.
    assert {d: set(by) for d, by in data["reductions_us_by_op"]["avg"].items()} == {
        "fp32": {"all_reduce", "reduce_scatter"}, "bf16": {"all_reduce", "reduce_scatter"}}
    # Compute stalls are counted on compute ops run by the executor itself (the probe schedule).
    noise = data["compute_noise"]
    compute, wake = noise["compute"], noise["wake"]
    assert compute["samples"] == 2 * 6 * PROBE_ITERS and 0 <= compute["stalled"] <= compute["samples"] and noise["stalls_per_s"] >= 0
    assert wake["samples"] == 2 * 5 * PROBE_ITERS and 0 <= noise["wake_stall_probability"] < 1
    # The probe runs in pieces; the median piece is the machine's.
    rates = sorted(p["stalls_per_s"] for p in data["compute_noise_pieces"])
    assert len(rates) == NOISE_PIECES and noise["stalls_per_s"] == rates[(NOISE_PIECES - 1) // 2]
    # The typical op's stretch is the median of the pieces' (the typical excess over 10 ms).
    stretches = sorted(p["duration_stretch"] for p in data["compute_noise_pieces"])
    assert noise["duration_stretch"] == stretches[(NOISE_PIECES - 1) // 2] == round(1 + compute["typical_us"] / 10_000, 4)
    # So do the overlap probes: each factor is the median of its pieces'.
    # The op's slowdown beside compute is over the loop's time alone (copies: the probe's).
    for (kind, dtype), e in by_op.items():
        assert len(e["pieces"]) == OVERLAP_PIECES and all(len(p["overlap_us"]) == 2 and all(x > 0 for x in p["overlap_us"]) for p in e["pieces"])
        median = sorted(p["comm_compute_slowdown"] for p in e["pieces"])[OVERLAP_PIECES // 2]
        assert e["comm_compute_slowdown"] == median
        beside = sorted(p["comm_beside_us"] for p in e["pieces"])[OVERLAP_PIECES // 2]
        if kind == "copy":
            assert e["loop_alone_us"] is None
            assert e["compute_comm_slowdown"] == sorted(p["compute_comm_slowdown"] for p in e["pieces"])[OVERLAP_PIECES // 2]
        else:
            series = data["p2p_us"] if kind == "send" else (data["collectives_us"][kind] if dtype in ("fp32", "any")
                                                           else data["reductions_us_by_dtype"][dtype][kind])  # fmt: skip
            assert e["loop_alone_us"] == dict(series)[max(s for s, _ in series)]  # the probe's size: the largest here
            assert e["compute_comm_slowdown"] == pytest.approx(max(1.0, beside / e["loop_alone_us"]))
    # Peer copies are timed inside the executor (a copy into rank 1's memory), each size.
    assert [s for s, _ in data["peer_copy_us"]] == [s for s, _ in data["p2p_us"]] and all(t > 0 for _, t in data["peer_copy_us"])
    assert "peer copy" in proc.stdout and not [s for s in data["skipped"] if s.startswith("peer copy")]
    assert "compute stalls inside the executor" in proc.stdout
    assert "interference inside the executor" in proc.stdout and "reduce_scatter bf16" in proc.stdout
    return out


def test_calibrated_machine_is_a_valid_machine(machine_file: Path) -> None:
    m = load_machine(machine_file)
    assert m.calibration is not None and m.calibration.by == "commdsl calibrate" and not m.calibration.quick
    rates = dict(m.device.peak_tflops)
    assert all(r > 0 for r in rates.values()) and rates
    for _, link in m.transports:
        assert link.latency_us >= 0 and link.bandwidth_gb_per_s > 0
    # memcpy is timed as the peer copies ran, the other transports as the P2P messages.
    raw = json.loads(machine_file.with_name("raw.json").read_text())
    copy_fit = fit_linear([float(s) for s, _ in raw["peer_copy_us"]], [t for _, t in raw["peer_copy_us"]])
    memcpy, gloo = m.transport(Transport.MEMCPY), m.transport(Transport.GLOO)
    assert memcpy.latency_us == round(copy_fit.intercept, 3) and memcpy != gloo
    assert m.kernel_launch_us > 0 and m.comm_launch_us > 0
    # The compute rate is the executor's FLOP block's, measured even though
    # --matmul-sizes leaves it out (the simulator must run FLOP-sized ops at its rate).
    matmul = json.loads(machine_file.with_name("raw.json").read_text())["matmul_us"]
    for dtype, points in matmul.items():
        block_us = dict(points)[FLOP_BLOCK_CPU]
        assert rates[Dtype(dtype)] == pytest.approx(2 * FLOP_BLOCK_CPU**3 / block_us / 1e6, rel=1e-4)
    # Both interference factors are measured and written (never below 1.0: no speed-up).
    c = m.contention
    assert isinstance(c, CpuContention) and m.device.kind is DeviceKind.CPU
    assert c.comm_compute_slowdown is not None and c.comm_compute_slowdown >= 1.0
    assert c.compute_comm_slowdown >= 1.0 and "compute_comm_slowdown:" in machine_file.read_text()
    assert c.compute_copy_slowdown >= 1.0 and "compute_copy_slowdown:" in machine_file.read_text()
    # Reductions have their avg tables: an avg all_reduce reads its own profile.
    avg = m.profile_for(Transport.NCCL, OpKind.ALL_REDUCE, 2, Dtype.BF16, ReduceOp.AVG)
    assert avg is not None and avg != m.profile_for(Transport.NCCL, OpKind.ALL_REDUCE, 2, Dtype.BF16, ReduceOp.SUM)
    assert m.compute_noise is not None and m.compute_noise.stalls_per_s >= 0 and m.compute_noise.stall_us >= 0
    noise = json.loads(machine_file.with_name("raw.json").read_text())["compute_noise"]
    assert m.compute_noise.duration_stretch == noise["duration_stretch"] > 0
    # Each measured comm op has its own factors; the fp32 all_reduce's are the machine-wide ones.
    listed = {(k, d) for k, d, _ in m.contention.interference_by_op}
    assert listed == {(OpKind.ALL_REDUCE, Dtype.BF16), (OpKind.REDUCE_SCATTER, Dtype.FP32), (OpKind.REDUCE_SCATTER, Dtype.BF16),
                      (OpKind.ALL_GATHER, None), (OpKind.SEND, None), (OpKind.RECV, None)}  # fmt: skip
    assert m.interference(OpKind.SEND, Dtype.FP32) == m.interference(OpKind.RECV, Dtype.BF16)
    assert m.interference(OpKind.BROADCAST, Dtype.FP32).comm_compute_slowdown == m.contention.comm_compute_slowdown
    # Every collective of the language is measured, the barrier included (no bytes: latency only).
    barrier = m.collective_link(Transport.NCCL, OpKind.BARRIER)
    assert m.has_override(Transport.NCCL, OpKind.BARRIER) and barrier.latency_us > 0 and barrier.bandwidth_gb_per_s == float("inf")
    header = machine_file.read_text().splitlines()[0]
    assert header.startswith("# Machine description written by commdsl.calibrate")


def test_simulate_run_compare_loop(machine_file: Path, tmp_path: Path) -> None:
    pred, meas = tmp_path / "pred.json", tmp_path / "meas.json"
    sim = _commdsl("simulate", "1f1b", *SMALL, "--machine", str(machine_file), "--trace", str(pred))
    assert sim.returncode == 0, sim.stderr
    run = _torchrun("-m", "commdsl.run", "1f1b", *SMALL, "--out", str(meas), "--warmup", "1", "--iters", "2",
                    "--compare", "--machine", str(machine_file))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "predicted on" in run.stdout and "makespan error" in run.stdout
    # The calibrated machine has compute stalls: --compare draws them once per measured iteration.
    assert "median of 2 samples" in run.stdout
    assert "FLOP rate" not in run.stdout  # 1f1b's compute is duration-sized: nothing timed
    assert "is not calibrated" not in run.stdout  # a file from calibrate
    cmp = _commdsl("compare", str(pred), str(meas), "--json", "--html", str(tmp_path / "r.html"))
    assert cmp.returncode == 0, cmp.stderr
    data = json.loads(cmp.stdout)
    num_ops = load_schedule("1f1b", dict(a.split("=") for a in SMALL[1::2])).num_ops
    assert data["ops_compared"] == num_ops and not data["only_predicted"] and not data["only_measured"]
    assert data["measured_makespan_us"] > 0 and data["predicted_makespan_us"] > 0
    page = (tmp_path / "r.html").read_text()
    assert "<canvas" in page and 'id="timeline-data"' in page  # the report's timeline (tests/test_report_html.py)


def test_run_compare_at_the_runs_flop_rate(machine_file: Path, tmp_path: Path) -> None:
    """FLOP-sized compute (tp_mlp's matmuls): --compare prints the machine file's rate
    against the run's start-up timing, and the makespan error re-simulated at the run's
    rate; the measured timeline holds the rates."""
    meas = tmp_path / "meas.json"
    params = ["-p", "dp=1", "-p", "tp=2", "-p", "blocks=1", "-p", "tokens=128", "-p", "hidden=128", "-p", "ffn=512"]
    run = _torchrun("-m", "commdsl.run", "tp_mlp", *params, "--out", str(meas), "--warmup", "1", "--iters", "2",
                    "--compare", "--machine", str(machine_file))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = " ".join(run.stdout.split())
    assert "FLOP block in bf16: the machine file says" in out and "at this run's FLOP rate (bf16" in out
    rates = Timeline.read(meas).meta[FLOP_RATE_META]
    assert set(rates) == {"0", "1"} and all(r["bf16"] > 0 for r in rates.values())


def test_calibrate_usage_errors(tmp_path: Path) -> None:
    alone = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", str(tmp_path / "m.yaml")],
                           capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert alone.returncode == 2 and "run it under torchrun" in alone.stderr and "Traceback" not in alone.stderr
    bad = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", "x.yaml", "--max-size", "2ms"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--max-size takes a size" in bad.stderr
    for seconds in ("-1", "nan", "inf"):
        r = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", "x.yaml", "--warm-up", seconds],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 2 and "--warm-up a finite number of seconds >= 0" in r.stderr and "Traceback" not in r.stderr
    # One message size cannot be fitted: said at once, not after the first pass of
    # measurements with an empty reason.
    one = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", "x.yaml", "--min-size", "1KiB", "--max-size", "3KiB"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert one.returncode == 2 and "give one message size, and calibrate fits a line through at least two" in one.stderr
    assert "--max-size 4KiB or more" in one.stderr and "Traceback" not in one.stderr
    for sizes in ("0,-3", "64,x", "100000"):  # (0 and -3 gave an empty compute rate, written with exit 0)
        r = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", "x.yaml", "--matmul-sizes", sizes],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 2 and "--matmul-sizes takes whole numbers from 1 to 32,768" in r.stderr, r.stderr
    # The output folder is checked before a minute of calibration, not after.
    nowhere = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--out", "/no/such/folder/m.yaml"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert nowhere.returncode == 2 and "--out /no/such/folder/m.yaml: the folder /no/such/folder does not exist" in nowhere.stderr
    assert "Traceback" not in nowhere.stderr


def test_run_compare_rejects_bad_machine_before_starting(tmp_path: Path) -> None:
    # The machine is checked while parsing arguments: no torchrun, no process group needed.
    proc = subprocess.run([sys.executable, "-m", "commdsl.run", "1f1b", "--compare", "--machine", "no-such-machine"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "no such machine file or preset: no-such-machine" in proc.stderr
    assert "Traceback" not in proc.stderr
    lonely = subprocess.run([sys.executable, "-m", "commdsl.run", "1f1b", "--machine", "cpu-loopback"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert lonely.returncode == 2 and "only apply with --compare" in lonely.stderr


def test_three_ranks_keep_in_step(tmp_path: Path) -> None:
    """P2P is measured between ranks 0 and 1; the others must make the same number of
    calls (warm-up included) or the ranks' collectives pair up wrongly and hang. One pass
    (`--quick`) runs every family of measurement once, which is what can fall out of step."""
    try:
        from test_run_support import torchrun
    except ImportError:  # tests/ imported as a package
        from tests.test_run_support import torchrun
    out = tmp_path / "m3.yaml"
    r = torchrun(3, ["--out", str(out), "--quick", "--max-size", "4KiB", "--repeats", "2", "--warmup", "1", "--matmul-sizes", "32,64"],
                 module="commdsl.calibrate", timeout_s=240)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    m = load_machine(out)
    assert m.num_devices == 3 and m.has_override(Transport.NCCL, OpKind.ALL_REDUCE)


def test_quick_calibration_is_labelled_rough(tmp_path: Path) -> None:
    out, raw = tmp_path / "quick.yaml", tmp_path / "quick.json"
    proc = _commdsl("calibrate", "-n", "2", "--quick", "--out", str(out), "--raw", str(raw), "--max-size", "64KiB",
                    "--matmul-sizes", "32,64", "--repeats", "2", "--warmup", "1", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.splitlines()[1].startswith("# ROUGH (quick calibration")
    machine = load_machine(out)
    assert machine.doc.startswith("ROUGH (quick calibration: one pass, small sizes, few runs): calibrated on ")
    assert machine.calibration is not None and machine.calibration.quick
    assert "rough: ROUGH" in proc.stdout and "calibrate without --quick before trusting predictions" in " ".join(proc.stdout.split())
    data = json.loads(raw.read_text())
    assert data["pass_ratios"] == {} and data["reductions_us_by_op"] == {}  # one pass, no avg reductions
    assert {(e["kind"], e["dtype"]) for e in data["interference_by_op"]} == {("all_reduce", "fp32"), ("copy", "any")}
    assert all(len(e["pieces"]) == 1 for e in data["interference_by_op"]) and len(data["compute_noise_pieces"]) == 1
    assert "in 1 pass(es)" in text and "at least 2 runs a point" in text
