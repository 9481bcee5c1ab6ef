"""torch.distributed.pipelining's schedule CSV: read and check it, write it, turn it into
a schedule and a schedule into it.

The format is what `_PipelineScheduleRuntime._dump_csv` writes and `_load_csv` reads:
one row per pipeline rank, one action per cell, in the rank's order. An action is
`{stage}{type}{microbatch}`: `2F0` (stage 2, forward, microbatch 0), `1B3` (full
backward), `1I3` / `1W3` (input / weight gradient), `0SEND_F1`, `1RECV_F1`,
`1SEND_B0`, `0RECV_B0` (transfers, named by the stage that sends or receives), and
`(0F7;7B3)OVERLAP_F_B` (a forward and a backward PyTorch's runtime runs one after the
other). An empty cell is an idle step. `UNSHARD`, `RESHARD` and `REDUCE_GRAD` are
FSDP's; they carry no time here and are skipped. A file with transfers is the
"compute_comms" format, one without them "compute_only".

`read_csv` checks what PyTorch's runtime needs (each stage on one rank, every
microbatch forward once and backward once, F before I or B before W, transfers that
pair up) and names the row and column of whatever is wrong. `schedule_text` writes
a commdsl schedule that runs the same order: compute-only files get `stage_send` /
`stage_recv` transfers, which commdsl places as PyTorch's own lowering does; files
with transfers keep theirs where they are. `csv_rows` goes the other way, from any
schedule whose compute ops name their pipeline action (`action= stage= microbatch=`).
"""

from __future__ import annotations

import csv
import enum
import io
import re
from dataclasses import dataclass
from pathlib import Path

from commdsl.errors import ScheduleError, SourceLoc, UsageError
from commdsl.files import exists, read_text, source_lines
from commdsl.ir import OpKind, PipelineAction, Program
from commdsl.limits import MAX_WORLD_SIZE


class ActionType(str, enum.Enum):
    """The action types of torch.distributed.pipelining's `_ComputationType`."""

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 (PyTorch's name)
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"


COMPUTE_TYPES = frozenset({ActionType.F, ActionType.B, ActionType.I, ActionType.W})
TRANSFER_TYPES = frozenset({ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B})
SKIPPED_TYPES = frozenset({ActionType.UNSHARD, ActionType.RESHARD, ActionType.REDUCE_GRAD})
"""FSDP's actions: no time and no transfer in a commdsl schedule."""

_ACTION = re.compile(r"(\d+)(" + "|".join(sorted((t.value for t in ActionType), key=len, reverse=True)) + r")(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


@dataclass(frozen=True)
class Action:
    stage: int
    type: ActionType
    microbatch: int | None
    loc: SourceLoc
    """Row (line) and column of its cell in the file."""

    def __str__(self) -> str:
        return f"{self.stage}{self.type.value}{'' if self.microbatch is None else self.microbatch}"

    @property
    def pipeline_action(self) -> PipelineAction:
        return PipelineAction.from_letter(self.type.value)


@dataclass(frozen=True)
class CsvSchedule:
    """A checked schedule CSV."""

    file: str
    ranks: tuple[tuple[Action, ...], ...]
    """Per rank (row), its compute and transfer actions in order: idle cells and FSDP
    actions left out, an OVERLAP_F_B as its forward then its backward."""
    with_transfers: bool
    """The file lists transfers (compute_comms); else commdsl places them."""
    stage_rank: tuple[int, ...]
    """Rank of each stage."""
    microbatches: int

    @property
    def num_stages(self) -> int:
        return len(self.stage_rank)


# ---- reading -----------------------------------------------------------------------------------


def read_csv(path: str | Path) -> CsvSchedule:
    """Read and check a schedule CSV written by torch.distributed.pipelining."""
    if not exists(path):
        raise UsageError(f"no such file: {path}")
    return parse_csv(read_text(path, str(path), ScheduleError, "CSV"), str(path))


MAX_CELLS = 250_000
"""Most cells a CSV may hold, over all rows: each action expands to a few ops (its
transfers, memory, the compute), so this keeps an import within the default op budget
(`commdsl.limits.DEFAULT_MAX_OPS`) and its memory bounded; checked before a row is split."""
MAX_INDEX_DIGITS = 9
"""Most digits of a stage or microbatch index (below 10^9); a larger one is refused as it
is read, before it is made a number."""


def parse_csv(text: str, file: str = "<csv>") -> CsvSchedule:
    lines = list(source_lines(text))
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ScheduleError("the CSV has no rows: a pipeline schedule has one row of actions per rank", SourceLoc(file, 1, 1))
    if len(lines) > MAX_WORLD_SIZE:
        raise ScheduleError(f"the CSV has {len(lines):,} rows, one per rank: more than the limit of {MAX_WORLD_SIZE:,} ranks",
                            SourceLoc(file, MAX_WORLD_SIZE + 1, 1, lines[MAX_WORLD_SIZE]))  # fmt: skip
    ranks = []
    cells = 0
    for row, line in enumerate(lines, start=1):
        cells += line.count(",") + 1
        if cells > MAX_CELLS:
            raise ScheduleError(f"the CSV holds more than {MAX_CELLS:,} cells by row {row}: more than an import expands within "
                                "the op budget", SourceLoc(file, row, 1, line))  # fmt: skip
        actions = tuple(_parse_row(line, row, file))
        if not any(a.type in COMPUTE_TYPES for a in actions):
            raise ScheduleError(f"row {row} has no compute action: rank {row - 1} would hold no stage",
                                SourceLoc(file, row, 1, line),
                                hint="every row is one rank's actions; a blank or FSDP-only row leaves a rank without work")  # fmt: skip
        ranks.append(actions)
    schedule = _check(file, tuple(ranks), lines)
    return schedule


def _parse_row(line: str, row: int, file: str):
    try:
        cells = next(csv.reader([line]))
    except csv.Error as e:
        raise ScheduleError(f"row {row} is not a CSV row: {e}", SourceLoc(file, row, 1, line)) from None
    exact = '"' not in line  # without quotes each cell starts after the previous comma
    column = 1
    for cell in cells:
        loc = SourceLoc(file, row, column if exact else 1, line)
        column += len(cell) + 1
        text = cell.strip()
        if not text:
            continue  # an idle step
        overlap = _OVERLAP.fullmatch(text)
        parts = overlap.group(1).split(";") if overlap else [text]
        for part in parts:
            action = _parse_action(part.strip(), loc)
            if action.type in SKIPPED_TYPES:
                continue
            if overlap and action.type not in COMPUTE_TYPES:
                raise ScheduleError(f"OVERLAP_F_B holds compute actions only, not {part.strip()}", loc)
            yield action


def _parse_action(text: str, loc: SourceLoc) -> Action:
    m = _ACTION.fullmatch(text)
    if m is None:
        raise ScheduleError(
            f"unknown action {text!r} in row {loc.line}, column {loc.column}",
            loc,
            hint="actions are STAGE TYPE MICROBATCH, e.g. 2F0, 1B3, 1I3, 1W3, 0SEND_F1, 1RECV_B0, "
            "or (0F7;7B3)OVERLAP_F_B",
        )
    stage, kind, mb = m.groups()
    for what, digits in (("stage", stage), ("microbatch", mb)):
        if len(digits) > MAX_INDEX_DIGITS:
            shown = digits if len(digits) <= 20 else f"{digits[:10]}...({len(digits):,} digits)"
            raise ScheduleError(f"{what} {shown} in row {loc.line}, column {loc.column} has more than {MAX_INDEX_DIGITS} digits", loc)
    atype = ActionType(kind)
    if atype not in SKIPPED_TYPES and not mb:
        raise ScheduleError(f"action {text!r} names no microbatch (row {loc.line}, column {loc.column})", loc,
                            hint=f"e.g. {stage}{kind}0")  # fmt: skip
    return Action(int(stage), atype, int(mb) if mb else None, loc)


def _check(file: str, ranks: tuple[tuple[Action, ...], ...], lines: list[str]) -> CsvSchedule:
    """What PyTorch's runtime relies on, with the row and column of the first violation."""
    computes = [a for actions in ranks for a in actions if a.type in COMPUTE_TYPES]
    forward_count = sum(a.type is ActionType.F for a in computes)
    # Stages are 0..S-1, each with a compute action, and microbatches 0..M-1, each with a
    # forward per stage: an index past the count of those actions leaves one without,
    # and would make the checks below count to it.
    for a in (a for actions in ranks for a in actions):
        if a.stage >= len(computes):
            raise ScheduleError(f"{a}: stage {a.stage} is past the {len(computes):,} compute actions of the file (each stage "
                                "from 0 up has one)", a.loc)  # fmt: skip
        if a.microbatch is not None and a.microbatch >= max(forward_count, 1):
            raise ScheduleError(f"{a}: microbatch {a.microbatch} is past the {forward_count:,} forward actions of the file "
                                "(each microbatch from 0 up has one)", a.loc)  # fmt: skip
    owner: dict[int, Action] = {}
    for actions in ranks:
        for a in actions:
            if a.type in COMPUTE_TYPES:
                first = owner.setdefault(a.stage, a)
                if first.loc.line != a.loc.line:
                    raise ScheduleError(f"stage {a.stage} is on rows {first.loc.line} and {a.loc.line}: a stage lives on one rank",
                                        a.loc, related=(("first here", first.loc),))  # fmt: skip
    num_stages = max(owner) + 1
    for s in range(num_stages):
        if s not in owner:
            raise ScheduleError(f"no row computes stage {s} (stages up to {num_stages - 1} appear)", SourceLoc(file, 1, 1, lines[0]))
    stage_rank = [owner[s].loc.line - 1 for s in range(num_stages)]
    forwards = [a.microbatch for actions in ranks for a in actions if a.type is ActionType.F]
    if not forwards:
        raise ScheduleError("the CSV has no forward action (F)", SourceLoc(file, 1, 1, lines[0]))
    microbatches = max(forwards) + 1
    for rank, actions in enumerate(ranks):
        _check_rank(rank, actions, microbatches, file, lines)
    with_transfers = any(a.type in TRANSFER_TYPES for actions in ranks for a in actions)
    if with_transfers:
        _check_transfers(ranks, stage_rank, file, lines)
    return CsvSchedule(file, ranks, with_transfers, tuple(stage_rank), microbatches)


def _check_rank(rank: int, actions: tuple[Action, ...], microbatches: int, file: str, lines: list[str]) -> None:
    done: dict[tuple[int, ActionType, int], Action] = {}
    row = rank + 1
    for a in actions:
        if a.type not in COMPUTE_TYPES:
            continue
        key = (a.stage, a.type, a.microbatch)
        if key in done:
            raise ScheduleError(f"rank {rank} runs {a} twice (row {row}, columns {done[key].loc.column} and {a.loc.column})",
                                a.loc, related=(("first here", done[key].loc),))  # fmt: skip
        if a.microbatch >= microbatches:
            raise ScheduleError(f"{a}: microbatch {a.microbatch} is past the last one the forwards run "
                                f"(0..{microbatches - 1})", a.loc)  # fmt: skip
        forward = (a.stage, ActionType.F, a.microbatch)
        if a.type in (ActionType.B, ActionType.I) and forward not in done:
            raise ScheduleError(f"{a} comes before the forward {a.stage}F{a.microbatch} on row {row}", a.loc)
        if a.type is ActionType.W and (a.stage, ActionType.I, a.microbatch) not in done:
            raise ScheduleError(f"{a} comes before its input gradient {a.stage}I{a.microbatch} on row {row}", a.loc)
        if a.type is ActionType.B and (a.stage, ActionType.I, a.microbatch) in done:
            raise ScheduleError(f"{a}: microbatch {a.microbatch} of stage {a.stage} already ran its input gradient (I)", a.loc)
        if a.type is ActionType.I and (a.stage, ActionType.B, a.microbatch) in done:
            raise ScheduleError(f"{a}: microbatch {a.microbatch} of stage {a.stage} already ran its full backward (B)", a.loc)
        done[key] = a
    stages = sorted({a.stage for a in actions if a.type in COMPUTE_TYPES})
    end = SourceLoc(file, row, len(lines[rank]) + 1, lines[rank])
    for s in stages:
        for mb in range(microbatches):
            if (s, ActionType.F, mb) not in done:
                raise ScheduleError(f"rank {rank} skips microbatch {mb}: stage {s} has no forward {s}F{mb} on row {row}", end)
            has_b = (s, ActionType.B, mb) in done
            has_i, has_w = (s, ActionType.I, mb) in done, (s, ActionType.W, mb) in done
            if not (has_b or (has_i and has_w)):
                missing = f"{s}W{mb}" if has_i else f"{s}B{mb} (or {s}I{mb} and {s}W{mb})"
                raise ScheduleError(f"rank {rank} skips microbatch {mb}: stage {s} has no backward {missing} on row {row}", end)


def _check_transfers(ranks: tuple[tuple[Action, ...], ...], stage_rank: list[int], file: str, lines: list[str]) -> None:
    """Each transfer between ranks appears once on each side, and each compute op that
    takes an input from another rank has received it before."""
    last = len(stage_rank) - 1
    seen: dict[tuple[int, ActionType, int], Action] = {}
    for rank, actions in enumerate(ranks):
        received: set[tuple[int, ActionType, int]] = set()
        for a in actions:
            if a.type in TRANSFER_TYPES:
                key = (a.stage, a.type, a.microbatch)
                if key in seen:
                    raise ScheduleError(f"{a} appears twice", a.loc, related=(("first here", seen[key].loc),))
                seen[key] = a
                if stage_rank[a.stage] != rank:
                    raise ScheduleError(f"{a} is on row {rank + 1}, but stage {a.stage} is on row {stage_rank[a.stage] + 1}", a.loc)
                received.add(key)
                continue
            needs = None
            if a.type is ActionType.F and a.stage > 0 and stage_rank[a.stage - 1] != rank:
                needs = (a.stage, ActionType.RECV_F, a.microbatch)
            elif a.type in (ActionType.B, ActionType.I) and a.stage < last and stage_rank[a.stage + 1] != rank:
                needs = (a.stage, ActionType.RECV_B, a.microbatch)
            if needs is not None and needs not in received:
                raise ScheduleError(f"{a} needs {needs[0]}{needs[1].value}{needs[2]} before it on row {rank + 1} "
                                    f"(its input comes from rank {stage_rank[a.stage - 1 if a.type is ActionType.F else a.stage + 1]})",
                                    a.loc)  # fmt: skip
    pairs = ((ActionType.SEND_F, ActionType.RECV_F, 1), (ActionType.SEND_B, ActionType.RECV_B, -1))
    for (stage, atype, mb), a in seen.items():
        for send, recv, step in pairs:
            if atype is send and (stage + step, recv, mb) not in seen:
                raise ScheduleError(f"{a} has no {stage + step}{recv.value}{mb} on row {stage_rank[stage + step] + 1}", a.loc)
            if atype is recv and (stage - step, send, mb) not in seen:
                raise ScheduleError(f"{a} has no {stage - step}{send.value}{mb} on row {stage_rank[stage - step] + 1}", a.loc)


# ---- CSV -> schedule -------------------------------------------------------------------------------

_HEADER = """\
# Imported from {file} by `commdsl import pipelining`: the {fmt} schedule CSV of
# torch.distributed.pipelining ({ranks} ranks, {stages} stages, {mbs} microbatches).
# {transfers}
# Op times, transfer sizes and memory are params; the order is the file's.
#
# Run:
#   commdsl simulate {name}.yaml
#   commdsl export pipelining {name}.yaml     # back to the CSV
name: {name}
doc: {fmt} schedule imported from {file} (torch.distributed.pipelining CSV).
params:
  act: 32MiB        # bytes sent between stages per microbatch (activation / its gradient)
  t_fwd: 1ms        # forward of one stage for one microbatch
  t_bwd: 2ms        # full backward (B)
  t_bwd_in: 1ms     # input gradient (I)
  t_bwd_w: 1ms      # weight gradient (W)
  saved: 32MiB      # activation bytes a forward keeps for its backward, per microbatch
  saved_w: 8MiB     # the part of saved the weight gradient needs (kept until W)
  weights: 256MiB   # parameter bytes of one stage (its gradients take as much)
  optimizer: 512MiB # optimizer-state bytes of one stage
world: {{pp: {ranks}}}
streams: [compute]
program: |
  # Each block runs one action of a stage s for microbatch mb; act[mb, s] is the input
  # of stage s, grad[mb, s] the gradient of its output.
"""

_STAGE_BLOCKS = """\
  # src / dst: the rank an input comes from / an output goes to; -1: none (the first or
  # last stage, or a neighbouring stage on the same rank).
  def forward(s, mb, src, dst):
      if src >= 0:
          stage_recv act[mb, s] act from src group=pp
      alloc saved[mb, s] saved - saved_w
      alloc saved_w[mb, s] saved_w
      compute F[mb, s] t_fwd action=forward stage=s microbatch=mb
      if dst >= 0:
          stage_send act[mb, s + 1] act to dst group=pp

  def backward(s, mb, src, dst):
      if src >= 0:
          stage_recv grad[mb, s] act from src group=pp
      compute B[mb, s] t_bwd action=backward stage=s microbatch=mb
      free saved[mb, s]
      free saved_w[mb, s]
      if dst >= 0:
          stage_send grad[mb, s - 1] act to dst group=pp

  def backward_input(s, mb, src, dst):
      if src >= 0:
          stage_recv grad[mb, s] act from src group=pp
      compute I[mb, s] t_bwd_in action=backward_input stage=s microbatch=mb
      free saved[mb, s]
      if dst >= 0:
          stage_send grad[mb, s - 1] act to dst group=pp
"""

_TRANSFER_BLOCKS = """\
  # A transfer's handle is waited by the compute op that needs it (received) or at the
  # end of the rank's program (sent), as PyTorch's runtime does.
  def forward(s, mb, waits):
      if waits:
          wait recv_act[mb, s]
      alloc saved[mb, s] saved - saved_w
      alloc saved_w[mb, s] saved_w
      compute F[mb, s] t_fwd action=forward stage=s microbatch=mb

  def backward(s, mb, waits):
      if waits:
          wait recv_grad[mb, s]
      compute B[mb, s] t_bwd action=backward stage=s microbatch=mb
      free saved[mb, s]
      free saved_w[mb, s]

  def backward_input(s, mb, waits):
      if waits:
          wait recv_grad[mb, s]
      compute I[mb, s] t_bwd_in action=backward_input stage=s microbatch=mb
      free saved[mb, s]
"""

_COMMON_BLOCKS = """\
  def backward_weight(s, mb):
      compute W[mb, s] t_bwd_w action=backward_weight stage=s microbatch=mb
      free saved_w[mb, s]

  def stage_memory(s):
      alloc weights[s] weights
      alloc grads[s] weights
      alloc optimizer[s] optimizer
"""


def schedule_text(schedule: CsvSchedule, name: str) -> str:
    """A commdsl schedule (YAML text) that runs `schedule`'s order."""
    fmt = "compute_comms" if schedule.with_transfers else "compute_only"
    transfers = ("The file's transfers stay where it puts them: irecv where it receives, isend where it sends."
                 if schedule.with_transfers else
                 "Transfers are stage_send / stage_recv, placed as PyTorch's runtime lowering places them.")  # fmt: skip
    out = [_HEADER.format(file=Path(schedule.file).name, fmt=fmt, ranks=len(schedule.ranks), stages=schedule.num_stages,
                          mbs=schedule.microbatches, transfers=transfers, name=name)]  # fmt: skip
    out.append(_TRANSFER_BLOCKS if schedule.with_transfers else _STAGE_BLOCKS)
    out.append(_COMMON_BLOCKS)
    bodies = [_rank_body(schedule, rank, actions) for rank, actions in enumerate(schedule.ranks)]
    _rank_tree(out, bodies, 0, len(bodies), "  ")
    return "\n".join(out) + "\n"


def _rank_tree(out: list[str], bodies: list[list[str]], lo: int, hi: int, indent: str) -> None:
    """Append the statements that run `bodies[r]` on rank r, for ranks lo..hi-1: a
    balanced tree of `if pp.rank < mid:` / `else:`, so that each rank's program walks
    log2(ranks) conditions, not an `elif` per rank before it (which made importing N
    ranks take N^2 steps)."""
    if hi - lo == 1:
        out.extend(indent + line for line in bodies[lo])
        return
    mid = (lo + hi) // 2
    out.append(f"{indent}if pp.rank < {mid}:")
    _rank_tree(out, bodies, lo, mid, indent + "    ")
    out.append(f"{indent}else:")
    _rank_tree(out, bodies, mid, hi, indent + "    ")


def _rank_body(schedule: CsvSchedule, rank: int, actions: tuple[Action, ...]) -> list[str]:
    """The statements rank `rank` runs: its stages' memory, then its actions in order."""
    rank_of = schedule.stage_rank
    last = schedule.num_stages - 1
    body = [f"stage_memory({s})" for s in sorted({a.stage for a in actions if a.type in COMPUTE_TYPES})]
    sends = []
    for a in actions:
        s, mb = a.stage, a.microbatch
        prev = rank_of[s - 1] if s > 0 and rank_of[s - 1] != rank else -1
        nxt = rank_of[s + 1] if s < last and rank_of[s + 1] != rank else -1
        if not schedule.with_transfers:
            body.append({ActionType.F: f"forward({s}, {mb}, {prev}, {nxt})", ActionType.B: f"backward({s}, {mb}, {nxt}, {prev})",
                         ActionType.I: f"backward_input({s}, {mb}, {nxt}, {prev})", ActionType.W: f"backward_weight({s}, {mb})"}[a.type])  # fmt: skip
        elif a.type is ActionType.F:
            body.append(f"forward({s}, {mb}, {str(prev >= 0).lower()})")
        elif a.type in (ActionType.B, ActionType.I):
            block = "backward" if a.type is ActionType.B else "backward_input"
            body.append(f"{block}({s}, {mb}, {str(nxt >= 0).lower()})")
        elif a.type is ActionType.W:
            body.append(f"backward_weight({s}, {mb})")
        else:
            body.append(_transfer_statement(a, rank_of))
            if a.type in (ActionType.SEND_F, ActionType.SEND_B):
                sends.append(_send_handle(a))
    body += [f"wait {handle}" for handle in sends]
    return body


def _send_handle(a: Action) -> str:
    return f"send_act[{a.microbatch}, {a.stage + 1}]" if a.type is ActionType.SEND_F else f"send_grad[{a.microbatch}, {a.stage - 1}]"


def _transfer_statement(a: Action, rank_of: tuple[int, ...]) -> str:
    mb, s = a.microbatch, a.stage
    # The action a transfer belongs to: what torch's runtime calls it by (F or B side).
    tag = "forward" if a.type in (ActionType.SEND_F, ActionType.RECV_F) else "backward"
    opts = f"group=pp action={tag} stage={s} microbatch={mb}"
    if a.type is ActionType.SEND_F:
        return f"{_send_handle(a)} = isend act[{mb}, {s + 1}] act to {rank_of[s + 1]} {opts}"
    if a.type is ActionType.RECV_F:
        return f"recv_act[{mb}, {s}] = irecv act[{mb}, {s}] act from {rank_of[s - 1]} {opts}"
    if a.type is ActionType.SEND_B:
        return f"{_send_handle(a)} = isend grad[{mb}, {s - 1}] act to {rank_of[s - 1]} {opts}"
    return f"recv_grad[{mb}, {s}] = irecv grad[{mb}, {s}] act from {rank_of[s + 1]} {opts}"


# ---- schedule -> CSV -------------------------------------------------------------------------------

_TRANSFER_OF = {
    (OpKind.SEND, True): ActionType.SEND_F, (OpKind.RECV, True): ActionType.RECV_F,
    (OpKind.SEND, False): ActionType.SEND_B, (OpKind.RECV, False): ActionType.RECV_B,
}  # fmt: skip
_GRADIENT_ACTIONS = frozenset({PipelineAction.BACKWARD, PipelineAction.BACKWARD_WEIGHT})
"""The actions that finish a microbatch's weight gradients."""
_EXPORTED_KINDS = frozenset({OpKind.COMPUTE, OpKind.SEND, OpKind.RECV})
"""Ops that become actions; waits, memory and events carry nothing PyTorch's runtime runs."""


def csv_rows(program: Program, with_transfers: bool) -> list[list[str]]:
    """Each rank's actions as PyTorch's runtime loads them: its pipeline compute ops, and
    with `with_transfers` its transfers, in program order, and a stage's REDUCE_GRAD
    after its last backward (what PyTorch's own lowering adds: the runtime scales and
    reduces the gradients there)."""
    if program.mesh and len(program.mesh) > 1:
        raise ScheduleError(f"{program.name} has a {len(program.mesh)}-axis mesh; a pipelining CSV describes one pipeline "
                            "(one row per pipeline rank)", None)  # fmt: skip
    microbatches: dict[int, int] = {}
    for op in program.all_ops():
        if op.kind is OpKind.COMPUTE and op.action is PipelineAction.FORWARD:
            microbatches[op.stage] = microbatches.get(op.stage, 0) + 1
    rows = []
    for rank_ops in program.ops:
        row: list[str] = []
        backwards: dict[int, int] = {}
        for op in rank_ops:
            if op.kind.is_collective or op.kind is OpKind.COPY or op.kind is OpKind.HOST:
                raise ScheduleError(f"{op.label} has no pipelining action: the CSV lists compute and transfers "
                                    "only", op.loc, rank=op.rank)  # fmt: skip
            if op.kind not in _EXPORTED_KINDS or (op.kind.is_p2p and not with_transfers):
                continue
            if op.action is None:
                what = "compute op" if op.kind is OpKind.COMPUTE else "transfer"
                raise ScheduleError(f"{what} {op.name} names no pipeline action, so it has no place in the CSV", op.loc,
                                    rank=op.rank, hint="give it action=forward|backward|backward_input|backward_weight "
                                    "stage=S microbatch=MB (stage_send/stage_recv take theirs from the compute op next to them)")  # fmt: skip
            if op.kind is OpKind.COMPUTE:
                row.append(f"{op.stage}{op.action.letter}{op.microbatch}")
                if with_transfers and op.action in _GRADIENT_ACTIONS:
                    backwards[op.stage] = backwards.get(op.stage, 0) + 1
                    if backwards[op.stage] == microbatches.get(op.stage):
                        row.append(f"{op.stage}{ActionType.REDUCE_GRAD.value}")
            else:
                forward = op.action is PipelineAction.FORWARD
                row.append(f"{op.stage}{_TRANSFER_OF[(op.kind, forward)].value}{op.microbatch}")
        rows.append(row)
    return rows


def format_csv(rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow(row)
    return out.getvalue()
