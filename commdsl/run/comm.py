"""The torch.distributed call behind each communication op.

`CommPlan` is prepared once per op (or per batch of P2P ops); `launch` issues it with
`async_op=True` and returns the Work objects. Every call names the op's process group;
peers and roots are global ranks, as torch.distributed takes them with `group=`.
Whatever the op's declared transport (`nccl`, `gloo`, `memcpy`), the call runs on the
active backend: NCCL on GPUs, gloo on CPU (see docs/executor.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.ir import Op, OpKind, ReduceOp
from commdsl.run.tensors import CommBuffers

# torch 2.13 renamed the tensor forms of all_gather / reduce_scatter; older torch has the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

TORCH_REDUCE = {
    ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.AVG, ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.PROD: dist.ReduceOp.PRODUCT,
}  # fmt: skip


@dataclass
class CommPlan:
    """One collective, one P2P op, or one batch of P2P ops (batch_isend_irecv)."""

    ops: tuple[Op, ...]
    pg: dist.ProcessGroup
    group_size: int
    buffers: tuple[CommBuffers, ...]
    """Per op in `ops`."""
    chunks: list[torch.Tensor] | None = None
    """gather output / scatter input at the root, as views of one chunk per member."""
    barrier_tensor: torch.Tensor | None = None
    """On NCCL a barrier is a one-element all_reduce, so it stays stream-ordered."""
    tag: int = 0
    """Tag of a send or recv: memcpy transfers on CPU are matched by tag, since their stream
    threads may post them in any order (NCCL ignores tags)."""

    @property
    def lead(self) -> Op:
        return self.ops[0]


def make_plan(ops: tuple[Op, ...], pg: dist.ProcessGroup, group_size: int, buffers: tuple[CommBuffers, ...],
              backend: str, device: torch.device) -> CommPlan:  # fmt: skip
    plan = CommPlan(ops, pg, group_size, buffers)
    op, buf = ops[0], buffers[0]
    if op.kind is OpKind.GATHER and buf.out is not None:
        plan.chunks = list(buf.out.chunk(group_size))
    elif op.kind is OpKind.SCATTER and buf.inp is not None:
        plan.chunks = list(buf.inp.chunk(group_size))
    elif op.kind is OpKind.BARRIER and backend == "nccl":
        plan.barrier_tensor = torch.zeros(1, device=device)
    return plan


def launch(plan: CommPlan) -> list:
    """Issue the op(s) asynchronously on the current stream; return the Work objects."""
    op, buf, pg = plan.lead, plan.buffers[0], plan.pg
    kind = op.kind
    if op.batch is not None:
        p2p = [
            dist.P2POp(dist.isend if o.kind is OpKind.SEND else dist.irecv,
                       b.inp if o.kind is OpKind.SEND else b.out, o.peer, group=pg)
            for o, b in zip(plan.ops, plan.buffers)
        ]  # fmt: skip
        return list(dist.batch_isend_irecv(p2p))
    if kind is OpKind.SEND:
        work = dist.isend(buf.inp, dst=op.peer, group=pg, tag=plan.tag)
    elif kind is OpKind.RECV:
        work = dist.irecv(buf.out, src=op.peer, group=pg, tag=plan.tag)
    elif kind is OpKind.BROADCAST:
        work = dist.broadcast(buf.inp, src=op.root, group=pg, async_op=True)
    elif kind is OpKind.REDUCE:
        work = dist.reduce(buf.inp, dst=op.root, op=TORCH_REDUCE[op.reduce_op], group=pg, async_op=True)
    elif kind is OpKind.ALL_REDUCE:
        work = dist.all_reduce(buf.inp, op=TORCH_REDUCE[op.reduce_op], group=pg, async_op=True)
    elif kind is OpKind.ALL_GATHER:
        work = _ALL_GATHER(buf.out, buf.inp, group=pg, async_op=True)
    elif kind is OpKind.REDUCE_SCATTER:
        work = _REDUCE_SCATTER(buf.out, buf.inp, op=TORCH_REDUCE[op.reduce_op], group=pg, async_op=True)
    elif kind is OpKind.GATHER:
        work = dist.gather(buf.inp, gather_list=plan.chunks, dst=op.root, group=pg, async_op=True)
    elif kind is OpKind.SCATTER:
        work = dist.scatter(buf.out, scatter_list=plan.chunks, src=op.root, group=pg, async_op=True)
    elif kind is OpKind.ALL_TO_ALL:
        work = dist.all_to_all_single(buf.out, buf.inp, group=pg, async_op=True)
    elif kind is OpKind.BARRIER:
        if plan.barrier_tensor is not None:
            work = dist.all_reduce(plan.barrier_tensor, group=pg, async_op=True)
        else:
            work = dist.barrier(group=pg, async_op=True)
    else:  # pragma: no cover - the executor only hands comm ops here
        raise AssertionError(f"not a comm op: {op.kind}")
    return [] if work is None else [work]
