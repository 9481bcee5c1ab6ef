"""Rank templates: expand a program that never reads its rank once, copy it to every rank.

A program that reads neither `rank` nor a group's `.rank` or `.size` nor `rank_at()` (the
compiler notes whether it does: `ProgramCompiler.reads_rank`) computes the same values
on every rank, so every rank makes the same ops but for the op's rank and its groups (a
mesh axis has one group per coordinate of the other axes). Data-parallel programs are
like that. Such a program is expanded for rank 0 only; every other rank gets a copy of
rank 0's ops with its own rank and groups, which costs making the ops and nothing else:
no statement runs again.

A copy is made only where it is certainly what expanding the rank would give:

  * rank 0 made no send, recv, peer copy or rooted collective (their checks compare the
    rank with its peers and roots) and no warning (a warning names its rank);
  * the rank belongs to a group of every family rank 0's ops use, of the same size as
    rank 0's (a collective's size must split into one chunk per member);
  * the budget has room for the rank's ops and loop steps, as rank 0 counted them.

Otherwise the rank is expanded as usual, and says whatever it has to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from commdsl.dsl.expand import ExpansionBudget, InternTables, RankExpander, WorldLayout
from commdsl.ir import P2P_KINDS, ROOTED_KINDS, CopyDir, Op, OpKind, OpSpec, op_on_rank


@dataclass
class RankTemplate:
    """Rank 0's expansion of a rank-free program, and what copying it to a rank needs."""

    ops: tuple[Op, ...]
    steps: int
    """Loop iterations and block calls rank 0 counted (each copy counts as many)."""
    family_of: dict[str, str]
    """Group id of a group rank 0's ops use -> its family."""
    sizes: dict[str, int]
    """Family -> the size of rank 0's group in it."""
    layout: WorldLayout
    tables: InternTables
    _specs: dict[tuple[int, str], OpSpec] = field(default_factory=dict)
    """(id of one of rank 0's specs, a group id) -> the spec with that group."""

    @classmethod
    def of(cls, expander: RankExpander, steps: int) -> RankTemplate | None:
        """The template of rank 0's finished expansion, or None if it cannot be copied."""
        if expander.warnings:
            return None
        groups = {group.id: family for family, (group, _) in expander.group_of.items()}
        family_of: dict[str, str] = {}
        for op in expander.ops:
            kind, spec = op.kind, op.spec
            if kind in P2P_KINDS or kind in ROOTED_KINDS or (kind is OpKind.COPY and spec.copy_dir is CopyDir.PEER):
                return None
            if spec.group is not None:
                family_of[spec.group] = groups[spec.group]
        sizes = {family: len(expander.group_of[family][0].ranks) for family in family_of.values()}
        return cls(tuple(expander.ops), steps, family_of, sizes, expander.layout, expander.tables)

    def copy_for(self, rank: int, budget: ExpansionBudget) -> tuple[Op, ...] | None:
        """Rank `rank`'s ops, charged to `budget`; None if it must be expanded instead."""
        membership = self.layout.membership
        group_ids: dict[str, str] = {}
        for family, size in self.sizes.items():
            found = membership[family].get(rank)
            if found is None or len(found[0].ranks) != size:
                return None
            group_ids[family] = found[0].id
        if budget.ops + len(self.ops) > budget.max_ops or budget.steps + self.steps > budget.max_steps:
            return None
        budget.ops += len(self.ops)
        budget.steps += self.steps
        renamed = {gid: group_ids[family] for gid, family in self.family_of.items() if group_ids[family] != gid}
        if not renamed:
            return tuple([op_on_rank(op, rank, op.spec) for op in self.ops])
        spec_for = self._spec_for
        return tuple([op_on_rank(op, rank, spec_for(op.spec, renamed)) for op in self.ops])

    def _spec_for(self, spec: OpSpec, renamed: dict[str, str]) -> OpSpec:
        """`spec` with its group renamed as `renamed` says (if it has one)."""
        group = spec.group
        if group is None or group not in renamed:
            return spec
        key = (id(spec), renamed[group])
        out = self._specs.get(key)
        if out is None:
            out = replace(spec, group=renamed[group])
            out = self._specs[key] = self.tables.specs.setdefault(out, out)
        return out
