"""Collectives whose members go one after another: NCCL's ring broadcast and reduce.

NCCL runs broadcast and reduce as a chain along its ring with no barrier (src/device/
broadcast.h, reduce.h: each rank receives, copies or reduces, and forwards; nothing
waits for the whole chain). A member's kernel ends once its own part is done, and the
next op on its stream starts right after, while the members behind it still work. Ops
issued back to back therefore pipeline along the chain: the time per op is the period
of the slowest member's part, not the chain's end-to-end latency.

The engine hands such a collective's arrivals here (`ChainRuns.arrived`) instead of
waiting for every member. On each channel's ring (`commdsl.sim.nccl.Chain`: one ring on
one node, up to one per GPU of a node across nodes), member k in the order data flows
begins its part at

    begin_k = max(arrival_k, begin_(k-1) + lead_k)        begin_0 = arrival_0

(its stream reached the op, and the first chunk crossed the hop from member k-1), and
its op ends at

    end_k = max(begin_k + part_k, end_(k-1))

(a member never ends before the one it receives from); its op ends when its parts on
every ring have. With every member arriving at once the last member ends at the op's
latency plus its pipelined bytes, as a collective that holds every member until the end;
what changes is that the others end earlier.

The bytes are timed alone on the links (`NcclFlows.chain`: the op's solo rate). The
network is still given the whole op's transfer when the root begins, so that its loads
meet other transfers' and it appears in the flow statistics; the members' ends are the
chain's. Chains are used for NCCL broadcast / reduce with an NCCL model (`nccl:`) and 2+
members; a run that folds a program's replicas (`commdsl.sim.folding`) keeps the
collective that moves when all members have arrived (`enabled`), and a program with
chains is not folded by rank (`commdsl.sim.symmetry`: its ranks end apart). Where the
contention model follows transfers, the op's memory traffic runs with the network's
transfer (root's begin to the transfer's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commdsl.ir import Algo, Op, OpKind, Transport
from commdsl.machine.model import Machine
from commdsl.sim.collectives import plan
from commdsl.sim.entities import ALGOS, KIND_CODE, PROTOS, Collective
from commdsl.sim.network import Transfer
from commdsl.sim.nccl import Chain

CHAIN_KINDS = frozenset({OpKind.BROADCAST, OpKind.REDUCE})
"""Collectives NCCL runs as a chain (its other ring and tree algorithms step every rank
together: ring all_reduce / all_gather / reduce_scatter wait on their predecessor every
step around the ring, and trees and NVLS reduce and broadcast within one op)."""


@dataclass
class _Run:
    """One chain collective in flight."""

    chain: Chain
    transfer: Transfer
    ends: dict[int, Transfer]
    """Per member (rank), what ends its op: no bytes of its own (the op's bytes and their
    memory traffic are `transfer`'s)."""
    ops: dict[int, int]
    """Per member (rank), its op (g); a member that never issues it has none."""
    arrival: dict[int, float] = field(default_factory=dict)
    begin: list[list[float]] = field(default_factory=list)
    """Per ring, the begins of the members so far, in chain order."""
    end: list[list[float]] = field(default_factory=list)
    rings_left: dict[int, int] = field(default_factory=dict)
    """Per member, the rings whose part it has not begun yet."""
    last_end: dict[int, float] = field(default_factory=dict)
    """Per member, the latest end of its parts so far: its op's end once every ring is in."""


class ChainRuns:
    """The chain collectives of one engine run (see the module doc)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._runs: dict[int, _Run | None] = {}
        """Per collective (its number), its run; None: not a chain."""

    @staticmethod
    def in_ops(ops: list[Op], machine: Machine) -> bool:
        """Whether `ops` hold a broadcast or reduce over NCCL that `machine`'s NCCL model
        runs as a chain (its ranks then end apart: the engine does not fold such a
        program's ranks, and checks rank 0's ops, which every rank runs, for it)."""
        return machine.nccl is not None and any(op.kind in CHAIN_KINDS and op.transport is Transport.NCCL for op in ops)

    @staticmethod
    def enabled(engine) -> bool:
        """Whether `engine`'s run uses chains: the network has the NCCL model, ranks are
        not folded, and some collective is a broadcast or reduce over NCCL (the per-op
        kind codes are counted first, at C speed, before any op is looked at)."""
        if engine.network.nccl is None or engine.folded or engine.program.fold is not None:
            return False
        kinds = bytes(engine.wiring.kinds)
        if not any(kinds.count(KIND_CODE[k]) for k in CHAIN_KINDS):
            return False
        ops = engine.ops
        return any(ops[inst.ops[0]].kind in CHAIN_KINDS and ops[inst.ops[0]].transport is Transport.NCCL
                   for inst in engine.collectives if inst.ops)  # fmt: skip

    def arrived(self, inst: Collective, g: int, now: float) -> bool:
        """Member op `g` of `inst` became active at `now`: True where `inst` is a chain
        (its members' ends are scheduled here), False for a collective of the usual kind."""
        run = self._runs.get(inst.number, False)
        if run is False:
            run = self._runs[inst.number] = self._run(inst)
        if run is None:
            return False
        inst.arrived.append(g)  # what the deadlock report reads
        run.arrival[self.engine.ops[g].rank] = now
        self._advance(run, now)
        return True

    def _run(self, inst: Collective) -> _Run | None:
        e = self.engine
        first = inst.ops[0]
        rep = e.ops[first]
        algo, proto = ALGOS[e.algos[first]], PROTOS[e.protos[first]]
        ranks = e.group_ranks[inst.group]
        if rep.kind not in CHAIN_KINDS or rep.transport is not Transport.NCCL or proto is None or len(ranks) < 2:
            return None
        if algo not in (Algo.RING, Algo.CHAIN):
            return None
        chain = e.network.nccl.chain(rep.kind, ranks, rep.size_bytes, rep.root, algo, proto)
        p = plan(rep.kind, algo, len(ranks), rep.size_bytes, e.machine.chunk_bytes, proto)
        transfer = Transfer(rep.kind, ranks, rep.size_bytes, rep.transport, p, rep.root, rep.dtype, rep.reduce_op)
        ends = {r: Transfer(rep.kind, (r,), 0, rep.transport, p, rep.root, rep.dtype, rep.reduce_op) for r in ranks}
        rings = len(chain.orders)
        return _Run(chain, transfer, ends, {e.ops[m].rank: m for m in inst.ops}, begin=[[] for _ in range(rings)],
                    end=[[] for _ in range(rings)], rings_left=dict.fromkeys(ranks, rings))  # fmt: skip

    def _advance(self, run: _Run, now: float) -> None:
        """Begin every member whose turn has come on each ring, in chain order, and schedule
        the end of each member whose parts on every ring are known."""
        e = self.engine
        chain = run.chain
        for j, order in enumerate(chain.orders):
            begins, ends = run.begin[j], run.end[j]
            while len(begins) < len(order) and (r := order[k := len(begins)]) in run.arrival:
                arrival = run.arrival[r]
                if k == 0:
                    begin, end = arrival, arrival + chain.part_us[j][0]
                    if j == 0:  # the whole op's loads on the links, for other transfers and the flow statistics
                        e.network.start(run.transfer, tuple(run.ops.values()), self._moved)
                        self._traffic(run.transfer, True)
                else:
                    begin = max(arrival, begins[k - 1] + chain.lead_us[j][k])
                    if begin > arrival:
                        e.cause[run.ops[r]] = run.ops[order[k - 1]]  # it waited for the member before it
                    end = max(begin + chain.part_us[j][k], ends[k - 1])
                begins.append(begin)
                ends.append(end)
                run.last_end[r] = max(run.last_end.get(r, end), end)
                run.rings_left[r] -= 1
                if run.rings_left[r] == 0:
                    ev = e.env.timeout(run.last_end[r] - now)
                    ev.callbacks.append(lambda _ev, g=run.ops[r], t=run.ends[r]: e._transfer_done(t, (g,)))

    def _moved(self, transfer: Transfer, _ops: tuple[int, ...]) -> None:
        """The network's end of a chain's transfer: its traffic stops (the members end on their own)."""
        self._traffic(transfer, False)

    def _traffic(self, transfer: Transfer, started: bool) -> None:
        e = self.engine
        if e.traffic:
            for rank in e.contention.transfer(transfer, started):
                e._retime(rank)
