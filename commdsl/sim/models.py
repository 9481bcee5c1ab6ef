"""The network models by name (`--network NAME`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from commdsl.sim.analytic import AnalyticNetwork
from commdsl.sim.flow import FlowNetwork, SteppedFlowNetwork
from commdsl.sim.network import Network

NETWORKS: Mapping[str, type[Network]] = MappingProxyType(
    {"flow": FlowNetwork, "analytic": AnalyticNetwork, "flow-steps": SteppedFlowNetwork}
)
"""`--network NAME` -> model (read-only)."""

DEFAULT_NETWORK = "flow"
