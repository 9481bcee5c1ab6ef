"""`commdsl import`: turn another tool's schedule into a commdsl schedule.

    commdsl import pipelining schedule.csv -o schedule.yaml   # torch.distributed.pipelining's CSV
    commdsl import pipelining schedule.csv                    # the YAML on stdout
    commdsl import kineto traces/ -o job.yaml                 # a job's profiler traces, one per rank

The CSV is what `_PipelineScheduleRuntime._dump_csv` writes (one row of actions per
rank), compute-only or with transfers; see commdsl/interop/pipelining.py. The schedule is
loaded, validated and checked for deadlock (as `commdsl check` does) before anything is
written: a CSV whose ranks would wait on each other writes nothing and exits 3. A folder of
PyTorch profiler (Kineto) traces becomes a schedule that replays one step of the job
(commdsl/interop/kineto_import.py); it is also checked to finish (no deadlock).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from commdsl.errors import CommdslError, UsageError
from commdsl.files import OutputPath, check_output_format, write_text
from commdsl.progress import Progress

FORMATS = ("pipelining", "kineto")

MAX_NOTES = 5
"""Notes of an import printed on the terminal (the schedule's header holds them all)."""

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
"""A schedule's name (the language's rule)."""


def default_name(path: str) -> str:
    """The schedule name taken from a file or folder: its stem (a folder's own name for
    `.`), with characters a name cannot hold as `_`, and `_` before a leading digit."""
    p = Path(path)
    stem = p.stem if p.suffix or not p.is_dir() else p.resolve().name
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem.removesuffix(".pt.trace").removesuffix(".json")) or "imported"
    return name if NAME.fullmatch(name) else f"_{name}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="what the file is: pipelining (torch.distributed.pipelining's schedule CSV), "
                        "kineto (a folder of PyTorch profiler traces, one per rank)")
    parser.add_argument("file", help="the file (or, for kineto, the folder of traces) to import")
    parser.add_argument("--step", type=int, default=None, metavar="N",
                        help="kineto: replay step ProfilerStep#N (default: the last step of every rank's trace that holds work)")
    parser.add_argument("--tolerance", type=float, default=None, metavar="US",
                        help="kineto: an op starting this close to another stream's op ending waited for it (default 20 us)")
    parser.add_argument("-o", "--out", default=None, action=OutputPath, metavar="OUT.yaml", help="write the schedule here (default: stdout)")
    parser.add_argument("--name", default=None, help="the schedule's name (default: the output's or the input's file stem)")


def run(args: argparse.Namespace) -> int:
    from commdsl.interop.pipelining import read_csv, schedule_text

    check_output_format("-o", args.out, args.file, "a schedule (YAML)", (".csv", ".json"))
    if args.name is not None and not NAME.fullmatch(args.name):
        raise UsageError(f"--name {args.name!r}: a schedule name starts with a letter or _ and holds letters, digits, _ . -")
    name = args.name or default_name(args.out or args.file)
    if args.format == "kineto":
        return _import_kineto(args, name)
    if args.step is not None or args.tolerance is not None:
        raise UsageError("--step and --tolerance apply to kineto traces")
    with Progress("commdsl import") as progress:
        progress.phase(f"reading {args.file}")
        schedule = read_csv(args.file)
        text = schedule_text(schedule, name)
        # e.g. ranks that wait on each other: the file's order, as written
        _checked(text, name, args.file, f"the order comes from {args.file} as written", progress)
    if args.out:
        write_text(args.out, text, "-o")
        print(f"wrote {args.out}: {len(schedule.ranks)} ranks, {schedule.num_stages} stages, {schedule.microbatches} microbatches "
              f"({'with' if schedule.with_transfers else 'without'} transfers in the file)", file=sys.stderr)  # fmt: skip
    else:
        sys.stdout.write(text)
    return 0


def _checked(text: str, name: str, source: str, origin: str, progress: Progress):
    """The imported schedule, loaded, validated and checked to finish before anything is
    written; an error points at the generated text and says where it came from (`origin`)."""
    from commdsl.dsl import load_schedule_text
    from commdsl.sim import check_deadlock

    shown = f"<{name} imported from {source}>"
    try:
        progress.phase(f"expanding {shown}")
        program = load_schedule_text(text, shown)
        progress.phase("checking that every rank finishes", unit="ops")
        check_deadlock(program, progress.update)
    except CommdslError as err:
        err.hint = (err.hint + "; " if err.hint else "") + f"{origin}; nothing was written"
        raise
    return program


def _import_kineto(args: argparse.Namespace, name: str) -> int:
    from commdsl.interop.kineto_import import DEFAULT_TOLERANCE_US, schedule_text
    from commdsl.interop.kineto_read import read_job

    tolerance = DEFAULT_TOLERANCE_US if args.tolerance is None else args.tolerance
    if not 0 <= tolerance < float("inf"):
        raise UsageError(f"--tolerance must be a number of microseconds >= 0, got {args.tolerance}")
    with Progress("commdsl import kineto") as progress:
        progress.phase(f"reading the traces in {args.file}")
        job = read_job(args.file, args.step, "a replay")
        progress.phase("writing the schedule")
        notes: list[str] = []
        text = schedule_text(job, name, tolerance, notes)
        # the traces may hold what the language cannot replay as written
        program = _checked(text, name, args.file, f"the schedule comes from the traces in {args.file}", progress)
    for note in notes[:MAX_NOTES]:
        print(f"note: {note}", file=sys.stderr)
    if len(notes) > MAX_NOTES:
        print(f"note: ... and {len(notes) - MAX_NOTES} more, in the schedule's header", file=sys.stderr)
    if args.out:
        write_text(args.out, text, "-o")
        step = next(iter(job.ranks.values())).step or "the whole trace"
        print(f"wrote {args.out}: {job.world_size} ranks, {sum(len(o) for o in program.ops)} ops, replaying {step} "
              f"({job.step_us / 1e3:.3f} ms in the trace)", file=sys.stderr)  # fmt: skip
    else:
        sys.stdout.write(text)
    return 0
