"""The whole `commdsl simulate` command at scale: what a user waits for and how much memory it takes.

    python bench/scale.py                    # every figure below (about two minutes)
    python bench/scale.py --quick            # smaller sizes, one repeat: a smoke run
    python bench/scale.py --astra PATH       # also run ASTRA-sim's analytical backend on the same workload
    python bench/scale.py --only chained     # one figure (chained, 1f1b, cost, samples; repeatable)
    python bench/scale.py --only pipeline --instructions   # figure 5 also in instructions (valgrind)

Each figure is the CPU time (user + system) and the peak resident memory of one
`commdsl simulate` process, start-up to exit, as `os.wait4` reports them for the child;
the median of a few runs. CPU time, not wall time, because the machines this runs on are
shared. Figures:

  1. chained all_reduce: 1000 chained 64 MiB ring all_reduces on 64 ranks, one 50 GB/s
     link per rank with 500 ns per step (the flow network, `--json`). With `--astra`, the
     same workload for ASTRA-sim 2.0 (a Chakra trace per NPU, a 64-NPU ring, the same
     rate and latency in ASTRA's units) and the ratio of the two CPU times; the Chakra
     trace generator needs the `chakra` package (github.com/mlcommons/chakra).
  2. a 1M-op 1F1B schedule (64 stages), plain, with `--json` and with `--trace`: CPU
     seconds, peak memory and bytes of peak memory per op;
  3. the cost per op of the 1F1B schedule from 1k to 1M ops (is it flat?);
  4. `--samples 8` against one sample on the same schedule.
  5. the pipeline where every rank runs: 512 stages x 200 microbatches, 1 ms compute,
     64 MiB sends between neighbours, each stage receive -> compute -> send on its own
     stream (715,600 ops; the ring machine of figure 1 with 512 devices): the whole
     command's CPU time, and where it goes (measured in this process: expansion, the
     checks across ranks, `simulate()`, the summary and its JSON), and its start-up (the
     same command on 2 stages x 1 microbatch).

The simulator's own rate (`simulate()` alone) is bench/sim_scale.py's, expansion's is
bench/expand.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from contention import CHAINED, RING_MACHINE  # bench/contention.py (the script's folder is on the path)

FIGURES = ("chained", "1f1b", "cost", "samples", "pipeline")
"""The figures below, by the name `--only` takes."""
OPS_PER_MICROBATCH_64 = 508.75
"""Ops of the bundled 1f1b per microbatch at 64 stages (130,240 ops at 256 microbatches)."""


def run_command(argv: list[str], stdout) -> tuple[float, int, str]:
    """Run one process: (CPU seconds of the child, its peak RSS in bytes, its stderr)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` exited {proc.returncode}:\n{stderr}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, stderr


def simulate_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "commdsl.cli", "simulate", *args]


def measure(argv: list[str], repeats: int, out: Path | None = None) -> dict:
    """Median CPU s and peak RSS of `argv` over `repeats` runs; stdout goes to `out` (or nowhere)."""
    cpu, rss = [], []
    for _ in range(repeats):
        with open(out, "w") if out else open(os.devnull, "w") as f:
            c, r, _ = run_command(argv, f)
        cpu.append(c)
        rss.append(r)
    return {"cpu_s": statistics.median(cpu), "rss_bytes": statistics.median(rss)}


def chained(tmp: Path, repeats: int, astra: str | None) -> None:
    schedule, machine, out = tmp / "chained.yaml", tmp / "ring-50.yaml", tmp / "chained.json"
    schedule.write_text(CHAINED)
    machine.write_text(RING_MACHINE)
    r = measure(simulate_argv(str(schedule), "--machine", str(machine), "--network", "flow", "--json"), repeats, out)
    predicted_ms = json.loads(out.read_text())["makespan_us"] / 1e3
    print(f"1. chained all_reduce, 64 ranks x 1000 x 64 MiB (flow, --json): {r['cpu_s']:.2f} s CPU, "
          f"{r['rss_bytes'] / 2**20:.0f} MiB peak, predicted {predicted_ms:.2f} ms")  # fmt: skip
    if astra:
        astra_s, astra_ms = run_astra(astra, tmp / "astra", repeats)
        print(f"   ASTRA-sim: {astra_s:.2f} s CPU, predicted {astra_ms:.2f} ms ({(astra_ms / predicted_ms - 1) * 100:+.3f}%); "
              f"ASTRA-sim / commdsl = {astra_s / r['cpu_s']:.1f}x")  # fmt: skip


def run_astra(binary: str, folder: Path, repeats: int) -> tuple[float, float]:
    """ASTRA-sim 2.0 (analytical, congestion unaware) on the chained all_reduce: (CPU s, makespan ms)."""
    try:
        from chakra.schema.protobuf.et_def_pb2 import ALL_REDUCE, COMM_COLL_NODE, AttributeProto, GlobalMetadata, Node
        from chakra.src.third_party.utils.protolib import encodeMessage
    except ImportError as e:
        raise SystemExit(f"--astra needs the chakra package to write the workload ({e}): build a wheel of "
                         "github.com/mlcommons/chakra and `pip install --no-deps` it with protobuf") from e  # fmt: skip
    folder.mkdir()
    npus, count, size_bytes = 64, 1000, 64 * 2**20
    for npu in range(npus):
        with open(folder / f"chained.{npu}.et", "wb") as f:
            encodeMessage(f, GlobalMetadata(version="0.0.4"))
            for i in range(count):
                node = Node(id=i, name=f"all_reduce {i}", type=COMM_COLL_NODE)
                if i:
                    node.data_deps.append(i - 1)  # chained: each waits for the one before
                node.attr.append(AttributeProto(name="is_cpu_op", bool_val=False))
                node.attr.append(AttributeProto(name="comm_type", int64_val=ALL_REDUCE))
                node.attr.append(AttributeProto(name="comm_size", int64_val=size_bytes))
                encodeMessage(f, node)
    # ASTRA's analytical backend reads GB/s as 2^30 bytes per second and latency in ns:
    # 50e9 B/s is 46.566 of its GB/s. One chunk per collective, as commdsl's ring. ASTRA charges each
    # reduce step 3 x chunk / local-mem-bw for the reduction, which commdsl does not model: a local-mem-bw
    # of 1e9 GB/s makes that 0 ns. Endpoint delay 1 ns, not 0: with 0 the first event falls at t = 0 and
    # the analytical event queue's assertion (next event later than now) aborts; it adds 1 ns a send.
    (folder / "network.yml").write_text(f"topology: [ Ring ]\nnpus_count: [ {npus} ]\nbandwidth: [ {50e9 / 2**30:.6f} ]\n"
                                        "latency: [ 500.0 ]\n")  # fmt: skip
    (folder / "system.json").write_text(json.dumps({
        "scheduling-policy": "LIFO", "endpoint-delay": 1, "active-chunks-per-dimension": 1, "preferred-dataset-splits": 1,
        "all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
        "reduce-scatter-implementation": ["ring"], "all-to-all-implementation": ["ring"],
        "collective-optimization": "baseline", "local-mem-bw": 1e9, "boost-mode": 0}))  # fmt: skip
    (folder / "memory.json").write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}))
    argv = [binary, f"--workload-configuration={folder / 'chained'}", f"--system-configuration={folder / 'system.json'}",
            f"--remote-memory-configuration={folder / 'memory.json'}", f"--network-configuration={folder / 'network.yml'}",
            f"--logging-folder={folder / 'log'}"]  # it writes log/ under the working directory otherwise
    cpu = []
    for _ in range(repeats):
        with tempfile.TemporaryFile("w+") as out:
            c, _, stderr = run_command(argv, out)
            out.seek(0)
            text = out.read() + stderr
        cpu.append(c)
    cycles = [int(x) for x in re.findall(r"finished, (\d+) cycles", text)]
    if not cycles:
        raise SystemExit(f"no 'finished, N cycles' line in ASTRA-sim's output:\n{text[-2000:]}")
    return statistics.median(cpu), max(cycles) / 1e6  # cycles are ns


def one_f_one_b(tmp: Path, repeats: int, target_ops: int) -> None:
    microbatches = max(2, round(target_ops / OPS_PER_MICROBATCH_64))
    params = ["-p", "stages=64", "-p", f"microbatches={microbatches}"]
    out = tmp / "1f1b.json"
    runs = {label: measure(simulate_argv("1f1b", *params, "--network", "flow", *extra), repeats, out if label == "--json" else None)
            for label, extra in (("plain", []), ("--json", ["--json"]), ("--trace", ["--trace", str(tmp / "trace.json"), "--gantt", "never"]))}  # fmt: skip
    ops = json.loads(out.read_text())["num_ops"]
    print(f"2. 1f1b, 64 stages x {microbatches} microbatches = {ops:,} ops (flow network); budget 10 s, 300 B/op:")
    for label, r in runs.items():
        print(f"   {label:8} {r['cpu_s']:6.2f} s CPU  {r['rss_bytes'] / 2**20:6.0f} MiB peak  {r['rss_bytes'] / ops:5.0f} B/op")


def cost_per_op(tmp: Path, repeats: int, sizes: tuple[int, ...]) -> None:
    print("3. cost per op, 1f1b at 64 stages (whole command, flow network, --json):")
    out = tmp / "cost.json"
    for target in sizes:
        microbatches = max(2, round(target / OPS_PER_MICROBATCH_64))
        r = measure(simulate_argv("1f1b", "-p", "stages=64", "-p", f"microbatches={microbatches}", "--network", "flow", "--json"),
                    repeats, out)  # fmt: skip
        ops = json.loads(out.read_text())["num_ops"]
        print(f"   {ops:>10,} ops  {r['cpu_s']:6.2f} s CPU  {r['cpu_s'] / ops * 1e6:6.2f} us/op")


def samples(tmp: Path, repeats: int, microbatches: int) -> None:
    from commdsl.machine.loader import PRESETS_DIR

    machine = tmp / "cpu-noisy.yaml"  # cpu-loopback with compute stalls: samples differ
    machine.write_text((PRESETS_DIR / "cpu-loopback.yaml").read_text() + "compute_noise: {stalls_per_s: 200, stall_us: 300}\n")
    params = ["1f1b", "-p", "stages=64", "-p", f"microbatches={microbatches}", "-p", "saved=16MiB", "--machine", str(machine),
              "--network", "flow", "--gantt", "never"]  # fmt: skip
    one = measure(simulate_argv(*params), repeats)
    eight = measure(simulate_argv(*params, "--samples", "8"), repeats)
    print(f"4. --samples 8 vs 1 (1f1b 64 x {microbatches}, compute stalls): {eight['cpu_s']:.2f} s vs {one['cpu_s']:.2f} s "
          f"= {eight['cpu_s'] / one['cpu_s']:.2f}x (budget 8x)")  # fmt: skip


PIPELINE = """
name: every_rank_pipeline
params: {stages: 512, microbatches: 200, t_compute: 1ms, act: 64MiB}
world: stages
streams: [compute, recv, send]
program: |
  for mb in range(microbatches):
      if rank > 0:
          recv act[mb] act from rank - 1 on recv
          record got[mb] on recv
          wait got[mb] on compute
      compute F[mb] t_compute
      if rank < stages - 1:
          record done[mb] on compute
          wait done[mb] on send
          send out[mb] act to rank + 1 on send
"""
"""Each middle stage 7 ops per microbatch, the first and last 4: 715,600 ops at 512 x 200."""


def instructions(argv: list[str]) -> int:
    """Instructions (valgrind's cachegrind, `I refs`) that `argv` executes: a count that
    does not move with the machine's load, unlike its CPU time."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *argv]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def pipeline(tmp: Path, repeats: int, stages: int, microbatches: int, count_instructions: bool = False) -> None:
    import io

    from commdsl.dsl import load_schedule_text
    from commdsl.machine import load_machine_text
    from commdsl.sim import simulate
    from commdsl.sim.collector import frozen, gc_paused
    from commdsl.sim.summary import summarize
    from commdsl.validate import validate_program

    schedule, machine_file, out = tmp / "pipeline.yaml", tmp / "ring-512.yaml", tmp / "pipeline.json"
    schedule.write_text(PIPELINE)
    machine_text = RING_MACHINE.replace("devices: 64", f"devices: {stages}")
    machine_file.write_text(machine_text)
    params = ["-p", f"stages={stages}", "-p", f"microbatches={microbatches}"]
    r = measure(simulate_argv(str(schedule), *params, "--machine", str(machine_file), "--network", "flow", "--json"), repeats, out)
    ops = json.loads(out.read_text())["num_ops"]
    print(f"5. every rank runs: {stages} stages x {microbatches} microbatches = {ops:,} ops (flow, --json): "
          f"{r['cpu_s']:.2f} s CPU, {r['rss_bytes'] / 2**20:.0f} MiB peak")  # fmt: skip
    # Where the time goes, phase by phase, in this process (one run; CPU time), with the
    # cyclic collector as the command has it: paused while the program is made and checked,
    # the program frozen before it runs again (commdsl/commands/simulate.py).
    overrides = {"stages": str(stages), "microbatches": str(microbatches)}
    machine = load_machine_text(machine_text, str(machine_file))
    phases = []
    with ExitStack() as to_the_end:
        with gc_paused():
            t = time.process_time()
            program = load_schedule_text(PIPELINE, str(schedule), overrides, validate=False)
            phases.append(("expansion", time.process_time() - t))
            t = time.process_time()
            validate_program(program)
            phases.append(("checks across ranks", time.process_time() - t))
            to_the_end.enter_context(frozen())
        t = time.process_time()
        result = simulate(program, machine, "flow")
        phases.append(("simulate()", time.process_time() - t))
        t = time.process_time()
        summarize(result).write_json(io.StringIO())
        phases.append(("summary and JSON", time.process_time() - t))
    total = sum(s for _, s in phases)
    print("   " + ", ".join(f"{name} {s:.2f} s ({s / total:.0%})" for name, s in phases))
    # Start-up and imports: the same command on the smallest pipeline.
    small = measure(simulate_argv(str(schedule), "-p", "stages=2", "-p", "microbatches=1", "--machine", str(machine_file),
                                  "--network", "flow", "--json"), repeats)  # fmt: skip
    print(f"   start-up: the same command at 2 stages x 1 microbatch {small['cpu_s']:.2f} s CPU")
    if count_instructions:  # a tenth of the microbatches: under valgrind the full size takes minutes
        tenth = max(microbatches // 10, 1)
        args = ("--machine", str(machine_file), "--network", "flow", "--json")
        whole = instructions(simulate_argv(str(schedule), "-p", f"stages={stages}", "-p", f"microbatches={tenth}", *args))
        start = instructions(simulate_argv(str(schedule), "-p", "stages=2", "-p", "microbatches=1", *args))
        print(f"   instructions: the command at {stages} stages x {tenth} microbatches {whole / 1e6:,.0f} M, "
              f"at 2 stages x 1 microbatch {start / 1e6:,.0f} M")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--astra", metavar="PATH", help="ASTRA-sim's AstraSim_Analytical_Congestion_Unaware binary")
    parser.add_argument("--only", choices=FIGURES, action="append", help="run only this figure (repeatable; default: all)")
    parser.add_argument("--instructions", action="store_true",
                        help="figure 5 also counts instructions (valgrind's cachegrind) at a tenth of its microbatches")
    args = parser.parse_args()
    if args.instructions and not shutil.which("valgrind"):
        raise SystemExit("--instructions: valgrind is not on the PATH")
    if args.astra and not shutil.which(args.astra) and not Path(args.astra).is_file():
        raise SystemExit(f"--astra: no such program: {args.astra}")
    repeats = 1 if args.quick else args.repeats
    # An installed package has its bytecode compiled (pip does it); a checkout may not
    # (PYTHONDONTWRITEBYTECODE), and compiling at every start-up is not what users pay.
    import commdsl

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(commdsl.__file__).parent)], check=True)
    print(f"commdsl scale bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"CPU s and peak RSS of the whole process, median of {repeats}", flush=True)  # fmt: skip
    from commdsl.sim import ENGINE_BUILD  # the commands it times run the same engine

    print(f"engine: {ENGINE_BUILD.describe()}", flush=True)
    only = set(args.only or FIGURES)
    with tempfile.TemporaryDirectory() as tmp:
        if "chained" in only:
            chained(Path(tmp), repeats, args.astra)
        if "1f1b" in only:
            one_f_one_b(Path(tmp), repeats, 100_000 if args.quick else 1_000_000)
        if "cost" in only:
            cost_per_op(Path(tmp), repeats, (1_000, 10_000, 100_000) if args.quick else (1_000, 10_000, 100_000, 1_000_000))
        if "samples" in only:
            samples(Path(tmp), repeats, 16 if args.quick else 64)
        if "pipeline" in only:
            pipeline(Path(tmp), repeats, 64 if args.quick else 512, 20 if args.quick else 200, args.instructions)


if __name__ == "__main__":
    main()
