"""The simulator: execution semantics of DESIGN.md in SimPy (no torch).

    from commdsl.sim import simulate
    result = simulate(program, machine)        # raises DeadlockError if it cannot finish
    result.timeline.write("trace.json")
"""

from commdsl.sim.network import NETWORKS, AnalyticNetwork, Network, Transfer
from commdsl.sim.simulate import SimResult, check_deadlock, simulate

__all__ = ["NETWORKS", "AnalyticNetwork", "Network", "SimResult", "Transfer", "check_deadlock", "simulate"]
