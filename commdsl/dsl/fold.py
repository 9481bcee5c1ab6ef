"""Fold the replicas along a mesh axis: expand one replica, verify it stands for the others.

Data parallelism makes `dp` copies of one model-parallel mesh: the ranks that differ only
in their `dp` coordinate run the same program up to renaming (their rank, their pipeline
peers and tensor-parallel groups are shifted by a multiple of the axis's stride; the
data-parallel groups span every replica). `commdsl check` and `commdsl simulate` then
need only the representative replica (the ranks whose coordinate on the axis is 0): its
ops are expanded, and the others are described by a `Fold` (`commdsl.ir`) rather than by
ops of their own.

Folding is verified, never assumed. An axis is folded only if

  * the program never reads what tells the replicas apart: not `rank` (nor `rank_at()`
    without coordinates), not the axis's `.rank`, not a `rank_at(AXIS=...)` that sets its
    coordinate, not a custom group's `.rank` or `.size`, not `world.rank` (the compiler
    notes each read, `ProgramCompiler.rank_reads`);
  * the representative's ops keep to its replica: every peer is a rank of the replica,
    every group either lies inside it or spans every replica the same way (the axis's
    groups, the world), and a group that spans replicas carries no rooted collective (its
    root would be one replica's rank);
  * expanding the next replica (coordinate 1) and the last one gives, op for op, the
    representative's ops renamed: same kinds, names, sizes, streams, handles and waits,
    peers and roots shifted, groups mapped to the shifted group;
  * no rank warns (a warning names its rank).

Otherwise the program is expanded for every rank as usual, and `Program.fold_note` says
why it was not folded. The one axis folded is the outermost that passes the first test
(the replicas furthest apart in rank order: on a machine of identical nodes filled in rank
order, on nodes of their own soonest). Where a replica's ranks are not a whole number of
a node's GPUs (`load_schedule`'s `fold_unit`), the representative is the fewest
consecutive replicas that are, and "replica" above reads "that block of replicas"; where
only the whole axis is, nothing is folded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from commdsl.dsl.expand import WorldLayout
from commdsl.ir import ROOTED_KINDS, Fold, Group, Op


def fold_axis(layout: WorldLayout, rank_reads: Iterable[tuple[str, ...]]) -> tuple[str | None, str]:
    """(the mesh axis to fold, "") or (None, why no axis may be folded; "" where there is
    nothing to fold: no mesh axis of two or more ranks), from what the program reads of
    its rank (`ProgramCompiler.rank_reads`)."""
    reads = set(rank_reads)
    if all(size < 2 for _, size in layout.mesh):
        return None, ""
    if ("rank",) in reads:
        return None, "the program reads `rank`"
    if ("group", "world", "rank") in reads:
        return None, "the program reads `world.rank`"
    axes = dict(layout.mesh)
    custom = sorted(f"{r[1]}.{r[2]}" for r in reads if r[0] == "group" and r[1] not in axes and r[1] != "world")
    if custom:
        return None, f"the program reads `{custom[0]}` (a custom group's place may differ between replicas)"
    why = []
    for axis, size in layout.mesh:
        if size < 2:
            continue
        if ("group", axis, "rank") in reads:
            why.append(f"`{axis}.rank` is read")
        elif ("rank_at", axis) in reads:
            why.append(f"`rank_at({axis}=...)` is read")
        else:
            return axis, ""
    return None, "every mesh axis of two or more ranks is told apart (" + "; ".join(why) + ")"


def make_fold(layout: WorldLayout, axis: str, unit: int = 1) -> Fold:
    """The `Fold` of `axis`: how many copies of the representative, their stride and the
    representative's ranks. With `unit` (a node's GPUs) the representative holds the
    fewest consecutive replicas whose ranks are a whole number of `unit` apart (2 where
    a replica of TP 4 fills half an 8-GPU node), so each copy has nodes of its own; one
    replica where no such block divides the axis."""
    stride = 1
    sizes = dict(layout.mesh)
    for name, size in reversed(layout.mesh):
        if name == axis:
            break
        stride *= size
    size = sizes[axis]
    block = next((k for k in range(1, size + 1) if size % k == 0 and k * stride % unit == 0), 1)
    replicas, stride = size // block, stride * block
    ranks = tuple(r for r in range(layout.world_size) if r // stride % replicas == 0)
    return Fold(axis, replicas, stride, ranks, block)


class FoldGroups:
    """Where each group lies with respect to the fold, and its image in another replica."""

    def __init__(self, layout: WorldLayout, fold: Fold):
        self.fold = fold
        self.by_id: dict[str, Group] = {g.id: g for groups in layout.families.values() for g in groups}
        self._by_ranks: dict[tuple[int, ...], str] | None = None
        self._kind: dict[str, str] = {}

    def kind(self, group_id: str) -> str:
        """"inside" (every member in the representative replica), "spans" (the same
        members in every replica, shifted), or "mixed"."""
        out = self._kind.get(group_id)
        if out is None:
            fold = self.fold
            ranks = self.by_id[group_id].ranks
            present = fold.present(ranks)
            if len(present) == len(ranks):
                out = "inside"
            else:
                images = {r + k * fold.stride for r in present for k in range(fold.replicas)}
                out = "spans" if images == set(ranks) and len(ranks) == len(present) * fold.replicas else "mixed"
            self._kind[group_id] = out
        return out

    def image(self, group_id: str, shift: int) -> str | None:
        """The id of the group `group_id` (of the representative replica) becomes `shift`
        ranks on: itself if it spans the replicas; None if no group has those ranks."""
        if self.kind(group_id) == "spans":
            return group_id
        if self._by_ranks is None:
            self._by_ranks = {g.ranks: g.id for g in self.by_id.values()}
        return self._by_ranks.get(tuple(r + shift for r in self.by_id[group_id].ranks))


def representative_problem(per_rank: list[tuple[Op, ...]], fold: Fold, groups: FoldGroups) -> str | None:
    """Why the representative replica's ops cannot stand for the others (a peer outside
    the replica, a group across replicas it does not span, a rooted collective on a group
    across replicas, a group inside the replica that another replica
    has no copy of); None if they can."""
    inside = set(fold.ranks)
    used: set[str] = set()
    for rank in fold.ranks:
        seen: set[tuple] = set()
        for op in per_rank[rank]:
            spec = op.spec
            key = (id(spec), op.kind)
            if key in seen:
                continue
            seen.add(key)
            if spec.peer is not None and spec.peer not in inside:
                return f"rank {rank}'s {op.label} ({op.loc}) has peer {spec.peer}, in replica {fold.replica_of(spec.peer)}"
            if spec.group is None:
                continue
            where = groups.kind(spec.group)
            if where == "mixed":
                return f"rank {rank}'s {op.label} ({op.loc}) is on group {spec.group}, which neither lies in one replica nor spans them all alike"
            if where == "spans" and op.kind in ROOTED_KINDS:  # (a send's peer is in the replica: checked above)
                return f"rank {rank}'s {op.label} ({op.loc}) is a {op.kind.value} on group {spec.group}, across replicas"
            used.add(spec.group)
    for group_id in sorted(used):  # a group inside the replica has its copy in every replica (custom groups may not)
        if groups.kind(group_id) == "inside":
            for replica in range(1, fold.replicas):
                if groups.image(group_id, replica * fold.stride) is None:
                    return f"group {group_id} has no copy in replica {replica} (its ranks shifted by {replica * fold.stride})"
    return None


def replica_difference(per_rank: list[tuple[Op, ...]], fold: Fold, groups: FoldGroups, replica: int) -> str | None:
    """How replica `replica`'s ops differ from the representative's renamed (the first
    difference), or None where they are the same."""
    shift = replica * fold.stride
    expected: dict[int, object] = {}  # id of a representative spec -> the spec renamed
    for rank in fold.ranks:
        ours, theirs = per_rank[rank], per_rank[rank + shift]
        other = rank + shift
        if len(ours) != len(theirs):
            return f"rank {other} makes {len(theirs)} ops but rank {rank} makes {len(ours)}"
        for a, b in zip(ours, theirs):
            spec = expected.get(id(a.spec))
            if spec is None:
                spec = _renamed(a.spec, shift, groups)
                expected[id(a.spec)] = spec
            if (a.kind is not b.kind or a.name != b.name or a.index != b.index or a.handle != b.handle or a.microbatch != b.microbatch
                    or a.batch != b.batch or a.waits_for != b.waits_for or (b.spec is not spec and b.spec != spec)):  # fmt: skip
                return f"rank {other}'s op {b.index} ({b.label}, {b.loc}) is not rank {rank}'s ({a.label}, {a.loc}) renamed"
    return None


def _renamed(spec, shift: int, groups: FoldGroups):
    """`spec` as the replica `shift` ranks on makes it; None where it has no image."""
    changes: dict[str, object] = {}
    if spec.peer is not None:
        changes["peer"] = spec.peer + shift
    if spec.group is not None:
        image = groups.image(spec.group, shift)
        if image is None:
            return None
        changes["group"] = image
        if spec.root is not None and groups.kind(spec.group) == "inside":
            changes["root"] = spec.root + shift
    return replace(spec, **changes) if changes else spec
