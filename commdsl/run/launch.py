"""Launch N local ranks of a commdsl module through torch's elastic launcher.

`commdsl run FILE -n N` and `commdsl calibrate -n N` start their ranks here, on this
machine: what `torchrun --standalone --nproc_per_node=N -m MODULE ...` does, through
torch's own API (`torch.distributed.launcher.api.elastic_launch`), with a rendezvous on
a free local port. Each rank is `python -m MODULE ARGS` and prints its own errors (rank 0
those every rank hits alike); the launcher keeps torch's failure report (a
`ChildFailedError` traceback) from the user and exits with the failed rank's exit code:
1 schedule error or failed op, 2 usage error, 3 watchdog (an op hung), 128 + N after
signal N. Several nodes or Slurm: `torchrun ... -m commdsl.run` (docs/executor.md).

Importing this module does not import torch; `launch` does, and says how to install it
where it is missing.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from commdsl.errors import UsageError

ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")
"""Loggers of torch's launcher, kept to errors that are not the workers' (see `launch`)."""


class ArgumentRecorder:
    """Adds arguments to a parser like `parser.add_argument` and keeps the actions, in
    order: the options a rank module takes, for `rank_argv`."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.actions: list[argparse.Action] = []

    def __call__(self, *names: str, **options) -> None:
        self.actions.append(self.parser.add_argument(*names, **options))


def add_nproc_argument(parser: argparse.ArgumentParser, default: int | None, what: str) -> None:
    """-n / --nproc-per-node: how many local ranks to start."""
    parser.add_argument("-n", "--nproc-per-node", dest="nproc", type=int, default=default, metavar="N",
                        help=f"ranks to start on this machine ({what}); several nodes: torchrun (docs/executor.md)")  # fmt: skip


def rank_argv(actions: list[argparse.Action], args: argparse.Namespace) -> list[str]:
    """The command line that gives a rank's parser the values `args` holds for `actions`
    (the rank module's own options, as `add_arguments` returned them): positionals in
    order, then every option that differs from its default."""
    positional, options = [], []
    for action in actions:
        value = getattr(args, action.dest)
        if not action.option_strings:
            positional.append(str(value))
        elif action.nargs == 0:  # store_true / store_const
            if value != action.default:
                options.append(action.option_strings[-1])
        elif action.nargs in ("+", "*"):  # one option, several values
            if value:
                options += [action.option_strings[-1], *map(str, value)]
        elif isinstance(value, list):  # append: the option once per value
            options += [f"{action.option_strings[-1]}={item}" for item in value]
        elif value is not None and value != action.default:
            options.append(f"{action.option_strings[-1]}={value}")
    return positional + options


@contextmanager
def torch_required(command: str) -> Iterator[None]:
    """Imports inside turn a missing torch into `command`'s usage error; any other
    import error is a bug and passes."""
    try:
        yield
    except ImportError as e:
        if e.name is None or e.name.partition(".")[0] != "torch":
            raise
        raise UsageError(f"`{command}` runs ranks with torch.distributed, and torch is not installed here",
                         hint='pip install "commdsl[run]" (or install the torch build for your GPUs first)') from None  # fmt: skip


def launch(module: str, argv: list[str], nproc: int, command: str) -> int:
    """Run `python -m module argv` as `nproc` local ranks; returns the exit code."""
    if nproc < 1:
        raise UsageError(f"-n must be at least 1, got {nproc}")
    with torch_required(command):
        from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    if nproc > 1:
        # As torchrun: one intra-op thread per rank unless the user says otherwise, so
        # that N ranks do not start N thread teams as wide as the machine.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    levels = {name: logging.getLogger(name).level for name in ELASTIC_LOGGERS}
    with tempfile.TemporaryDirectory(prefix="commdsl-launch-") as log_dir:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
            rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1, start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        )  # fmt: skip
        try:
            # The ranks print their own errors; torch's launcher would add a report and
            # a traceback of the failure after them (and a log line per worker).
            for name in ELASTIC_LOGGERS:
                logging.getLogger(name).setLevel(logging.CRITICAL)
            elastic_launch(config, sys.executable)("-m", module, *argv)
        except ChildFailedError as failed:
            return _exit_code(failed.failures, command)
        except SignalException as stopped:
            print(f"{command}: stopped by {stopped.sigval.name}", file=sys.stderr, flush=True)
            return 128 + int(stopped.sigval)
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
    return 0


def _exit_code(failures: dict, command: str) -> int:
    """The exit code of the rank that failed first with an exit status of its own (the
    others were usually stopped by the launcher); a rank killed by a signal, which
    printed nothing, is reported here."""
    by_time = sorted(failures.items(), key=lambda rf: (rf[1].timestamp, rf[0]))
    exited = [(rank, f) for rank, f in by_time if f.exitcode > 0]
    rank, failure = (exited or by_time)[0]
    if failure.exitcode > 0:
        return failure.exitcode
    try:
        name = signal.Signals(-failure.exitcode).name
    except ValueError:
        name = f"signal {-failure.exitcode}"
    print(f"{command}: rank {rank} was killed by {name}", file=sys.stderr, flush=True)
    return 128 - failure.exitcode
