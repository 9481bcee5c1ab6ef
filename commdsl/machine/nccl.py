"""What a machine file says about NCCL (`nccl:`), and NCCL's own published constants.

Two kinds of numbers live here:

  * NCCL's tuning constants (`TUNING`): the table NCCL itself uses to predict the time of
    every algorithm x protocol and pick the fastest (src/graph/tuning.cc of NVIDIA/nccl;
    the values of the newest release modelled, and `tuning_for` what older releases had
    differently). They are per GPU generation and NCCL release, not per machine: the
    simulator uses them only to *choose*, as NCCL does (`commdsl.sim.nccl.select`).
  * the machine's physics (`NcclConfig`): how long a chosen algorithm x protocol really
    takes there. Latencies per protocol (a base per collective plus one per step over an
    NVLink, PCIe or network hop), the fraction of the wire each protocol fills with data,
    what one channel (one CTA) moves, the number of channels, and the host time of a
    launch. Defaults come from the same NCCL table (its latencies are NCCL's own estimate
    of the hardware); a machine file overrides them with measured values and says where
    they come from.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from commdsl.ir import Algo, Protocol


class Generation(str, enum.Enum):
    """The GPU generation NCCL's tuning tables are indexed by (compute capability)."""

    VOLTA = "volta"
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"


class CpuVendor(str, enum.Enum):
    """The host CPU: NCCL's tuning differs between Intel and AMD hosts across nodes."""

    INTEL = "intel"
    AMD = "amd"
    OTHER = "other"


class HopKind(str, enum.Enum):
    """What one step of an algorithm crosses, as NCCL's latency table tells them apart."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    NETWORK = "network"


class NicPath(str, enum.Enum):
    """How a GPU reaches a NIC, as NCCL's path types tell them apart (topo.h `PATH_*`):
    what decides whether LL128 may cross the network (`Tuning.ll128_nic_paths`)."""

    PCIE_SWITCH = "pcie_switch"
    """Through PCIe switches only, no CPU (PIX, PXB)."""
    C2C = "c2c"
    """Through the GPU's own CPU, reached over NVLink-C2C (GH200): P2C from NCCL 2.27, a
    path through a CPU (PHB) before."""
    CPU = "cpu"
    """Through a CPU's PCIe root complex (PHB)."""
    CPUS = "cpus"
    """Across CPU sockets (SYS)."""


NCCL_ALGOS = (Algo.TREE, Algo.RING, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN, Algo.NVLS, Algo.NVLS_TREE, Algo.PAT)
"""The collective algorithms of NCCL's tuning table, in its order."""
PROTOCOLS = (Protocol.LL, Protocol.LL128, Protocol.SIMPLE)
"""NCCL's protocols in its order."""


@dataclass(frozen=True)
class Tuning:
    """NCCL's tuning constants for one GPU generation (src/graph/tuning.cc)."""

    base_latency_us: dict[Algo, tuple[float, float, float]]
    """`baseLat`: per algorithm, (LL, LL128, Simple) latency of a collective, us."""
    hop_latency_us: dict[HopKind, dict[Algo, tuple[float, float, float]]]
    """`hwLat`: per hop kind and algorithm, (LL, LL128, Simple) latency of one step, us."""
    ll_max_bus_gb_per_s: tuple[tuple[float, float, float], ...]
    """`llMaxBws` rows (Volta/Intel, Ampere/AMD, Hopper, Blackwell) x (1, 2, >2 nodes)."""
    ring_ll128_channel_gb_per_s: tuple[float, float, float]
    """`perChMaxRingLL128Bws` of this generation, per graph channel, (1, 2, >2 nodes)."""
    tree_ll128_channel_gb_per_s: tuple[float, float, float]
    """`perChMaxTreeLL128Bws`."""
    tree_channel_gb_per_s: tuple[float, float, float]
    """`perChMaxTreeBws`."""
    nvls_tree_channel_gb_per_s: tuple[float, float, float]
    """`perChMaxNVLSTreeBws`."""
    nvls_efficiency: float
    """`nvlsEfficiency`: NVLS bus bandwidth per channel over the graph's (v2.28+)."""
    row: int
    """This generation's row in `ll_max_bus_gb_per_s` (NCCL's compCapIndex)."""
    pat: bool = True
    """The release has PAT (NCCL 2.23 and later, `PAT_SINCE`)."""
    pat_bandwidth_factor: float = 0.75
    """What the table takes of PAT's graph bandwidth (`busBw *= .75`, from v2.24; 1 in 2.23)."""
    nvls_switch_model: bool = True
    """How the table rates NVLS and NVLS_TREE. True (NCCL 2.28 and later): the switch's
    bus bandwidth per channel, the graph's intra bandwidth x `nvls_efficiency` x
    (channels-1)/channels, twice for an all_reduce, at most the network's and
    `nvls_tree_channel_gb_per_s`; algorithm bandwidth = bus x n / nsteps. False (NCCL 2.27
    and earlier): the graph's bandwidth, min(intra, inter) for NVLS and min(intra, inter /
    2 beyond two nodes) for NVLS_TREE, and algorithm bandwidth = bus x 5/6."""
    ll128_nic_paths: frozenset[NicPath] = frozenset({NicPath.PCIE_SWITCH})
    """How a node's GPUs may reach their NICs for LL128 to cross the network by default
    (tuning.cc: `typeInter <= PATH_PXB`; on Hopper and later up to PXN, and from NCCL 2.27
    through C2C too, `NCCL_LL128_C2C` default 1, `LL128_C2C_SINCE`)."""


_BASE = {
    Algo.TREE: (6.8, 14.0, 8.4), Algo.RING: (6.6, 14.0, 8.4),
    Algo.COLLNET_DIRECT: (0.0, 0.0, 0.0), Algo.COLLNET_CHAIN: (0.0, 0.0, 0.0),
    Algo.NVLS: (0.0, 0.0, 0.0), Algo.NVLS_TREE: (0.0, 0.0, 0.0), Algo.PAT: (8.0, 8.0, 8.0),
}  # fmt: skip
_HW = {
    HopKind.NVLINK: {Algo.TREE: (0.6, 1.25, 4.0), Algo.RING: (0.6, 1.9, 3.4), Algo.COLLNET_DIRECT: (0.0, 0.0, 3.7),
                     Algo.COLLNET_CHAIN: (0.0, 0.0, 2.8), Algo.NVLS: (0.0, 0.0, 25.0), Algo.NVLS_TREE: (0.0, 0.0, 25.0),
                     Algo.PAT: (0.0, 0.0, 4.0)},
    HopKind.PCIE: {Algo.TREE: (1.0, 1.9, 4.0), Algo.RING: (1.0, 2.5, 5.7), Algo.COLLNET_DIRECT: (0.0, 0.0, 3.7),
                   Algo.COLLNET_CHAIN: (0.0, 0.0, 2.8), Algo.NVLS: (0.0, 0.0, 0.0), Algo.NVLS_TREE: (0.0, 0.0, 0.0),
                   Algo.PAT: (0.0, 0.0, 4.0)},
    HopKind.NETWORK: {Algo.TREE: (5.0, 8.5, 14.0), Algo.RING: (2.7, 4.0, 14.0), Algo.COLLNET_DIRECT: (0.0, 0.0, 31.0),
                      Algo.COLLNET_CHAIN: (0.0, 0.0, 30.0), Algo.NVLS: (0.0, 0.0, 18.0), Algo.NVLS_TREE: (0.0, 0.0, 20.9),
                      Algo.PAT: (0.0, 0.0, 14.0)},
}  # fmt: skip
_LL_MAX = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))


def _tuning(row: int, ring_ll128, tree_ll128, tree, nvls_tree, nvls_eff) -> Tuning:
    return Tuning(_BASE, _HW, _LL_MAX, ring_ll128, tree_ll128, tree, nvls_tree, nvls_eff, row)


TUNING: dict[Generation, Tuning] = {
    Generation.VOLTA: _tuning(0, (20.0,) * 3, (20.0,) * 3, (26.5, 18.5, 10.0), (26.5, 18.5, 10.0), 0.0),
    Generation.AMPERE: _tuning(1, (20.0,) * 3, (20.0,) * 3, (24.0, 23.6, 17.8), (24.0, 23.6, 17.8), 0.0),
    Generation.HOPPER: replace(_tuning(2, (36.7,) * 3, (36.7, 36.7, 29.0), (38.7, 41.4, 36.0), (0.0, 57.7, 45.5), 0.85),
                               ll128_nic_paths=frozenset({NicPath.PCIE_SWITCH, NicPath.C2C})),
    Generation.BLACKWELL: replace(_tuning(3, (40.0,) * 3, (55.6, 31.67, 20.0), (70.0, 42.8, 24.0), (0.0, 96.0, 80.0), 0.74),
                                  ll128_nic_paths=frozenset({NicPath.PCIE_SWITCH, NicPath.C2C})),
}
"""NCCL's tuning constants per generation as the newest release modelled has them
(tuning.cc: `ncclTunerConstantsDefaults` in v2.28+, the static tables `baseLat`, `hwLat`,
`llMaxBws`, `perChMax*Bws` before); `tuning_for` gives an older release's."""

GRAPH_LINKS = ("nic", "nvlink", "pcie")
"""The kinds of link NCCL's graphs are rated by (`NcclConfig.graph_scale`): a GPU's links
inside its node (NVLink or PCIe) and its node's NICs."""

NcclVersion = tuple[int, int, int]
"""An NCCL release as (major, minor, patch): (2, 24, 3) for `NCCL version 2.24.3`."""

NVLS_SWITCH_MODEL_SINCE: NcclVersion = (2, 28, 0)
"""The first release whose table rates NVLS by the switch (`nvlsEfficiency`,
`perChMaxNVLSTreeBws`, tuning.cc v2.28.3); before, by the graph (v2.27.7 and earlier)."""
LL128_C2C_SINCE: NcclVersion = (2, 27, 0)
"""The first release whose LL128 may cross the network from a GPU that reaches its NIC
through its CPU over C2C (v2.27.3: `NCCL_LL128_C2C`, path type P2C); before, such a path
is PHB, beyond LL128's reach."""
PAT_SINCE: NcclVersion = (2, 23, 0)
"""The first release with PAT (v2.23.4, the first 2.23 tag)."""
PAT_BANDWIDTH_FACTOR_SINCE: NcclVersion = (2, 24, 0)
"""The first release whose table takes PAT's bandwidth x 0.75 (`Tuning.pat_bandwidth_factor`,
v2.24.3); v2.23.4 takes the graph's whole."""
PAT_RANK_US = 2.8
"""tuning.cc, PAT's latency: `nRanks * 2.8` us, "still a linear part" beside its log2(nodes)
tree levels (each `interLat / 3.5`, `PAT_LEVEL_DIVISOR`): NCCL's own figures, v2.23 on."""
PAT_LEVEL_DIVISOR = 3.5
NVLS_TREE_NET_LATENCY_US = ((2, 28, 9), 20.9, 14.0)
"""hwLat[NET][NVLS_TREE] Simple: 20.9 us from v2.28.9 on (the release that reordered the
main and proxy threads' operations), 14 us before (tuning.cc v2.28.7 and earlier)."""


def parse_nccl_version(text: str) -> NcclVersion | None:
    """(major, minor, patch) of `2.24.3`, `2.24.3+cuda12.6` or `2.24` (patch 0); None if
    the text is no NCCL version."""
    head = text.strip().split("+", 1)[0]
    parts = head.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 4 for p in parts):
        return None
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return nums[0], nums[1], nums[2]


def format_nccl_version(version: NcclVersion) -> str:
    return ".".join(str(v) for v in version)


def tuning_for(generation: Generation, version: NcclVersion | None) -> Tuning:
    """NCCL's table for `generation` as release `version` has it (None: the newest release
    modelled). What differs between the releases modelled: the NVLS bandwidth model
    (`Tuning.nvls_switch_model`), hwLat[NET][NVLS_TREE] (`NVLS_TREE_NET_LATENCY_US`),
    PAT (`PAT_SINCE`, `PAT_BANDWIDTH_FACTOR_SINCE`) and LL128 through C2C (`LL128_C2C_SINCE`)."""
    t = TUNING[generation]
    if version is None:
        return t
    since, newer, older = NVLS_TREE_NET_LATENCY_US
    changes: dict = {}
    if version < since:
        net = dict(t.hop_latency_us[HopKind.NETWORK])
        ll, ll128, _ = net[Algo.NVLS_TREE]
        net[Algo.NVLS_TREE] = (ll, ll128, older)
        changes["hop_latency_us"] = {**t.hop_latency_us, HopKind.NETWORK: net}
    if version < NVLS_SWITCH_MODEL_SINCE:
        changes["nvls_switch_model"] = False
    if version < PAT_SINCE:
        changes["pat"] = False
    elif version < PAT_BANDWIDTH_FACTOR_SINCE:
        changes["pat_bandwidth_factor"] = 1.0
    if version < LL128_C2C_SINCE:
        changes["ll128_nic_paths"] = t.ll128_nic_paths - {NicPath.C2C}
    return replace(t, **changes) if changes else t


NET_OVERHEAD_US = {CpuVendor.INTEL: 1.0, CpuVendor.AMD: 2.0, CpuVendor.OTHER: 1.0}
"""tuning.cc `getNetOverhead`: host time to post one network operation, per CPU vendor."""

# Threads per channel and work per thread before NCCL uses fewer channels (device.h,
# comm.h: NCCL_{SIMPLE,LL,LL128}_MAX_NTHREADS, NCCL_*_THREAD_THRESHOLD).
MAX_THREADS = {Protocol.SIMPLE: 512, Protocol.LL: 512, Protocol.LL128: 640}
THREAD_THRESHOLD_BYTES = {Protocol.SIMPLE: 64, Protocol.LL: 8, Protocol.LL128: 8}

P2P_LL_THRESHOLD_BYTES = 16384
"""NCCL_P2P_LL_THRESHOLD (enqueue.cc): a send of at most channels x this uses LL."""
P2P_CHUNK_BYTES = {HopKind.NVLINK: 1 << 19, HopKind.PCIE: 1 << 17, HopKind.NETWORK: 1 << 17}
"""NCCL_P2P_{NVL,PCI,NET}_CHUNKSIZE (init.cc): the step of a P2P transfer by path."""
P2P_CHANNEL_NET_GB_PER_S = 14.0
"""NCCL_P2P_PER_CHANNEL_NET_BW (paths.cc): the bandwidth NCCL counts one P2P channel to
drive across the network when it decides how many channels a remote peer gets."""
P2P_PEERS_PER_BATCH = 8
"""NCCL_MAX_DEV_WORK_P2P_PER_BATCH (device.h): peers one channel serves in one round."""

NVLS_CHUNK_BYTES = 128 * 1024
"""NCCL_NVLS_CHUNKSIZE (transport/nvls.cc): the largest chunk an NVLS kernel moves per
channel and head; enqueue.cc `calcCollChunking` halves it for smaller ops."""
NVLS_TREE_MAX_CHUNK_BYTES_4_NODES = 64 * 1024
"""NVLS_TREE's chunk limit from 4 nodes on (nvls.cc `ncclNvlsTuning`, NCCL 2.29)."""
NVLS_PIPELINE_CHUNKS = 3
"""Chunks of one NVLS lane (channel x head) in flight before the lane streams: a chunk
is read and reduced by the switch (multimem load-reduce), then multicast back (multimem
store), and the lane's flags go round between them. The depth is set by the 1-node NVLS
all_reduce curves of bench/data (NCCL 2.24 and 2.29, 16 MiB to 8 GiB); the chunk sizes it
multiplies are NCCL's own (`commdsl.sim.nccl.nvls_chunk_bytes`)."""


@dataclass(frozen=True)
class ProtocolSpec:
    """How one NCCL protocol performs on this machine (the physics the simulator times)."""

    base_latency_us: float
    """Latency of one collective beyond its steps (kernel start, the first and last step's
    synchronisation), us."""
    hop_latency_us: tuple[tuple[HopKind, float], ...]
    """Latency of one algorithm step over each kind of hop (NVLink, PCIe, the network), us."""
    efficiency: float
    """Fraction of the bytes on the wire that are data (LL: 0.5, a 4-byte flag per 4 bytes
    of data; LL128: 120/128; Simple: 1.0). A link moves data at bandwidth x efficiency."""
    channel_bandwidth_gb_per_s: float
    """The most one channel (one CTA of the NCCL kernel) moves with this protocol, GB/s;
    `inf`: only the links limit it."""

    def hop_us(self, hop: HopKind) -> float:
        for k, v in self.hop_latency_us:
            if k is hop:
                return v
        raise AssertionError(f"no {hop.value} latency")


@dataclass(frozen=True)
class NcclConfig:
    """`nccl:` in a machine file: how NCCL runs on the machine's GPUs (see the module doc)."""

    generation: Generation
    """Which of NCCL's tuning tables applies (the GPUs' compute capability)."""
    channels: int
    """Channels of ring and tree collectives (NCCL's `nChannels`, "N coll channels" in an
    NCCL_DEBUG=INFO log): one ring (or pair of trees) and one CTA each."""
    protocols: tuple[tuple[Protocol, ProtocolSpec], ...]
    """Per protocol, its latencies, efficiency and per-channel bandwidth."""
    channels_across_nodes: int | None = None
    """Channels of ring and tree collectives when the communicator spans nodes (None: as
    `channels`). NCCL searches its graph again across nodes, where the NICs bound it (on
    DGX H100, two rings per NIC: 16), and sizes its P2P channels from it too
    (`p2p_channel_count`)."""
    cpu: CpuVendor = CpuVendor.INTEL
    """The hosts' CPU vendor (NCCL's LL bandwidth and network overhead depend on it)."""
    nvls: bool = False
    """NVSwitch with NVLink SHARP (H100 and later NVSwitch systems): NVLS and NVLS_TREE."""
    nvls_channels: int = 16
    """Channels of NVLS collectives (NCCL_NVLS_NCHANNELS)."""
    nvls_latency_us: float = 25.0
    """Latency of one NVLS collective inside a node (the switch's reduce and multicast), us."""
    nvls_efficiency: float = 0.85
    """Fraction of an NVLink's bandwidth NVLS reaches (NCCL's `nvlsEfficiency`)."""
    collnet: bool = False
    """In-network reduction between nodes (IB SHARP switches): COLLNET_DIRECT and CHAIN."""
    net_device_offload: bool = False
    """The network plugin leaves received data for the GPU to unpack (NCCL's net device
    type is not HOST, as with GPUDirect-TCPX's plugin). NCCL then runs no PAT."""
    p2p_channels: int = 32
    """Channels of point-to-point transfers and all_to_all (NCCL's `p2pnChannels`)."""
    p2p_channels_per_peer: int = 32
    """Most channels one send/recv pair uses (`p2pnChannelsPerPeer`)."""
    p2p_channel_bandwidth_gb_per_s: float = math.inf
    """The most one P2P channel moves inside a node (its CTA copies with half its warps), GB/s."""
    p2p_net_channel_bandwidth_gb_per_s: float = P2P_CHANNEL_NET_GB_PER_S
    """The most one P2P channel moves across the network, GB/s: one channel is one proxy
    stream of NCCL_STEPS chunks in flight to one peer. The default is NCCL's own figure
    for it (NCCL_P2P_PER_CHANNEL_NET_BW, paths.cc), by which it gives a remote peer
    enough channels to fill its NIC."""
    p2p_net_efficiency: float = 1.0
    """Fraction of a NIC's bandwidth point-to-point transfers (send/recv, all_to_all) reach
    over the network: many chunks to many peers use a NIC less well than a ring's streams."""
    net_latency_us: float = 0.0
    """Latency the network adds to every message NCCL sends across nodes, us, beyond NCCL's
    own hop: what the network plugin reports as its `latency` (ncclNetProperties_t; NCCL
    adds it to every network step, twice with Simple for the flush that follows a
    receive, tuning.cc). 0 for InfiniBand and RoCE through NCCL's own transport; tens of
    us for TCP-offload GPU networking (GPUDirect-TCPX/TCPXO)."""
    tree_net_scale: float = 1.0
    """How a tree level across nodes compares with NCCL's own figure for it: a level of a
    tree (or NVLS_TREE's tree) costs NCCL's network latency of that algorithm and protocol
    (tuning.cc hwLat NET, the tree and NVLS_TREE columns, per release) x this, plus the
    network's `net_latency_us`. A parameter of its own, apart from a ring's network step:
    NCCL's trees and rings across nodes pace differently, and a fit to one must not move
    the other. 1: NCCL's figures."""
    graph_scale: tuple[tuple[str, float], ...] = ()
    """How NCCL's topology search sees each kind of link (`GRAPH_LINKS`: `nic`, `nvlink`,
    `pcie`) against the rate the topology gives it, as (kind, factor) pairs; a kind not
    listed: 1. NCCL rates its graphs by the speeds its search reads off the hardware, and
    its table chooses by them (`nccl.select`), not by what the links deliver. A machine
    that `commdsl calibrate --from-nccl-tests` fitted to deliver more or less than its base
    keeps its base's speeds here, so that a fitted rate moves times, not NCCL's choices."""
    launch_us: float = 0.0
    """Host time NCCL takes to enqueue and launch one collective's kernel on one GPU, us
    (what a loop of back-to-back ops costs the thread that issues them)."""
    launch_per_channel_us: float = 0.0
    """Host time per channel of the launch (work descriptors are written per channel), us."""
    version: NcclVersion | None = None
    """The NCCL release the machine runs (`version: 2.24.3`, as NCCL prints it at start-up):
    its tuning table makes the choice (`tuning_for`). None: the newest release modelled."""
    algos: frozenset[Algo] | None = None
    """Algorithms NCCL may use (`algo:`, as NCCL_ALGO); None: all the machine has."""
    protos: frozenset[Protocol] | None = None
    """Protocols NCCL may use (`proto:`, as NCCL_PROTO); None: all."""

    def coll_channels(self, nodes: int) -> int:
        """Ring and tree channels of a communicator spanning `nodes` nodes."""
        if nodes > 1 and self.channels_across_nodes is not None:
            return self.channels_across_nodes
        return self.channels

    def p2p_channel_count(self, nodes: int) -> int:
        """P2P channels (`p2pnChannels`) of a communicator spanning `nodes` nodes: NCCL
        takes its collective channels rounded up to a power of two (paths.cc
        `ncclTopoComputeP2pChannels`), so across nodes they follow `channels_across_nodes`."""
        if nodes > 1 and self.channels_across_nodes is not None:
            return min(self.p2p_channels, 1 << (self.channels_across_nodes - 1).bit_length())
        return self.p2p_channels

    def graph_factor(self, link: str) -> float:
        """`graph_scale`'s factor for a kind of link (1 where it has none)."""
        return next((f for name, f in self.graph_scale if name == link), 1.0)

    def protocol(self, proto: Protocol) -> ProtocolSpec:
        for p, spec in self.protocols:
            if p is proto:
                return spec
        raise AssertionError(f"no {proto.value} protocol")

    @property
    def tuning(self) -> Tuning:
        """NCCL's table for the GPUs' generation, as the machine's NCCL release has it."""
        return tuning_for(self.generation, self.version)

    @property
    def net_overhead_us(self) -> float:
        return NET_OVERHEAD_US[self.cpu]

    def net_message_us(self, proto: Protocol) -> float:
        """What the network itself adds to one network step of `proto` (`net_latency_us`;
        Simple pays it twice: the data, then the flush of the receive)."""
        return self.net_latency_us * (2 if proto is Protocol.SIMPLE else 1)

    def launch_host_us(self, channels: int) -> float:
        """Host time of one launch using `channels` channels."""
        return self.launch_us + self.launch_per_channel_us * channels

    def to_json(self) -> dict:
        return {
            "generation": self.generation.value,
            "channels": self.channels,
            **({"channels_across_nodes": self.channels_across_nodes} if self.channels_across_nodes is not None else {}),
            "cpu": self.cpu.value,
            "nvls": self.nvls,
            "nvls_channels": self.nvls_channels,
            "nvls_latency_us": self.nvls_latency_us,
            "nvls_efficiency": self.nvls_efficiency,
            "collnet": self.collnet,
            "p2p_channels": self.p2p_channels,
            "p2p_channels_per_peer": self.p2p_channels_per_peer,
            "p2p_channel_bandwidth_gb_per_s": _num(self.p2p_channel_bandwidth_gb_per_s),
            "p2p_net_channel_bandwidth_gb_per_s": _num(self.p2p_net_channel_bandwidth_gb_per_s),
            "p2p_net_efficiency": self.p2p_net_efficiency,
            "net_latency_us": self.net_latency_us,
            "tree_net_scale": self.tree_net_scale,
            "launch_us": self.launch_us,
            "launch_per_channel_us": self.launch_per_channel_us,
            **({"graph_scale": dict(self.graph_scale)} if self.graph_scale else {}),
            **({"version": format_nccl_version(self.version)} if self.version is not None else {}),
            **({"algo": sorted(a.value for a in self.algos)} if self.algos is not None else {}),
            **({"proto": sorted(p.value for p in self.protos)} if self.protos is not None else {}),
            "protocols": {
                p.value: {
                    "base_latency_us": s.base_latency_us,
                    "hop_latency_us": {h.value: v for h, v in s.hop_latency_us},
                    "efficiency": s.efficiency,
                    "channel_bandwidth_gb_per_s": _num(s.channel_bandwidth_gb_per_s),
                }
                for p, s in self.protocols
            },
        }


def _num(v: float) -> float | str:
    return v if v != math.inf else "inf"


PROTOCOL_EFFICIENCY = {Protocol.LL: 0.5, Protocol.LL128: 120 / 128, Protocol.SIMPLE: 1.0}
"""Data per byte on the wire: LL stores 4 data bytes with a 4-byte flag; LL128 120 data
bytes with an 8-byte flag per 128-byte line (device.h: NCCL_LL128_DATAELEMS / LINEELEMS)."""


def default_protocol(generation: Generation, proto: Protocol, channels: int) -> ProtocolSpec:
    """A protocol's physics from NCCL's own table where a machine file gives none: the ring
    column of `baseLat` and `hwLat`, the wire efficiency, and per-channel bandwidths from
    `llMaxBws` (LL: the single-node row over the ring graph's channels, half the comm
    channels) and `perChMaxRingLL128Bws` (per graph channel, i.e. two comm channels)."""
    t = TUNING[generation]
    i = PROTOCOLS.index(proto)
    hops = tuple((h, t.hop_latency_us[h][Algo.RING][i]) for h in HopKind)
    graph_channels = max(1, channels // 2)
    if proto is Protocol.LL:
        per_channel = t.ll_max_bus_gb_per_s[t.row][0] / graph_channels / 2
    elif proto is Protocol.LL128:
        per_channel = t.ring_ll128_channel_gb_per_s[0] / 2
    else:
        per_channel = math.inf
    return ProtocolSpec(t.base_latency_us[Algo.RING][i], hops, PROTOCOL_EFFICIENCY[proto], per_channel)
