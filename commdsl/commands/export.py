"""`commdsl export`: write a schedule in another tool's format.

    commdsl export pipelining zbv -p stages=4 -p microbatches=8 -o zbv.csv
    commdsl export pipelining zbv --format compute_comms            # with the transfers, on stdout

`pipelining` is torch.distributed.pipelining's schedule CSV, which
`_PipelineScheduleRuntime._load_csv(file, format)` loads: compute_only (PyTorch's
runtime places the transfers) or compute_comms (the schedule's own transfers, in its
order). Every compute op needs its pipeline action (`action= stage= microbatch=`).
"""

from __future__ import annotations

import argparse
import sys

from commdsl.cli import add_schedule_arguments, load_from_args
from commdsl.files import OutputPath, check_output_format, write_text

FORMATS = ("pipelining",)
CSV_FORMATS = ("compute_only", "compute_comms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="what to write: pipelining (torch.distributed.pipelining's schedule CSV)")
    add_schedule_arguments(parser)
    parser.add_argument("-o", "--out", default=None, action=OutputPath, metavar="OUT.csv", help="write here (default: stdout)")
    parser.add_argument("--csv-format", choices=CSV_FORMATS, default="compute_only",
                        help="compute_only (default): compute actions, PyTorch places the transfers; "
                             "compute_comms: with the schedule's own transfers")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from commdsl.interop.pipelining import csv_rows, format_csv

    check_output_format("-o", args.out, args.schedule, "a pipelining CSV", (".yaml", ".yml", ".json"))
    program = load_from_args(args)
    text = format_csv(csv_rows(program, with_transfers=args.csv_format == "compute_comms"))
    if args.out:
        write_text(args.out, text, "-o")
        print(f"wrote {args.out}: {program.world_size} ranks ({args.csv_format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
