"""Place `stage_send` / `stage_recv` transfers as torch.distributed.pipelining does.

A pipeline schedule states per rank the order of its compute ops, the transfers each
compute op needs before it (`stage_recv`) and those it sends after it (`stage_send`).
Where to post the receives is a property of all ranks together: posted too late, the
sender blocks in its send; posted in another order than the senders send, neighbouring
ranks wait for each other. PyTorch's runtime solves this in `_add_send_recv`, and this
module does what it does, on the expanded op lists:

  * walk all ranks in lockstep rounds, ranks in increasing order within a round; in a
    round a rank issues its ops up to its next compute op and everything after it up
    to the compute op after that (so one compute op per round, with the sends that
    follow it);
  * a rank stops early at the wait of a `stage_recv` whose sender has not sent it in
    an earlier round (a compute op takes a round: its output is there in the next);
  * when a rank issues a `stage_send`, the receive of the same name (on the same
    sender, receiver and group) is posted on the receiving rank at once, after
    whatever that rank has issued so far.

PyTorch's schedules pad each rank's actions with idle steps where the rank would wait
(its `None`s) and let an action use an input sent in the same round by a lower rank;
taking one round per compute op gives the same placement without the padding, for
any compute order: a rank's receive is posted when its sender really sends, not
before it has the sender's input itself.
Every send and its receive are then issued at the same point of one global order, so
the transfers can never wait for each other in a cycle, whatever order the
communicators serialise them in. If a round passes in which no rank can issue anything,
the compute order itself is cyclic (some rank needs an input that is produced only
after something that needs this rank's output): that is a deadlock, reported with each
rank's waiting line.
"""

from __future__ import annotations

from commdsl.dsl.expand import StageTransfers
from commdsl.errors import DeadlockError, ScheduleError
from commdsl.ir import P2P_KINDS, Op, OpKind, make_op

_Channel = tuple[int, int, str]
"""(sender, receiver, group id)."""


def lower_stage_transfers(per_rank: list[tuple[Op, ...]], transfers: list[StageTransfers]) -> list[tuple[Op, ...]]:
    """The ranks' op lists with every `stage_recv` moved to where its send is issued."""
    if not any(t.sends or t.recvs for t in transfers):
        return per_rank
    receiver_of = _match(per_rank, transfers)
    floating = [frozenset(t.recvs) for t in transfers]
    out: list[list[Op]] = [[] for _ in per_rank]
    cursor = [0] * len(per_rank)
    posted: list[dict[int, int]] = [{} for _ in per_rank]
    """Per rank, its posted stage_recvs (index) and the round their send was issued in."""
    round_ = 0
    compute, wait = OpKind.COMPUTE, OpKind.WAIT  # read once: an enum member is a slow attribute on Python 3.11
    while any(cursor[r] < len(per_rank[r]) for r in range(len(per_rank))):
        progress = False
        for rank, ops in enumerate(per_rank):
            i, computed = cursor[rank], False
            while i < len(ops):
                op = ops[i]
                if i in floating[rank]:  # posted by its sender
                    i += 1
                    continue
                if op.kind is compute:
                    if computed:
                        break
                    computed = True
                elif op.kind is wait and any(j in floating[rank] and posted[rank].get(j, round_) == round_ for j in op.waits_for):
                    break
                out[rank].append(op)
                target = receiver_of.get((rank, i))
                if target is not None:
                    dst, j = target
                    out[dst].append(per_rank[dst][j])
                    posted[dst][j] = round_
                i += 1
            progress = progress or i != cursor[rank]
            cursor[rank] = i
        if not progress:  # nothing issued, so nothing posted: no later round can differ
            raise _cyclic(per_rank, cursor)
        round_ += 1
    return [_renumber(rank_ops) for rank_ops in out]


def _match(per_rank: list[tuple[Op, ...]], transfers: list[StageTransfers]) -> dict[tuple[int, int], tuple[int, int]]:
    """(sender rank, send index) -> (receiver rank, recv index): a stage_recv takes the
    stage_send of the same name on its channel (sender, receiver, group)."""
    sends: dict[tuple[_Channel, str], Op] = {}
    recvs: dict[tuple[_Channel, str], Op] = {}
    plain: dict[_Channel, Op] = {}
    send = OpKind.SEND
    for rank, ops in enumerate(per_rank):
        stage_sends, stage_recvs = set(transfers[rank].sends), set(transfers[rank].recvs)
        for op in ops:
            if op.kind not in P2P_KINDS:
                continue
            channel = (op.rank, op.peer, op.group) if op.kind is send else (op.peer, op.rank, op.group)
            if op.index in stage_sends or op.index in stage_recvs:
                table = sends if op.index in stage_sends else recvs
                twin = table.get((channel, op.name))
                if twin is not None:
                    word = "stage_send" if op.kind is OpKind.SEND else "stage_recv"
                    raise ScheduleError(f"{word} {op.name} on rank {op.rank} repeats a transfer of that name between ranks "
                                        f"{channel[0]} and {channel[1]} (group {channel[2]})", op.loc, rank=op.rank,
                                        related=(("the first one", twin.loc),),
                                        hint="stage transfers match by name: index the name by microbatch and stage")  # fmt: skip
                table[(channel, op.name)] = op
            else:
                plain.setdefault(channel, op)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for key in sorted(sends.keys() | recvs.keys()):
        (src, dst, group), name = key
        s, r = sends.get(key), recvs.get(key)
        if s is None or r is None:
            extra = s or r
            word, missing, peer = (("stage_send", "stage_recv", dst) if extra.kind is OpKind.SEND
                                   else ("stage_recv", "stage_send", src))  # fmt: skip
            raise ScheduleError(f"{word} {name} on rank {extra.rank} has no {missing} {name} on rank {peer} (group {group})",
                                extra.loc, rank=extra.rank)  # fmt: skip
        other = plain.get((src, dst, group))
        if other is not None:
            raise ScheduleError(
                f"rank {src} -> rank {dst} on group {group} carries stage transfers and plain {other.kind.value}s; "
                "placing the stage transfers would change which plain send each plain recv matches",
                other.loc, rank=other.rank, related=(("a stage transfer on the same channel", s.loc),),
                hint="use stage_send/stage_recv for every transfer between the two stages' ranks, or another group",
            )  # fmt: skip
        out[(s.rank, s.index)] = (r.rank, r.index)
    return out


def _cyclic(per_rank: list[tuple[Op, ...]], cursor: list[int]) -> DeadlockError:
    waiting = []
    for rank, ops in enumerate(per_rank):
        if cursor[rank] < len(ops):
            op = ops[cursor[rank]]
            waiting.append((f"rank {rank} waits for {op.name.removeprefix('stage_recv ')}", op.loc))
    first_label, first_loc = waiting[0]
    return DeadlockError(
        "the pipeline's compute order is cyclic: no rank can go on, each waits for an input that is sent only "
        f"after it ({first_label})",
        first_loc,
        related=tuple(waiting[1:]),
        hint="every input of a compute op must be produced before it on the rank that sends it",
    )


def _renumber(ops: list[Op]) -> tuple[Op, ...]:
    """The ops at their new positions: indices, handle targets and batch leads follow."""
    new_index = {op.index: i for i, op in enumerate(ops)}
    out = []
    for i, op in enumerate(ops):
        waits, batch = op.waits_for, op.batch
        if waits:
            moved = tuple(new_index[j] for j in waits)
            waits = waits if moved == waits else moved
        if batch is not None:
            batch = new_index[batch]
        if op.index != i or waits is not op.waits_for or batch != op.batch:  # `op.replace`, without its generality
            op = make_op(op.rank, i, op.kind, op.name, op.handle, op.spec, op.microbatch, batch, waits)
        out.append(op)
    return tuple(out)
