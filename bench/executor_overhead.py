"""Executor overhead: 1F1B on 2 ranks (gloo) run by commdsl.run vs the same schedule
hand-written in plain torch.distributed.

    python bench/executor_overhead.py [--runs 5] [--iters 10] [--modes sleep busy]

Each implementation is launched `--runs` times under torchrun; each launch runs
`--warmup` + `--iters` iterations and reports per-iteration makespans (first start to
last end over both ranks, on the shared monotonic clock). We compare the medians over
all measured iterations of all launches. Two compute modes:

* sleep: compute ops sleep for their duration, so the difference is the executor's
  own cost (stream threads, comm queues, timing) with no CPU contention;
* busy: compute ops are real work given in FLOPs (t_fwd = 2, t_bwd = 4 multiplies of
  256x256 fp32 matrices), which commdsl.run runs as exactly that
  many 256x256 matmuls, as the hand-written loop does; the work competes for the
  cores with the executor's threads. (Durations would be calibrated separately by
  each launch, and calibration noise on a shared CPU would swamp the overhead.)

The hand-written worker (`--worker`) is the loop a person would write for 1F1B:
blocking send/recv, batch_isend_irecv for the steady state's paired transfers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARAMS = {"stages": 2, "microbatches": 8, "act": "64KiB", "t_fwd": "2ms", "t_bwd": "4ms"}
BLOCK_FLOP = 2 * 256**3
BUSY_PARAMS = dict(PARAMS, t_fwd=f"{2 * BLOCK_FLOP}FLOP", t_bwd=f"{4 * BLOCK_FLOP}FLOP")
"""busy mode: the same schedule with work instead of durations (2 and 4 matmul blocks)."""
ACT_ELEMS = 1 << 14  # 64 KiB of fp32
T_FWD_S, T_BWD_S = 2e-3, 4e-3
FWD_BLOCKS, BWD_BLOCKS = 2, 4


# ---- the hand-written 1F1B ---------------------------------------------------------------


def worker(mode: str, warmup: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, stages, mbs = dist.get_rank(), dist.get_world_size(), PARAMS["microbatches"]
    first, last = rank == 0, rank == stages - 1
    act = [torch.zeros(ACT_ELEMS) for _ in range(mbs)]
    grad = [torch.zeros(ACT_ELEMS) for _ in range(mbs)]
    a = torch.rand(256, 256)
    b, out = a.clone(), torch.empty(256, 256)

    def compute(seconds: float) -> None:
        if mode == "sleep":
            time.sleep(seconds)
        else:
            for _ in range(FWD_BLOCKS if seconds == T_FWD_S else BWD_BLOCKS):
                torch.mm(a, b, out=out)

    def batch(send_t, send_to, recv_t, recv_from) -> None:
        ops = [dist.P2POp(dist.isend, send_t, send_to), dist.P2POp(dist.irecv, recv_t, recv_from)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def one_iteration() -> None:
        warm = min(stages - rank - 1, mbs)
        for mb in range(warm):
            if not first:
                dist.recv(act[mb], rank - 1)
            compute(T_FWD_S)
            if not last:
                dist.send(act[mb], rank + 1)
        if not first and warm < mbs:
            dist.recv(act[warm], rank - 1)
        for i in range(mbs - warm):
            f = warm + i
            compute(T_FWD_S)
            if not last:
                batch(act[f], rank + 1, grad[i], rank + 1)
            compute(T_BWD_S)
            if not first:
                if f + 1 < mbs:
                    batch(grad[i], rank - 1, act[f + 1], rank - 1)
                else:
                    dist.send(grad[i], rank - 1)
        for mb in range(mbs - warm, mbs):
            if not last:
                dist.recv(grad[mb], rank + 1)
            compute(T_BWD_S)
            if not first:
                dist.send(grad[mb], rank - 1)

    spans = []
    for it in range(warmup + iters):
        dist.barrier()
        t0 = time.monotonic_ns()
        one_iteration()
        t1 = time.monotonic_ns()
        if it >= warmup:
            spans.append((t0, t1))
    from commdsl.run.backend import all_gather_objects  # torch's *_object collectives need numpy

    everyone = all_gather_objects(spans, dist.group.WORLD, stages)
    if rank == 0:
        makespans = [(max(s[i][1] for s in everyone) - min(s[i][0] for s in everyone)) / 1e3 for i in range(iters)]
        print("MAKESPANS_US " + json.dumps(makespans), flush=True)
    dist.destroy_process_group()


# ---- the driver ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], timeout_s: float = 300) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"torchrun timed out: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return out


def run_commdsl(mode: str, warmup: int, iters: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        params = [f"-p{k}={v}" for k, v in (BUSY_PARAMS if mode == "busy" else PARAMS).items()]
        _torchrun(["-m", "commdsl.run", "1f1b", *params, "--duration-mode", mode, "--warmup", str(warmup),
                   "--iters", str(iters), "--out", str(out), "-q"])  # fmt: skip
        return json.loads(out.read_text())["otherData"]["commdsl"]["meta"]["iteration_makespans_us"]


def run_plain(mode: str, warmup: int, iters: int) -> list[float]:
    out = _torchrun([str(Path(__file__).resolve()), "--worker", "--mode", mode, "--warmup", str(warmup), "--iters", str(iters)])
    line = next(ln for ln in out.splitlines() if ln.startswith("MAKESPANS_US "))
    return json.loads(line.split(" ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="launches per implementation and mode")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--modes", nargs="+", default=["sleep", "busy"], choices=["sleep", "busy"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="sleep", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.mode, a.warmup, a.iters)
        return
    print(f"1F1B, 2 ranks, gloo: {', '.join(f'{k}={v}' for k, v in PARAMS.items())}; "
          f"{a.runs} launches x {a.iters} measured iterations (after {a.warmup} warm-up) each")  # fmt: skip
    results = {}
    for mode in a.modes:
        plain, dsl = [], []
        for _ in range(a.runs):  # interleaved, so drifting machine load hits both alike
            plain += run_plain(mode, a.warmup, a.iters)
            dsl += run_commdsl(mode, a.warmup, a.iters)
        p, d = statistics.median(plain), statistics.median(dsl)
        overhead = (d - p) / p * 100
        results[mode] = overhead
        print(f"  {mode:5s}: plain torch.distributed median {p / 1e3:8.3f} ms | commdsl.run median {d / 1e3:8.3f} ms "
              f"| overhead {overhead:+.1f}%")  # fmt: skip
    worst = max(results.values())
    print(f"executor overhead: {worst:+.1f}% (target <= 5%) -> {'OK' if worst <= 5 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
