"""Run settings: what the command line asks the executor to do."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commdsl.ir import Program
    from commdsl.progress import Progress


class BackendChoice(str, enum.Enum):
    AUTO = "auto"
    GLOO = "gloo"
    NCCL = "nccl"


class DurationMode(str, enum.Enum):
    """How a compute op with an explicit duration is run."""

    BUSY = "busy"
    """Matrix multiplies, repeated as often as start-up calibration says fits the duration."""
    SLEEP = "sleep"
    """The stream sleeps for the duration (CPU only): exact, and uses no core."""


@dataclass(frozen=True)
class RunConfig:
    schedule: str
    """Schedule file or bundled schedule name."""
    params: tuple[tuple[str, str], ...] = ()
    """`-p key=value` overrides, in command-line order."""
    out: str = "measured.json"
    """Where rank 0 writes the measured timeline (Chrome-trace JSON)."""
    warmup: int = 2
    """Iterations run before the measured ones (NCCL set-up, caches, allocator)."""
    iters: int = 5
    """Measured iterations; each op's span is the median over them."""
    check: bool = False
    """Fill inputs with rank-dependent values and verify every communication result."""
    timeout_s: float = 60.0
    """An op unfinished this long after it was issued triggers the watchdog."""
    backend: BackendChoice = BackendChoice.AUTO
    duration_mode: DurationMode = DurationMode.BUSY
    values_file: str | None = None
    """YAML file of explicit input values per tensor name and rank (see docs/executor.md)."""
    dump_values: str | None = None
    """Where rank 0 writes every comm op's input and output values (small tensors)."""
    records_out: str | None = None
    """Where rank 0 writes every measured iteration's op times (`--records`)."""
    validate: bool = True
    """Run the static checks before any op runs (send/recv matching, collective order,
    and `commdsl check`'s deadlock check); off to reproduce a hang on purpose."""
    max_ops: int | None = None
    quiet: bool = False
    compare: bool = False
    """After the run, rank 0 simulates the same program and prints the comparison."""
    machine: str | None = None
    """Machine for --compare (preset or file); None: cpu-loopback on gloo, the simulator's default on NCCL."""
    network: str = "analytic"
    """Network model for --compare."""
    trace_dir: str | None = None
    """Where rank 0 also writes the measured timeline as Kineto traces, one per rank."""
    profile_dir: str | None = None
    """`--profile DIR`: the measured iterations run under `torch.profiler`, and every rank
    writes its Kineto trace there (`rank-<r>.pt.trace.json`), with a `record_function`
    range per op named as the schedule names it."""


def load_program(config: RunConfig, progress: Progress | None = None) -> Program:
    """`config`'s schedule, expanded; with `config.validate`, also checked to finish
    (`commdsl.sim.check_deadlock`), so a schedule that would hang stops before any rank
    runs an op, with every stuck rank's op and line. `progress` hears both phases."""
    from commdsl.dsl import DEFAULT_MAX_OPS, load_schedule
    from commdsl.sim import check_deadlock

    if progress is not None:
        progress.phase(f"expanding {config.schedule}")
    program = load_schedule(config.schedule, dict(config.params), max_ops=config.max_ops or DEFAULT_MAX_OPS, validate=config.validate)
    if config.validate:
        if progress is not None:
            progress.phase("checking that every rank finishes", unit="ops")
        check_deadlock(program, progress.update if progress is not None else None)
    return program
