"""`commdsl run FILE -n N`: run a schedule for real on N ranks of this machine.

    commdsl run 1f1b -p stages=2                   # as many ranks as the schedule has
    commdsl run 1f1b -n 2 -p stages=2 --check --compare

The same options as `torchrun -m commdsl.run` (docs/executor.md), which stays the way
to run on several nodes or under Slurm. The schedule is loaded and checked here first
(`load_program`), so a schedule error, a deadlock or a wrong -n stops before any rank
starts; then `commdsl.run.launch` starts the
ranks, watches them and exits with the code of the rank that failed first.
"""

from __future__ import annotations

import argparse

from commdsl.errors import UsageError
from commdsl.progress import Progress
from commdsl.run import cli as run_cli
from commdsl.run.config import load_program
from commdsl.run.launch import add_nproc_argument, launch, rank_argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = run_cli.add_arguments(parser)
    add_nproc_argument(parser, None, "default: the schedule's world size")
    parser.set_defaults(_rank_actions=actions)


def run(args: argparse.Namespace) -> int:
    config = run_cli.config_from_args(args)  # every option checked as the ranks will check it
    with Progress("commdsl run") as progress:
        program = load_program(config, progress)
    world = program.world_size
    nproc = world if args.nproc is None else args.nproc
    if nproc != world:
        raise UsageError(f"the schedule has {world} ranks, -n asks for {nproc}",
                         hint=f"use -n {world} (or leave -n out), or change the schedule's world with -p")  # fmt: skip
    return launch("commdsl.run", rank_argv(args._rank_actions, args), nproc, "commdsl run")
