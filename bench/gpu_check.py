"""Run the executor on one device, calibrate it, and check the one-device model against it.

    python bench/gpu_check.py --out gpu_check            # on a GPU (NCCL), or on this CPU (gloo)
    python bench/gpu_check.py --out gpu_check --quick    # smaller sizes and a --quick calibration

One run does, on one rank of this machine (a GPU where torch sees CUDA, else the CPU):

1. records the environment: `nvidia-smi -q`, torch, CUDA and NCCL versions, the device;
2. runs the executor on every schedule that touches the device (the bundled
   `stream_overlap`, and `bench/gpu_check/*.yaml`: compute by duration and by FLOPs in
   three dtypes; host-to-device and device-to-host copies, small and large, and a
   device-to-device copy; alloc/free around compute with a one-rank all_reduce), once with
   `--check` and then timed, keeping the measured timelines;
3. calibrates a one-device machine file (`commdsl calibrate -n 1`: matmul rate per dtype,
   copies by size and direction, launch costs, copy/compute interference);
4. simulates every schedule on the calibrated file and on the preset (`h100-nvlink` on a
   GPU, `cpu-loopback` on a CPU) and compares each op by op (`commdsl compare --json`);
5. writes `summary.md` and `summary.json`: per schedule the makespan predicted on the
   preset, on the calibrated file, measured, and both errors.

Everything goes under the --out folder (env/, measured/, predicted/, compare/, the
machine file and the calibration's raw times). Each step is a real `commdsl` command,
printed as it starts; a failed step is recorded with its output and the run goes on.
On a GPU it takes a few minutes; the tests run it on the CPU with --quick.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEDULES = ("stream_overlap", *sorted(str(p) for p in (HERE / "gpu_check").glob("*.yaml")))
"""Bundled names and files, as `commdsl run` takes them."""


@dataclass(frozen=True)
class Sizes:
    """Params per schedule for one kind of device: large enough on a GPU that launch costs
    do not hide the rates, small enough on a CPU that the check runs in seconds."""

    params: dict[str, tuple[str, ...]]
    """Schedule stem -> its `-p KEY=VALUE` overrides."""
    preset: str
    """The preset the predictions are also made on."""


GPU = Sizes({"stream_overlap": ("batch=256MiB", "t_step=10ms"), "compute": ("work=200GFLOP",),
             "copies": ("large=256MiB",), "memory": ("buf=512MiB",)}, "h100-nvlink")  # fmt: skip
CPU = Sizes({"stream_overlap": ("batch=4MiB", "t_step=4ms", "t_prep=1ms"), "compute": ("ops=3", "t_op=4ms", "work=20MFLOP", "half=false"),
             "copies": ("large=8MiB", "repeats=2"), "memory": ("buf=4MiB",)}, "cpu-loopback")  # fmt: skip


QUICK_CALIBRATION = ["--quick", "--max-size", "4MiB", "--matmul-sizes", "64,128,256", "--repeats", "5"]
"""--quick: a rough calibration of small sizes, a minute or less on a CPU."""


@dataclass
class Step:
    """One command of the check, as run."""

    name: str
    argv: list[str]
    exit_code: int
    seconds: float
    output_file: str
    """Where its stdout and stderr are kept (relative to the --out folder)."""


@dataclass
class Row:
    """One schedule's makespans (ms) and errors (%); None where a step failed."""

    schedule: str
    measured_ms: float | None = None
    preset_ms: float | None = None
    calibrated_ms: float | None = None
    preset_error_pct: float | None = None
    calibrated_error_pct: float | None = None
    worst_ops: dict[str, list[dict]] = field(default_factory=dict)
    """Per machine, the ops whose duration the prediction missed most (from compare)."""


class Check:
    """The run: its folder, its log of steps, and the `commdsl` command it calls."""

    def __init__(self, out: Path, quick: bool, timeout_s: float):
        self.out = out
        self.quick = quick
        self.timeout_s = timeout_s
        self.steps: list[Step] = []
        self.commdsl = [sys.executable, "-m", "commdsl.cli"]

    def run(self, name: str, args: list[str], *, stdout_to: Path | None = None) -> int:
        """Run `commdsl ARGS`, keep its output under logs/, print one line; its exit code."""
        log = self.out / "logs" / f"{name}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: commdsl {' '.join(args)}", flush=True)
        start = time.monotonic()
        try:
            proc = subprocess.run(self.commdsl + args, capture_output=True, text=True, timeout=self.timeout_s)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            code, stdout, stderr = 124, _text(e.stdout), _text(e.stderr) + f"\n(gpu_check: stopped after {self.timeout_s:g} s)"
        seconds = time.monotonic() - start
        log.write_text(f"$ commdsl {' '.join(args)}\n# exit {code}, {seconds:.1f} s\n{stdout}\n{stderr}")
        if stdout_to is not None and code == 0:
            stdout_to.write_text(stdout)
        self.steps.append(Step(name, args, code, round(seconds, 2), str(log.relative_to(self.out))))
        if code != 0:
            print(f"    failed (exit {code}): see {log}", flush=True)
        return code


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def environment(out: Path) -> dict:
    """What ran the check: versions, the device, and `nvidia-smi -q` where there is one."""
    import platform

    import torch

    import commdsl

    env = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "commdsl": commdsl.__version__,
        "commdsl_engine": commdsl.ENGINE_BUILD.describe(),
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, sm_count=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 2),
                   nccl=".".join(str(v) for v in torch.cuda.nccl.version()))  # fmt: skip
    else:
        env.update(device=f"{platform.machine()} CPU", nccl=None)
    (out / "env").mkdir(parents=True, exist_ok=True)
    smi = shutil.which("nvidia-smi")
    if smi:
        proc = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=60)
        (out / "env" / "nvidia-smi-q.txt").write_text(proc.stdout + proc.stderr)
    (out / "env" / "versions.json").write_text(json.dumps(env, indent=1) + "\n")
    return env


def stem(schedule: str) -> str:
    return Path(schedule).stem


def makespan_ms(compare_json: Path) -> tuple[float, float, list[dict]]:
    """(predicted, measured) makespans in ms, and the five ops whose duration the
    prediction missed most, from `commdsl compare --json`."""
    data = json.loads(compare_json.read_text())
    ops = [op for op in data["ops"] if op["measured_duration_us"] >= MIN_OP_US]
    for op in ops:
        op["error_pct"] = round((op["predicted_duration_us"] - op["measured_duration_us"]) / op["measured_duration_us"] * 100, 1)
    worst = sorted(ops, key=lambda op: -abs(op["error_pct"]))[:5]
    keep = ("op_id", "name", "kind", "predicted_duration_us", "measured_duration_us", "error_pct")
    return data["predicted_makespan_us"] / 1e3, data["measured_makespan_us"] / 1e3, [{k: op[k] for k in keep} for op in worst]


MIN_OP_US = 10.0
"""Ops shorter than this (measured) are left out of the worst ops, as `compare` leaves them
out of its duration errors."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for everything the check writes (created; must be empty or absent)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer iterations and a --quick calibration of small sizes (how the tests run it on a CPU)")
    parser.add_argument("--only", action="append", choices=[stem(s) for s in SCHEDULES], metavar="SCHEDULE",
                        help="check only this schedule (repeatable; default: all of " + ", ".join(stem(s) for s in SCHEDULES) + ")")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one step may take (default 300)")
    args = parser.parse_args(argv)
    schedules = [s for s in SCHEDULES if not args.only or stem(s) in args.only]
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"--out {out}: exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)

    env = environment(out)
    sizes = GPU if env["cuda_available"] else CPU
    print(f"gpu_check on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}) -> {out}", flush=True)
    check = Check(out, args.quick, args.timeout)
    iters = ["--warmup", "1", "--iters", "3"] if args.quick else ["--warmup", "2", "--iters", "5"]
    for sub in ("measured", "predicted", "compare"):
        (out / sub).mkdir(exist_ok=True)

    # 1. The executor: checked values first, then a timed run that keeps its timeline.
    measured: dict[str, Path] = {}
    for schedule in schedules:
        name = stem(schedule)
        params = [a for p in sizes.params.get(name, ()) for a in ("-p", p)]
        if check.run(f"run-check-{name}", ["run", schedule, "-n", "1", *params, "--check", "--out", str(out / "measured" / f"{name}.check.json"),
                                            "--warmup", "1", "--iters", "1"]) != 0:  # fmt: skip
            continue
        target = out / "measured" / f"{name}.json"
        if check.run(f"run-{name}", ["run", schedule, "-n", "1", *params, "--out", str(target), *iters]) == 0:
            measured[name] = target

    # 2. Calibrate one device.
    machine = out / "calibrated.yaml"
    calibrate = ["calibrate", "-n", "1", "--out", str(machine), "--raw", str(out / "calibration_raw.json")]
    calibrated = check.run("calibrate", calibrate + (QUICK_CALIBRATION if args.quick else [])) == 0

    # 3. Predict on the preset and the calibrated file; compare each with the measurement.
    rows = []
    machines = {"preset": sizes.preset, **({"calibrated": str(machine)} if calibrated else {})}
    for schedule in schedules:
        name = stem(schedule)
        row = Row(name)
        rows.append(row)
        if name not in measured:
            continue
        params = [a for p in sizes.params.get(name, ()) for a in ("-p", p)]
        for label, m in machines.items():
            predicted = out / "predicted" / f"{name}.{label}.json"
            if check.run(f"simulate-{name}-{label}", ["simulate", schedule, *params, "--machine", m, "--network", "flow",
                                                      "--trace", str(predicted), "--gantt", "never"]) != 0:  # fmt: skip
                continue
            cmp_json = out / "compare" / f"{name}.{label}.json"
            if check.run(f"compare-{name}-{label}", ["compare", str(predicted), str(measured[name]), "--json"], stdout_to=cmp_json) != 0:
                continue
            pred_ms, meas_ms, worst = makespan_ms(cmp_json)
            row.measured_ms = round(meas_ms, 4)
            setattr(row, f"{label}_ms", round(pred_ms, 4))
            setattr(row, f"{label}_error_pct", round((pred_ms - meas_ms) / meas_ms * 100, 2))
            row.worst_ops[label] = worst

    summary = {"env": env, "preset": sizes.preset, "rows": [asdict(r) for r in rows], "steps": [asdict(s) for s in check.steps]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(table(env, sizes.preset, rows))
    print(table(env, sizes.preset, rows), flush=True)
    failed = [s for s in check.steps if s.exit_code != 0]
    for s in failed:
        print(f"failed: {s.name} (exit {s.exit_code}), output in {out / s.output_file}", file=sys.stderr)
    return 1 if failed else 0


def table(env: dict, preset: str, rows: list[Row]) -> str:
    """The summary as a Markdown table, as docs/validation.md quotes it."""

    def ms(v: float | None) -> str:
        return "failed" if v is None else f"{v:.3f} ms"

    def pct(v: float | None) -> str:
        return "" if v is None else f"{v:+.1f}%"

    lines = [
        f"{env['date_utc']} UTC, {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, NCCL {env['nccl']}",
        "",
        f"| schedule | measured | predicted on {preset} | error | predicted on the calibrated file | error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r.schedule} | {ms(r.measured_ms)} | {ms(r.preset_ms)} | {pct(r.preset_error_pct)} | "
                     f"{ms(r.calibrated_ms)} | {pct(r.calibrated_error_pct)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
