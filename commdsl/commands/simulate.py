"""`commdsl simulate`: predict a schedule's timeline on a machine.

    commdsl simulate 1f1b                              # summary, critical path, Gantt
    commdsl simulate 1f1b --machine a100-nvlink --trace predicted.json
    commdsl simulate ddp_overlap --trace-dir traces/   # Kineto traces per rank, for HTA
    commdsl simulate my.yaml -p stages=8 --json        # summary as JSON (makespan_us, ranks, links, ...)
    commdsl simulate memcpy_vs_nccl --machine pcie-nvlink-pairs --links   # busiest links
    commdsl simulate tp_mlp --machine dgx-h100 --nodes 2 -p dp=2 -p tp=8  # a 2-node cluster
    commdsl simulate 1f1b --network analytic           # no contention (the closed forms)
    commdsl simulate 1f1b --machine machine.yaml --samples 25   # draw the calibrated compute stalls
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from dataclasses import replace

from commdsl.cli import add_fold_argument, add_schedule_arguments, count_at_least, load_from_args
from commdsl.errors import UsageError, require_output_folder
from commdsl.files import OutputPath, check_output_folder
from commdsl.machine import DEFAULT_MACHINE, resolve_machine
from commdsl.progress import Progress
from commdsl.sim import NETWORKS, simulate
from commdsl.sim.models import DEFAULT_NETWORK
from commdsl.sim.collector import frozen, gc_paused
from commdsl.sim.folding import fold_unit, inexact
from commdsl.sim.summary import flow_entries, summarize

# rich (the terminal tables) and the Gantt chart are imported where they are printed:
# `--json` needs neither, and start-up time is part of every command's time.


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of every command that simulates."""
    parser.add_argument("--machine", default=DEFAULT_MACHINE, metavar="NAME|PATH",
                        help=f"machine preset or machine YAML file (default {DEFAULT_MACHINE})")  # fmt: skip
    parser.add_argument("--network", default=DEFAULT_NETWORK, choices=sorted(NETWORKS),
                        help=f"network model: flow (links shared max-min), analytic (no contention), flow-steps "
                             f"(collectives step by step, for validation); default {DEFAULT_NETWORK}")  # fmt: skip
    parser.add_argument("--nodes", type=count_at_least(1), default=None, metavar="N",
                        help="number of nodes of a machine with a topology (e.g. --machine dgx-h100 --nodes 8)")  # fmt: skip


def machine_from_args(args: argparse.Namespace):
    """--machine, with --nodes applied."""
    return resolve_machine(args.machine, nodes=args.nodes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    add_fold_argument(parser)
    add_machine_arguments(parser)
    parser.add_argument("--trace", metavar="OUT.json", default=None, action=OutputPath,
                        help="write the predicted timeline as Chrome-trace JSON (opens in Perfetto)")  # fmt: skip
    parser.add_argument("--trace-dir", metavar="DIR", default=None,
                        help="write the predicted timeline as PyTorch profiler (Kineto) traces, one JSON per rank, "
                             "which Holistic Trace Analysis and Perfetto read")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON (per rank, per link and per kind of transfer)")  # fmt: skip
    parser.add_argument("--flows", action="store_true",
                        help="with --json: list every transfer too (one entry per collective and per send/recv pair)")  # fmt: skip
    parser.add_argument("--gantt", choices=("auto", "always", "never"), default="auto",
                        help="terminal Gantt chart (auto: for small schedules)")  # fmt: skip
    parser.add_argument("--links", type=count_at_least(1), nargs="?", const=10, default=None, metavar="N",
                        help="print the N busiest links (default 10) with bytes, busy time and utilisation")  # fmt: skip
    add_sampling_arguments(parser)


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """--samples and --seed (simulate, and run --compare)."""
    parser.add_argument("--samples", type=count_at_least(1), default=1, metavar="N",
                        help="draw the machine's random compute stalls (compute_noise, from calibration) in N runs "
                             "and report each op's median, as commdsl.run does over its iterations (default 1: no noise)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="first random seed of --samples (default 0)")


def run(args: argparse.Namespace) -> int:
    if args.flows and not args.json:
        raise UsageError("--flows lists every transfer in the --json output", hint="add --json")
    require_output_folder("--trace", args.trace)  # before the simulation, which can take seconds
    check_output_folder("--trace-dir", args.trace_dir)
    with ExitStack() as to_the_end:
        with Progress("commdsl simulate") as progress:
            progress.phase(f"expanding {args.schedule}")
            # The program lives to the end and holds no garbage: frozen, the cyclic collector
            # no longer walks its ops (a million at a million ops) in the full collections
            # that the summary and the output start. Frozen before the collector runs again:
            # expansion makes the ops with it paused, and its first run after would walk
            # them all (the young generation's count is theirs), then again in the next
            # generation.
            with gc_paused():
                machine = machine_from_args(args)
                program = load_from_args(args, fold=True, fold_unit=fold_unit(machine, args.network))
                if (why := inexact(program, machine, args.network, args.samples)) is not None:
                    progress.phase(f"expanding {args.schedule} for every rank")
                    program = replace(load_from_args(args), fold_note=f"not folded along {program.fold.axis}: {why}")
                to_the_end.enter_context(frozen())
            progress.phase(f"simulating on {machine.name}", unit="ops")
            result = simulate(program, machine, args.network, samples=args.samples, seed=args.seed, progress=progress.update)
            if args.trace:
                progress.phase(f"writing the trace {args.trace}", unit="spans")
                result.write_trace(args.trace, flag="--trace", progress=progress.update)
            if args.trace_dir:
                from commdsl.interop.kineto_write import machine_device, write_kineto_traces

                progress.phase(f"writing Kineto traces into {args.trace_dir}", unit="ranks")
                if program.fold is not None:
                    print(f"commdsl simulate: the folded program's Kineto traces are the {program.fold.label} ranks', "
                          f"which stand for every replica (--no-fold: every rank's)", file=sys.stderr)  # fmt: skip
                backend, device = machine_device(machine)
                write_kineto_traces(result.timeline, program, args.trace_dir, backend=backend, device=device, progress=progress.update)
            progress.phase("summarising")
            summary = summarize(result)
        if args.json:
            summary.write_json(sys.stdout, flow_entries(result) if args.flows else None)
            return 0
        from commdsl.commands.simulate_tables import print_terminal

        print_terminal(result, summary, links=args.links, gantt=args.gantt, trace=args.trace)
        return 0
