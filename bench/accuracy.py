"""Prediction accuracy on this machine: calibrate once, then simulate, run and compare
every bundled schedule (2 ranks, gloo, sizes that run in seconds).

    python bench/accuracy.py [--out-dir bench_out] [--iters 21] [--min-seconds 3] [--launches 3]
                             [--only 1f1b,gpipe] [--runs 3] [--samples 25]

Each schedule is launched --launches times, round robin over the schedules, and the
launch with the median makespan is compared. Prints a markdown table of makespan error
and per-op duration error per schedule and writes `accuracy.json` under --out-dir. Targets: median makespan error <= 5%, worst
<= 10%. Everything goes through the real command lines a user types.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from commdsl.calibrate.main import REPEATS
from commdsl.comparison import compare_timelines, machine_at_run_rate
from commdsl.dsl import load_schedule
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.timeline import Timeline

# Two-rank params per bundled schedule: ops of several milliseconds, so that the
# millisecond stalls of gloo threads on a small shared CPU stay a small part of each op,
# and an iteration well under a second.
SMALL_PARAMS: dict[str, dict[str, str]] = {
    "1f1b": {"stages": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "10ms", "t_bwd": "20ms"},
    "gpipe": {"stages": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "10ms", "t_bwd": "20ms"},
    "interleaved_1f1b": {"stages": "2", "chunks": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "5ms", "t_bwd": "10ms"},
    "looped_bfs": {"stages": "2", "chunks": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "5ms", "t_bwd": "10ms"},
    "interleaved_zb": {"stages": "2", "chunks": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "5ms", "t_bwd_in": "5ms", "t_bwd_w": "5ms"},
    "zbv": {"stages": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "5ms", "t_bwd_in": "5ms", "t_bwd_w": "5ms"},
    "dualpipev": {"stages": "2", "microbatches": "4", "act": "4MiB", "t_fwd": "5ms", "t_bwd_in": "5ms", "t_bwd_w": "5ms"},
    "collectives": {"ranks": "2", "tensor": "8MiB", "skew": "5ms"},
    "ddp_overlap": {"ranks": "2", "layers": "4", "bucket_layers": "2", "layer_grad": "8MiB", "t_fwd": "5ms", "t_bwd": "10ms", "t_opt": "5ms"},
    "fsdp": {"ranks": "2", "layers": "4", "layer_params": "8MiB", "t_fwd": "5ms", "t_bwd": "10ms", "t_opt": "5ms"},
    "memcpy_vs_nccl": {"gpus": "2", "copies": "4", "msg": "8MiB", "t_compute": "20ms"},
    "p2p": {"pairs": "1", "msg": "8MiB", "t_compute": "10ms", "t_host": "5ms"},
    "stream_overlap": {"ranks": "2", "batch": "16MiB", "t_step": "10ms", "t_prep": "5ms"},
    # 1024 tokens x 1024 hidden: 10 ms matmuls and 2 MiB all_reduces (at 512 x 512, 1.4 ms
    # matmuls and 512 KiB all_reduces whose expected time is mostly gloo's stalls).
    "tp_mlp": {"dp": "1", "tp": "2", "tokens": "1024", "hidden": "1024", "ffn": "4096"},
}


def _iterations(args, predicted_trace: Path) -> int:
    """Measured iterations of one launch of a schedule: at least --iters, and enough to run
    --min-seconds by its predicted makespan. The VM's speed drifts over seconds: within one
    launch of collectives, the median makespan of each 10 iterations went from 48.6 to 58.8 ms; three
    launches of 21 iterations measured 51.0-59.6 ms, three of 101 measured 47.3-50.1 ms."""
    makespan_s = Timeline.read(predicted_trace).makespan_us / 1e6
    return max(args.iters, math.ceil(args.min_seconds / makespan_s) if makespan_s > 0 else args.iters)


def _error_at_run_rate(name: str, machine: str, measured: Path, samples: int) -> float | None:
    """Makespan error (%) of `name` re-simulated with the compute rates its measured launch
    timed at start-up (`commdsl.comparison.machine_at_run_rate`); None without FLOP-sized ops."""
    tl = Timeline.read(measured)
    at_run = machine_at_run_rate(resolve_machine(machine), tl)
    if at_run is None:
        return None
    program = load_schedule(name, SMALL_PARAMS.get(name, {}))
    return compare_timelines(simulate(program, at_run, samples=samples).timeline, tl).makespan_error_pct


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def _params(name: str) -> list[str]:
    return [a for k, v in SMALL_PARAMS.get(name, {}).items() for a in ("-p", f"{k}={v}")]


def _one_run(args, out: Path, port: int, *, first: bool) -> dict | None:
    """Calibrate (unless --machine), then simulate, run and compare every schedule; writes
    and returns the run's summary (None if calibration failed)."""
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    torchrun = [py, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    machine = args.machine
    if machine is None:
        machine = str(out / "machine.yaml")
        start = time.perf_counter()
        # Only the first run warms up: the later ones follow the previous run's launches.
        warm_up = ["--warm-up", str(args.warm_up)] if args.warm_up and first else []
        proc = _run([*torchrun, f"--master_port={port}", "-m", "commdsl.calibrate", "--out", machine,
                     "--max-size", "64MiB", "--size-factor", str(args.size_factor), "--repeats", str(args.repeats),
                     "--raw", str(out / "calibration_raw.json"), *warm_up], 900)  # fmt: skip
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return None
        print(f"calibrated in {time.perf_counter() - start:.0f} s -> {machine}")

    names = [n for n in (args.only.split(",") if args.only else sorted(SMALL_PARAMS)) if n]
    failed: dict[str, str] = {}
    iterations: dict[str, int] = {}
    for name in names:
        pred = out / f"{name}.predicted.json"
        sim = _run([py, "-m", "commdsl.cli", "simulate", name, *_params(name), "--machine", machine, "--trace", str(pred),
                    "--samples", str(args.samples)], 120)  # fmt: skip
        if sim.returncode != 0:
            failed[name] = "simulate failed: " + sim.stderr.strip().splitlines()[0]
        else:
            iterations[name] = _iterations(args, pred)

    # Launches go round robin over the schedules, so that a slow minute of the machine
    # lands on one launch of several schedules rather than on every launch of one.
    launches: dict[str, list[Path]] = {name: [] for name in iterations}
    for k in range(args.launches):
        for i, name in enumerate(iterations):
            if name in failed:
                continue
            meas = out / f"{name}.measured.{k + 1}.json"
            ran = _run([*torchrun, f"--master_port={port + 1 + i + len(names) * k}", "-m", "commdsl.run", name,
                        *_params(name), "--out", str(meas), "--iters", str(iterations[name]), "--warmup", str(args.warmup),
                        "--duration-mode", args.duration_mode], 600)  # fmt: skip
            if ran.returncode != 0:
                tail = (ran.stderr.strip() or ran.stdout.strip()).splitlines()[-1:]
                failed[name] = "run failed: " + " ".join(tail)
            else:
                launches[name].append(meas)

    rows = []
    for name in names:
        if name in failed:
            rows.append({"schedule": name, "error": failed[name]})
            continue
        pred, meas = out / f"{name}.predicted.json", out / f"{name}.measured.json"
        launch_ms = [Timeline.read(m).makespan_us / 1e3 for m in launches[name]]
        # The launch with the median makespan is the measurement (the lower one of two).
        median_launch = sorted(range(len(launch_ms)), key=launch_ms.__getitem__)[(len(launch_ms) - 1) // 2]
        shutil.copyfile(launches[name][median_launch], meas)
        cmp = _run([py, "-m", "commdsl.cli", "compare", str(pred), str(meas), "--json", "--html", str(out / f"{name}.html")], 120)
        if cmp.returncode != 0:
            rows.append({"schedule": name, "error": "compare failed: " + cmp.stderr.strip()})
            continue
        data = json.loads(cmp.stdout)
        rows.append({
            "schedule": name,
            "predicted_ms": data["predicted_makespan_us"] / 1e3,
            "measured_ms": data["measured_makespan_us"] / 1e3,
            "launch_makespans_ms": launch_ms,
            "makespan_error_pct": data["makespan_error_pct"],
            "op_duration_error_median_pct": data["duration_error_pct"]["median"],
            "op_duration_error_p90_pct": data["duration_error_pct"]["p90"],
            "worst_op": f"{data['duration_error_pct'].get('worst_name', '')} ({data['duration_error_pct'].get('worst_source', '').split('/')[-1]})",
            "iterations": iterations[name],
            # FLOP-sized compute: the machine file's block rate against the compared
            # launch's start-up timing (the machine's speed that day, not the model's error),
            # and the makespan error re-simulated at the launch's rate.
            "flop_block_machine_error_pct": {c["dtype"]: c["machine_error_pct"] for c in data["flop_block_tflops"]},
            "makespan_error_at_run_rate_pct": _error_at_run_rate(name, machine, meas, args.samples),
        })  # fmt: skip
        spread = ", ".join(f"{ms:.1f}" for ms in launch_ms)
        rates = "".join(f"; the machine file's {c['dtype']} FLOP rate {c['machine_error_pct']:+.1f}% off this launch's"
                        for c in data["flop_block_tflops"])  # fmt: skip
        if rows[-1]["makespan_error_at_run_rate_pct"] is not None:
            rates += f", {rows[-1]['makespan_error_at_run_rate_pct']:+.1f}% at its rate"
        print(f"{name}: makespan error {data['makespan_error_pct']:+.1f}% "
              f"(launches {spread} ms, {iterations[name]} iterations each{rates})", flush=True)  # fmt: skip

    errs = [abs(r["makespan_error_pct"]) for r in rows if "error" not in r]
    # The model's error apart from the machine's speed that day: FLOP-sized schedules at
    # the compared launch's own start-up rate (duration-sized ones time their work at
    # start-up anyway).
    at_run = [abs(r["makespan_error_at_run_rate_pct"] if r["makespan_error_at_run_rate_pct"] is not None else r["makespan_error_pct"])
              for r in rows if "error" not in r]  # fmt: skip
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{socket.gethostname()} {platform.machine()} {platform.processor() or ''}".strip(),
        "cores": os.cpu_count(),
        "machine_file": machine,
        "samples": args.samples,
        "median_abs_makespan_error_pct": statistics.median(errs) if errs else None,
        "worst_abs_makespan_error_pct": max(errs) if errs else None,
        "median_abs_makespan_error_at_run_rates_pct": statistics.median(at_run) if at_run else None,
        "worst_abs_makespan_error_at_run_rates_pct": max(at_run) if at_run else None,
        "rows": rows,
    }
    (out / "accuracy.json").write_text(json.dumps(summary, indent=1))
    print()
    print("| schedule | predicted | measured | makespan error | per-op duration error (median / p90) | worst op |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['schedule']} | | | {r['error']} | | |")
        else:
            print(f"| {r['schedule']} | {r['predicted_ms']:.1f} ms | {r['measured_ms']:.1f} ms | {r['makespan_error_pct']:+.1f}% "
                  f"| {r['op_duration_error_median_pct']:.1f}% / {r['op_duration_error_p90_pct']:.1f}% | {r['worst_op']} |")  # fmt: skip
    if errs:
        print(f"\nmedian |makespan error| {summary['median_abs_makespan_error_pct']:.1f}% (target <= 5%), "
              f"worst {summary['worst_abs_makespan_error_pct']:.1f}% (target <= 10%) over {len(errs)} schedules")  # fmt: skip
        print(f"at the launches' own FLOP rates: median {summary['median_abs_makespan_error_at_run_rates_pct']:.1f}%, "
              f"worst {summary['worst_abs_makespan_error_at_run_rates_pct']:.1f}%")  # fmt: skip
    return summary


def _across_runs(summaries: list[dict]) -> None:
    """Per schedule, its makespan error in every run; per run, the median and worst."""
    print(f"\n{len(summaries)} runs, makespan error per run:")
    names = [r["schedule"] for r in summaries[0]["rows"]]
    for name in names:
        cells = []
        for s in summaries:
            row = next((r for r in s["rows"] if r["schedule"] == name), None)
            cells.append("failed" if row is None or "error" in row else f"{row['makespan_error_pct']:+.1f}%")
        print(f"  {name:18} " + "  ".join(f"{c:>8}" for c in cells))
    for i, s in enumerate(summaries, 1):
        if s["median_abs_makespan_error_pct"] is not None:
            print(f"  run {i}: median {s['median_abs_makespan_error_pct']:.1f}%, worst {s['worst_abs_makespan_error_pct']:.1f}% "
                  f"(at the launches' own FLOP rates: {s['median_abs_makespan_error_at_run_rates_pct']:.1f}%, "
                  f"{s['worst_abs_makespan_error_at_run_rates_pct']:.1f}%)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default="bench_out")
    parser.add_argument("--iters", type=int, default=21, help="measured iterations per launch, at least")
    parser.add_argument("--min-seconds", type=float, default=3.0,
                        help="and enough iterations to run this long by the predicted makespan (default 3)")
    parser.add_argument("--launches", type=int, default=3,
                        help="torchrun launches per schedule, round robin over the schedules; "
                             "the launch with the median makespan is compared (default 3)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--machine", help="use this machine file instead of calibrating")
    parser.add_argument("--warm-up", type=float, default=0.0, metavar="SECONDS",
                        help="the first run's calibration keeps the machine busy this long before measuring "
                             "(calibrate's --warm-up; default 0)")  # fmt: skip
    parser.add_argument("--size-factor", type=int, default=4,
                        help="calibrate's ratio between consecutive message sizes (default 4, as calibrate's)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="calibrate's timed runs per point at least (default %(default)s, as calibrate's)")
    parser.add_argument("--only", default="", help="comma-separated schedule names")
    parser.add_argument("--samples", type=int, default=25,
                        help="simulate with the calibrated compute stalls drawn in N runs, per-op medians (1: no noise)")  # fmt: skip
    parser.add_argument("--port", type=int, default=29731)
    parser.add_argument("--duration-mode", choices=("busy", "sleep"), default="busy",
                        help="how commdsl.run realises compute with an explicit duration (see docs/executor.md)")
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat everything (calibration included) this many times, in run1/, run2/, ...: "
                             "the machine is noisy, one run says little")  # fmt: skip
    args = parser.parse_args()
    if args.runs < 1 or args.launches < 1:
        parser.error("--runs and --launches must be at least 1")
    out = Path(args.out_dir)
    summaries = []
    for k in range(args.runs):
        run_dir = out if args.runs == 1 else out / f"run{k + 1}"
        summary = _one_run(args, run_dir, args.port + 100 * k, first=k == 0)
        if summary is None:
            return 1
        summaries.append(summary)
    if args.runs > 1:
        _across_runs(summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
