"""`commdsl import`: turn another tool's schedule into a commdsl schedule.

    commdsl import pipelining schedule.csv -o schedule.yaml   # torch.distributed.pipelining's CSV
    commdsl import pipelining schedule.csv                    # the YAML on stdout

The CSV is what `_PipelineScheduleRuntime._dump_csv` writes (one row of actions per
rank), compute-only or with transfers; see commdsl/interop/pipelining.py. The schedule is
loaded, validated and checked for deadlock (as `commdsl check` does) before anything is
written: a CSV whose ranks would wait on each other writes nothing and exits 3.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from commdsl.errors import CommdslError, UsageError
from commdsl.files import OutputPath, write_text
from commdsl.progress import Progress

FORMATS = ("pipelining",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="what the file is: pipelining (torch.distributed.pipelining's schedule CSV)")
    parser.add_argument("file", help="the file to import")
    parser.add_argument("-o", "--out", default=None, action=OutputPath, metavar="OUT.yaml", help="write the schedule here (default: stdout)")
    parser.add_argument("--name", default=None, help="the schedule's name (default: the output's or the input's file stem)")


def run(args: argparse.Namespace) -> int:
    from commdsl.dsl import load_schedule_text
    from commdsl.interop.pipelining import read_csv, schedule_text
    from commdsl.sim import check_deadlock

    name = args.name or Path(args.out or args.file).stem
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
        raise UsageError(f"--name {name!r}: a schedule name is letters, digits, _ . -")
    with Progress("commdsl import") as progress:
        progress.phase(f"reading {args.file}")
        schedule = read_csv(args.file)
        text = schedule_text(schedule, name)
        shown = args.out or f"<{name} imported from {args.file}>"
        try:
            progress.phase(f"expanding {shown}")
            program = load_schedule_text(text, shown)
            progress.phase("checking that every rank finishes", unit="ops")
            check_deadlock(program, progress.update)
        except CommdslError as err:  # e.g. ranks that wait on each other: the file's order, as written
            err.hint = (err.hint + "; " if err.hint else "") + f"the order comes from {args.file} as written; nothing was written"
            raise
    if args.out:
        write_text(args.out, text, "-o")
        print(f"wrote {args.out}: {len(schedule.ranks)} ranks, {schedule.num_stages} stages, {schedule.microbatches} microbatches "
              f"({'with' if schedule.with_transfers else 'without'} transfers in the file)", file=sys.stderr)  # fmt: skip
    else:
        sys.stdout.write(text)
    return 0
