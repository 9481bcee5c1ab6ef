"""`torchrun -m commdsl.run FILE [-p k=v ...] [--out measured.json] ...`

Loads the schedule on every rank, checks the torchrun environment against it, sets up
the process groups, runs warm-up and measured iterations, and has rank 0 write the
measured timeline. Exit codes: 0 ok, 1 schedule error / check failure / failed op,
2 usage error, 3 watchdog (an op hung). A Python traceback reaching the user is a bug.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from commdsl.errors import CommdslError, UsageError, require_output_folder
from commdsl.files import check_output_folder
from commdsl.limits import MAX_RUN_ITERS
from commdsl.run.config import BackendChoice, DurationMode, RunConfig
from commdsl.run.launch import ArgumentRecorder, torch_required

if TYPE_CHECKING:
    from commdsl.ir import Program
    from commdsl.timeline import Timeline

PROG = "torchrun --nproc_per_node=N -m commdsl.run"


class UsageParser(argparse.ArgumentParser):
    """argparse whose errors are commdsl usage errors (exit code 2) pointing at `help_command`."""

    def __init__(self, *args, help_command: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.help_command = help_command

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, hint=f"see `{self.help_command}`")


DESCRIPTION = ("Run a commdsl schedule for real with torch.distributed and write the measured timeline "
               "(Chrome-trace JSON with the simulator's op ids). See docs/executor.md.")


MAX_TIMEOUT_S = 86_400.0 * 365
"""A year: longer than any run, short enough for the watchdog's clock arithmetic."""


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog=PROG, description=DESCRIPTION, help_command="python -m commdsl.run --help")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The run's options (also `commdsl run`'s); returns the actions added, in order."""
    add = ArgumentRecorder(p)
    add("schedule", help="schedule file, or the name of a bundled schedule")
    add("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="override a param (repeatable)")
    add("--out", default="measured.json", help="measured timeline, written by rank 0 (default: measured.json)")
    add("--trace-dir", metavar="DIR", default=None,
        help="rank 0 also writes the measured timeline as PyTorch profiler (Kineto) traces, one JSON per rank")  # fmt: skip
    add("--warmup", type=int, default=2, metavar="K", help="warm-up iterations (default 2)")
    add("--iters", type=int, default=5, metavar="N", help="measured iterations; spans are per-op medians (default 5)")
    add("--check", action="store_true", help="fill rank-dependent values and verify every communication result")
    add("--timeout", type=float, default=60.0, metavar="S",
        help="watchdog: with ops unfinished, no op of a rank finishing for S seconds stops every rank (default 60)")  # fmt: skip
    add("--backend", choices=[b.value for b in BackendChoice], default="auto",
        help="auto: NCCL with one GPU per rank where CUDA is available, else gloo")  # fmt: skip
    add("--duration-mode", choices=[m.value for m in DurationMode], default="busy",
        help="compute with an explicit duration: calibrated matmuls (busy) or, on CPU, sleep")  # fmt: skip
    add("--values", metavar="FILE", help="YAML: explicit input values per tensor name and rank (implies per-op buffers)")
    add("--dump-values", metavar="FILE", help="rank 0 writes every comm op's input and output values (JSON)")
    add("--records", metavar="FILE",
        help="rank 0 also writes every measured iteration's op start and end times (JSON), behind the per-op medians")  # fmt: skip
    add("--no-validate", action="store_true",
        help="skip the static matching checks (to reproduce a hang on purpose)")  # fmt: skip
    add("--max-ops", type=int, default=None, metavar="N", help="fail if the schedule expands to more than N ops")
    add("-q", "--quiet", action="store_true", help="print nothing on success")
    add("--compare", action="store_true",
        help="after the run, simulate the same schedule and print predicted vs measured")  # fmt: skip
    add("--machine", metavar="NAME|PATH", default=None,
        help="machine for --compare (default: cpu-loopback on gloo, the simulator's default on NCCL; "
        "best: a file from `commdsl calibrate -n N --out FILE`)")  # fmt: skip
    add("--network", default=None, help="network model for --compare (default analytic)")
    add("--profile", metavar="DIR", default=None,
        help="run the measured iterations under torch.profiler; every rank writes its Kineto trace to DIR")  # fmt: skip
    return add.actions


def parse_config(argv: list[str] | None) -> RunConfig:
    return config_from_args(build_parser().parse_args(argv))


def config_from_args(a: argparse.Namespace) -> RunConfig:
    """The run's settings from parsed options (`add_arguments`), every value checked."""
    from commdsl.dsl import parse_overrides

    if not 0 <= a.warmup <= MAX_RUN_ITERS:
        raise UsageError(f"--warmup must be from 0 to {MAX_RUN_ITERS:,}, got {a.warmup:,}")
    if not 1 <= a.iters <= MAX_RUN_ITERS:
        raise UsageError(f"--iters must be from 1 to {MAX_RUN_ITERS:,}, got {a.iters:,}")
    if not 0 < a.timeout < MAX_TIMEOUT_S:  # also refuses nan and inf
        raise UsageError(f"--timeout must be a number of seconds above 0 and below {MAX_TIMEOUT_S:g}, got {a.timeout}")
    if a.max_ops is not None and a.max_ops < 1:
        raise UsageError(f"--max-ops must be at least 1, got {a.max_ops}")
    for flag, path in (("--out", a.out), ("--records", a.records), ("--dump-values", a.dump_values)):
        require_output_folder(flag, path)  # written by rank 0 after the whole run: checked before any rank starts
    check_output_folder("--trace-dir", a.trace_dir)
    check_output_folder("--profile", a.profile)
    if (a.machine is not None or a.network is not None) and not a.compare:
        raise UsageError("--machine and --network only apply with --compare")
    if a.compare:
        # Fail before any process group exists if the machine or network is wrong.
        from commdsl.machine import resolve_machine
        from commdsl.sim import NETWORKS

        if a.machine is not None:
            resolve_machine(a.machine)
        if a.network is not None and a.network not in NETWORKS:
            raise UsageError(f"--network {a.network}: unknown network model (known: {', '.join(sorted(NETWORKS))})")
    return RunConfig(
        schedule=a.schedule, params=tuple(parse_overrides(a.param).items()), out=a.out, warmup=a.warmup,
        iters=a.iters, check=a.check, timeout_s=a.timeout, backend=BackendChoice(a.backend),
        duration_mode=DurationMode(a.duration_mode), values_file=a.values, dump_values=a.dump_values, records_out=a.records,
        validate=not a.no_validate, max_ops=a.max_ops, quiet=a.quiet, compare=a.compare, machine=a.machine,
        network=a.network or "analytic", trace_dir=a.trace_dir, profile_dir=a.profile,
    )  # fmt: skip


def print_run_comparison(program: Program, config: RunConfig, measured: Timeline, meta: dict) -> None:
    """Rank 0, --compare: simulate the very Program that ran and print the comparison
    (`commdsl.run.session.Comparer`)."""
    from rich.console import Console

    from commdsl.commands.compare import print_comparison
    from commdsl.comparison import compare_timelines, run_flop_rates
    from commdsl.dsl.values import format_us
    from commdsl.machine import resolve_machine
    from commdsl.progress import Progress
    from commdsl.run.session import comparison_machine
    from commdsl.sim import simulate

    machine_name = comparison_machine(config, meta["backend"])
    machine = resolve_machine(machine_name)
    # A machine with random compute stalls is sampled as often as the run iterated: both
    # sides are then per-op medians over as many draws.
    samples = config.iters if machine.compute_noise is not None else 1
    with Progress("commdsl run --compare") as progress:
        progress.phase(f"simulating on {machine_name}", unit="ops")
        predicted = simulate(program, machine, config.network, samples=samples, progress=progress.update).timeline
    console = Console(highlight=False)
    drawn = f", median of {samples} samples" if samples > 1 else ""
    console.print(f"\npredicted on {machine_name} ({config.network} network{drawn}) vs measured:")
    print_comparison(compare_timelines(predicted, measured), console)
    rates = run_flop_rates(measured)
    if rates:
        again = simulate(program, machine.with_peak_tflops(rates), config.network, samples=samples).timeline
        shown = ", ".join(f"{d.value} {r:.3g}" for d, r in rates.items())
        console.print(f"at this run's FLOP rate ({shown} TFLOP/s): predicted {format_us(again.makespan_us)}, makespan error "
                      f"{compare_timelines(again, measured).makespan_error_pct:+.2f}% (the machine's speed that day taken out)")  # fmt: skip


COMMON_ERROR_GRACE_S = 10.0
"""How long a rank other than 0 waits before exiting with an error every rank hits alike."""


def _let_rank_0_report() -> bool:
    """Rank 0 prints an error that every rank hits; another rank that exits first makes
    the launcher stop rank 0, maybe before it printed. So the other ranks wait: the
    launcher stops them as soon as rank 0 has exited (in a tenth of a second with
    `commdsl run -n`). Returns whether the wait ran out: rank 0 did not end the run, so
    the error is this rank's alone, and this rank has to say it."""
    try:
        time.sleep(COMMON_ERROR_GRACE_S)
    except KeyboardInterrupt:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    # Errors that reach here are hit alike by every rank (usage, schedule, check
    # summary): rank 0 prints them. Errors of one rank are printed by the session.
    first = os.environ.get("RANK", "0") == "0"
    try:
        config = parse_config(argv)
        with torch_required("python -m commdsl.run"):
            from commdsl.run.session import run
        return run(config, print_run_comparison)
    except CommdslError as err:
        if first:
            print(err.format(), file=sys.stderr, flush=True)
        elif _let_rank_0_report():
            print(f"rank {os.environ.get('RANK')}: {err.format()}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank under torchrun: one line each, then out at once, before
        # gloo's threads are torn down mid-operation (their destructors abort the process).
        print(f"rank {os.environ.get('RANK', '0')}: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)
    except (RuntimeError, OSError, ValueError) as e:  # torch.distributed set-up (store, rendezvous, NCCL)
        # Another rank's failure often shows here as a closed connection: where rank 0
        # ended the run (it says why), the launcher stops this rank before it prints.
        if first or _let_rank_0_report():
            print(f"run error: rank {os.environ.get('RANK', '0')}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
