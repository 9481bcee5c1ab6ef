"""Print a digest of every per-op outcome of every bundled schedule, simulated on a few
machines with every network model (and sampled, and unfolded), and of the trace of each
flow-network run: what `test_native` compares between the compiled modules and the
Python source, each in its own process.

    python tests/engine_digests.py            # the engine `commdsl.native` picks
    COMMDSL_PURE_PYTHON=1 python tests/engine_digests.py
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from commdsl.dsl import load_schedule
from commdsl.errors import CommdslError
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.loader import PRESETS_DIR
from commdsl.resources import bundled_schedules
from commdsl.sim import ENGINE_BUILD, NETWORKS, simulate

MACHINES = ("h100-nvlink", "dgx-h100", "pcie-nvlink-pairs", "cpu-loopback")
"""The default GPU machine; two with a topology and copy engines; gloo on CPUs with a
contention model (timed compute, shared cores)."""
NOISE = "compute_noise: {stalls_per_s: 200, stall_us: 300}\n"
"""Random compute stalls, for a sampled simulation on the CPU machine."""


def digest(result) -> str:
    raw = result.raw
    h = hashlib.sha256()
    for column in (raw.issue_start, raw.issue_end, raw.start, raw.end, raw.state, raw.cause, raw.partner, raw.algos, raw.protos, raw.kinds):
        h.update(bytes(column))
    h.update(repr(sorted(result.nominal_us.items())).encode())
    return h.hexdigest()[:16]


def trace_digest(result, folder: Path) -> str:
    """The digest of the Chrome trace `write_trace` streams for `result`."""
    path = folder / "trace.json"
    result.write_trace(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    print(f"engine: {ENGINE_BUILD.describe()}")
    noisy = load_machine_text((PRESETS_DIR / "cpu-loopback.yaml").read_text() + NOISE, "noisy.yaml")
    # Every bundled schedule as it comes, and a longer pipeline (queues, pair order, reuse).
    for name, params in [(name, {}) for name in bundled_schedules()] + [("1f1b", {"stages": "16", "microbatches": "64"})]:
        program = load_schedule(name, params)
        runs = [(m, network, {}) for m in MACHINES for network in sorted(NETWORKS)]
        runs += [("h100-nvlink", "flow", {"fold": False}), (noisy, "flow", {"samples": 3, "seed": 7})]
        for machine, network, options in runs:
            try:
                result = simulate(program, resolve_machine(machine) if isinstance(machine, str) else machine, network, **options)
                outcome = digest(result)
                if network == "flow":  # the network with link counters in its trace
                    with tempfile.TemporaryDirectory() as folder:
                        outcome += " trace " + trace_digest(result, Path(folder))
            except CommdslError as error:
                outcome = f"{type(error).__name__}: {error}"
            print(name, params, machine if isinstance(machine, str) else "noisy cpu-loopback", network, options, outcome)


if __name__ == "__main__":
    main()
