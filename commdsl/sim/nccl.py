"""NCCL's cost model: which algorithm x protocol NCCL runs, with how many channels, and
how long its latency is on a machine (`nccl:` in the machine file, `NcclConfig`).

Selection is NCCL's own (src/graph/tuning.cc `ncclTopoTuneModel`, src/enqueue.cc
`topoGetAlgoInfo`, of the machine's NCCL release, `nccl.version`: `tuning_for`): for every
enabled algorithm x protocol a predicted time
`latency + size / bandwidth` from NCCL's tuning constants (`commdsl.machine.nccl.TUNING`)
and the bandwidth of NCCL's channel graphs; the fastest wins. The graphs are estimated
from the topology: a GPU's bandwidth to the rest of its node (its NVLink or PCIe links)
and its node's network bandwidth (all its NICs), split over half the machine's channels
(NCCL searches rings and duplicates each once when it connects them), and for NVLS over
one channel per GPU of the node at the fastest of NCCL's channel speeds that fits.

Time is the machine's physics for the chosen pair (`latency_us` here; the bandwidth part
is the flow network's, over the links the algorithm loads, see `commdsl.sim.flow`):

    ring        base + one hop per step: 2(n-1) steps (all_reduce), n-1 (all_gather,
                reduce_scatter), n (broadcast, reduce). On one node an NVLink or PCIe
                hop each; across nodes with LL128 and Simple every step a network hop
                (all ranks step at once and wait for their predecessor's piece), with LL
                each hop once (its words forward as their flags land); broadcast and
                reduce, a pipeline, pay each hop of the chain once
    tree        base + 2 x ((ppn-1) intra hops + log2(N) tree levels), a level being
                NCCL's own network latency for the tree (hwLat NET) x `tree_net_scale`
    nvls        the machine's NVLS latency (+ one network hop across nodes)
    nvls_tree   NVLS latency + 2 log2(N) tree levels (NCCL's NVLS_TREE figure, per release)
    collnet     base + 2 intra hops + one network hop (direct); 2(ppn-1) intra (chain)
    pat         NCCL's base for PAT + log2(N) tree levels / 3.5 + 2.8 us a rank (NCCL's
                own figures; all_gather and reduce_scatter with one GPU a node)
    send, recv  NCCL's own base latency of the protocol (tuning.cc baseLat, not the
                machine's fitted one) + one hop inside a node; across nodes two of the
                proxies' network steps (Simple's, for any protocol: the receiver's
                clear-to-send, then the first chunk)
    all_to_all  base + one hop of its path; across nodes (gather, scatter alike) it also
                waits while each proxy posts its remote peers' network operations one
                after another (`proxy_posts_us`)

with n ranks over N nodes, ppn per node; every network hop also pays the network's own
latency per message (`nccl.net_latency_us`, twice with Simple). NVLS kernels stream once
a few chunks per lane are in flight (`nvls_fill_bytes`, NCCL's chunk rule). Channels
shrink for small messages as NCCL does (`collective_channels`): a channel per `threads x
threshold` bytes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from commdsl.errors import ScheduleError
from commdsl.ir import Algo, Op, OpKind, Protocol
from commdsl.machine.nccl import (MAX_THREADS, NVLS_CHUNK_BYTES, NVLS_PIPELINE_CHUNKS, NVLS_TREE_MAX_CHUNK_BYTES_4_NODES,
                                  P2P_CHANNEL_NET_GB_PER_S, P2P_CHUNK_BYTES, P2P_LL_THRESHOLD_BYTES, PAT_LEVEL_DIVISOR, PAT_RANK_US,
                                  PROTOCOL_EFFICIENCY,
                                  P2P_PEERS_PER_BATCH, PROTOCOLS, THREAD_THRESHOLD_BYTES, CpuVendor,
                                  Generation, HopKind, NcclConfig, NicPath)  # fmt: skip

NCCL_KINDS = frozenset({OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.BROADCAST, OpKind.REDUCE})
"""Collectives NCCL runs with its own algorithms (the rest are point-to-point based)."""
P2P_BASED = frozenset({OpKind.ALL_TO_ALL, OpKind.GATHER, OpKind.SCATTER, OpKind.SEND, OpKind.RECV})
"""Ops NCCL runs as grouped sends and receives."""

ALGOS_BY_KIND = {
    OpKind.ALL_REDUCE: (Algo.RING, Algo.TREE, Algo.NVLS, Algo.NVLS_TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN),
    OpKind.ALL_GATHER: (Algo.RING, Algo.NVLS, Algo.COLLNET_DIRECT, Algo.PAT),
    OpKind.REDUCE_SCATTER: (Algo.RING, Algo.NVLS, Algo.COLLNET_DIRECT, Algo.PAT),
    OpKind.BROADCAST: (Algo.RING,),
    OpKind.REDUCE: (Algo.RING,),
}
"""What NCCL's table considers per collective (tuning.cc)."""

_SPEEDS_INTRA = {
    Generation.VOLTA: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    Generation.AMPERE: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    Generation.HOPPER: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    Generation.BLACKWELL: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0),
}
"""search.cc `speedArrayIntra` / `sm90SpeedArrayIntra` / `sm100SpeedArrayIntra`: the
per-channel bandwidths NCCL's graph search tries, fastest first."""
_MAX_NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
_MAX_DIRECT_ARITY = 7  # device.h NCCL_MAX_DIRECT_ARITY

# tuning.cc treeCorrectionFactor: per protocol (LL, LL128, Simple), by log2(bytes / 64).
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)


@dataclass(frozen=True)
class Layout:
    """Where a group's ranks sit: what NCCL's tuning and its rings depend on."""

    ranks: tuple[int, ...]
    """The group's members (global ranks) in group order."""
    nodes: tuple[tuple[int, ...], ...]
    """The members of each node the group spans, nodes in order of first member."""
    intra_hop: HopKind
    """What a step between two GPUs of a node crosses: NVLink, or PCIe (any step of the
    ring that is not all NVLink makes it PCIe, as NCCL's graph type)."""
    intra_gb_per_s: float
    """A GPU's bandwidth to the other GPUs of its node (the slowest member's)."""
    inter_gb_per_s: float
    """A node's bandwidth to the network: all its NICs (inf on one node)."""
    nvswitch: bool
    """The node's GPUs meet in an NVSwitch (CollNet Direct needs it)."""
    mesh: bool = False
    """Every two GPUs of each node are joined by NVLinks of their own, no switch between
    (a GH200 quad node): `intra_gb_per_s` is then all of a GPU's links to its node, and
    the channels' rings take different paths through a node (`ring_orders`)."""
    nic_path: NicPath | None = None
    """How the group's GPUs reach the network, as NCCL's graph across nodes sees it: on the
    node that fares worst, the best of its members' paths to a NIC (the graph enters and
    leaves a node at the GPU nearest a NIC; the others reach it over NVLink, NCCL's PXN).
    None on one node (nothing crosses the network), and on a layout built by hand without
    it (nothing then restricts LL128)."""

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def ppn(self) -> int:
        """Ranks per node (the most on any node)."""
        return max(len(m) for m in self.nodes)


@dataclass(frozen=True)
class Choice:
    """What NCCL runs for one collective."""

    algo: Algo
    proto: Protocol
    channels: int
    """Channels (CTAs) the kernel uses at this size."""


NIC_PATH_WORDS = {NicPath.PCIE_SWITCH: "through PCIe switches", NicPath.C2C: "through their CPU over C2C (before NCCL 2.27)",
                  NicPath.CPU: "through a CPU", NicPath.CPUS: "across CPU sockets"}  # fmt: skip
"""How an error says a `NicPath`."""


def log2i(n: int) -> int:
    """floor(log2(n)) for n >= 1, as NCCL's log2i."""
    return max(n, 1).bit_length() - 1


# ---- NCCL's table ----------------------------------------------------------------------


def _graph(cfg: NcclConfig, layout: Layout, algo: Algo) -> tuple[int, float, float]:
    """(channels, intra GB/s, inter GB/s per channel) of NCCL's graph for `algo`."""
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        nch = min(layout.ppn, _MAX_NVLS_ARITY)
        speeds = _SPEEDS_INTRA[cfg.generation]
        speed = next((s for s in speeds if s * nch <= layout.intra_gb_per_s), speeds[-1])
        inter = layout.inter_gb_per_s / nch if layout.num_nodes > 1 else speed
        return nch, speed, inter
    nch = max(1, cfg.coll_channels(layout.num_nodes) // 2)
    intra = layout.intra_gb_per_s / nch
    if layout.num_nodes == 1:
        return nch, intra, intra
    # Across nodes NCCL's search runs a ring at one speed inside and between nodes (bwIntra
    # = bwInter), no faster than the NICs; a tree's (or CollNet's) inside may rise to twice
    # that (search.cc, pass 2: "increase bwIntra for trees"), which its table reads on two
    # nodes: where the NICs are slower than NVLink, NCCL takes the tree there.
    inter = layout.inter_gb_per_s / nch
    cap = inter if algo is Algo.RING else 2 * inter  # PAT runs on the tree's graph (init.cc)
    return nch, min(intra, cap), inter


def nccl_table(cfg: NcclConfig, kind: OpKind, layout: Layout) -> dict[tuple[Algo, Protocol], tuple[float, float]]:
    """NCCL's (latency us, algorithm bandwidth GB/s) of every algorithm x protocol it may
    use for `kind` on this group (tuning.cc `ncclTopoTuneModel`; disabled ones left out)."""
    t = cfg.tuning
    n, nodes = layout.n, layout.num_nodes
    ppn = n / nodes
    index2 = nodes - 1 if nodes <= 2 else 2
    index1 = t.row if nodes == 1 else (1 if cfg.cpu is CpuVendor.AMD else 0)
    ll_max = t.ll_max_bus_gb_per_s[index1][index2]
    intra_hw = layout.intra_hop
    hw = intra_hw if nodes == 1 else HopKind.NETWORK
    nsteps = 2 * (n - 1) if kind is OpKind.ALL_REDUCE else n - 1 if kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER) else n
    # LL128 needs NVLink inside the node and, across nodes, GPUs near enough their NICs
    # (tuning.cc pEnable: typeIntra <= NVB, typeInter by release and generation)
    ll128 = intra_hw is HopKind.NVLINK and (layout.nic_path is None or layout.nic_path in t.ll128_nic_paths)
    out: dict[tuple[Algo, Protocol], tuple[float, float]] = {}
    for algo in ALGOS_BY_KIND[kind]:
        if not _enabled(cfg, algo, layout):
            continue
        nch, bw_intra, bw_inter = _graph(cfg, layout, algo)
        for p, proto in enumerate(PROTOCOLS):
            if algo in (Algo.NVLS, Algo.NVLS_TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN, Algo.PAT) and proto is not Protocol.SIMPLE:
                continue
            if proto is Protocol.LL128 and not ll128:
                continue
            collnet = algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)
            bw = bw_intra if nodes <= 2 or collnet else bw_inter
            if algo in (Algo.NVLS, Algo.NVLS_TREE) and not t.nvls_switch_model:
                # NCCL 2.27 and earlier: the graph's bandwidth; NVLS_TREE beyond two nodes
                # at half the network's (an inner node of the tree sends and receives twice)
                inter = bw_inter if algo is Algo.NVLS or nodes <= 2 else bw_inter / 2
                bw = min(bw_intra, inter)
            elif algo in (Algo.NVLS, Algo.NVLS_TREE):
                # the switch's bus bandwidth per channel (NCCL 2.28+): the graph's intra
                # bandwidth x nvlsEfficiency x (channels-1)/channels, twice for an
                # all_reduce (it pipelines its reduce and its multicast); the network's,
                # twice on two nodes for NVLS_TREE; at most perChMaxNVLSTreeBw
                nvls_intra = bw_intra * t.nvls_efficiency * (nch - 1) / nch
                nvls_intra *= 2.0 if kind is OpKind.ALL_REDUCE else (ppn - 1) / ppn
                # (on one node nothing crosses the network: the switch alone limits it)
                nvls_inter = math.inf if nodes == 1 else bw_inter * (2.0 if nodes <= 2 and algo is Algo.NVLS_TREE else 1.0)
                bw = min(nvls_intra, nvls_inter)
                if algo is Algo.NVLS_TREE:
                    bw = min(bw, t.nvls_tree_channel_gb_per_s[index2])
            bus = nch * bw
            if algo is Algo.RING and proto is Protocol.LL:
                bus = min(ll_max, bus * 0.5)
            if algo is Algo.RING and proto is Protocol.LL128:
                bus = min(bus * 0.92, nch * t.ring_ll128_channel_gb_per_s[index2])
            if algo is Algo.TREE and kind is OpKind.ALL_REDUCE:
                bus = min(bus * 0.92, nch * t.tree_channel_gb_per_s[index2])
            if algo is Algo.TREE and proto is Protocol.LL:
                bus = min(bus / 3.8, ll_max)
            if algo is Algo.TREE and proto is Protocol.LL128:
                bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), nch * t.tree_ll128_channel_gb_per_s[index2])
            if algo is Algo.COLLNET_DIRECT:
                if kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
                    bus = 0.0 if nodes > 1 else ppn * bw  # needs the network's allgather/reducescatter
                else:
                    factor = ppn / nch
                    bus /= factor - (factor - 1) / 2
                    if cfg.generation in (Generation.HOPPER, Generation.BLACKWELL):
                        bus *= 0.85
            if algo is Algo.NVLS and kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER) and nodes > 1:
                bus = 0.0
            if algo is Algo.PAT:
                bus *= t.pat_bandwidth_factor
            if not (algo is not Algo.RING and kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)):
                if algo is Algo.RING:
                    bus *= n / nsteps
                elif algo in (Algo.NVLS, Algo.NVLS_TREE):
                    bus *= n / nsteps if t.nvls_switch_model else 5.0 / 6.0
                else:
                    bus *= 0.5
            if bus <= 0.0:
                continue
            lat = t.base_latency_us[algo][p]
            intra_lat = t.hop_latency_us[intra_hw][algo][p]
            inter_lat = t.hop_latency_us[HopKind.NETWORK][Algo.TREE if ppn == 1 else algo][p] + cfg.net_message_us(proto)
            if algo is Algo.RING:
                if kind in (OpKind.BROADCAST, OpKind.REDUCE):
                    if nodes == 1:  # every channel on the same ring (NCCL's graph.sameChannels)
                        lat += t.hop_latency_us[hw][algo][p]
                    else:
                        # the channels' rings differ across nodes (sameChannels 0, `ring_orders`):
                        # NCCL adds a hop per step, Simple's at the tree's Simple hop
                        lat += nsteps * t.hop_latency_us[hw][Algo.TREE if proto is Protocol.SIMPLE else algo][p]
                else:
                    overhead = 0.0
                    if nodes > 1:
                        overhead = cfg.net_overhead_us * (3 if proto is Protocol.SIMPLE else 1)
                    intra_lat = max(intra_lat, overhead)
                    inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if kind is OpKind.ALL_REDUCE else nodes - 1
                    lat += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
            elif algo is Algo.TREE:
                lat += 2 * ((n // nodes - 1) * intra_lat + log2i(nodes) * inter_lat)
            elif algo is Algo.COLLNET_DIRECT:
                lat += 2 * (min(1, n // nodes - 1) * intra_lat + (n // nodes - 1) * 0.4) + inter_lat
            elif algo is Algo.COLLNET_CHAIN:
                lat += 2 * (n // nodes - 1) * intra_lat + inter_lat
            elif algo is Algo.NVLS:
                lat = intra_lat + (inter_lat if nodes > 1 else 0.0)
            elif algo is Algo.NVLS_TREE:
                lat += intra_lat + 2 * log2i(nodes) * inter_lat
            elif algo is Algo.PAT:
                lat += log2i(nodes) * inter_lat / PAT_LEVEL_DIVISOR + n * PAT_RANK_US
            out[(algo, proto)] = (lat, bus)
    return out


def _enabled(cfg: NcclConfig, algo: Algo, layout: Layout) -> bool:
    """Whether the machine has what `algo` needs for this group (tuning.cc, enqueue.cc)."""
    nodes = layout.num_nodes
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        if not cfg.nvls or layout.intra_hop is not HopKind.NVLINK or layout.ppn < 2:
            return False
        if algo is Algo.NVLS_TREE and nodes == 1:
            return False
        if algo is Algo.NVLS and nodes > 1 and not cfg.collnet:
            return False
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        if not cfg.collnet or nodes == 1 or layout.ppn > _MAX_DIRECT_ARITY + 1:
            return False
        if algo is Algo.COLLNET_DIRECT and not layout.nvswitch:
            return False
    if algo is Algo.PAT:
        # one GPU a node, with the release's PAT, and a plugin that leaves no unpacking to
        # the GPU (tuning.cc `ncclPatEnable`)
        return cfg.tuning.pat and nodes == layout.n and not cfg.net_device_offload
    return True


def nccl_time_us(cfg: NcclConfig, kind: OpKind, layout: Layout, algo: Algo, proto: Protocol, lat: float, bw: float,
                 size_bytes: float) -> float:  # fmt: skip
    """NCCL's predicted time of one op (enqueue.cc `ncclTopoGetAlgoTime`, one op in flight)."""
    log_size = log2i(int(size_bytes) >> 6) if size_bytes >= 64 else -1
    if algo is Algo.TREE and kind is OpKind.ALL_REDUCE and 0 <= log_size < 23:
        bw *= _TREE_CORRECTION[PROTOCOLS.index(proto)][log_size]
    if (algo is Algo.RING and proto is Protocol.SIMPLE and layout.num_nodes > 1 and kind is OpKind.ALL_REDUCE
            and size_bytes / (cfg.channels * layout.n) >= 64):  # fmt: skip
        lat *= 1.9 if cfg.generation is Generation.VOLTA else 1.4  # "plateau effect of ring"
    return lat + size_bytes / (1000.0 * bw)


def select(cfg: NcclConfig, kind: OpKind, layout: Layout, size_bytes: int, algo: Algo | None = None,
           proto: Protocol | None = None, op: Op | None = None) -> Choice:  # fmt: skip
    """What NCCL runs: the fastest enabled algorithm x protocol by NCCL's table, among those
    the op (`algo=`, `proto=`) and the machine (`nccl.algo`, `nccl.proto`) allow; an op that
    forces what the machine lacks is an error naming what it has."""
    if kind is OpKind.BARRIER:  # torch's NCCL barrier: an all_reduce of one element
        kind, size_bytes = OpKind.ALL_REDUCE, 4
    if kind in P2P_BASED:
        return p2p_choice(cfg, kind, layout, size_bytes, proto, op=op)
    if layout.n <= 1:
        return Choice(Algo.RING, Protocol.SIMPLE, 1)  # enqueue.cc: one rank, nothing moves
    table = nccl_table(cfg, kind, layout)
    algos = {algo} if algo is not None else cfg.algos
    protos = {proto} if proto is not None else cfg.protos
    best: tuple[float, Algo, Protocol] | None = None
    for (a, p), (lat, bw) in table.items():
        if (algos is not None and a not in algos) or (protos is not None and p not in protos):
            continue
        t = nccl_time_us(cfg, kind, layout, a, p, lat, bw, size_bytes)
        if best is None or t < best[0]:
            best = (t, a, p)
    if best is None:
        has = ", ".join(sorted({f"{a.value}/{p.value}" for a, p in table}))
        # what the op forces, else what the machine (nccl.algo / nccl.proto, a log's NCCL_ALGO) allows
        named = [", ".join(sorted(x.value for x in allowed)) for allowed in (algos, protos) if allowed is not None]
        wanted = "/".join(named) or "algorithm and protocol"
        if (algo is None and cfg.algos is not None) or (proto is None and cfg.protos is not None):
            wanted += " among the machine's nccl.algo / nccl.proto"
        why = ""
        if Protocol.LL128 in (protos or ()) and layout.nic_path is not None and layout.nic_path not in cfg.tuning.ll128_nic_paths:
            why = (f"; LL128 does not cross the network where the GPUs reach their NICs {NIC_PATH_WORDS[layout.nic_path]}"
                   " (tuning.cc: typeInter)")  # fmt: skip
        raise ScheduleError(f"NCCL has no {wanted} for {kind.value} on {layout.n} ranks over {layout.num_nodes} node(s) of this "
                            f"machine (it has: {has or 'nothing'}){why}", op.loc if op else None, rank=op.rank if op else None)  # fmt: skip
    _, a, p = best
    return Choice(a, p, collective_channels(cfg, a, p, layout, size_bytes))


def collective_channels(cfg: NcclConfig, algo: Algo, proto: Protocol, layout: Layout, size_bytes: int) -> int:
    """Channels a collective uses (enqueue.cc `topoGetAlgoInfo`): NVLS its own; ring and
    tree drop channels while a channel would get less than threads x threshold bytes."""
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return cfg.nvls_channels if layout.num_nodes == 1 or algo is Algo.NVLS_TREE else min(cfg.nvls_channels, cfg.channels)
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        return cfg.channels
    threshold = THREAD_THRESHOLD_BYTES[proto] * (layout.n if algo is Algo.RING and proto is Protocol.LL else 1)
    per_channel = MAX_THREADS[proto] * threshold
    return max(1, min(cfg.coll_channels(layout.num_nodes), int(size_bytes // per_channel)))


@dataclass(frozen=True)
class P2pComm:
    """What NCCL's point-to-point channel counts depend on beyond the pair: its communicator."""

    ranks: int
    """Ranks of the communicator (at least the pair's 2)."""
    nodes: int
    """Nodes the communicator spans: across nodes NCCL sizes every transfer of the
    communicator for the network, even one between two GPUs of a node (init.cc
    `computeBuffSizes`: P2P chunk; enqueue.cc `addP2pToPlan`: part sizes)."""
    nic_gb_per_s: float = 0.0
    """A GPU's NIC bandwidth (0: no network), GB/s: how many channels NCCL gives a peer
    across the network (paths.cc `ncclTopoGetNchannels`)."""
    nics: int = 0
    """NICs the communicator's GPUs reach the network through, on the node that uses the
    fewest (0: every NIC of a node): NCCL's graph across nodes has a ring per NIC it uses."""


def p2p_choice(cfg: NcclConfig, kind: OpKind, layout: Layout, size_bytes: int, proto: Protocol | None = None,
               comm: P2pComm | None = None, op: Op | None = None) -> Choice:  # fmt: skip
    """Point-to-point based ops: per peer, NCCL's channels (`p2p_channels_per_transfer` in
    the communicator `comm`; None: the op's own ranks), and LL when the bytes per peer fit
    in channels x NCCL_P2P_LL_THRESHOLD, else Simple."""
    p2p = kind in (OpKind.SEND, OpKind.RECV)
    per_peer = size_bytes if p2p else size_bytes // max(layout.n, 1)
    peers = 1 if p2p else max(layout.n - 1, 1)
    if comm is None:
        comm = P2pComm(max(layout.n, 2), layout.num_nodes)
    hop = HopKind.NETWORK if comm.nodes > 1 else layout.intra_hop
    channels = p2p_channels_per_transfer(cfg, comm, per_peer, hop)
    if proto is None:
        allowed = cfg.protos
        ll = per_peer <= channels * P2P_LL_THRESHOLD_BYTES and (allowed is None or Protocol.LL in allowed)
        proto = Protocol.LL if ll else Protocol.SIMPLE
    elif proto is Protocol.LL128:
        raise ScheduleError(f"proto=ll128: NCCL's point-to-point transfers ({kind.value} here) run LL or Simple, not LL128",
                            op.loc if op else None, rank=op.rank if op else None)  # fmt: skip
    total = min(p2p_channel_total(cfg, comm), channels * peers)
    return Choice(Algo.DIRECT, proto, total)


# search.cc `ncclTopoDupChannels`: a graph whose rings carry at least DUP_MIN GB/s each
# is doubled, except on Hopper and later when it has more than DUP_MAX_RINGS rings of
# less than DUP_KEEP GB/s each.
P2P_DUP_MIN_GB_PER_S, P2P_DUP_KEEP_GB_PER_S, P2P_DUP_MAX_RINGS = 25.0, 50.0, 4


def p2p_channel_total(cfg: NcclConfig, comm: P2pComm) -> int:
    """NCCL's P2P channels of the communicator (`p2pnChannels`): its collective channels
    rounded up to a power of two (`NcclConfig.p2p_channel_count`). Across nodes those come
    from the graph NCCL searches over the NICs: a ring per NIC the communicator's GPUs
    use (each carrying at most its NIC's bandwidth), doubled by `ncclTopoDupChannels`'
    rule (`P2P_DUP_*`) and again by connect.cc `ncclTopoPostset`, at most the whole
    nodes' `channels_across_nodes`. On DGX H100 (a 47 GB/s NIC per GPU) 1, 2, 4 and 8
    GPUs a node have 4, 8, 16 and 16 channels."""
    full = cfg.p2p_channel_count(comm.nodes)
    if comm.nodes <= 1 or cfg.channels_across_nodes is None or comm.nics <= 0:
        return full
    ring_gb = comm.nic_gb_per_s
    newer = cfg.generation in (Generation.HOPPER, Generation.BLACKWELL)
    kept = newer and ring_gb < P2P_DUP_KEEP_GB_PER_S and comm.nics > P2P_DUP_MAX_RINGS
    dup = ring_gb >= P2P_DUP_MIN_GB_PER_S and not kept
    channels = min(cfg.channels_across_nodes, 2 * comm.nics * (2 if dup else 1))
    return min(full, 1 << (channels - 1).bit_length())


def p2p_channels_per_peer(cfg: NcclConfig, comm: P2pComm) -> int:
    """The most channels NCCL gives one peer (`p2pnChannelsPerPeer`). On one node, the
    machine's `p2p_channels_per_peer`. Across nodes, NCCL takes the least over all peers
    (paths.cc `ncclTopoComputeP2pChannelsPerPeer`), and a peer across the network gets
    one channel per NCCL_P2P_PER_CHANNEL_NET_BW (14 GB/s) of its GPU's NIC bandwidth
    (`ncclTopoGetNchannels`), rounded up to a power of two; then NCCL halves it until one
    round of every peer, 8 peers to a work batch, fits in `p2p_channels`
    (`ncclTopoComputeP2pChannels`, NCCL 2.29): 4 channels a peer among 16 ranks of DGX H100
    nodes, 2 among 80."""
    most = cfg.p2p_channels_per_peer
    if comm.nodes <= 1:
        return most
    if comm.nic_gb_per_s > 0:
        net = max(1, math.ceil(comm.nic_gb_per_s / P2P_CHANNEL_NET_GB_PER_S))
        most = min(most, 1 << (net - 1).bit_length())
    rounds = -(-comm.ranks // P2P_PEERS_PER_BATCH)
    while most * rounds > p2p_channel_total(cfg, comm) and most > 1:
        most //= 2
    return most


def p2p_channels_per_transfer(cfg: NcclConfig, comm: P2pComm, nbytes: int, hop: HopKind) -> int:
    """Channels one send uses (enqueue.cc `addP2pToPlan`): as few as its size needs, in
    parts of one to 32 P2P steps (one half to one across nodes), doubling up to the
    per-peer maximum (`p2p_channels_per_peer`); the minimum shrinks so that all peers'
    channels fit in `p2p_channels`."""
    if nbytes <= 0:
        return 1
    most = p2p_channels_per_peer(cfg, comm)
    least = most
    while least * comm.ranks > p2p_channel_total(cfg, comm) and least > 1:
        least //= 2
    step = P2P_CHUNK_BYTES[hop]
    min_part = step // 2 if comm.nodes > 1 else step // 8
    max_part = step if comm.nodes > 1 else step * 32
    n = max(1, min(least, math.ceil(nbytes / min_part)))
    part = max(min_part, math.ceil(nbytes / n))
    while part > max_part and n <= most // 2:
        n *= 2
        part = math.ceil(nbytes / n)
    return n


# ---- the physics ------------------------------------------------------------------------


def latency_us(cfg: NcclConfig, kind: OpKind, layout: Layout, algo: Algo, proto: Protocol) -> float:
    """The latency part of a collective's time on this machine (see the module doc)."""
    spec = cfg.protocol(proto)
    intra = spec.hop_us(layout.intra_hop)
    net = spec.hop_us(HopKind.NETWORK) + cfg.net_message_us(proto)
    n, nodes = layout.n, layout.num_nodes
    if n <= 1:
        return 0.0
    if kind is OpKind.BARRIER:
        kind = OpKind.ALL_REDUCE
    if kind in P2P_BASED:
        if kind in (OpKind.SEND, OpKind.RECV):
            # One peer's kernel: NCCL's own base latency of the protocol, not the fixed
            # cost a machine's collectives were fitted to. Across nodes the receiver's
            # proxy posts its buffer and its clear-to-send crosses the network before the
            # sender's proxy writes the first chunk (net transport): two of the proxies'
            # network steps, Simple's whatever the protocol (LL's own step is a ring's
            # with its buffers already posted), and the network's latency per message.
            base = cfg.tuning.base_latency_us[Algo.RING][PROTOCOLS.index(proto)]
            if nodes <= 1:
                return base + intra
            step = cfg.protocol(Protocol.SIMPLE).hop_us(HopKind.NETWORK)
            return base + 2 * step + cfg.net_latency_us + cfg.net_message_us(proto)
        return spec.base_latency_us + (net if nodes > 1 else intra) + proxy_posts_us(cfg, kind, layout, proto)
    if algo in (Algo.RING, Algo.CHAIN):
        if kind is OpKind.ALL_REDUCE:
            steps, inter = 2 * (n - 1), 2 * (nodes - 1)
        elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
            steps, inter = n - 1, nodes - 1
        else:
            steps, inter = n, nodes - 1
        if kind in (OpKind.BROADCAST, OpKind.REDUCE) or nodes == 1:
            return spec.base_latency_us + (steps - inter) * intra + inter * net
        if proto is Protocol.LL:
            # LL forwards each 8-byte word as its flag lands: a piece crosses the ring hop
            # by hop, each hop once (NCCL's own formula), a step inside a node no shorter
            # than the proxy's post of the step that leaves it (tuning.cc: "inter-node
            # rings still have to launch nsteps * net overhead")
            return spec.base_latency_us + (steps - inter) * max(intra, cfg.net_overhead_us) + inter * net
        # LL128 and Simple: every rank takes a step at once and waits for its
        # predecessor's piece: across nodes each step of the ring lasts as long as its
        # slowest hop, the network's (kept linear in the hop latencies, as the
        # calibration's closed form needs). The network's own latency per message is no
        # part of a step's turn: a connection keeps NCCL_STEPS messages in flight, so the
        # ring pays it once per crossing of its chain, as NCCL's table counts it.
        return spec.base_latency_us + steps * spec.hop_us(HopKind.NETWORK) + inter * cfg.net_message_us(proto)
    if algo is Algo.TREE:
        return spec.base_latency_us + 2 * ((layout.ppn - 1) * intra + log2i(nodes) * _tree_net_hop_us(cfg, algo, proto))
    if algo is Algo.NVLS:
        return cfg.nvls_latency_us + (net if nodes > 1 else 0.0)
    if algo is Algo.NVLS_TREE:
        return cfg.nvls_latency_us + 2 * log2i(nodes) * _tree_net_hop_us(cfg, algo, proto)
    if algo is Algo.PAT:
        # NCCL's own figures, as no measured curve of PAT was at hand to time it by: its
        # base (not the one a machine's rings are fitted to, which carries their pipeline
        # start), log2(N) tree levels, pipelined (each a fraction of the machine's tree
        # level), and a part linear in the ranks
        base = cfg.tuning.base_latency_us[Algo.PAT][PROTOCOLS.index(proto)]
        return base + log2i(nodes) * _tree_net_hop_us(cfg, Algo.TREE, proto) / PAT_LEVEL_DIVISOR + n * PAT_RANK_US
    if algo is Algo.COLLNET_DIRECT:
        return spec.base_latency_us + 2 * intra + net
    if algo is Algo.COLLNET_CHAIN:
        return spec.base_latency_us + 2 * (layout.ppn - 1) * intra + net
    raise AssertionError(f"no latency for {algo}")


def proxy_posts_us(cfg: NcclConfig, kind: OpKind, layout: Layout, proto: Protocol) -> float:
    """What a point-to-point based op across nodes waits while NCCL's proxies post its
    network operations one after another. Every remote peer of a rank is a network
    send and receive that one CPU proxy thread posts, each costing the host's network
    overhead (tuning.cc `getNetOverhead`: 1 us on Intel, 2 on AMD; three times that with
    Simple, NCCL's own factor where it counts a ring's network steps: "inter-node rings
    still have to launch nsteps * net overhead"). The
    first peer's is the op's network hop; the rest come on top. With PXN (rail-aligned
    sends through the destination rail's GPU) a NIC's proxy posts the sends of all its
    node's GPUs to its rail and its own GPU's receives: as many pairs as without, the
    rank's remote peers. So an all_to_all over 10 x 8 H100 (72 remote peers) waits
    71 x 3 us; a send waits nothing more than its hop."""
    if layout.num_nodes <= 1 or kind in (OpKind.SEND, OpKind.RECV):
        return 0.0
    remote = max(layout.n - len(members) for members in layout.nodes)
    return max(remote - 1, 0) * cfg.net_overhead_us * (3 if proto is Protocol.SIMPLE else 1)


def nvls_chunk_bytes(algo: Algo, layout: Layout, channels: int, size_bytes: float) -> int:
    """The chunk an NVLS kernel moves per channel and head (enqueue.cc `calcCollChunking`):
    NCCL_NVLS_CHUNKSIZE, halved while the op is small against the lanes (channels x heads,
    a head per GPU of the node) x chunk: below 64, 8 and 2 lanes' chunks for NVLS (down to
    64, 32, 16 KiB), below 32, 16, 4 and 1 for NVLS_TREE (256, 128, 64, 32 KiB)."""
    lanes = channels * layout.ppn
    if algo is Algo.NVLS:
        chunk, steps = NVLS_CHUNK_BYTES, ((64, 65536), (8, 32768), (2, 16384))
    else:
        chunk = NVLS_CHUNK_BYTES if layout.num_nodes < 4 else min(NVLS_CHUNK_BYTES, NVLS_TREE_MAX_CHUNK_BYTES_4_NODES)
        steps = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
    for lanes_chunks, smaller in steps:
        if size_bytes < lanes_chunks * lanes * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_fill_bytes(algo: Algo, layout: Layout, channels: int, size_bytes: float) -> float:
    """The pipeline fill of an NVLS kernel, in bytes of the op moved at its rate: every
    lane (channel x head) streams once `NVLS_PIPELINE_CHUNKS` of its chunks are in flight,
    so the op takes as long as if it were that many chunks per lane larger. Small ops get
    small chunks (`nvls_chunk_bytes`) and so a small fill; at 32-64 MiB on 8 H100 the
    fill is about a third of the op. A lane never waits for more than the op holds."""
    lanes = channels * layout.ppn
    return NVLS_PIPELINE_CHUNKS * min(nvls_chunk_bytes(algo, layout, channels, size_bytes) * lanes, size_bytes)


def _tree_net_hop_us(cfg: NcclConfig, algo: Algo, proto: Protocol) -> float:
    """A tree level across nodes: a parent takes its two children's pieces before it sends
    up, so a level costs more than a ring's network step. NCCL's table says how much
    (hwLat NET, the tree or NVLS_TREE column: LL 5.0, LL128 8.5, Simple 14; NVLS_TREE 20.9
    from NCCL 2.28.9, 14 before: v2.28.9 raised it with a change to how NCCL's proxy
    thread orders its operations), of the machine's NCCL release; the machine scales it
    (`tree_net_scale`) and its network adds its own latency per message."""
    return cfg.tuning.hop_latency_us[HopKind.NETWORK][algo][PROTOCOLS.index(proto)] * cfg.tree_net_scale + cfg.net_message_us(proto)


def channel_cap_gb_per_s(cfg: NcclConfig, choice: Choice, kind: OpKind, nodes: int = 1) -> float:
    """The most the chosen kernel's channels move per rank (GB/s of its busiest rank's
    bytes): channels x what one channel moves with the protocol (P2P channels for
    point-to-point based ops, at their network rate when the ranks span `nodes` > 1)."""
    if kind in P2P_BASED:
        per_channel = cfg.p2p_channel_bandwidth_gb_per_s
        if nodes > 1:
            per_channel = min(per_channel, cfg.p2p_net_channel_bandwidth_gb_per_s)
        return choice.channels * per_channel
    if choice.algo in (Algo.NVLS, Algo.NVLS_TREE):
        return math.inf  # the switch reduces; only the links limit it
    return choice.channels * cfg.protocol(choice.proto).channel_bandwidth_gb_per_s


def efficiency(cfg: NcclConfig, choice: Choice) -> float:
    """Data per byte on the wire of the chosen kernel (NVLS: the machine's NVLS efficiency)."""
    if choice.algo in (Algo.NVLS, Algo.NVLS_TREE):
        return cfg.nvls_efficiency
    return cfg.protocol(choice.proto).efficiency


def net_wire_format(choice: Choice, kind: OpKind) -> bool:
    """Whether the NICs carry the chosen kernel's bytes at a protocol's wire format, which
    no fit moves (ring, tree, PAT, CollNet and NVLS_TREE collectives), rather than at the
    kernel's own efficiency (point-to-point based ops, NVLS)."""
    return kind not in P2P_BASED and choice.algo is not Algo.NVLS


def net_efficiency(cfg: NcclConfig, choice: Choice, kind: OpKind) -> float:
    """Data per byte on a NIC's link of the chosen kernel: a collective's at its protocol's
    wire format (`PROTOCOL_EFFICIENCY`: NCCL's net transport sends the buffer as it is,
    and a NIC's rate is what NCCL delivers through it), NVLS_TREE's at Simple's (its tree
    between nodes runs the net transport with Simple); point-to-point based ops and NVLS
    kernels as on every other link (`efficiency`)."""
    if not net_wire_format(choice, kind):
        return efficiency(cfg, choice)
    return PROTOCOL_EFFICIENCY[Protocol.SIMPLE if choice.algo is Algo.NVLS_TREE else choice.proto]


# ---- where bytes go ------------------------------------------------------------------


def ring_orders(layout: Layout, channels: int) -> list[list[int]]:
    """One ring per channel. Inside a node the ring visits the node's ranks in a rotated
    order, entering at member c and leaving at member c+1 (mod ppn) of channel c; across
    nodes it goes from one node's exit to the next node's entry. Every NIC of a node with a
    GPU per NIC thus carries the rings of channels/ppn channels in each direction: NCCL's
    rings are rail-aligned in the same sense. On a node whose GPUs form an NVLink mesh
    (`Layout.mesh`) the order in between is `_mesh_path`'s."""
    out = []
    loads: dict[tuple[int, int], int] = {}  # mesh nodes: rings per GPU-to-GPU link so far
    for c in range(channels):
        ring: list[int] = []
        for members in layout.nodes:
            m = len(members)
            start = c % m
            if layout.mesh and 3 <= m <= MESH_SEARCH_MAX_GPUS:
                ring.extend(_mesh_path(members, start, (start + 1) % m if layout.num_nodes > 1 else None, loads))
            else:
                # enter at `start`, walk down, leave at start + 1: start, start-1, ..., start+1
                ring.extend(members[(start - i) % m] for i in range(m))
        out.append(ring)
    return out


MESH_SEARCH_MAX_GPUS = 6
"""The most GPUs of a mesh node whose rings `_mesh_path` searches ((n-1)! orders);
larger ones keep the rotated order."""


def _mesh_path(members: tuple[int, ...], start: int, exit_: int | None, loads: dict[tuple[int, int], int]) -> list[int]:
    """A channel's order through a node whose GPUs are all joined pairwise (`Layout.mesh`):
    from member `start`, every member once, to member `exit_` (None: on one node, back to
    `start`, a cycle). Like NCCL's ring search, which places each ring on the links the
    rings before it left free, it takes the order whose busiest link carries the fewest
    rings once it is added (then the fewest in all; then the first in order), and counts
    it in `loads`. On 4 GPUs the 24 channels of one node spread over all 12 links, 8
    rings each, where one rotated order would put them all on 4 of them."""
    first = members[start]
    rest = [r for i, r in enumerate(members) if i != start and (exit_ is None or i != exit_)]
    best: tuple[tuple[int, int], list[int], list[tuple[int, int]]] | None = None
    for middle in itertools.permutations(rest):
        path = [first, *middle] + ([] if exit_ is None else [members[exit_]])
        links = list(zip(path, path[1:])) + ([(path[-1], first)] if exit_ is None else [])
        after = [loads.get(link, 0) + 1 for link in links]
        score = (max(after), sum(after))
        if best is None or score < best[0]:
            best = (score, path, links)
    assert best is not None
    for link in best[2]:
        loads[link] = loads.get(link, 0) + 1
    return best[1]


def ring_edges(layout: Layout, channels: int, bytes_per_channel_edge: float) -> dict[tuple[int, int], float]:
    """(src, dst) -> bytes of `channels` rings, each edge carrying `bytes_per_channel_edge`."""
    out: dict[tuple[int, int], float] = {}
    for ring in ring_orders(layout, channels):
        n = len(ring)
        for i in range(n):
            key = (ring[i], ring[(i + 1) % n])
            out[key] = out.get(key, 0.0) + bytes_per_channel_edge
    return out


def _btree_parent(count: int, i: int) -> int:
    """Parent of position `i` in NCCL's binary tree of `count` positions (trees.cc
    `ncclGetBtree`: rooted at 0, which has one child; a position's lowest set bit says its
    level, so leaves and inner positions alternate); -1 for the root."""
    if i == 0:
        return -1
    bit = i & -i
    up = (i ^ bit) | (bit << 1)
    return up if up < count else i ^ bit


def _binary_tree(count: int, second: bool) -> list[int]:
    """Parent of each of `count` positions (-1: the root) in NCCL's double binary tree
    (trees.cc `ncclGetDtree`): the first tree is `ncclGetBtree`'s; the `second` is its
    mirror (count even) or the same tree shifted by one position (count odd), so that a
    position inner in one tree is a leaf in the other."""
    if not second:
        return [_btree_parent(count, i) for i in range(count)]
    if count % 2 == 1:
        out = []
        for i in range(count):
            p = _btree_parent(count, (i - 1) % count)
            out.append(-1 if p < 0 else (p + 1) % count)
        return out
    out = []
    for i in range(count):
        p = _btree_parent(count, count - 1 - i)
        out.append(-1 if p < 0 else count - 1 - p)
    return out


def tree_edges(layout: Layout, channels: int, size: float) -> dict[tuple[int, int], float]:
    """Double binary tree all_reduce: per channel a chain through each node from a head
    (member c mod ppn, its NIC's GPU) and, across nodes, NCCL's binary tree of the heads
    (odd channels its second tree, so a node that is inner in one tree is a leaf in the other).
    Each channel reduces size/channels up and broadcasts it down every edge."""
    share = size / max(channels, 1)
    trees = [_binary_tree(len(layout.nodes), second) for second in (False, True)]
    # Channel c's edges depend on c only modulo the period below (the tree's parity and each
    # node's head), so the first period's channels stand for all, each counted as often as
    # its residue recurs. An edge's bytes are then `share` added once per use, as a sum in
    # channel order would give them (the same float: every term is `share`).
    period = math.lcm(2, *(len(members) for members in layout.nodes))
    uses: dict[tuple[int, int], int] = {}
    for c in range(min(channels, period)):
        times = (channels - 1 - c) // period + 1
        heads = []
        for members in layout.nodes:
            m = len(members)
            order = [members[(c + i) % m] for i in range(m)] if m > 1 else members
            heads.append(order[0])
            for a, b in zip(order, order[1:]):
                uses[(a, b)] = uses.get((a, b), 0) + times
                uses[(b, a)] = uses.get((b, a), 0) + times
        for i, p in enumerate(trees[c % 2]):
            if p >= 0:
                a, b = heads[i], heads[p]
                uses[(a, b)] = uses.get((a, b), 0) + times
                uses[(b, a)] = uses.get((b, a), 0) + times
    sums = [0.0]
    for _ in range(max(uses.values(), default=0)):
        sums.append(sums[-1] + share)
    return {edge: sums[n] for edge, n in uses.items()}


def head_tree_edges(layout: Layout, size: float) -> dict[tuple[int, int], float]:
    """The network part of NVLS_TREE: every member is the head of 1/ppn of the data, and
    the heads of one rail (same position in their node) reduce and broadcast their share
    over NCCL's double binary tree of the nodes (half on each tree; `_binary_tree`)."""
    out: dict[tuple[int, int], float] = {}
    ppn = layout.ppn
    share = size / ppn / 2
    for second in (False, True):
        for i in range(ppn):
            heads = [members[i % len(members)] for members in layout.nodes]
            for j, p in enumerate(_binary_tree(len(heads), second)):
                if p >= 0:
                    a, b = heads[j], heads[p]
                    out[(a, b)] = out.get((a, b), 0.0) + share
                    out[(b, a)] = out.get((b, a), 0.0) + share
    return out


# ---- broadcast and reduce: a chain whose members go one after another -----------------

CHAIN_CHUNK_BYTES = {Protocol.LL: 4096, Protocol.LL128: 38400, Protocol.SIMPLE: 524288}
"""The data a member of a ring broadcast / reduce must have whole, per channel, before it
forwards any of it to a GPU of its node (the unit each hop of the chain fills in). LL and
LL128 forward line by line as the flags arrive: LL a trip of every thread's line
(prims_ll.h, 512 threads x 8 data bytes), LL128 a round of every warp's slice
(prims_ll128.h `WireWordPerSlice`: 640 threads x 8 words x 8 B, 15/16 of it data).
Simple forwards a slice once its sender posts it: a step (enqueue.cc `calcCollChunking`:
4 MiB / NCCL_STEPS = 8, BROADCAST_ and REDUCE_SLICESTEPS 1), or the channel's whole share
when that is less."""

CHAIN_NET_STEP_BYTES = {Protocol.LL: 32768, Protocol.LL128: 576000, Protocol.SIMPLE: 524288}
"""The same across the network: NCCL's proxy sends a step as one message once the GPU has
written all of it (transport/net.cc `sendProxyProgress`: the step's size from the
connection FIFO; for LL it checks every line's flags of the step first), so a member at a
node's exit holds a whole step, per channel, before any of it leaves. A step's data is the
protocol's buffer / NCCL_STEPS (`calcCollChunking`): LL 8 lines x 512 threads x 16 B / 2
(half of a line is flags) = 32 KiB, LL128 120 x 640 x 8 B x 120/128 = 576,000 B, Simple
512 KiB; or the channel's share when that is less."""


@dataclass(frozen=True)
class Chain:
    """A ring broadcast or reduce as NCCL runs it: on each channel a chain along that
    channel's ring with no barrier. On ring j, member k (in the order data flows: the root
    first for broadcast, last for reduce) begins its part `lead_us[j][k]` after member k-1
    began its own (the first chunk crossed the hop between them) and once its stream
    reached the op; the part lasts `part_us[j][k]`, and never ends before member k-1's on
    that ring. A member's op ends when its parts on every ring have: where the channels'
    rings visit a node's GPUs in different orders (`ring_orders`), a member early on one
    ring is late on another, and every member waits for most of the chain."""

    orders: tuple[tuple[int, ...], ...]
    """Per distinct ring of the op's channels, the members (global ranks) in the order data flows."""
    lead_us: tuple[tuple[float, ...], ...]
    """Per ring and position, the hop from the member before plus the first chunk at the
    op's rate (across the network a whole step, and the proxy's cost of its message; 0 first)."""
    part_us: tuple[tuple[float, ...], ...]
    """Per ring and position, the member's part: NCCL's base latency, its outgoing hop (the
    last member: a step inside its node, as NCCL's tuning counts n steps), the op's bytes
    at its rate (the last member: all but the first chunk, which its lead counted) and, on
    a ring that crosses nodes, the proxy's cost of each of a channel's messages."""

    @property
    def alone_us(self) -> float:
        """The op's time when every member arrives at once: the last member's end on the longest ring."""
        return max(sum(lead) + part[-1] for lead, part in zip(self.lead_us, self.part_us))


def chain(cfg: NcclConfig, kind: OpKind, layout: Layout, choice: Choice, root: int | None, size_bytes: float,
          rate_bytes_per_us: float) -> Chain:  # fmt: skip
    """The chains of a ring broadcast / reduce (see `Chain`) along the rings of its channels
    (the distinct ones: channel c's ring repeats channel c - ppn's; one ring on one node), its bytes moving at
    `rate_bytes_per_us` (the op's solo rate on the links), each channel carrying its share
    at its share of the rate. On one ring, alone, the last member ends at the ring's hops
    + base + (n - 2 + k) chunks at that rate, k the chunks per channel: the pipelined chain
    of the module doc. Across nodes a network hop's chunk is a whole step
    (`CHAIN_NET_STEP_BYTES`), and each message of a channel costs `chain_message_us` more."""
    spec = cfg.protocol(choice.proto)
    intra = spec.hop_us(layout.intra_hop)
    net = spec.hop_us(HopKind.NETWORK) + cfg.net_message_us(choice.proto)
    node_of = {r: i for i, members in enumerate(layout.nodes) for r in members}
    channels = max(choice.channels, 1)

    def fill_us(per_channel_bytes: int) -> float:
        """All channels' first chunks of `per_channel_bytes` (or the op, if less) at the op's rate."""
        return min(float(size_bytes), per_channel_bytes * channels) / rate_bytes_per_us if rate_bytes_per_us > 0 else 0.0

    # Across the network NCCL's proxy launches each step of a channel as a message, at NCCL's
    # net overhead per step (tuning.cc getNetOverhead, x3 for Simple, as NCCL charges a ring's
    # network steps): in series with the channel's transfer, so a chain that crosses nodes
    # moves each channel's share at step / (step at its rate + the overhead), and every
    # member behind it keeps that pace (a connection holds NCCL_STEPS steps).
    step = CHAIN_NET_STEP_BYTES[choice.proto]
    message_us = chain_message_us(cfg, choice.proto) if layout.num_nodes > 1 else 0.0
    intra_fill, net_fill = fill_us(CHAIN_CHUNK_BYTES[choice.proto]), fill_us(step) + message_us
    bytes_us = size_bytes / rate_bytes_per_us if rate_bytes_per_us > 0 else 0.0
    bytes_us += math.ceil(size_bytes / channels / step) * message_us
    orders, leads, parts = [], [], []
    # Across nodes the channels' rings enter each node at a different GPU (its NIC's; NCCL's
    # graph then has sameChannels 0); on one node every channel runs the same ring.
    for ring in ring_orders(layout, min(channels, layout.ppn) if layout.num_nodes > 1 else 1):
        start = ring.index(root) if root in ring else 0
        order = ring[start:] + ring[:start]
        if kind is OpKind.REDUCE:
            order = order[::-1]  # data flows towards the root
        same = [node_of[a] == node_of[b] for a, b in zip(order, order[1:])]
        hops = [intra if s else net for s in same]
        fills = [intra_fill if s else net_fill for s in same]
        orders.append(tuple(order))
        leads.append(tuple([0.0] + [h + f for h, f in zip(hops, fills)]))
        parts.append(tuple([spec.base_latency_us + h + bytes_us for h in hops] + [spec.base_latency_us + intra + bytes_us - fills[-1]]))
    return Chain(tuple(orders), tuple(leads), tuple(parts))


def chain_message_us(cfg: NcclConfig, proto: Protocol) -> float:
    """What NCCL's proxy adds to each message a chain sends across the network: NCCL's net
    overhead per network step (tuning.cc `getNetOverhead`: 1 us on Intel hosts, 2 on AMD),
    three times for Simple, whose receive also needs a flush before the GPU may read it."""
    return cfg.net_overhead_us * (3 if proto is Protocol.SIMPLE else 1)
