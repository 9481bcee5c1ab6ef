"""The Python API's latency for a planner's inner loop: `commdsl.simulate` of a 1,000-op
program with the analytic network, and what the result's metrics add.

The program is the example auto-pipeliner's 1F1B (examples/auto_pipeliner.py), built with
`commdsl.Builder`, with the microbatches that bring it closest to `--ops` ops. Each case
runs `--repeats` times after one warm-up call; the figure is the median CPU time of one
call (`time.process_time`, which a loaded machine disturbs far less than wall time).
Target: simulate <= 5 ms for 1,000 ops (the same program each call; a new program each
call is timed too).

    python bench/api_latency.py [--ops 1000] [--stages 8] [--machine dgx-h100] [--repeats 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import commdsl

ROOT = Path(__file__).resolve().parents[1]


def _pipeliner():
    spec = importlib.util.spec_from_file_location("auto_pipeliner", ROOT / "examples" / "auto_pipeliner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["auto_pipeliner"] = module
    spec.loader.exec_module(module)
    return module


def median_ms(call: Callable[..., object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    """Median CPU time of `call()` (ms), or of `call(setup())` with `setup` untimed."""

    def once() -> float:
        args = () if setup is None else (setup(),)
        start = time.process_time()
        call(*args)
        return time.process_time() - start

    once()  # warm: imports, caches
    return statistics.median(once() for _ in range(repeats)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--machine", default="dgx-h100")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    pipeliner = _pipeliner()

    def build(microbatches: int) -> commdsl.Program:
        return pipeliner.candidate(args.stages, microbatches)[1]

    microbatches = 1  # the count whose program is closest to --ops ops
    while build(microbatches + 1).num_ops <= args.ops:
        microbatches += 1
    if abs(build(microbatches + 1).num_ops - args.ops) < abs(build(microbatches).num_ops - args.ops):
        microbatches += 1
    program = build(microbatches)
    machine = commdsl.load_machine(args.machine)
    print(f"1F1B, {args.stages} stages x {microbatches} microbatches: {program.num_ops:,} ops; machine {machine.name}; "
          f"{commdsl.ENGINE_BUILD.describe()}; load {os.getloadavg()[0]:.1f}; median CPU of {args.repeats} calls")  # fmt: skip
    # A planner's candidates are new programs: the same program's next call starts from
    # the wiring its last one left (`commdsl.sim.simulate`), a new one wires itself. As in
    # a planner's loop, each new program is built (untimed) just before its call and
    # dropped after it.
    cases: dict[str, Callable[..., object] | tuple[Callable[[], object], Callable[..., object]]] = {
        "build with the Builder": lambda: build(microbatches),
        "simulate(program, Machine, 'analytic')": lambda: commdsl.simulate(program, machine, network="analytic"),
        "simulate(new program, Machine, 'analytic')": (lambda: build(microbatches),
                                                       lambda fresh: commdsl.simulate(fresh, machine, network="analytic")),
        "simulate(program, name, 'analytic')": lambda: commdsl.simulate(program, args.machine, network="analytic"),
        "simulate + metrics (analytic)": lambda: commdsl.metrics(commdsl.simulate(program, machine, network="analytic")),
        "simulate(program, Machine, 'flow')": lambda: commdsl.simulate(program, machine, network="flow"),
    }
    for label, case in cases.items():
        setup, call = case if isinstance(case, tuple) else (None, case)
        ms = median_ms(call, args.repeats, setup)
        print(f"  {label:<42} {ms:8.2f} ms  {ms * 1e3 / program.num_ops:6.2f} us/op")


if __name__ == "__main__":
    main()
