"""`--check`: rank-dependent inputs and the expected result of every comm op.

Inputs. The input a rank contributes to an op is `Fill.values(name, rank, salt, n)`:
the explicit values given for that tensor name and rank in a `--values` file, else a
pattern `((7·rank + 3·salt + i) mod 11) + 1` (small integers, exact in every dtype,
different per rank, per element and per op). The salt is the sender's op index for
P2P and the collective's position in its group's sequence for collectives, so an op
matched with the wrong partner shows up as a wrong value.

Expected values follow torch.distributed's semantics (as the PyTorch distributed tutorial describes them): recv gets the
matched send's values (sends and recvs match first-in-first-out per (src, dst,
group)); broadcast copies the root's; reduce/all_reduce combine all members' (reduce:
at the root only: gloo uses the other members' buffers as scratch); all_gather and
gather (at the root) concatenate members' chunks in group-rank order (torch orders a
group's ranks ascending); scatter hands member g chunk g of the root's input;
reduce_scatter hands member g chunk g of the reduction; all_to_all hands member g
chunk g of every member's input, in member order.

A copy to another rank (`copy x SIZE to RANK`) carries its source's pattern (salt: its
op index) into the destination's buffer: the destination checks what landed, after every
rank has ended the iteration (`arrivals`).

Every rank holds the whole Program, so it computes its expectations on its own,
before the run; a wrong result names the op, its source line, and the ranks involved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
import torch

from commdsl.errors import CommdslError, UsageError
from commdsl.files import is_file, read_text
from commdsl.ir import Dtype, Op, OpKind, Program, ReduceOp
from commdsl.run.tensors import TORCH_DTYPE, layout
from commdsl.yamldoc import YamlDocument

_RTOL = {Dtype.FP64: 1e-12, Dtype.FP32: 1e-5, Dtype.FP16: 2e-3, Dtype.BF16: 2e-2, Dtype.FP8: 0.13}


class CheckError(CommdslError):
    """A communication result differs from its semantics (exit code 1)."""

    kind = "check failed"


def load_values(path: str) -> dict[str, dict[int, list]]:
    """A `--values` file: tensor name -> rank -> list of numbers (that rank's input)."""
    if not is_file(path):
        raise UsageError(f"no such values file: {path}")
    doc = YamlDocument(read_text(path, path, UsageError, "values file"), path, UsageError)
    data = doc.construct(doc.root) if doc.root is not None else None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of tensor name -> rank -> list of values")
    out: dict[str, dict[int, list]] = {}
    for name, per_rank in data.items():
        if not isinstance(per_rank, dict):
            raise UsageError(f"{path}: '{name}' must map ranks to lists of values, e.g. 0: [1, 2, 3]")
        out[str(name)] = {}
        for rank, values in per_rank.items():
            ok = isinstance(rank, int) and isinstance(values, list)
            if not ok or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise UsageError(f"{path}: '{name}' rank {rank} must be a list of numbers")
            out[str(name)][rank] = values
    return out


class Fill:
    """The input values of every (tensor name, rank)."""

    def __init__(self, values: dict[str, dict[int, list]] | None = None, origin: str = ""):
        self.explicit = values or {}
        self.origin = origin

    def values(self, name: str, rank: int, salt: int, numel: int, dtype: Dtype) -> torch.Tensor:
        given = self.explicit.get(name, {}).get(rank)
        if given is not None:
            if len(given) != numel:
                raise UsageError(f"{self.origin}: '{name}' rank {rank} has {len(given)} values; the op's input "
                                 f"buffer has {numel} elements")  # fmt: skip
            return torch.tensor(given, dtype=torch.float64).to(TORCH_DTYPE[dtype])
        i = torch.arange(numel, dtype=torch.int64)
        v = (7 * rank + 3 * salt + i) % 11 + 1
        if dtype is Dtype.BOOL:
            return (v % 2).bool()
        return v.to(TORCH_DTYPE[dtype])


@dataclass(frozen=True)
class Expectation:
    """What one op's buffers hold before (inp) and must hold after (out) it runs."""

    op: Op
    inp: torch.Tensor | None
    out: torch.Tensor | None
    source: str
    """Who produced the expected values, for the failure message."""


def _reduce(tensors: list[torch.Tensor], op: ReduceOp, dtype: Dtype) -> torch.Tensor:
    wide = torch.stack([t.to(torch.float64 if dtype.value.startswith(("fp", "bf")) else torch.int64) for t in tensors])
    if op is ReduceOp.SUM:
        r = wide.sum(0)
    elif op is ReduceOp.AVG:
        r = wide.sum(0) / len(tensors)
    elif op is ReduceOp.MAX:
        r = wide.max(0).values
    elif op is ReduceOp.MIN:
        r = wide.min(0).values
    else:
        r = wide.prod(0)
    if dtype is Dtype.BOOL:
        return r != 0
    return r.to(TORCH_DTYPE[dtype])


class Checker:
    """Expected inputs/outputs of one rank's comm ops, and their verification."""

    def __init__(self, program: Program, rank: int, fill: Fill):
        self.program = program
        self.rank = rank
        self.fill = fill
        self.matched_send = match_p2p(program)
        self.coll_seq = _collective_positions(program)
        self._coll_ops: dict[tuple[str, int], list[Op]] = defaultdict(list)
        for op in program.all_ops():
            if op.kind.is_collective:
                self._coll_ops[(op.group, op.rank)].append(op)
        self.expect: dict[int, Expectation] = {}
        for op in program.ops[rank]:
            if op.kind.is_comm:
                self.expect[op.index] = self._expectation(op)
            elif op.is_peer_copy:
                self.expect[op.index] = Expectation(op, self._copied(op), None, "")
        self.arrivals = [Expectation(op, None, self._copied(op), f"rank {op.rank} op {op.id}")
                         for op in program.all_ops() if op.is_peer_copy and op.peer == rank]  # fmt: skip
        """Copies other ranks make into this rank's buffers, with what they write."""

    def _copied(self, op: Op) -> torch.Tensor:
        """What peer copy `op` reads on its rank, and so writes on its destination."""
        return self.fill.values(op.name, op.rank, op.index, op.size_bytes // op.dtype.itemsize, op.dtype)

    def _member_order(self, op: Op) -> list[int]:
        return sorted(self.program.group(op.group).ranks)

    def _expectation(self, op: Op) -> Expectation:
        members = self._member_order(op)
        n = len(members)
        n_in, n_out, _ = layout(op, n)
        f, dt = self.fill.values, op.dtype
        if op.kind is OpKind.SEND:
            return Expectation(op, f(op.name, op.rank, op.index, n_in, dt), None, "")
        if op.kind is OpKind.RECV:
            send = self.matched_send[op.id]
            return Expectation(op, None, f(send.name, send.rank, send.index, n_out, dt), f"rank {send.rank} op {send.id}")
        if op.kind is OpKind.BARRIER:
            return Expectation(op, None, None, "")
        k = self.coll_seq[(op.rank, op.index)]
        peers = {m: self._coll_ops[(op.group, m)][k] for m in members}
        numel = op.size_bytes // dt.itemsize
        chunk = numel // n
        g = members.index(op.rank)

        def full(m: int) -> torch.Tensor:
            return f(peers[m].name, m, k, numel, dt)

        def part(m: int) -> torch.Tensor:
            return f(peers[m].name, m, k, chunk, dt)

        everyone = f"ranks {members}"
        kind = op.kind
        if kind is OpKind.BROADCAST:
            return Expectation(op, full(op.rank), full(op.root), f"root rank {op.root}")
        if kind is OpKind.ALL_REDUCE:
            return Expectation(op, full(op.rank), _reduce([full(m) for m in members], op.reduce_op, dt), everyone)
        if kind is OpKind.REDUCE:
            out = _reduce([full(m) for m in members], op.reduce_op, dt) if op.rank == op.root else None
            return Expectation(op, full(op.rank), out, everyone)
        if kind is OpKind.ALL_GATHER:
            return Expectation(op, part(op.rank), torch.cat([part(m) for m in members]), everyone)
        if kind is OpKind.GATHER:
            out = torch.cat([part(m) for m in members]) if op.rank == op.root else None
            return Expectation(op, part(op.rank), out, everyone)
        if kind is OpKind.SCATTER:
            inp = full(op.rank) if op.rank == op.root else None
            return Expectation(op, inp, full(op.root).chunk(n)[g].clone(), f"root rank {op.root}")
        if kind is OpKind.REDUCE_SCATTER:
            red = _reduce([full(m) for m in members], op.reduce_op, dt)
            return Expectation(op, full(op.rank), red.chunk(n)[g].clone(), everyone)
        if kind is OpKind.ALL_TO_ALL:
            return Expectation(op, full(op.rank), torch.cat([full(m).chunk(n)[g] for m in members]), everyone)
        raise AssertionError(kind)

    def verify(self, op: Op, got: torch.Tensor) -> str | None:
        """None if `got` (the op's output buffer) holds the expected values, else why not."""
        return self.verify_values(self.expect[op.index], got, f"rank {op.rank}: op {op.id} {op.label}{_who(op)}")

    def verify_arrival(self, exp: Expectation, got: torch.Tensor) -> str | None:
        """None if `got` (this rank's buffer a peer copy writes) holds what the copy wrote."""
        op = exp.op
        return self.verify_values(exp, got, f"rank {self.rank}: {op.dest}, written by copy {op.name} (op {op.id}) of rank {op.rank}")

    def verify_values(self, exp: Expectation, got: torch.Tensor, what: str) -> str | None:
        """None if `got` holds `exp.out`, else a message that starts with `what`."""
        op = exp.op
        if exp.out is None:
            return None
        got = got.detach().cpu()
        if got.dtype != exp.out.dtype:
            got = got.view(exp.out.dtype)
        if op.dtype in _RTOL:
            ok = torch.allclose(got.double(), exp.out.double(), rtol=_RTOL[op.dtype], atol=1e-6)
            bad = ~torch.isclose(got.double(), exp.out.double(), rtol=_RTOL[op.dtype], atol=1e-6)
        else:
            ok = torch.equal(got, exp.out)
            bad = got != exp.out
        if ok:
            return None
        idx = int(bad.nonzero()[0].item())
        nbad = int(bad.sum().item())
        return (f"{what} at {op.loc}: {nbad} of {got.numel()} elements wrong; element {idx} is {_num(got[idx])}, "
                f"expected {_num(exp.out[idx])} (from {exp.source})")  # fmt: skip


def _who(op: Op) -> str:
    if op.kind is OpKind.SEND:
        return f" to rank {op.peer}"
    if op.kind is OpKind.RECV:
        return f" from rank {op.peer}"
    root = f" root={op.root}" if op.root is not None else ""
    return f" (group {op.group}{root})"


def _num(x: torch.Tensor) -> str:
    v = x.item()
    return f"{v:g}" if isinstance(v, float) else str(v)


def match_p2p(program: Program) -> dict[str, Op]:
    """recv op id -> the send it matches (FIFO per (src, dst, group))."""
    sends: dict[tuple, list[Op]] = defaultdict(list)
    for op in program.all_ops():
        if op.kind is OpKind.SEND:
            sends[(op.rank, op.peer, op.group)].append(op)
    taken: dict[tuple, int] = defaultdict(int)
    out: dict[str, Op] = {}
    for op in program.all_ops():
        if op.kind is OpKind.RECV:
            key = (op.peer, op.rank, op.group)
            i = taken[key]
            if i < len(sends[key]):
                out[op.id] = sends[key][i]
            taken[key] = i + 1
    return out


def _collective_positions(program: Program) -> dict[tuple[int, int], int]:
    pos: dict[tuple[int, int], int] = {}
    count: dict[tuple[str, int], int] = defaultdict(int)
    for op in program.all_ops():
        if op.kind.is_collective:
            key = (op.group, op.rank)
            pos[(op.rank, op.index)] = count[key]
            count[key] += 1
    return pos
