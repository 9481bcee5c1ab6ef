"""Scale without bounds: how long commdsl takes to finish, or to refuse, on huge inputs.

    python bench/scale_limits.py                  # every case
    python bench/scale_limits.py --case world_16k # one case
    python bench/scale_limits.py --list           # the cases

Each case runs in a child process of its own under a memory cap (`--memory-gib`,
default 4) and a wall-clock cap (`--timeout`, default 60 s), so a case that runs away
is reported as such instead of taking the machine with it. The figure is the child's
wall time, from the start of the case's work (imports excluded) to its end: the
simulation finished, or the error it ended with, whose first line is printed; the CPU
time the child spent in that span (user + system: on a machine shared with other work,
what the case costs, which the wall time exceeds by however much the others took); and
its peak resident memory (`ru_maxrss`, imports included).

Cases (the targets, see docs/limits.md):
  * world_16k: `check` and `simulate` of one all_reduce over a 16,384-rank world on the
    default machine (target: <= 5 s for both together); world_16k_dgx: the same on
    2,048 DGX H100 nodes (`--machine dgx-h100 --nodes 2048`, the flow network's links);
  * mesh_65k_check: `check` of a 65,536-rank mesh {dp: 8192, tp: 8} with one all_reduce
    per axis (it must end, in seconds);
  * all_to_all_4k: `simulate` of one all_to_all over 4,096 ranks on 512 DGX H100 nodes
    (target: seconds); all_to_all_4k_nvlink: the same on the `h100-nvlink` preset, one
    node of 4,096 GPUs (target: within a minute and 2 GiB, or refused up front);
  * check_1f1b_60k: `commdsl check 1f1b -p stages=60000` (4.0 M ops, under the op
    budget; target: within a minute and 2 GiB); its outcome line gives the time of each
    phase (expansion, the static checks, the deadlock check);
  * nodes_1e8: `simulate --machine dgx-h100 --nodes 100000000`: refused up front;
  * gpus_per_node_1e9: a machine file with `gpus_per_node: 1000000000`: refused up front;
  * nested_loops_1e15 / nested_blocks_1e15: a program that would expand to 10^15 ops
    (loops nested, or blocks calling blocks): the op limit trips within a second;
  * compare_300mb: `commdsl compare --json` of two timelines of about 300 MB each (1F1B,
    8 stages, 9,000 microbatches, predicted on two machines; written once, before the
    timed part, into the temporary folder): target well under 2 GiB and within a minute.

Each line also gives the child's peak resident memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD_16K = """
name: world_16k
world: 16384
program: |
  all_reduce grads 64MiB
"""

MESH_65K = """
name: mesh_65k
world: {dp: 8192, tp: 8}
program: |
  all_reduce act 8MiB group=tp
  all_reduce grads 64MiB group=dp
"""

ALL_TO_ALL_4K = """
name: all_to_all_4k
world: 4096
program: |
  all_to_all tokens 4096MiB
"""

NESTED_LOOPS = """
name: nested_loops
world: 2
program: |
  for i in range(100000):
      for j in range(100000):
          for k in range(100000):
              compute F 1us
"""

NESTED_BLOCKS = """
name: nested_blocks
world: 2
program: |
  def a():
      for i in range(1000):
          compute F 1us
  def b():
      for i in range(1000):
          a()
  def c():
      for i in range(1000):
          b()
  def d():
      for i in range(1000):
          c()
  def e():
      for i in range(1000):
          d()
  e()
  e()
"""


def _machine_text(gpus_per_node: int) -> str:
    return f"""
name: huge
device: {{name: x, peak_tflops: {{fp32: 100}}, memory_bandwidth_gb_per_s: 1000, sm_count: 100}}
kernel_launch_us: 4
comm_launch_us: 10
host_link: {{latency_us: 2, bandwidth_gb_per_s: 50}}
transports:
  nccl: {{latency_us: 4, bandwidth_gb_per_s: 300}}
topology:
  gpus_per_node: {gpus_per_node}
  vertices: {{nvswitch: nvswitch, cpu0: cpu}}
  links:
    - {{kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 0.5, between: [[gpu0, nvswitch]]}}
    - {{kind: pcie, bandwidth_gb_per_s: 55, latency_us: 0.5, between: [[gpu0, cpu0]]}}
"""


def _check(text: str, name: str) -> str:
    from commdsl.dsl import load_schedule_text
    from commdsl.sim import check_deadlock

    program = load_schedule_text(text, f"{name}.yaml")
    check_deadlock(program)
    return f"ok: {program.world_size:,} ranks, {program.num_ops:,} ops"


def _simulate(text: str, name: str, machine_name: str = "h100-nvlink", nodes: int | None = None, machine_text: str | None = None) -> str:
    from commdsl.dsl import load_schedule_text
    from commdsl.machine import resolve_machine
    from commdsl.machine.loader import load_machine_text
    from commdsl.sim import check_deadlock, simulate

    machine = load_machine_text(machine_text, "huge.yaml") if machine_text else resolve_machine(machine_name)
    if nodes is not None:
        machine = machine.with_nodes(nodes)
    program = load_schedule_text(text, f"{name}.yaml")
    check_deadlock(program)
    result = simulate(program, machine)
    return f"ok: {program.world_size:,} ranks, makespan {result.makespan_us / 1e3:.3f} ms"


def _check_1f1b(stages: int) -> str:
    """`commdsl check 1f1b -p stages=N`, phase by phase (as `commdsl check` runs them)."""
    from commdsl.dsl import load_schedule
    from commdsl.sim import check_deadlock
    from commdsl.validate import validate_program

    start = time.perf_counter()
    program = load_schedule("1f1b", {"stages": str(stages)}, validate=False)
    expanded = time.perf_counter()
    validate_program(program)
    validated = time.perf_counter()
    check_deadlock(program)
    checked = time.perf_counter()
    return (f"ok: {program.num_ops:,} ops; expand {expanded - start:.1f} s, validate {validated - expanded:.1f} s, "
            f"deadlock check {checked - validated:.1f} s")


def _refused_nodes() -> str:
    from commdsl.cli import main

    code = main(["simulate", "p2p", "--machine", "dgx-h100", "--nodes", "100000000"])
    return f"exit {code}"


BIG_TRACES = Path(tempfile.gettempdir()) / "commdsl-bench-compare"
BIG_TRACE_PARAMS = ["-p", "stages=8", "-p", "microbatches=9000"]


def _big_traces() -> tuple[str, str]:
    """Two timelines of about 300 MB each of the same schedule (predicted on two
    machines), written once into `BIG_TRACES`."""
    BIG_TRACES.mkdir(exist_ok=True)
    paths = []
    for machine in ("h100-nvlink", "a100-nvlink"):
        path = BIG_TRACES / f"1f1b-{machine}.json"
        if not path.exists():
            cmd = [sys.executable, "-m", "commdsl.cli", "simulate", "1f1b", *BIG_TRACE_PARAMS, "--machine", machine, "--trace", str(path), "--json"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        paths.append(str(path))
    return paths[0], paths[1]


def _compare_big() -> str:
    from commdsl.cli import main

    predicted, measured = (str(BIG_TRACES / f"1f1b-{m}.json") for m in ("h100-nvlink", "a100-nvlink"))
    size_mb = (os.path.getsize(predicted) + os.path.getsize(measured)) / 2 / 1e6
    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            code = main(["compare", predicted, measured, "--json"])
        finally:
            sys.stdout = stdout
    return f"exit {code}: two traces of {size_mb:.0f} MB each"


CASES = {
    "world_16k": lambda: _simulate(WORLD_16K, "world_16k"),
    "world_16k_dgx": lambda: _simulate(WORLD_16K, "world_16k", "dgx-h100", nodes=2048),
    "mesh_65k_check": lambda: _check(MESH_65K, "mesh_65k"),
    "all_to_all_4k": lambda: _simulate(ALL_TO_ALL_4K, "all_to_all_4k", "dgx-h100", nodes=512),
    "all_to_all_4k_nvlink": lambda: _simulate(ALL_TO_ALL_4K, "all_to_all_4k"),
    "check_1f1b_60k": lambda: _check_1f1b(60_000),
    "nodes_1e8": _refused_nodes,
    "gpus_per_node_1e9": lambda: _simulate("world: 2\nprogram: |\n  all_reduce g 4MiB\n", "small", machine_text=_machine_text(10**9)),
    "nested_loops_1e15": lambda: _check(NESTED_LOOPS, "nested_loops"),
    "nested_blocks_1e15": lambda: _check(NESTED_BLOCKS, "nested_blocks"),
    "compare_300mb": _compare_big,
}
SETUP = {"compare_300mb": _big_traces}
"""Cases' inputs made before the child starts (not timed)."""


def _child(case: str, memory_gib: float) -> None:
    """Run one case here and print a JSON line: seconds, CPU seconds, peak MiB, outcome."""
    limit = int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import commdsl.cli  # noqa: F401 -- imports are not part of the figure
    import commdsl.sim  # noqa: F401

    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        outcome = CASES[case]()
    except MemoryError:
        outcome = f"MemoryError at {memory_gib:g} GiB"
    except Exception as e:  # the figure is what happened, whatever it was
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mib": peak_mib, "outcome": outcome[:160]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only this case (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the cases")
    parser.add_argument("--timeout", type=float, default=60.0, help="wall-clock cap per case, seconds (default 60)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap per case, GiB (default 4)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.memory_gib)
        return
    if args.list:
        print("\n".join(CASES))
        return
    print(f"{'case':22} {'seconds':>8} {'cpu s':>8} {'peak MiB':>9}  outcome")
    for case in args.case or CASES:
        if case in SETUP:
            SETUP[case]()
        cmd = [sys.executable, __file__, "--child", case, "--memory-gib", str(args.memory_gib)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{case:22} {'>' + format(args.timeout, 'g'):>8} {'-':>8} {'-':>9}  still running after {args.timeout:g} s (killed)", flush=True)
            continue
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{case:22} {'-':>8} {'-':>8} {'-':>9}  died (exit {proc.returncode}): {tail[:160]}", flush=True)
            continue
        r = json.loads(lines[-1])
        print(f"{case:22} {r['seconds']:>8.2f} {r['cpu_seconds']:>8.2f} {r['peak_mib']:>9.0f}  {r['outcome']}", flush=True)


if __name__ == "__main__":
    main()
