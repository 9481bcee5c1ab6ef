"""Collective algorithms: how many latency-bound steps and how many bytes each takes.

Every communication op is reduced to a `CommPlan`: `latency_steps` sequential
latency-bound steps, and `serial_bytes`, the bytes the busiest rank pushes through its
link one after another. The analytic network times it as

    time = latency_steps * latency + serial_bytes / bandwidth

which is the textbook (and NCCL tuning-model) formula of each algorithm. Sizes follow
the nccl-tests convention (`commdsl.ir`): S is the largest buffer, n the group size.

    op              algo    latency_steps   serial_bytes       nccl-tests busbw factor
    all_reduce      ring    2(n-1)          2(n-1)/n * S       2(n-1)/n
    all_reduce      tree    2*ceil(log2 n)  2 * S              (double binary tree, see below)
    all_gather      ring    n-1             (n-1)/n * S        (n-1)/n
    reduce_scatter  ring    n-1             (n-1)/n * S        (n-1)/n
    broadcast/reduce chain  n-2+k           (n-2+k)/k * S      1 (as k grows)
    all_to_all      direct  1               (n-1)/n * S        (n-1)/n
    gather/scatter  direct  1               (n-1)/n * S        (n-1)/n
    barrier         ring    2(n-1)          0                  -
    send/recv       direct  1               S                  1

Broadcast and reduce are a chain along the ring (NCCL calls it RING) pipelined in k =
ceil(S / chunk_bytes) chunks: the last rank receives the first chunk after n-1 steps and
one more chunk per step, so n-2+k steps each moving S/k. With zero latency the time of a
ring or direct algorithm is S * factor / bandwidth, i.e. bus bandwidth == link bandwidth.

This is the model of machines without NCCL's (no `nccl:` in the machine file). With it,
an NCCL transfer's plan carries NCCL's protocol (`CommPlan.proto`) and the networks time
it by `commdsl.sim.nccl` and `commdsl.sim.nccl_flows` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commdsl.errors import ScheduleError
from commdsl.ir import Algo, Op, OpKind, Protocol

DEFAULT_ALGO = {
    OpKind.ALL_REDUCE: Algo.RING,
    OpKind.ALL_GATHER: Algo.RING,
    OpKind.REDUCE_SCATTER: Algo.RING,
    OpKind.BROADCAST: Algo.CHAIN,
    OpKind.REDUCE: Algo.CHAIN,
    OpKind.ALL_TO_ALL: Algo.DIRECT,
    OpKind.GATHER: Algo.DIRECT,
    OpKind.SCATTER: Algo.DIRECT,
    OpKind.BARRIER: Algo.RING,
    OpKind.SEND: Algo.DIRECT,
    OpKind.RECV: Algo.DIRECT,
}
"""The algorithm used when an op names none: what NCCL picks within one node for
large messages (ring), a pipelined chain for rooted ops, direct sends for all_to_all."""

SUPPORTED_ALGOS = {
    OpKind.ALL_REDUCE: frozenset({Algo.RING, Algo.TREE}),
    OpKind.ALL_GATHER: frozenset({Algo.RING}),
    OpKind.REDUCE_SCATTER: frozenset({Algo.RING}),
    # NCCL names the pipelined chain of broadcast/reduce RING; both words mean it here.
    OpKind.BROADCAST: frozenset({Algo.CHAIN, Algo.RING}),
    OpKind.REDUCE: frozenset({Algo.CHAIN, Algo.RING}),
    OpKind.ALL_TO_ALL: frozenset({Algo.DIRECT}),
    OpKind.GATHER: frozenset({Algo.DIRECT}),
    OpKind.SCATTER: frozenset({Algo.DIRECT}),
    OpKind.BARRIER: frozenset({Algo.RING}),
    OpKind.SEND: frozenset({Algo.DIRECT}),
    OpKind.RECV: frozenset({Algo.DIRECT}),
}

_BUS_FACTOR = {
    OpKind.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
    OpKind.ALL_GATHER: lambda n: (n - 1) / n,
    OpKind.REDUCE_SCATTER: lambda n: (n - 1) / n,
    OpKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    OpKind.GATHER: lambda n: (n - 1) / n,
    OpKind.SCATTER: lambda n: (n - 1) / n,
    OpKind.BROADCAST: lambda n: 1.0,
    OpKind.REDUCE: lambda n: 1.0,
    OpKind.SEND: lambda n: 1.0,
    OpKind.RECV: lambda n: 1.0,
}


def bus_factor(kind: OpKind, n: int) -> float:
    """nccl-tests' busbw = algbw * factor (see its doc/PERFORMANCE.md)."""
    return _BUS_FACTOR[kind](n)


@dataclass(frozen=True, slots=True)
class CommPlan:
    algo: Algo
    latency_steps: int
    """Sequential latency-bound steps."""
    serial_bytes: float
    """Bytes the busiest rank moves one after another (sets the bandwidth term)."""
    proto: Protocol | None = None
    """NCCL's protocol (machines with an `nccl:` model); None: the transport's parameters."""


def resolve_algo(op: Op) -> Algo:
    """The op's algorithm; an algorithm the op kind has no model for is an error."""
    if op.algo is None:
        return DEFAULT_ALGO[op.kind]
    if op.algo not in SUPPORTED_ALGOS[op.kind]:
        known = ", ".join(sorted(a.value for a in SUPPORTED_ALGOS[op.kind]))
        raise ScheduleError(f"the simulator has no {op.algo.value} algorithm for {op.kind.value} (it models: {known})", op.loc, rank=op.rank)
    return op.algo


def plan(kind: OpKind, algo: Algo, n: int, size_bytes: float, chunk_bytes: int, proto: Protocol | None = None) -> CommPlan:
    """Steps and bytes of one op of `kind` on `n` ranks moving `size_bytes` (see module doc)."""
    p = _plan(kind, algo, n, size_bytes, chunk_bytes)
    return p if proto is None else CommPlan(p.algo, p.latency_steps, p.serial_bytes, proto)


def _plan(kind: OpKind, algo: Algo, n: int, size_bytes: float, chunk_bytes: int) -> CommPlan:
    if kind is OpKind.SEND or kind is OpKind.RECV:
        return CommPlan(algo, 1, float(size_bytes))
    if n <= 1:
        return CommPlan(algo, 0, 0.0)
    s = float(size_bytes)
    if kind is OpKind.ALL_REDUCE:
        if algo is Algo.TREE:
            # Double binary tree: reduce up and broadcast down, log-depth latency; each rank
            # sends about S per tree direction in total (half in each of the two trees).
            return CommPlan(algo, 2 * math.ceil(math.log2(n)), 2.0 * s)
        return CommPlan(algo, 2 * (n - 1), 2 * (n - 1) * s / n)
    if kind is OpKind.BARRIER:
        return CommPlan(algo, 2 * (n - 1), 0.0)
    if kind is OpKind.ALL_GATHER or kind is OpKind.REDUCE_SCATTER:
        return CommPlan(algo, n - 1, (n - 1) * s / n)
    if kind is OpKind.BROADCAST or kind is OpKind.REDUCE:
        chunks = max(1, math.ceil(s / chunk_bytes))
        steps = n - 2 + chunks
        return CommPlan(algo, steps, steps * s / chunks)
    if kind in (OpKind.ALL_TO_ALL, OpKind.GATHER, OpKind.SCATTER):
        return CommPlan(algo, 1, (n - 1) * s / n)
    raise AssertionError(f"no plan for {kind}")


def edges(kind: OpKind, algo: Algo, ranks: tuple[int, ...], size_bytes: float, root: int | None, p: CommPlan) -> list[tuple[int, int, float]]:
    """The bytes an algorithm moves between each ordered pair of ranks over the whole op:
    (src, dst, bytes), ranks global. The flow network routes each pair and charges its
    bytes to every link on the path; `p.serial_bytes` is the unit the op progresses in.

      ring (all_reduce, all_gather, reduce_scatter): rank i -> i+1 in group order, each
        edge carrying the serial bytes;
      tree (all_reduce): two binary trees (heap order over the group, and its mirror),
        each reducing S/2 up and broadcasting S/2 down, so every rank sends and receives
        about 2S in total, the serial bytes;
      chain (broadcast, reduce): root -> next -> ... along the group (reduce: towards the
        root); each edge is charged the serial bytes, (n-2+k)/k * S, so the pipeline fill
        costs bandwidth as in the analytic formula;
      direct: all_to_all every pair S/n; gather every rank -> root S/n; scatter root ->
        every rank S/n; send src -> dst S.
    """
    n = len(ranks)
    s = float(size_bytes)
    if kind is OpKind.SEND or kind is OpKind.RECV:
        return [(ranks[0], ranks[1], s)]
    if n <= 1 or p.serial_bytes == 0:
        return []
    if algo is Algo.TREE:
        out: dict[tuple[int, int], float] = {}
        for order in (ranks, ranks[::-1]):
            for i in range(1, n):
                child, parent = order[i], order[(i - 1) // 2]
                out[(child, parent)] = out.get((child, parent), 0.0) + s / 2
                out[(parent, child)] = out.get((parent, child), 0.0) + s / 2
        return [(a, b, v) for (a, b), v in out.items()]
    if kind in (OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        return [(ranks[i], ranks[(i + 1) % n], p.serial_bytes) for i in range(n)]
    if kind is OpKind.BROADCAST or kind is OpKind.REDUCE:
        start = ranks.index(root) if root in ranks else 0
        chain = ranks[start:] + ranks[:start]
        pairs = [(chain[i], chain[i + 1]) for i in range(n - 1)]
        if kind is OpKind.REDUCE:
            pairs = [(b, a) for a, b in reversed(pairs)]
        return [(a, b, p.serial_bytes) for a, b in pairs]
    if kind is OpKind.ALL_TO_ALL:
        return [(a, b, s / n) for a in ranks for b in ranks if a != b]
    if kind is OpKind.GATHER:
        return [(a, root, s / n) for a in ranks if a != root]
    if kind is OpKind.SCATTER:
        return [(root, b, s / n) for b in ranks if b != root]
    raise AssertionError(f"no edges for {kind} {algo}")
