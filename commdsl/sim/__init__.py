"""The simulator: execution semantics of docs/simulator.md in SimPy (no torch).

    from commdsl.sim import simulate
    result = simulate(program, machine)        # raises DeadlockError if it cannot finish
    result.timeline.write("trace.json")
"""

# First: whether the engine's modules load compiled or from the source is decided before
# anything imports them.
from commdsl.sim import native  # isort: skip

ENGINE_BUILD = native.select()
"""The engine this process runs (`commdsl.sim.native`)."""

from commdsl.sim.analytic import AnalyticNetwork
from commdsl.sim.flow import FlowNetwork, SteppedFlowNetwork
from commdsl.sim.models import DEFAULT_NETWORK, NETWORKS
from commdsl.sim.network import Network, Transfer
from commdsl.sim.simulate import SimResult, check_deadlock, simulate

__all__ = [
    "DEFAULT_NETWORK", "ENGINE_BUILD", "NETWORKS", "AnalyticNetwork", "FlowNetwork", "Network", "SimResult", "SteppedFlowNetwork",
    "Transfer", "check_deadlock", "simulate",
]  # fmt: skip
