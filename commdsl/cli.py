"""The `commdsl` console script.

Subcommands live in their own modules; each provides `add_arguments(parser)` and
`run(args) -> int`. This module parses the command line, dispatches, and turns every
`CommdslError` into its one-screen message and exit code (0 ok, 1 schedule error,
2 usage error, 3 deadlock, 5 out of device memory). A Python traceback reaching the user is a bug.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from commdsl import __version__
from commdsl.errors import CommdslError, UsageError

# name -> (module, one-line help). Command modules import their heavy parts (the
# simulator, the HTML report) only when they run; nothing reachable from here imports
# torch, which only the executor and calibrate need (`run` and `calibrate` import it
# when they launch ranks).
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("commdsl.commands.check", "validate a schedule and print a summary"),
    "show": ("commdsl.commands.show", "print each rank's op order (grid and listing)"),
    "list": ("commdsl.commands.listing", "list the bundled schedules"),
    "simulate": ("commdsl.commands.simulate", "predict a schedule's timeline on a machine (summary, Gantt, trace)"),
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
        "--max-ops", type=int, default=None, metavar="N",
        help="fail if the schedule expands to more than N ops (default 5,000,000)",
    )  # fmt: skip


def parse_overrides(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier() or not value:
            raise UsageError(f"-p takes KEY=VALUE, got {item!r}", hint="e.g. -p stages=8 or -p act=64MiB")
        if key in out:
            raise UsageError(f"-p {key} is given twice")
        out[key] = value
    return out


def load_from_args(args: argparse.Namespace, *, validate: bool = True):
    """Load the schedule named by a command's arguments."""
    from commdsl.dsl import DEFAULT_MAX_OPS, load_schedule

    max_ops = args.max_ops if args.max_ops is not None else DEFAULT_MAX_OPS
    if max_ops < 1:
        raise UsageError(f"--max-ops must be at least 1, got {max_ops}")
    return load_schedule(args.schedule, parse_overrides(args.param), max_ops=max_ops, validate=validate)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="commdsl",
        description="Write a distributed-training communication schedule once; check it, show it, "
        "simulate it, run it under torchrun, and compare.",
    )
    parser.add_argument("--version", action="version", version=f"commdsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args._module.run(args) or 0)
    except CommdslError as err:
        print(err.format(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
