"""A global rank that `rank_at()` gives while a replica is expanded to stand for others.

Folding (`commdsl.dsl.fold`) expands the ranks of one replica and lets them stand for
every replica along a mesh axis: rank r of replica k runs what rank r of replica 0 runs,
renamed. `rank_at(pp=...)` keeps the caller's coordinate on the folded axis, so its value
differs between replicas by the replica's offset; as a peer or a root that is the renaming
(the representative's op names the representative's peer). Anything else done with it
(compare it, compute with it, put it in a name) could make replicas behave differently in
a way no sample of replicas is sure to show (`if rank_at(pp=0) == 1000`). So in the
representative's expansion `rank_at()` returns a `ReplicaRank`: an int that notes where
it came from in `uses` whenever it is used for anything but a peer or a root (the op
statements take it with `plain`), and folding is then refused.
"""

from __future__ import annotations

from commdsl.errors import SourceLoc


class ReplicaRank(int):
    """An int from `rank_at()` (see the module doc); `uses` hears its `loc` when it is
    used as a number."""

    def __new__(cls, value: int, uses: list[SourceLoc], loc: SourceLoc) -> ReplicaRank:
        out = super().__new__(cls, value)
        out.uses = uses
        out.loc = loc
        return out


def plain(value: object) -> object:
    """`value` as an op takes a peer or a root: a `ReplicaRank` as the plain int it holds
    (not a use), anything else as it is."""
    return int.__int__(value) if value.__class__ is ReplicaRank else value


def _noting(name: str):
    method = getattr(int, name)

    def use(self, *args):
        self.uses.append(self.loc)
        return method(int.__int__(self), *(plain(a) for a in args))

    use.__name__ = name
    return use


# Every way of using an int as a number notes the use; the results are plain values.
for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__index__", "__int__",
              "__float__", "__str__", "__repr__", "__format__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__",
              "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__",
              "__divmod__", "__rdivmod__", "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__", "__invert__", "__and__",
              "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__",
              "__rrshift__", "__round__", "__trunc__", "__floor__", "__ceil__"):  # fmt: skip
    setattr(ReplicaRank, _name, _noting(_name))
del _name
