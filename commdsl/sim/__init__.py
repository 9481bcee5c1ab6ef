"""The simulator: execution semantics of docs/simulator.md in SimPy (no torch).

    from commdsl.sim import simulate
    result = simulate(program, machine)        # raises DeadlockError if it cannot finish
    result.timeline.write("trace.json")
"""

from commdsl import ENGINE_BUILD  # the build this process runs (`commdsl.native`)

from commdsl.sim.analytic import AnalyticNetwork
from commdsl.sim.flow import FlowNetwork, SteppedFlowNetwork
from commdsl.sim.models import DEFAULT_NETWORK, NETWORKS
from commdsl.sim.network import Network, Transfer
from commdsl.sim.simulate import SimResult, check_deadlock, simulate

__all__ = [
    "DEFAULT_NETWORK", "ENGINE_BUILD", "NETWORKS", "AnalyticNetwork", "FlowNetwork", "Network", "SimResult", "SteppedFlowNetwork",
    "Transfer", "check_deadlock", "simulate",
]  # fmt: skip
