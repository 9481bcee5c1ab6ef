"""What the engine knows before the clock starts: who talks to whom.

`wire()` walks every op once and fixes the static facts of a program on a machine:
each comm op's comm queue (none for memcpy, which runs on its stream), send/recv pairs
(first in, first out per (src, dst, group)), collective instances (the k-th collective
of a group on every member), P2P batches, and each comm op's algorithm and protocol (the
network's choice, `Network.choose`). It also checks what the machine must provide: a
transport for every comm op and peer copy, a route for every memcpy transfer (not
between nodes), and a compute rate for every FLOP-sized dtype.

The result is flat: per-op arrays (partner, algorithm and protocol indices, kind codes,
memcpy marks), a batch as the range of its consecutive ops, and the network's choice
made once per distinct shape of comm op. A sampled simulation wires once and hands the
same `Wiring` to every sample's engine, which resets its queues and collective instances.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

from commdsl.errors import MachineError, ScheduleError
from commdsl.ir import COLLECTIVE_KINDS, P2P_KINDS, Op, OpKind, Program, Transport
from commdsl.machine.model import Machine
from commdsl.sim.contention import memory_bound
from commdsl.sim.entities import ALGOS, KIND_CODE, PROTOS, Collective, Queue, entry_typecode, op_index_typecode
from commdsl.sim.network import Network, Transfer
from commdsl.sim.symmetry import copy_rank_0, shifted


@dataclass
class Wiring:
    """Static facts per op, indexed by g (ranks laid out one after another)."""

    queues: list[dict[str, Queue]]
    """Per rank, its comm queue of each group it uses."""
    queue_list: list[Queue]
    """Every comm queue, numbered."""
    queue_at: array
    """Per op, the number of its group's comm queue on its rank (-1: none). Numbers
    rather than references: 4 bytes per op instead of 8."""
    partner: array
    """Per send/recv, the matching op (-1: none)."""
    coll_at: array
    """Per op, the number of its collective instance in `collectives` (-1: none)."""
    collectives: list[Collective]
    batch_last: array
    """P2P batches: at a batch's first op (g), its last op (a batch's ops are consecutive:
    it holds isend/irecv only); empty without batches."""
    batch_multi: dict[int, tuple[Queue, ...]]
    """P2P batches over several groups: first op (g) -> the comm queues it occupies (a
    batch not here occupies its first op's queue alone)."""
    batch_gloo: set[int]
    """P2P batches (their first op, g) with a gloo op: a synchronous one blocks the host."""
    algos: bytearray
    """Per comm op, the index in `ALGOS` of its algorithm."""
    protos: bytearray
    """Per comm op, the index in `PROTOS` of its NCCL protocol (0: none)."""
    kinds: bytearray
    """Per op, its kind as an index in `KINDS` (the engine's hot paths test bytes, not ops)."""
    on_stream: bytearray
    """Per op, 1 for a memcpy transfer (a peer copy, a memcpy send or recv): it runs on its
    stream, with no comm queue."""
    # The engine's transfers by shape, built on first use: they follow from the program and
    # the machine alone, so every run made with this wiring (a sampled simulation's
    # samples) shares them.
    transfers: dict[tuple, Transfer] = field(default_factory=dict)
    """`Engine._transfers`: collectives."""
    p2p_shapes: dict[tuple, tuple[Transfer, tuple[str, int, int] | None, tuple[int, ...] | None]] = field(default_factory=dict)
    """`Engine._p2p_shapes`: point-to-point transfers and peer copies."""
    pair_of: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    """`Engine._pair_of`: NCCL sends' pairs."""
    memory_bound: bool = False
    """Some compute op's time is its bytes' on the machine (`memory_bound`): only those
    share the device's memory with NCCL's traffic (`GpuModel.transfer`)."""
    kernel_factors: array | None = None
    """Per op, the compute slowdown of its NCCL kernel, filled as the contention model
    looks it up (`_KernelFactors.factor_at`); None until a run tracks kernels."""


_COMM_KINDS = P2P_KINDS | COLLECTIVE_KINDS
# Enum members bound once: a member read through its class is a Python-level lookup
# (the enum's metaclass), dear where this module is compiled.
_COMPUTE, _SEND, _RECV = OpKind.COMPUTE, OpKind.SEND, OpKind.RECV
_MEMCPY, _GLOO = Transport.MEMCPY, Transport.GLOO
_MEMORY_BOUND = "memory-bound"
"""In `_facts`' set of what it checked: some compute op's time is its bytes' on the machine."""


def wire(program: Program, ops: list[Op], base: list[int], machine: Machine, network: Network, symmetric: bool = False) -> Wiring:
    """The program's `Wiring`. `symmetric`: its ranks are interchangeable
    (`commdsl.sim.symmetry.interchangeable`): rank 0 is wired, the others' facts derived."""
    n = len(ops)
    queues: list[dict[str, Queue]] = [{} for _ in range(program.world_size)]
    queue_list: list[Queue] = []
    index = op_index_typecode(n)
    items = entry_typecode(n)  # a comm queue's items (g, never negative)
    partner = array(index, [-1]) * n
    queue_at = array(index, [-1]) * n
    coll_at = array(index, [-1]) * n
    collectives: list[Collective] = []
    algos = bytearray(n)
    protos = bytearray(n)
    on_stream = bytearray(n)
    kinds = bytearray(n)
    group_ranks = {group.id: group.ranks for group in program.groups}
    fold = program.fold
    members = group_ranks if fold is None else {gid: fold.present(ranks) for gid, ranks in group_ranks.items()}
    """Per group, the members that issue its collectives (of a folded program, those of
    the representative replica: the others run the same, `commdsl.dsl.fold`)."""
    unmatched: dict[tuple, deque[int]] = {}
    """(src, dst, group, kind) -> the sends (or recvs) not matched yet, in issue order."""
    instances: dict[str, list[Collective]] = {}
    """Per group, its collective instances in order."""
    # Most programs repeat a few shapes of comm op: the network's choice is made once per
    # shape, and kept as the (algo, proto) indices the arrays hold.
    chosen: dict[tuple, tuple[int, int]] = {}
    checked: set = set()
    batch_last = array(index)
    # The same memory under the names the loop writes: where this module is compiled
    # (`commdsl.native`), typed views, whose stores are C stores.
    partner_at, queue_of, coll_of = partner, queue_at, coll_at
    kind_of, on_stream_of, algo_of, proto_of = kinds, on_stream, algos, protos
    batch_multi: dict[int, tuple[Queue, ...]] = {}
    batch_gloo: set[int] = set()
    for rank, rank_ops in enumerate(program.ops[:1] if symmetric else program.ops):
        b = base[rank]
        seq: dict[str, int] = {}
        """Per group: the rank's collectives so far."""
        # What an op's spec and kind decide on this rank (the ops of one statement share a
        # spec): its kind code and, for a comm op, its queue, algorithm and matching key.
        facts: dict[int, tuple] = {}
        for g, op in enumerate(rank_ops, b):
            kind = op.kind
            fact = facts.get(id(op.spec))
            if fact is None or fact[0] is not kind:
                fact = _facts(op, machine, network, queues[rank], queue_list, items, group_ranks, chosen, checked)
                if fact[0] is kind:
                    facts[id(op.spec)] = fact
            _, code, comm, stream_only, q, algo, proto, key, unmatched_key, gloo = fact  # q: the queue's number
            kind_of[g] = code
            on_stream_of[g] = stream_only
            if not comm:
                continue
            queue_of[g] = q
            algo_of[g] = algo
            proto_of[g] = proto
            if op.batch is not None:
                if not batch_last:
                    batch_last = array(index, [0]) * n
                first = b + op.batch
                if first != g:
                    assert batch_last[first] == g - 1, "a batch's ops are consecutive"
                    if q != queue_of[first]:
                        batch_multi[first] = (*batch_multi.get(first, (queue_list[queue_of[first]],)), queue_list[q])
                batch_last[first] = g
                if gloo:
                    batch_gloo.add(first)
            if key is not None:  # a send or recv: pair it with the first unmatched other end
                other = unmatched.get(key)
                if other:
                    p = other.popleft()
                    partner_at[g] = p
                    partner_at[p] = g
                    if not other:
                        del unmatched[key]
                else:
                    waiting = unmatched.get(unmatched_key)
                    if waiting is None:
                        unmatched[unmatched_key] = deque((g,))
                    else:
                        waiting.append(g)
            else:  # a collective: the k-th of its group on every member is one instance
                group = op.group
                k = seq.get(group, 0)
                seq[group] = k + 1
                group_instances = instances.get(group)
                if group_instances is None:
                    group_instances = instances[group] = []
                if k < len(group_instances):
                    inst = group_instances[k]
                else:
                    inst = Collective(group, k, len(members[group]), len(collectives))
                    group_instances.append(inst)
                    collectives.append(inst)
                inst.ops.append(g)
                coll_of[g] = inst.number

    for first, multi in batch_multi.items():
        batch_multi[first] = tuple(dict.fromkeys(multi))
    if symmetric:
        # A collective is the same instance on every rank: its coll_at too is rank 0's.
        _derive_ranks(program.world_size, len(program.ops[0]), queues, queue_list, queue_at, collectives, [algos, protos, kinds, on_stream, coll_at])
    return Wiring(queues, queue_list, queue_at, partner, coll_at, collectives, batch_last, batch_multi, batch_gloo, algos, protos, kinds, on_stream,
                  memory_bound=_MEMORY_BOUND in checked)


def _derive_ranks(world: int, m: int, queues: list[dict[str, Queue]], queue_list: list[Queue], queue_at: array, collectives: list[Collective],
                  same: list) -> None:  # fmt: skip
    """Ranks 1 .. world - 1 of a program whose ranks run rank 0's `m` ops (no P2P, every
    collective over all ranks), as the walk over every rank would wire them: each rank its
    own comm queues, numbered after the previous rank's in the same order; the same
    collective instances, each with one op per rank in rank order; the per-op arrays
    `same` as on rank 0."""
    copy_rank_0(world, m, same)
    own = queue_list[:]
    for r in range(1, world):
        for q in own:
            queues[r][q.group] = queue = Queue(r, q.group, q.fifo.typecode, len(queue_list))
            queue_list.append(queue)
        queue_at[r * m : (r + 1) * m] = shifted(queue_at[:m], r * len(own))
    for inst in collectives:
        (g,) = inst.ops
        inst.ops.extend(range(g + m, g + world * m, m))


def _facts(op: Op, machine: Machine, network: Network, rank_queues: dict[str, Queue], queue_list: list[Queue], typecode: str,
           group_ranks: dict[str, tuple[int, ...]], chosen: dict[tuple, tuple[int, int]], checked: set) -> tuple:  # fmt: skip
    """What `wire` needs of an op that its kind, spec and rank decide, checking what the
    machine must provide for it: (kind, kind code, is a comm op, runs on its stream, comm
    queue's number in `queue_list` (-1: none), algo index, proto index, matching key, the
    key its own kind waits under, is a gloo op). A new comm queue holds its items as
    `typecode`. It reads the op's shared fields from its spec (`op.spec.size_bytes` is
    what `op.size_bytes` reads, without a property's call)."""
    kind = op.kind
    spec = op.spec
    code = KIND_CODE[kind]
    transport = spec.transport
    if kind not in _COMM_KINDS:
        stream_only = False
        if kind is _COMPUTE:
            if spec.duration_us is None and spec.flops is not None and (spec.dtype, "flops") not in checked:
                _check_rate(machine, op)
                checked.add((spec.dtype, "flops"))
            if spec.size_bytes and spec.duration_us is None and _MEMORY_BOUND not in checked and memory_bound(machine, op):
                checked.add(_MEMORY_BOUND)
        elif op.is_peer_copy:
            if transport not in checked:
                _check_transport(machine, op)
                checked.add(transport)
            network.check_copy(op)
            stream_only = transport is _MEMCPY
        return kind, code, False, stream_only, -1, 0, 0, None, None, transport is _GLOO
    if transport not in checked:
        _check_transport(machine, op)
        checked.add(transport)
    q = -1
    group = spec.group
    if transport is _MEMCPY:  # no communicator: it runs on its stream
        if kind not in P2P_KINDS:
            raise ScheduleError(f"{op.label} on rank {op.rank}: transport=memcpy copies point to point only (send, "
                                f"recv, a copy to a peer), not a collective", op.loc, rank=op.rank,
                                hint="give the collective transport=nccl or transport=gloo")  # fmt: skip
        network.check_copy(op)
    else:
        queue = rank_queues.get(group)
        if queue is None:
            queue = rank_queues[group] = Queue(op.rank, group, typecode, len(queue_list))
            queue_list.append(queue)
        q = queue.number
    # The op's algorithm and protocol: the network's choice, or what it forces (checked there).
    # A point-to-point op's depends on its pair (the link between them), so on its rank too.
    peer = spec.peer
    shape = (group, kind, spec.size_bytes, transport, spec.algo, spec.proto, peer, -1 if peer is None else op.rank)
    pick = chosen.get(shape)
    if pick is None:
        algo, proto = network.choose(op, group_ranks[group])
        pick = chosen[shape] = (ALGOS.index(algo), PROTOS.index(proto))
    # Sends and recvs pair first in, first out per (src, dst, group).
    key = own = None
    if kind is _SEND:
        key, own = (op.rank, peer, group, _RECV), (op.rank, peer, group, _SEND)
    elif kind is _RECV:
        key, own = (peer, op.rank, group, _SEND), (peer, op.rank, group, _RECV)
    return kind, code, True, transport is _MEMCPY and kind in P2P_KINDS, q, *pick, key, own, transport is _GLOO


def _check_transport(machine: Machine, op: Op) -> None:
    if machine.transport(op.transport) is None:
        raise MachineError(
            f"machine {machine.name} has no '{op.transport.value}' transport, which {op.kind.value} "
            f"{op.name} on rank {op.rank} uses (machine transports: {', '.join(t.value for t, _ in machine.transports)})",
            op.loc, rank=op.rank, hint="pick another --machine, or set the schedule's `transport:`",
        )  # fmt: skip


def _check_rate(machine: Machine, op: Op) -> None:
    if machine.device.tflops(op.dtype) is None:
        rates = ", ".join(d.value for d, _ in machine.device.peak_tflops)
        raise MachineError(
            f"machine {machine.name} has no {op.dtype.value} compute rate for compute {op.name} on rank {op.rank} "
            f"(it lists: {rates})",
            op.loc, rank=op.rank, hint="give the op a duration, another dtype=, or add the rate to the machine",
        )  # fmt: skip
