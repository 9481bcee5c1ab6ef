"""`commdsl calibrate -n N --out machine.yaml`: measure this machine with N local ranks.

    commdsl calibrate -n 2 --out my.yaml            # minutes: every series, three passes
    commdsl calibrate -n 2 --quick --out rough.yaml # a minute or two: a rough first file
    commdsl calibrate -n 1 --out gpu.yaml           # one device: compute, copies, launches
    commdsl calibrate --from-nccl-tests all_reduce.log --out cluster.yaml   # a GPU cluster from its logs (no ranks)
    commdsl calibrate --from-nccl-tests all_reduce.log --machine dgx-h100 --check   # how a machine predicts them

The same options as `torchrun -m commdsl.calibrate` (checked here before any rank
starts); `commdsl.run.launch` starts the ranks and watches them.
"""

from __future__ import annotations

import argparse

from commdsl.calibrate import main as calibrate_main
from commdsl.errors import UsageError
from commdsl.run.launch import add_nproc_argument, launch, rank_argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = calibrate_main.add_arguments(parser)
    add_nproc_argument(parser, 2, "default 2; with 1, the device, copies and launches only (no communication)")
    parser.set_defaults(_rank_actions=actions)


def run(args: argparse.Namespace) -> int:
    cfg = calibrate_main.config_from_args(args)  # every option checked as the ranks will check it
    if cfg.from_nccl_tests:  # fitted to logs, here: no ranks, no torch
        from commdsl.calibrate.nccl_tests import main_from_nccl_tests

        return main_from_nccl_tests(list(cfg.from_nccl_tests), cfg.out, cfg.base_machine, cfg.nccl_algo, cfg.nccl_proto, cfg.check)
    if args.nproc < 1:
        raise UsageError(f"calibrate needs at least 1 rank, got -n {args.nproc}")
    return launch("commdsl.calibrate", rank_argv(args._rank_actions, args), args.nproc, "commdsl calibrate")
