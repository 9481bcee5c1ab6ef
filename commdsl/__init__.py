"""commdsl: a schedule language, simulator and executor for distributed-training communication.

    import commdsl
    program = commdsl.load("1f1b", stages=8, microbatches=32)
    result = commdsl.simulate(program, machine="dgx-h100")
    print(result.makespan_us)

The functions mirror the command line (`commdsl.api`); the types they return and take are
importable from here too. Importing commdsl loads nothing heavy: each name is imported on
first use, and nothing here imports torch.
"""

from __future__ import annotations

import importlib

# First: whether the compiled modules or their sources load is decided before anything
# imports them.
from commdsl import native  # isort: skip

ENGINE_BUILD = native.select()
"""The build this process runs: compiled or the Python source (`commdsl.native`)."""

__version__ = "0.1.0"

_EXPORTS = {
    "load": "commdsl.api",
    "load_machine": "commdsl.api",
    "simulate": "commdsl.api",
    "compare": "commdsl.api",
    "read_timeline": "commdsl.api",
    "metrics": "commdsl.api",
    "Metrics": "commdsl.api",
    "Builder": "commdsl.builder",
    "sweep": "commdsl.sweeps",
    "Program": "commdsl.ir",
    "Op": "commdsl.ir",
    "Machine": "commdsl.machine.model",
    "SimResult": "commdsl.sim.simulate",
    "Summary": "commdsl.sim.summary",
    "Comparison": "commdsl.comparison",
    "Timeline": "commdsl.timeline",
    "CommdslError": "commdsl.errors",
    "ScheduleError": "commdsl.errors",
    "MachineError": "commdsl.errors",
    "DeadlockError": "commdsl.errors",
    "MemoryExceededError": "commdsl.errors",
    "ValidationError": "commdsl.errors",
    "LimitError": "commdsl.errors",
    "UsageError": "commdsl.errors",
}
"""Public name -> the module that defines it."""

__all__ = ["ENGINE_BUILD", "__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commdsl' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
