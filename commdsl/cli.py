"""The `commdsl` console script.

Subcommands live in their own modules; each provides `add_arguments(parser)` and
`run(args) -> int`. This module parses the command line, dispatches, and turns every
`CommdslError` into its one-screen message and exit code (0 ok, 1 schedule error,
2 usage error, 3 deadlock, 5 out of device memory). A Python traceback reaching the user is a bug.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import sys
from collections.abc import Iterable
from typing import NoReturn

from commdsl import __version__
from commdsl.errors import CommdslError, OutputError, UsageError

# name -> (module, one-line help). Command modules import their heavy parts (the
# simulator, the HTML report) only when they run; nothing reachable from here imports
# torch, which only the executor and calibrate need (`run` and `calibrate` import it
# when they launch ranks).
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("commdsl.commands.check", "validate a schedule and print a summary"),
    "show": ("commdsl.commands.show", "print each rank's op order (grid and listing)"),
    "list": ("commdsl.commands.listing", "list the bundled schedules"),
    "simulate": ("commdsl.commands.simulate", "predict a schedule's timeline on a machine (summary, Gantt, trace)"),
    "sweep": ("commdsl.commands.sweep", "simulate every combination of schedules, params, machines and nodes; the best points"),
    "compare": ("commdsl.commands.compare", "compare a predicted and a measured timeline op by op"),
    "import": ("commdsl.commands.import_", "turn another tool's schedule (torch.distributed.pipelining CSV) into a schedule"),
    "export": ("commdsl.commands.export", "write a schedule as another tool's schedule (torch.distributed.pipelining CSV)"),
    "run": ("commdsl.commands.run", "run a schedule for real on N local ranks (torch.distributed) and write the measured timeline"),
    "calibrate": ("commdsl.commands.calibrate", "measure this machine with N local ranks and write a machine file"),
}


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors through our hierarchy (exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments every command that loads a schedule takes."""
    parser.add_argument("schedule", help="schedule file, or the name of a bundled schedule (see `commdsl list`)")
    parser.add_argument(
        "-p", "--param", action="append", default=[], metavar="KEY=VALUE",
        help="override a param, e.g. -p stages=8 -p act=64MiB (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--max-ops", type=count_at_least(1), default=None, metavar="N",
        help="fail if the schedule expands to more than N ops (default 5,000,000)",
    )  # fmt: skip


def count_at_least(minimum: int):
    """An argparse `type`: a whole number >= `minimum` (a bad one is a usage error naming it)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def non_negative_number(text: str) -> float:
    """An argparse `type`: a finite number >= 0."""
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got '{text}'")
    return value


def add_fold_argument(parser: argparse.ArgumentParser) -> None:
    """--no-fold, of the commands that understand a folded program (check, simulate)."""
    parser.add_argument("--no-fold", dest="fold", action="store_false",
                        help="expand and check every rank even where the replicas along a mesh axis run the same "
                             "program (by default one replica stands for them all: docs/simulator.md, folding)")  # fmt: skip


def load_from_args(args: argparse.Namespace, *, validate: bool = True, fold: bool = False, fold_unit: int = 1):
    """Load the schedule named by a command's arguments; `fold`: fold the replicas along a
    mesh axis where that is verified (`load_schedule`, with `fold_unit`) unless the
    command's --no-fold says not."""
    from commdsl.dsl import DEFAULT_MAX_OPS, load_schedule, parse_overrides

    max_ops = args.max_ops if args.max_ops is not None else DEFAULT_MAX_OPS
    fold = fold and getattr(args, "fold", True)
    return load_schedule(args.schedule, parse_overrides(args.param), max_ops=max_ops, validate=validate, fold=fold,
                         fold_unit=fold_unit)  # fmt: skip


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Every command is listed, but only those in `commands`
    (None: all) get their arguments: adding them imports the command's module, which
    costs start-up time a command that is not run should not pay."""
    parser = _ArgumentParser(
        prog="commdsl",
        description="Write a distributed-training communication schedule once; check it, show it, "
        "simulate it, run it under torchrun, and compare.",
    )
    parser.add_argument("--version", action="version", version=f"commdsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if commands is None or name in commands:
            module = importlib.import_module(module_name)
            module.add_arguments(cmd)
            cmd.set_defaults(_module=module)
    return parser


def _command_in(argv: list[str]) -> tuple[str, ...]:
    """The command `argv` names: its first word that is not an option (the top-level
    options, --help and --version, take no value); () if there is none."""
    return next(((arg,) for arg in argv if not arg.startswith("-")), ())


STARTS_PROCESSES = frozenset({"run", "calibrate"})
"""Commands that launch ranks (torchrun, torch): their process ends the interpreter's way."""


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` and return its exit code; `argv` None: the process's own
    command line (the `commdsl` console script, `python -m commdsl.cli`), and then, but
    for a command in `STARTS_PROCESSES` or under a profiler or tracer, the process ends
    here (`_end_process`)."""
    code = _main(argv)
    # Under a profiler or a tracer (cProfile, coverage) the process ends the interpreter's
    # way, so that they write what they measured at exit.
    watched = sys.getprofile() is not None or sys.gettrace() is not None
    if argv is None and not watched and not STARTS_PROCESSES.intersection(_command_in(sys.argv[1:])):
        _end_process(code)
    return code


def _end_process(code: int) -> NoReturn:
    """End the process with `code` once its output is flushed, skipping the interpreter's
    teardown: it frees every object and module one by one, which costs CPU time in the
    order of a large summary's and writes nothing (the command's files are closed, its
    progress thread stopped, and nothing of commdsl's runs at exit)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone or a stream closed: `_main` reported what it could
            pass
    os._exit(code)


def _main(argv: list[str] | None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not in Python's exit
        return code
    except CommdslError as err:
        return _fail(err)
    except KeyboardInterrupt:
        _print_error("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): nobody reads a message; leave quietly, exit 1
        # as rich does (`_run`).
        _detach_stdout()
        return 1
    except OSError as e:
        if not _stdout_failed(e):
            raise
        return _fail(OutputError(f"cannot write the output: {e.strerror or e}", hint="is the disk full?"))


def _run(argv: list[str] | None) -> int:
    parser = build_parser(_command_in(sys.argv[1:] if argv is None else argv))
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as e:  # --help, --version: argparse printed and exits
        return e.code if isinstance(e.code, int) else 0
    if args.command is None:
        parser.print_help()
        return 2
    if unknown:  # the command's arguments: its own help says what they are
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}", hint=f"see `commdsl {args.command} --help`")
    try:
        return int(args._module.run(args) or 0)
    except SystemExit as e:  # rich, on a closed pipe: it pointed stdout at /dev/null first
        if isinstance(e.code, str):
            _print_error(e.code)
        return e.code if isinstance(e.code, int) else 1


def _fail(err: CommdslError) -> int:
    if isinstance(err, OutputError):
        _detach_stdout()
    _print_error(err.format())
    return err.exit_code


def _print_error(text: str) -> None:
    try:
        print(text, file=sys.stderr)
    except OSError:  # stderr is gone too: the exit code says it
        pass


_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EPIPE})


def _stdout_failed(e: OSError) -> bool:
    """Whether `e` came from writing standard output: commdsl's own files fail as usage
    errors naming them (commdsl/files.py), so an OSError that names no file and is of a
    kind a write raises (a full disk, an I/O error) is the output's."""
    return e.filename is None and e.errno in _OUTPUT_ERRNOS


def _detach_stdout() -> None:
    """Point stdout at /dev/null, so Python's final flush of what is still buffered does
    not fail again (and print a traceback) at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (stdout replaced): nothing buffered to lose
        pass


if __name__ == "__main__":
    sys.exit(main())
