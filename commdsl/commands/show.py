"""`commdsl show`: each rank's op order as a grid, then per-rank listings with source lines."""

from __future__ import annotations

import argparse
import json
import re

from commdsl.cli import add_schedule_arguments, count_at_least, load_from_args
from commdsl.dsl.values import format_bytes, format_flops, format_us
from commdsl.errors import UsageError, printable
from commdsl.ir import HOST_STREAM, HostMemory, Op, OpKind, Program
from commdsl.progress import Progress

_INDEX_RE = re.compile(r"\[([^\]]*)\]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser)
    parser.add_argument("--rank", type=count_at_least(0), default=None, metavar="R", help="only this rank")
    parser.add_argument("--json", action="store_true", help="dump the expanded IR as JSON")
    parser.add_argument("--grid", choices=("compute", "all"), default=None,
                        help="ops in the grid: compute only (default when the schedule computes) or all")  # fmt: skip
    parser.add_argument("--no-listing", action="store_true", help="print the grid only")


def short_label(op: Op) -> str:
    """Compact grid cell: `F[3]` -> `F3`, a collective -> `AR:g`."""
    name = _INDEX_RE.sub(lambda m: m.group(1), op.name)
    if op.kind in (OpKind.COMPUTE, OpKind.HOST):
        return name
    abbrev = {
        OpKind.SEND: "S", OpKind.RECV: "R", OpKind.ALL_REDUCE: "AR", OpKind.ALL_GATHER: "AG",
        OpKind.REDUCE_SCATTER: "RS", OpKind.ALL_TO_ALL: "A2A", OpKind.BROADCAST: "BC", OpKind.REDUCE: "RD",
        OpKind.GATHER: "GA", OpKind.SCATTER: "SC", OpKind.BARRIER: "BAR", OpKind.WAIT: "W",
        OpKind.RECORD: "rec", OpKind.WAIT_EVENT: "wev", OpKind.SYNCHRONIZE: "sync", OpKind.COPY: "cp",
        OpKind.ALLOC: "+", OpKind.FREE: "-",
    }[op.kind]  # fmt: skip
    if op.kind is OpKind.BARRIER or op.kind is OpKind.SYNCHRONIZE:
        return abbrev
    return f"{abbrev}:{name}"


def describe(op: Op) -> str:
    """One-line description of an op's arguments."""
    parts: list[str] = []
    if op.duration_us is not None:
        parts.append(format_us(op.duration_us))
    if op.flops is not None:
        parts.append(format_flops(op.flops))
    if op.size_bytes or op.kind.is_comm and op.kind is not OpKind.BARRIER:
        parts.append(format_bytes(op.size_bytes))
    if op.kind is OpKind.SEND:
        parts.append(f"to {op.peer}")
    elif op.kind is OpKind.RECV:
        parts.append(f"from {op.peer}")
    elif op.is_peer_copy:
        parts.append(f"to {op.peer}" + (f" into {op.dest}" if op.dest != op.name else ""))
    elif op.kind is OpKind.COPY:
        parts.append(op.copy_dir.value)
        if op.host_memory is HostMemory.PAGEABLE:
            parts.append("pageable")
    if op.group is not None:
        parts.append(f"group={op.group}")
    if op.root is not None:
        parts.append(f"root={op.root}")
    if op.reduce_op is not None:
        parts.append(f"op={op.reduce_op.value}")
    if op.algo is not None:
        parts.append(f"algo={op.algo.value}")
    if op.transport is not None and op.kind is not OpKind.COPY:
        parts.append(op.transport.value)
    if op.batch is not None:
        parts.append(f"batch@{op.batch}")
    if op.handle is not None and op.kind not in (OpKind.WAIT,):
        parts.append(f"-> {op.handle}")
    if op.waits_for:
        parts.append("for #" + ",".join(str(i) for i in op.waits_for))
    if op.action is not None:  # the torch.distributed.pipelining action: stage, letter, microbatch
        parts.append(f"pp:{op.stage}{op.action.letter}{op.microbatch}")
    return " ".join(parts)


def grid_lines(program: Program, ranks: list[int], mode: str | None) -> list[str]:
    computes = any(op.kind is OpKind.COMPUTE for r in ranks for op in program.ops[r])
    mode = mode or ("compute" if computes else "all")
    keep = (lambda op: op.kind in (OpKind.COMPUTE, OpKind.HOST)) if mode == "compute" else (lambda op: op.kind is not OpKind.WAIT)
    rows = {r: [short_label(op) for op in program.ops[r] if keep(op)] for r in ranks}
    width = max((len(c) for row in rows.values() for c in row), default=1)
    label_width = len(f"rank {max(ranks)}")
    out = [f"{'':{label_width}}   op order ({'compute ops' if mode == 'compute' else 'all ops but waits'})"]
    for r, row in rows.items():
        out.append(f"{f'rank {r}':{label_width}} | " + " ".join(f"{c:{width}}" for c in row))
    return out


def listing_lines(program: Program, rank: int) -> list[str]:
    ops = program.ops[rank]
    out = [f"rank {rank}: {len(ops)} ops"]
    if not ops:
        return out
    idx_w = len(str(len(ops) - 1))
    stream_w = max(len(op.stream) for op in ops)
    kind_w = max(len(op.kind.value) for op in ops)
    name_w = min(max(len(op.name) for op in ops), 24)
    for op in ops:
        stream = op.stream if op.stream != HOST_STREAM else "host"
        src = f"{op.loc.line:>4}: {op.loc.text.strip()}"
        out.append(
            f"  {op.index:>{idx_w}} {stream:<{stream_w}} {op.kind.value:<{kind_w}} {op.name:<{name_w}} "
            f"{describe(op):<36} | {src}"
        )
    return out


def run(args: argparse.Namespace) -> int:
    with Progress("commdsl show") as progress:
        progress.phase(f"expanding {args.schedule}")
        program = load_from_args(args)
        if args.rank is not None and not 0 <= args.rank < program.world_size:
            raise UsageError(f"--rank {args.rank} is out of range: the schedule has ranks 0..{program.world_size - 1}")
        ranks = [args.rank] if args.rank is not None else list(range(program.world_size))
        if args.json:
            data = program.to_json()
            if args.rank is not None:
                data["ranks"] = {str(args.rank): data["ranks"][args.rank]}
            text = json.dumps(data, indent=1)
        else:
            # A listing of a million ops takes seconds to format: progress per rank.
            progress.phase("formatting the grid and listings", total=sum(len(program.ops[r]) for r in ranks), unit="ops")
            lines = [f"{program.name}: {program.world_size} ranks, {program.num_ops} ops  ({program.source})", ""]
            lines += grid_lines(program, ranks, args.grid)
            if not args.no_listing:
                for r in ranks:
                    lines.append("")
                    lines += listing_lines(program, r)
                    progress.advance(len(program.ops[r]))
            text = printable_lines("\n".join(lines))
    print(text)
    return 0


def printable_lines(text: str) -> str:
    """`text`'s lines, each with the control characters of the user's names and source
    lines escaped (`commdsl.errors.printable`)."""
    return "\n".join(map(printable, text.split("\n")))
