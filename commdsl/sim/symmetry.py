"""Interchangeable ranks: simulate one, copy its timeline to the others.

In an SPMD program every rank often runs the same ops (data parallelism, a chain of
collectives): same kinds, streams, sizes, waits and handles, one statement after
another, every comm op a collective over all ranks. On a machine whose speeds on one
rank do not depend on work on another (`Contention.rank_local`), such ranks go through
identical timelines: they issue at the same instants, every collective starts when all
of them have arrived, at one instant, and ends for all of them together (the network
times a collective as one transfer). The engine then runs rank 0 alone, starts each
collective with every member's op as soon as rank 0's arrives, and copies rank 0's per-op
arrays to the other ranks (`replicate`); the network sees the same transfers at the same
times as in a run of every rank, so its records are the same too. `wire()` likewise
wires rank 0 and derives the others' facts from it.

Anything that could tell ranks apart disables this: point-to-point ops (a peer), a
collective over a subgroup, ops that differ in any field but their rank and name, random
noise (each rank draws its own), compute that slows transfers (the network then sees
which ranks compute). The equality with a run of every rank is tested on every bundled
schedule (tests/test_symmetry.py).
"""

from __future__ import annotations

from array import array
from itertools import compress, repeat
from operator import add, attrgetter, lt

from commdsl.ir import COLLECTIVE_KINDS, Op, OpKind, Program

_SPEC, _KIND = attrgetter("spec"), attrgetter("kind")
_EXTRA = attrgetter("handle", "microbatch", "batch", "waits_for")
"""The per-op fields besides kind that may decide timing (an op's other fields are in its
spec); only ops of a subclass of `Op` store them (a plain `Op` has the defaults)."""
_FOLDABLE_KINDS = frozenset(k for k in OpKind if not k.is_comm) | COLLECTIVE_KINDS
"""Kinds a folded rank may run: no point-to-point op (its timing depends on its peer)."""


def interchangeable(program: Program) -> bool:
    """Every rank runs what rank 0 runs (see the module doc): the same ops but for rank
    and name, no point-to-point op, every comm op in a group of all ranks. The machine's
    side (`Contention.rank_local`) is the caller's to check."""
    world = program.world_size
    if world < 2:
        return False
    first = program.ops[0]
    m = len(first)
    if m == 0 or any(len(rank_ops) != m for rank_ops in program.ops):
        return False
    kinds = list(map(_KIND, first))
    if not set(kinds) <= _FOLDABLE_KINDS:
        return False
    specs = list(map(_SPEC, first))
    everyone = tuple(range(world))
    group_ranks = {g.id: tuple(sorted(g.ranks)) for g in program.groups}
    for spec in set(specs):
        if spec.peer is not None or (spec.group is not None and group_ranks.get(spec.group) != everyone):
            return False
    spec_ids = list(map(id, specs))
    types = list(map(type, first))
    stored = [i for i, t in enumerate(types) if t is not Op]  # ops that store their own extra fields
    extras = list(map(_EXTRA, map(first.__getitem__, stored)))
    for rank_ops in program.ops[1:]:
        if list(map(_KIND, rank_ops)) != kinds or list(map(type, rank_ops)) != types:
            return False
        if list(map(id, map(_SPEC, rank_ops))) != spec_ids and list(map(_SPEC, rank_ops)) != specs:
            return False  # specs are interned (one object per value), but equal values do too
        if list(map(_EXTRA, map(rank_ops.__getitem__, stored))) != extras:
            return False
    return True


def shifted(numbers: array, offset: int) -> array:
    """`numbers` (each a number or -1 for none) plus `offset`, the -1s kept."""
    out = array(numbers.typecode, map(add, numbers, repeat(offset)))
    for i in compress(range(len(numbers)), map(lt, numbers, repeat(0))):
        out[i] = -1
    return out


def copy_rank_0(world: int, m: int, per_op: list) -> None:
    """Per-op arrays (ranks of `m` ops laid out one after another) whose entries are the
    same on every rank: rank 0's copied to ranks 1 .. world - 1, in place."""
    for a in per_op:
        a[m:] = a[:m] * (world - 1)


def replicate(world: int, m: int, times: list[array], state: bytearray, cause: array, nominal_us: dict[int, float]) -> None:
    """Copy rank 0's outcome (its first `m` entries) to ranks 1 .. world - 1 in place:
    the `times` arrays and `state` as they are, `cause` (an op number, or -1) and
    `nominal_us` (op number -> time) shifted to each rank's ops."""
    copy_rank_0(world, m, [*times, state])
    own = cause[:m]
    for r in range(1, world):
        cause[r * m : (r + 1) * m] = shifted(own, r * m)
    for g, us in list(nominal_us.items()):
        for r in range(1, world):
            nominal_us[g + r * m] = us
