"""CPU time and peak memory of `commdsl check` and `commdsl simulate` on the bundled
`llm_3d` schedule as the data-parallel width grows, up to TP 8 x PP 16 x DP 128 = 16,384
ranks (the target: each command <= 10 s and <= 4 GiB on the 2-core CI machine).

Each command runs as its own process, as a user runs it; its CPU time (user + system)
and peak resident memory come from the kernel's accounting of the finished child
(`os.wait4`). A command is stopped when it passes `--timeout` seconds or `--max-rss-gib`
of resident memory (the machine is shared), and its row says so.

    python bench/llm_3d.py                      # dp = 1, 2, 4, 8, 128
    python bench/llm_3d.py --dp 1,128 --timeout 900
    python bench/llm_3d.py --dp 128 --commands check
    python bench/llm_3d.py --json results.json
    python bench/llm_3d.py --dp 8 --no-fold     # every rank expanded, checked and simulated

By default the commands fold the data-parallel replicas (docs/simulator.md, "Folded
replicas"): one replica is expanded, checked and simulated for all, and each row says
whether it was (`folded`, from the summary's `fold` line); `--no-fold` passes the
commands' own `--no-fold`.

The model: 16 layers (one per stage), hidden 8192 with 64 heads and 8 KV heads, SwiGLU
ffn 28672, sequence 4096, 16 microbatches per replica, sequence parallelism, DDP-style
gradient sync, 1F1B; on `dgx-h100` nodes (8 GPUs each), as many as the ranks need.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"layers": 16, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "mlp_matrices": 3, "seq": 4096,
         "microbatches": 16, "sequence_parallel": "true", "tp": 8, "pp": 16}  # fmt: skip
GPUS_PER_NODE = 8
TARGET_S, TARGET_GIB = 10.0, 4.0
MAX_OPS = 20_000_000


@dataclass(frozen=True)
class Row:
    command: str
    ranks: int
    dp: int
    cpu_s: float
    """User + system CPU time of the command's process."""
    wall_s: float
    peak_rss_mib: float
    outcome: str
    """"ok", the exit code, or why it was stopped."""
    ops: int | None
    folded: bool | None
    """Whether the command folded the replicas (None: it did not finish)."""


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(command: str, dp: int, timeout_s: float, max_rss_gib: float, folder: Path, fold: bool = True) -> Row:
    ranks = MODEL["tp"] * MODEL["pp"] * dp
    params = [f"-p{k}={v}" for k, v in {**MODEL, "dp": dp}.items()]
    # 46,080 ops per 128 ranks: past the default --max-ops (5M) at DP 128
    argv = [sys.executable, "-m", "commdsl.cli", command, "llm_3d", *params, "--json", "--max-ops", str(MAX_OPS)]
    if command == "simulate":
        argv += ["--machine", "dgx-h100", "--nodes", str(max(1, ranks // GPUS_PER_NODE))]
    if not fold:
        argv.append("--no-fold")
    out_path, err_path = folder / "stdout", folder / "stderr"
    start = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err)
    stopped = ""
    # Watch time and memory while it runs; reap it with wait4 for the kernel's figures.
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > timeout_s:
            stopped = f"stopped at the {timeout_s:.0f} s timeout"
        elif _rss_mib(proc.pid) > max_rss_gib * 1024:
            stopped = f"stopped above {max_rss_gib:g} GiB resident"
        if stopped:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.1)
    wall_s = time.perf_counter() - start
    proc.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    ops = folded = None
    if not stopped and code == 0:
        summary = json.loads(out_path.read_text())
        ops = summary["num_ops"] if command == "simulate" else summary["ops"]
        folded = summary["fold"].startswith("folded")
    if stopped or code == 0:
        outcome = stopped or "ok"
    else:
        lines = err_path.read_text().strip().splitlines()
        outcome = f"exit {code}: {lines[0] if lines else ''}"
    return Row(command, ranks, dp, usage.ru_utime + usage.ru_stime, wall_s, usage.ru_maxrss / 1024, outcome, ops, folded)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", default="1,2,4,8,128", help="data-parallel widths, comma-separated (ranks = 128 x dp)")
    parser.add_argument("--commands", default="check,simulate", help="which commands to time, comma-separated")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a command is stopped")
    parser.add_argument("--max-rss-gib", type=float, default=3.0, help="resident memory at which a command is stopped")
    parser.add_argument("--no-fold", dest="fold", action="store_false", help="run the commands with --no-fold")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print(f"load average {os.getloadavg()[0]:.2f}; target: each command <= {TARGET_S:g} s CPU and <= {TARGET_GIB:g} GiB")
    print(f"{'command':>9} {'ranks':>7} {'ops':>11} {'folded':>6} {'CPU s':>8} {'wall s':>8} {'peak RSS MiB':>13}  outcome")
    folder = Path(tempfile.mkdtemp(prefix="llm_3d_bench."))
    for dp in (int(x) for x in args.dp.split(",")):
        for command in args.commands.split(","):
            row = measure(command, dp, args.timeout, args.max_rss_gib, folder, args.fold)
            rows.append(row)
            ops = f"{row.ops:,}" if row.ops else "-"
            folded = {True: "yes", False: "no", None: "-"}[row.folded]
            print(f"{row.command:>9} {row.ranks:>7,} {ops:>11} {folded:>6} {row.cpu_s:>8.1f} {row.wall_s:>8.1f} {row.peak_rss_mib:>13.0f}  {row.outcome}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
