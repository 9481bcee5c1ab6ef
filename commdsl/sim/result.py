"""`SimOutcome`: what one simulation produced, the type every output reads.

The modules import one way: this one holds the outcome's data; `commdsl.sim.summary`
(the summary), `commdsl.sim.trace` (the predicted timeline and its trace) and
`commdsl.sim.gantt` read it; `commdsl.sim.simulate` runs the engine and returns a
`SimResult`, an outcome with those outputs as methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commdsl.ir import Op, Program
from commdsl.machine.model import Machine
from commdsl.sim.entities import RawResult
from commdsl.sim.folding import own_channels
from commdsl.sim.network import FlowStat, LinkStat, Network


@dataclass(frozen=True)
class SimOutcome:
    """A simulation's outcome: per-op times (`raw`), the makespan and critical path, the
    network's per-flow and per-link statistics: what the summary, the predicted
    timeline and trace and the Gantt chart are made from."""

    program: Program
    machine: Machine
    network: str
    raw: RawResult
    network_meta: dict
    critical_path: list[int]
    """Global op numbers (see `op_at`) from the first to the last op of the path."""
    makespan_us: float
    warnings: list[str] = field(default_factory=list)
    network_model: Network | None = field(default=None, repr=False)
    """The network that timed the transfers: per-flow and per-link statistics."""
    nominal_us: dict[int, float] = field(default_factory=dict, repr=False)
    """Compute ops (g) slowed by comm kernels (interference): their time without it."""
    sampling: dict = field(default_factory=dict)
    """A sampled simulation's `samples`, `seed` and `sample_makespans_us`; empty otherwise."""

    def flow_stats(self) -> list[FlowStat]:
        return self.network_model.flow_stats() if self.network_model is not None else []

    def link_stats(self) -> list[LinkStat]:
        """Every link direction that carried bytes; of a folded program, those of the
        representative replica's devices (`commdsl.sim.folding.own_channels`)."""
        if self.network_model is None:
            return []
        return self.network_model.link_stats(self.makespan_us, own_channels(self.program, self.network_model))

    def op_at(self, g: int) -> Op:
        return self.raw.ops[g]
