"""Read `nccl:` of a machine file into an `NcclConfig`, every mistake named with its line.

    nccl:
      generation: hopper          # volta | ampere | hopper | blackwell (NCCL's tuning tables)
      version: 2.24.3             # the NCCL release (optional; its table chooses; default the newest modelled)
      channels: 24                # ring/tree channels
      cpu: intel                  # intel | amd | other
      nvls: true                  # NVLink SHARP (needs an nvswitch next to every GPU)
      nvls_channels: 16
      nvls_latency_us: 6
      nvls_efficiency: 0.85
      collnet: false              # in-network reduction between nodes
      net_device_offload: false   # the GPU unpacks received data (GPUDirect-TCPX): no PAT
      p2p_channels: 32
      p2p_channels_per_peer: 32
      p2p_channel_bandwidth_gb_per_s: 10
      p2p_net_efficiency: 0.78
      net_latency_us: 0           # the network's own latency per message (TCPXO: tens of us)
      tree_net_scale: 1           # a tree level across nodes over NCCL's own figure for it
      graph_scale: {nic: 0.9}     # NCCL's search sees the NICs at 0.9 x their rate (calibrated machines)
      launch_us: 4.2
      launch_per_channel_us: 0.04
      algo: [ring, tree]          # as NCCL_ALGO (optional)
      proto: [ll, ll128, simple]  # as NCCL_PROTO (optional)
      protocols:                  # each optional; missing values come from NCCL's table
        ll: {base_latency_us: 6.6, hop_latency_us: {nvlink: 0.6, pcie: 1.0, network: 2.7},
             efficiency: 0.5, channel_bandwidth_gb_per_s: 5.9}
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Protocol as Interface

import yaml

from commdsl.errors import did_you_mean
from commdsl.ir import Algo, Protocol
from commdsl.limits import MIN_BANDWIDTH_GB_PER_S
from commdsl.machine.model import Topology, VertexKind
from commdsl.machine.nccl import (GRAPH_LINKS, NCCL_ALGOS, PROTOCOLS, CpuVendor, Generation, HopKind, NcclConfig, NcclVersion, ProtocolSpec,
                                  default_protocol, parse_nccl_version)  # fmt: skip



class FieldReader(Interface):
    """What `read_nccl` needs of the machine file's reader (`commdsl.machine.loader`): the
    checked reading of one field each, failures naming the field's line. Declared here so
    that this module needs nothing of the loader, which imports it."""

    def fail(self, message: str, node: yaml.Node, hint: str | None = None) -> Exception: ...
    def mapping(self, node: yaml.Node, what: str, known: tuple[str, ...] | None, required: tuple[str, ...] = ()) -> dict[str, tuple[yaml.Node, yaml.Node]]: ...
    def number(self, node: yaml.Node, what: str, *, positive: bool = False, allow_inf: bool = False, minimum: float | None = None,
               maximum: float | None = None) -> float: ...  # fmt: skip
    def time_us(self, node: yaml.Node, what: str, *, positive: bool = False) -> float: ...
    def rate(self, node: yaml.Node, what: str, minimum: float) -> float: ...
    def integer(self, node: yaml.Node, what: str, minimum: int, maximum: int = ...) -> int: ...
    def string(self, node: yaml.Node, what: str) -> str: ...
    def text(self, node: yaml.Node) -> str: ...
    def value(self, node: yaml.Node) -> object: ...
    def enum(self, node: yaml.Node, enum_cls: type[enum.Enum], what: str) -> enum.Enum: ...

_KEYS = (
    "generation", "version", "channels", "channels_across_nodes", "cpu", "nvls", "nvls_channels", "nvls_latency_us", "nvls_efficiency", "collnet", "net_device_offload", "p2p_channels",
    "p2p_channels_per_peer", "p2p_channel_bandwidth_gb_per_s", "p2p_net_channel_bandwidth_gb_per_s",
    "p2p_net_efficiency", "net_latency_us", "tree_net_scale", "graph_scale", "launch_us", "launch_per_channel_us", "algo", "proto", "protocols",
)  # fmt: skip
_PROTOCOL_KEYS = ("base_latency_us", "hop_latency_us", "efficiency", "channel_bandwidth_gb_per_s")
_MAX_CHANNELS = 64  # NCCL's MAXCHANNELS


def read_nccl(r: FieldReader, node: yaml.Node, topology: Topology | None) -> NcclConfig:
    """`nccl:` (see the module doc); needs a topology: NCCL's rings run over its links."""
    keys = r.mapping(node, "nccl", _KEYS, ("generation", "channels"))
    if topology is None:
        raise r.fail("nccl: needs a topology (the NCCL model routes its rings and trees over the machine's links)", node,
                     hint="add topology:, or leave nccl: out to time NCCL by the transport's latency and bandwidth")  # fmt: skip
    generation = r.enum(keys["generation"][1], Generation, "nccl.generation")
    channels = _count(r, keys, "channels", 1, _MAX_CHANNELS)
    cfg = NcclConfig(
        generation=generation,
        channels=channels,
        protocols=tuple((p, default_protocol(generation, p, channels)) for p in PROTOCOLS),
        cpu=r.enum(keys["cpu"][1], CpuVendor, "nccl.cpu") if "cpu" in keys else CpuVendor.INTEL,
        nvls=_flag(r, keys, "nvls"),
        collnet=_flag(r, keys, "collnet"),
        net_device_offload=_flag(r, keys, "net_device_offload"),
    )
    numbers: dict = {}
    if "version" in keys:
        numbers["version"] = _version(r, keys["version"][1])
    for name in ("nvls_latency_us", "net_latency_us", "launch_us", "launch_per_channel_us"):
        if name in keys:
            numbers[name] = r.time_us(keys[name][1], f"nccl.{name}")
    for name in ("p2p_channel_bandwidth_gb_per_s", "p2p_net_channel_bandwidth_gb_per_s"):
        if name in keys:
            numbers[name] = r.rate(keys[name][1], f"nccl.{name}", MIN_BANDWIDTH_GB_PER_S)
    for name in ("nvls_efficiency", "p2p_net_efficiency"):
        if name in keys:
            numbers[name] = _fraction(r, keys[name][1], f"nccl.{name}")
    if "tree_net_scale" in keys:
        numbers["tree_net_scale"] = r.number(keys["tree_net_scale"][1], "nccl.tree_net_scale", positive=True)
    if "graph_scale" in keys:
        given = r.mapping(keys["graph_scale"][1], "nccl.graph_scale", GRAPH_LINKS)
        numbers["graph_scale"] = tuple((link, r.number(given[link][1], f"nccl.graph_scale.{link}", positive=True))
                                       for link in GRAPH_LINKS if link in given)  # fmt: skip
    for name in ("channels_across_nodes", "nvls_channels", "p2p_channels", "p2p_channels_per_peer"):
        if name in keys:
            numbers[name] = _count(r, keys, name, 1, _MAX_CHANNELS)
    if "p2p_channels_per_peer" not in numbers and "p2p_channels" in numbers:
        # Unsaid, a peer gets at most every P2P channel there is (NCCL's own bound).
        numbers["p2p_channels_per_peer"] = min(cfg.p2p_channels_per_peer, numbers["p2p_channels"])
    cfg = replace(cfg, **numbers)
    if cfg.p2p_channels_per_peer > cfg.p2p_channels:
        raise r.fail(f"nccl.p2p_channels_per_peer ({cfg.p2p_channels_per_peer}) is more than nccl.p2p_channels ({cfg.p2p_channels})",
                     keys["p2p_channels_per_peer"][1])  # fmt: skip
    if cfg.nvls:
        _check_nvswitch(r, keys["nvls"][1], topology)
    if "protocols" in keys:
        cfg = replace(cfg, protocols=_protocols(r, keys["protocols"][1], cfg))
    if "algo" in keys:
        cfg = replace(cfg, algos=_algos(r, keys["algo"][1], cfg))
    if "proto" in keys:
        cfg = replace(cfg, protos=frozenset(_names(r, keys["proto"][1], "nccl.proto", {p.value: p for p in PROTOCOLS})))
    return cfg


def _version(r: FieldReader, node: yaml.Node) -> NcclVersion:
    """`version: 2.24.3` (or 2.24): the NCCL release, as `NCCL version ...` prints it."""
    version = parse_nccl_version(str(node.value)) if isinstance(node, yaml.ScalarNode) else None
    if version is None:
        raise r.fail(f"nccl.version must be an NCCL release such as 2.24.3 (as NCCL prints it: 'NCCL version 2.24.3+cuda12.6'), "
                     f"got {r.text(node) if isinstance(node, yaml.ScalarNode) else 'a mapping or list'}", node)  # fmt: skip
    return version


def _flag(r: FieldReader, keys: dict, name: str) -> bool:
    if name not in keys:
        return False
    node = keys[name][1]
    v = r.value(node)
    if not isinstance(v, bool):
        raise r.fail(f"nccl.{name} must be true or false, got {r.text(node)}", node)
    return v


def _count(r: FieldReader, keys: dict, name: str, low: int, high: int) -> int:
    node = keys[name][1]
    v = r.integer(node, f"nccl.{name}", low)
    if v > high:
        raise r.fail(f"nccl.{name} must be at most {high} (NCCL's MAXCHANNELS), got {v}", node)
    return v


def _fraction(r: FieldReader, node: yaml.Node, what: str) -> float:
    v = r.number(node, what, positive=True)
    if v > 1.0:
        raise r.fail(f"{what} is a fraction of the link's bandwidth: more than 0 and at most 1, got {node.value}", node)
    return v


def _names(r: FieldReader, node: yaml.Node, what: str, known: dict) -> list:
    """A name or a list of names (NCCL_ALGO / NCCL_PROTO style), each one of `known`."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if not items:
        raise r.fail(f"{what} lists nothing (leave it out to allow all)", node)
    out = []
    for item in items:
        name = r.string(item, what).lower()
        if name not in known:
            raise r.fail(f"{what}: unknown name '{name}' (known: {', '.join(known)})", item, hint=did_you_mean(name, known))
        out.append(known[name])
    return out


def _algos(r: FieldReader, node: yaml.Node, cfg: NcclConfig) -> frozenset[Algo]:
    algos = frozenset(_names(r, node, "nccl.algo", {a.value: a for a in NCCL_ALGOS}))
    lacking = {Algo.NVLS: cfg.nvls, Algo.NVLS_TREE: cfg.nvls, Algo.COLLNET_DIRECT: cfg.collnet, Algo.COLLNET_CHAIN: cfg.collnet}
    for a in sorted(algos, key=NCCL_ALGOS.index):
        if not lacking.get(a, True):
            need = "nvls" if a in (Algo.NVLS, Algo.NVLS_TREE) else "collnet"
            raise r.fail(f"nccl.algo lists {a.value} but the machine has no {need} (nccl.{need} is false)", node)
    return algos


def _protocols(r: FieldReader, node: yaml.Node, cfg: NcclConfig) -> tuple[tuple[Protocol, ProtocolSpec], ...]:
    given = r.mapping(node, "nccl.protocols", tuple(p.value for p in PROTOCOLS))
    out = []
    for proto in PROTOCOLS:
        spec = cfg.protocol(proto)
        if proto.value in given:
            what = f"nccl.protocols.{proto.value}"
            keys = r.mapping(given[proto.value][1], what, _PROTOCOL_KEYS)
            changes: dict = {}
            if "base_latency_us" in keys:
                changes["base_latency_us"] = r.time_us(keys["base_latency_us"][1], f"{what}.base_latency_us")
            if "efficiency" in keys:
                changes["efficiency"] = _fraction(r, keys["efficiency"][1], f"{what}.efficiency")
            if "channel_bandwidth_gb_per_s" in keys:
                changes["channel_bandwidth_gb_per_s"] = r.rate(keys["channel_bandwidth_gb_per_s"][1], f"{what}.channel_bandwidth_gb_per_s",
                                                               MIN_BANDWIDTH_GB_PER_S)  # fmt: skip
            if "hop_latency_us" in keys:
                hops = dict(spec.hop_latency_us)
                hwhat = f"{what}.hop_latency_us"
                for name, (_, vnode) in r.mapping(keys["hop_latency_us"][1], hwhat, tuple(h.value for h in HopKind)).items():
                    hops[HopKind(name)] = r.time_us(vnode, f"{hwhat}.{name}")
                changes["hop_latency_us"] = tuple(hops.items())
            spec = replace(spec, **changes)
        out.append((proto, spec))
    return tuple(out)


def _check_nvswitch(r: FieldReader, node: yaml.Node, topology: Topology) -> None:
    """NVLS reduces in an NVSwitch: every GPU needs a link to a vertex of kind nvswitch."""
    switches = {name for name, kind in topology.vertices if kind is VertexKind.NVSWITCH}
    for i in range(topology.gpus_per_node):
        gpu = f"gpu{i}"
        if not any((l.a == gpu and l.b in switches) or (l.b == gpu and l.a in switches) for l in topology.links):
            raise r.fail(f"nccl.nvls is true but {gpu} has no link to an nvswitch vertex (NVLink SHARP reduces in the switch)", node)
