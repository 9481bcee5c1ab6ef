"""The network models by name (`--network NAME`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from commdsl.arguments import describe
from commdsl.errors import UsageError
from commdsl.sim.analytic import AnalyticNetwork
from commdsl.sim.flow import FlowNetwork, SteppedFlowNetwork
from commdsl.sim.network import Network

NETWORKS: Mapping[str, type[Network]] = MappingProxyType(
    {"flow": FlowNetwork, "analytic": AnalyticNetwork, "flow-steps": SteppedFlowNetwork}
)
"""`--network NAME` -> model (read-only)."""

DEFAULT_NETWORK = "flow"


def check_network(network: object) -> str:
    """`network` where it names a network model; else a `UsageError` listing them."""
    if not isinstance(network, str):
        raise UsageError(f"network must be the name of a network model ({', '.join(NETWORKS)}), got {describe(network)}")
    if network not in NETWORKS:
        raise UsageError(f"unknown network model '{network}' (known: {', '.join(NETWORKS)})")
    return network
