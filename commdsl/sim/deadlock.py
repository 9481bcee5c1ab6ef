"""Deadlock reports: when no event is left and ops remain, say why for every rank.

The engine stops when SimPy's event queue is empty. If some op is not done, every rank
that has unfinished ops is stuck on something; we name, per rank, the op it is stuck on
(id, name, source line) and what that op waits for, following the chain one step to the
peer rank so the usual cases read as one sentence: a recv whose send was never issued,
two ranks both blocked sending to each other, a collective missing members, an event
whose record never ran, a stream waiting on another stream.
"""

from __future__ import annotations

from commdsl.errors import DeadlockError, SourceLoc
from commdsl.ir import Op, OpKind
from commdsl.sim.engine import Engine
from commdsl.sim.entities import ACTIVE, DONE, ELIGIBLE, SYNC

_MAX_SNIPPETS = 4


def describe_op(op: Op) -> str:
    """`send act[0] (op 0:3, 1f1b.yaml:12)`."""
    return f"{op.label} (op {op.id}, {op.loc.file}:{op.loc.line})"


class _Reporter:
    def __init__(self, engine: Engine):
        self.e = engine

    def op(self, g: int) -> Op:
        return self.e.ops[g]

    def state_name(self, g: int) -> str:
        return {DONE: "done", ACTIVE: "active", ELIGIBLE: "queued"}.get(self.e.state[g], "not started")

    # ---- why a comm op that is not active is not active -------------------------------

    def why_inactive(self, g: int) -> str:
        """Why comm op g (on its own rank) has not become active."""
        e, op = self.e, self.op(g)
        if e.on_stream[g]:  # a memcpy transfer: only its stream can hold it back
            return self._stream_not_there(g)
        q = e.queues[op.rank][op.group]
        head = q.head()
        if head >= 0 and head != self._item_of(g):
            return f"it is queued behind {describe_op(self.op(head))} in rank {op.rank}'s comm queue for group {op.group}"
        if e.state[g] == ELIGIBLE:
            return "its batch waits for the head of another group's comm queue"
        return self._stream_not_there(g)

    def _stream_not_there(self, g: int) -> str:
        e, op = self.e, self.op(g)
        stream = e.streams[op.rank][op.stream]
        if stream.head() >= 0:
            head = stream.head() >> 2
            if head != g:
                return f"stream {op.stream} of rank {op.rank} has not reached it: it is stuck at {describe_op(self.op(head))}"
        return f"rank {op.rank}'s host never issued it"

    def _item_of(self, g: int) -> int:
        op = self.op(g)
        return self.e.base[op.rank] + op.batch if op.batch is not None else g

    # ---- what an active comm op waits for --------------------------------------------

    def why_active_blocked(self, g: int) -> tuple[str, str | None]:
        """(reason, hint) for an active comm op that never finished."""
        e, op = self.e, self.op(g)
        if op.kind.is_collective:
            inst = e.collectives[e.coll_at[g]]
            arrived = {self.op(m).rank for m in inst.arrived}
            issued = {self.op(m).rank: m for m in inst.ops}
            ranks = e.group_ranks[op.group]
            if e.program.fold is not None:  # the other replicas run as the representative's ranks
                ranks = e.program.fold.present(ranks)
            missing = [r for r in ranks if r not in arrived]
            parts = []
            for r in missing:
                if r not in issued:
                    parts.append(f"rank {r} never issues it")
                else:
                    parts.append(f"rank {r} has not reached it ({self.why_inactive(issued[r])})")
            return (
                f"waits for {len(missing)} of {len(ranks)} members of group {op.group} (collective #{inst.seq + 1}): " + "; ".join(parts),
                "every member must issue the group's collectives in the same order",
            )
        p = e.partner[g]
        other = "recv" if op.kind is OpKind.SEND else "send"
        if p < 0:
            direction = "to" if other == "send" else "from"
            return (
                f"waits for rank {op.peer} to post the matching {other}, but rank {op.peer} never issues "
                f"a matching {other} {direction} rank {op.rank} (group {op.group})",
                f"add the {other} on rank {op.peer}, or remove this {op.kind.value}",
            )
        po = self.op(p)
        if e.state[p] == ACTIVE:  # both active yet not finished: cannot happen with a network that finishes
            return f"its transfer with {describe_op(po)} never finished", None
        reason = f"waits for rank {po.rank}'s matching {describe_op(po)}, which is {self.state_name(p)}: {self.why_inactive(p)}"
        if e.on_stream[p]:  # memcpy: the peer's stream is held by a transfer towards us of the same direction
            peer_stream = e.streams[po.rank][po.stream]
            h = peer_stream.head() >> 2  # -1 when empty
            ho = self.op(h) if h >= 0 else None
            if ho is not None and e.on_stream[h] and ho.kind is op.kind and ho.peer == op.rank and e.state[h] == ACTIVE:
                verb = "sending to" if op.kind is OpKind.SEND else "receiving from"
                return (
                    reason + f". Ranks {min(op.rank, po.rank)} and {max(op.rank, po.rank)} are both blocked {verb} each other "
                    "on their streams (head to head)",
                    "put each rank's memcpy send and recv on different streams, or order them send-then-recv on one rank "
                    "and recv-then-send on the other",
                )
            return reason, None
        # Head to head: the peer's queue is blocked by an active op towards us of the same direction.
        q = e.queues[po.rank][po.group]
        if q.head() >= 0 and q.active:
            head = q.head()
            for h in self._members(head, po.group):
                ho = self.op(h)
                if ho.kind is op.kind and ho.peer == op.rank and e.state[h] == ACTIVE:
                    verb = "sending to" if op.kind is OpKind.SEND else "receiving from"
                    return (
                        reason + f". Ranks {min(op.rank, po.rank)} and {max(op.rank, po.rank)} are both blocked {verb} each other (head to head)",
                        "issue the send and the recv of each rank as one batch (`batch:` with isend/irecv), "
                        "or order them send-then-recv on one rank and recv-then-send on the other",
                    )
        return reason, None

    def _members(self, item: int, group: str) -> list[int]:
        op = self.op(item)
        if op.batch is None:
            return [item]
        out, g, end = [], item, self.e.hosts[op.rank].end
        while g < end and self.op(g).batch == op.batch:
            if self.op(g).group == group:
                out.append(g)
            g += 1
        return out

    # ---- per rank ------------------------------------------------------------------

    def rank_report(self, rank: int) -> tuple[int, list[str], str | None]:
        """(primary op g, lines, hint) for a stuck rank."""
        e = self.e
        found: list[tuple[int, int, str, str | None]] = []  # (priority, g, text, hint)
        for q in e.queues[rank].values():
            if q.head() < 0:
                continue
            for g in self._members(q.head(), q.group):
                if e.state[g] == ACTIVE:
                    reason, hint = self.why_active_blocked(g)
                    found.append((0, g, f"{describe_op(self.op(g))} is active and {reason}", hint))
        for s in e.streams[rank].values():
            if s.head() < 0:
                continue
            g, tag = s.head() >> 2, s.head() & 3
            op = self.op(g)
            if e.on_stream[g]:  # a memcpy send or recv holding its stream
                if e.state[g] == ACTIVE:
                    reason, hint = self.why_active_blocked(g)
                    found.append((0, g, f"{describe_op(op)} is active on stream {s.name} and {reason}", hint))
                continue
            deps = list(e._deps(g, tag))
            pending = [d for d in deps if e.state[d] != DONE]
            if tag == SYNC:
                what = ", ".join(describe_op(self.op(d)) for d in pending)
                found.append((1, g, f"stream {s.name} waits for synchronous {what} to finish", None))
            elif op.kind is OpKind.WAIT_EVENT:
                rec = self.op(deps[0])
                rs = e.streams[rank][rec.stream]
                at = f"; stream {rec.stream} is stuck at {describe_op(self.op(rs.head() >> 2))}" if rs.head() >= 0 else ""
                found.append((1, g, f"stream {s.name} is stuck at {describe_op(op)}: event {op.name} is never recorded "
                                    f"({describe_op(rec)} has not run{at})", None))  # fmt: skip
            elif op.kind is OpKind.WAIT:
                what = ", ".join(f"{describe_op(self.op(d))} ({self.state_name(d)})" for d in pending)
                found.append((1, g, f"stream {s.name} is stuck at {describe_op(op)}, waiting for {what}", None))
        h = e.hosts[rank]
        if h.block_g >= 0:
            op = self.op(h.block_g)
            pending = [d for d in h.block_deps if e.state[d] != DONE]
            if pending:
                what = ", ".join(f"{describe_op(self.op(d))} ({self.state_name(d)})" for d in pending)
            else:
                what = ", ".join(
                    (f"stream {x.name}" if hasattr(x, "name") else f"comm queue {x.group}") + f" ({target - x.done} entries left)"
                    for x, target in h.sync_targets if x.done < target
                )  # fmt: skip
            found.append((2, h.block_g, f"the host is blocked in {describe_op(op)}, waiting for {what}", None))
        if not found:  # cannot happen: a stuck rank has a blocked host, stream or queue
            first = next(g for g in range(h.pc - 1, e.base[rank] - 1, -1) if e.state[g] != DONE)
            found.append((3, first, f"{describe_op(self.op(first))} never finished", None))
        found.sort(key=lambda f: (f[0], f[1]))
        hint = next((f[3] for f in found if f[3]), None)
        return found[0][1], [f[2] for f in found], hint


def deadlock_error(engine: Engine) -> DeadlockError:
    """The `DeadlockError` describing every stuck rank of a finished-but-unfinished run."""
    rep = _Reporter(engine)
    stuck, finished = [], []
    for rank in range(len(engine.hosts)):
        b, end = engine.base[rank], engine.hosts[rank].end
        if any(engine.state[g] != DONE for g in range(b, end)):
            stuck.append(rank)
        else:
            finished.append(rank)
    when = f" after {engine.env.now:.3f} us" if engine.env.now > 0 else ""
    lines = [f"no op can progress{when} and {len(stuck)} of {len(engine.hosts)} ranks have ops left"]
    primaries: list[tuple[int, SourceLoc]] = []
    hint = None
    for rank in stuck:
        g, texts, h = rep.rank_report(rank)
        primaries.append((rank, engine.ops[g].loc))
        hint = hint or h
        lines.append(f"  rank {rank}: {texts[0]}")
        lines.extend(f"          also: {t}" for t in texts[1:])
    if finished:
        lines.append(f"  finished: rank{'s' if len(finished) > 1 else ''} {_ranges(finished)}")
    first_rank, first_loc = primaries[0]
    related = tuple((f"(rank {r})", loc) for r, loc in primaries[1:_MAX_SNIPPETS])  # as the first location shows its rank
    return DeadlockError("\n".join(lines), first_loc, rank=first_rank, related=related, hint=hint)


def _ranges(ranks: list[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)
