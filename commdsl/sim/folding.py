"""Simulating a folded program (`commdsl.dsl.fold`): one replica runs, and stands for all.

A folded program holds the ops of one replica along a mesh axis (the representative);
the other replicas run the same ops renamed. The engine runs the representative's ranks;
a collective over a group that spans the replicas (the data-parallel all_reduce) moves
once its representative members have arrived (`wire` counts only them), and the network
times it as the whole group's transfer, over every member's links, as it does in a run of
every rank. Each replica then goes through the representative's timeline: when every
replica issues the same ops at the same instants, that is what a run of every rank gives.

That holds where nothing on one replica's devices and links is seen by another's, save
the collectives that span them (`inexact` says why not, otherwise):

  * the analytic network has no contention: always the same;
  * the flow network shares links: the same where each replica's in-replica traffic
    stays on links of its own, i.e. the replicas are whole nodes apart (their ranks a
    multiple of the node's GPUs apart, no node holding two replicas' ranks) on a machine
    of identical nodes, and no link is machine-wide (a transport with a shared
    bandwidth, such as gloo's loopback TCP). The fabric's network between nodes is
    non-blocking (`commdsl.sim.fabric`): the NICs are the only links the replicas'
    inter-node transfers meet, each on its own node. A machine without a topology gives
    every rank its own link to a switch per transport;
  * compute slowing transfers (`Machine.slows_comm`) is not the same: a collective that
    spans the replicas is slowed by every member's compute, and only the representative
    computes; nor is drawing compute stalls (`--samples`): each rank draws its own.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

from commdsl.ir import Algo, Op, Program
from commdsl.machine.model import Machine
from commdsl.sim.network import Network

T = TypeVar("T")


def inexact(program: Program, machine: Machine, network: str, samples: int = 1) -> str | None:
    """Why simulating folded `program` on `machine` would not give what a run of every
    rank gives (see the module doc); None where it gives the same, or it is not folded."""
    fold = program.fold
    if fold is None:
        return None
    if samples > 1:
        return "--samples draws every rank's own compute stalls"
    if machine.slows_comm():
        return f"on {machine.name} compute slows the transfers of its device, and only the representative replica computes"
    if network == "analytic":
        return None
    if machine.shared:
        transports = ", ".join(t.value for t, _ in machine.shared)
        return f"{machine.name}'s {transports} bandwidth is shared machine-wide, by every replica's transfers"
    topo = machine.topology
    if topo is None:
        return None
    per_node = topo.gpus_per_node
    if fold.stride % per_node:
        apart = f"{fold.stride} ranks" if fold.stride > 1 else "one rank"
        return (f"the {fold.axis} replicas are {apart} apart, not a whole number of {per_node}-GPU nodes: "
                f"they share nodes, whose links carry both")  # fmt: skip
    nodes = {r // per_node for r in fold.ranks}
    step = fold.stride // per_node
    for k in range(1, fold.replicas):
        if any(n + k * step in nodes for n in nodes):
            return f"{fold.axis} replicas 0 and {k} share a node, whose links carry both"
    return None


def fold_unit(machine: Machine, network: str) -> int:
    """The ranks a folded copy must fill whole on `machine` with `network` (`load_schedule`'s
    `fold_unit`): a node's GPUs where replicas could share links, else 1."""
    topo = machine.topology
    return topo.gpus_per_node if topo is not None and network != "analytic" else 1


def approximate(program: Program, machine: Machine, network: str) -> str | None:
    """Why a folded simulation that `inexact` lets run gives close to, not exactly, what a
    run of every rank gives; None where it is exact. On the flow network a collective that
    spans the replicas loads every member's links as its algorithm does: a ring the same
    on every node, NCCL's trees more on the tree's inner nodes than on its leaves. Where the
    replicas' own transfers also cross nodes (pipeline sends), they meet that collective
    on their NICs, and each replica's nodes sit elsewhere in the tree: the representative's
    transfers see its own nodes' load, the others' theirs."""
    fold = program.fold
    topo = machine.topology
    if fold is None or network == "analytic" or topo is None or machine.nccl is None:
        return None
    per_node = topo.gpus_per_node
    own = set(fold.ranks)

    def nodes(ranks) -> int:
        return len({r // per_node for r in ranks})

    spanning: dict[tuple, Op] = {}
    crosses = False
    for rank in fold.ranks:
        for op in program.ops[rank]:
            if op.kind.is_p2p:
                crosses = crosses or (op.peer is not None and op.peer // per_node != rank // per_node)
            elif op.group is not None and op.kind.is_collective:
                ranks = program.group(op.group).ranks
                if own.issuperset(ranks):
                    crosses = crosses or nodes(ranks) > 1
                elif nodes(ranks) > 2:
                    spanning.setdefault((op.group, op.kind, op.size_bytes, op.algo, op.proto), op)
    if not crosses or not spanning:
        return None
    from commdsl.sim.nccl_flows import machine_links  # the NCCL model, only where a fold may meet its trees

    _, flows = machine_links(machine, program.world_size)
    for op in spanning.values():
        algo = flows.choose(op, program.group(op.group).ranks).algo
        if algo in (Algo.TREE, Algo.NVLS_TREE, Algo.COLLNET_CHAIN, Algo.COLLNET_DIRECT):
            return (f"{op.label} (across the {fold.axis} replicas) runs NCCL's {algo.value} over the nodes, whose inner "
                    f"nodes' NICs carry more than its leaves', and the replicas' own transfers across nodes meet it there: "
                    f"each replica runs as the representative's nodes load, so the result may differ a little from a run of "
                    f"every rank (--no-fold simulates every rank)")  # fmt: skip
    return None


def unfolded(per_rank: tuple[T, ...], program: Program) -> tuple[T, ...]:
    """Per-rank entries (dataclasses whose first field is `rank`, one per rank in rank
    order) of a folded program's simulation, where only the representative's are real:
    every rank's, each the entry of the rank it runs as, renamed. As given where it is
    not folded."""
    fold = program.fold
    if fold is None or not per_rank:
        return per_rank
    own = set(fold.ranks)
    first = per_rank[fold.ranks[0]]
    cls, names = type(first), [f.name for f in fields(first)]
    assert names[0] == "rank"
    values = {r: [getattr(per_rank[r], n) for n in names[1:]] for r in fold.ranks}  # a few per representative rank
    return tuple(per_rank[r] if r in own else cls(r, *values[fold.representative(r)]) for r in range(len(per_rank)))


def own_channels(program: Program, network: Network) -> frozenset[int] | None:
    """Of a folded program, the channels whose loads a folded run gives as a run of every
    rank does: those of the representative replica's devices (`Fabric.device_channels`).
    The other replicas' carry the same, shifted, but in the folded run only the transfers
    that span the replicas cross them. None: every channel (not folded, or no links)."""
    if program.fold is None or network.fabric is None:
        return None
    return network.fabric.device_channels(program.fold.ranks)
