"""NCCL transfers on a machine's links: which channels (link directions) an algorithm x
protocol loads, by how much, and how fast its kernel can go.

A transfer is one coflow (see `commdsl.sim.flow`): per byte of the op's size, the bytes it
puts on each channel, a cap (what its CTAs can move) and a latency (`commdsl.sim.nccl`).
Both network models use this: the flow network shares the channels by max-min, the
analytic one takes the coflow alone (latency + size / its solo rate), so the two agree
on any transfer that runs alone.

Where the bytes go, per algorithm (S the op's size, n ranks, C channels):

  ring            one ring per channel (`nccl.ring_orders`, rail-aligned across nodes); each
                  edge carries 2(n-1)/n S / C (all_reduce), (n-1)/n S / C (all_gather,
                  reduce_scatter); broadcast and reduce pipeline S / C along each ring from
                  (to) the root
  tree            the double binary tree of `nccl.tree_edges`: S / C up and down each edge
  nvls            each GPU to its NVSwitch and back, (1 + 1/n) S each way for all_reduce
                  (the switch reads every GPU's data to reduce, then multicasts the result);
                  all_gather S/n up and S down, reduce_scatter the reverse
  nvls_tree       NVLS inside each node, and a double binary tree of the nodes per rail over
                  the network carrying S / ppn (`nccl.head_tree_edges`)
  collnet         a ring all_reduce inside each node, and every GPU's 1/ppn share to the
                  network (which reduces it) and back
  all_to_all      every ordered pair S / n. Across nodes the bytes are summed per node and
                  NIC rather than per pair: a 4,096-rank all_to_all costs O(nodes x ppn^2)
  gather/scatter  S / n between the root and every other rank
  send            S along its route

Each channel is charged the wire bytes: the data over the protocol's efficiency (LL puts a
4-byte flag beside every 4 bytes of data, so its links carry twice the data; NVLS over
its NVLS efficiency, and NVLS_TREE's tree between nodes, NCCL's net transport with the
Simple protocol, over Simple's). A NIC's rate is what NCCL's net transport delivers
through it, and the net transport sends a protocol's buffer as it is, so a ring or tree
collective's bytes cross the network links at its protocol's wire format
(`PROTOCOL_EFFICIENCY`: LL 1/2, LL128 120/128, Simple data alone), while a machine's
fitted efficiencies, what an SM copy gets over NVLink or PCIe, stay on those links.
Point-to-point based ops keep the fitted efficiency on every link, with
`p2p_net_efficiency` on the network on top: their curves set those.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from commdsl.ir import Algo, Op, OpKind, Protocol, Transport
from commdsl.machine.model import NETWORK_VERTEX, LinkKind, Machine, Topology, VertexKind
from commdsl.machine.nccl import HopKind, NcclConfig, NicPath
from commdsl.sim import nccl
from commdsl.sim.fabric import Fabric, solo_rate

_INF = math.inf


@dataclass(frozen=True, slots=True)
class Coflow:
    """An NCCL transfer's loads, per byte of its size."""

    channel_bytes: tuple[tuple[int, float], ...]
    """(channel, wire bytes on it per byte of the op's size)."""
    cap: float
    """The most op bytes per microsecond its channels (CTAs) move."""
    latency_us: float

    def solo_rate(self, capacity: list[float]) -> float:
        """Op bytes per microsecond alone on the links: its cap, or the channel it fills first."""
        return solo_rate(capacity, self.channel_bytes, self.cap)


def machine_links(machine: Machine, world_size: int) -> tuple[Fabric, NcclFlows | None]:
    """The machine's `Fabric` for `world_size` ranks and its `NcclFlows` (None on a machine
    without `nccl:`), made once per machine and world size (`Machine.memo`): what they work
    out and cache (routes, layouts, NCCL's choices and loads) depends on the machine and
    the ranks alone, so every simulation on the machine shares it."""
    key = ("links", world_size)
    links = machine.memo.get(key)
    if links is None:
        fabric = Fabric(machine, world_size)
        links = machine.memo[key] = (fabric, NcclFlows(fabric, machine.nccl) if machine.nccl is not None else None)
    return links


_NIC_PATH_ORDER = (NicPath.PCIE_SWITCH, NicPath.C2C, NicPath.CPU, NicPath.CPUS)
"""Nearest first, as NCCL ranks its path types (topo.h)."""


def nic_paths(topo: Topology) -> tuple[NicPath, ...]:
    """Per GPU of a node, how it reaches its nearest NIC (NCCL's path type, `NicPath`): the
    best of the node's paths from the GPU to a NIC that pass no other GPU. A path with no
    CPU on it is through PCIe switches; one through a single CPU is C2C where the GPU's
    own link to that CPU is NVLink (GH200), else through the CPU's root complex; one
    through two CPUs crosses sockets. A GPU of a node without NICs counts as near: its
    node never reaches the network, so nothing is restricted."""
    gpus = [f"gpu{i}" for i in range(topo.gpus_per_node)]
    kinds = {**dict(topo.vertices), **{g: VertexKind.GPU for g in gpus}, NETWORK_VERTEX: VertexKind.NETWORK}
    adj: dict[str, list[tuple[str, LinkKind]]] = {}
    for link in topo.links:
        adj.setdefault(link.a, []).append((link.b, link.kind))
        adj.setdefault(link.b, []).append((link.a, link.kind))

    def nearest(gpu: str) -> NicPath:
        # A search over (vertex, CPUs passed: 0, 1 or more, through C2C): each state once.
        found: set[NicPath] = set()
        start = [(w, min(int(kinds[w] is VertexKind.CPU), 2), kinds[w] is VertexKind.CPU and kind is LinkKind.NVLINK)
                 for w, kind in adj.get(gpu, ())]  # fmt: skip
        seen, todo = set(start), deque(start)
        while todo:
            v, cpus, c2c = todo.popleft()
            if kinds[v] in (VertexKind.GPU, VertexKind.NETWORK):
                continue  # never a transit
            if kinds[v] is VertexKind.NIC:
                found.add(NicPath.PCIE_SWITCH if cpus == 0 else NicPath.CPUS if cpus > 1 else NicPath.C2C if c2c else NicPath.CPU)
                continue
            for w, _ in adj.get(v, ()):
                state = (w, min(cpus + (kinds[w] is VertexKind.CPU), 2), c2c)
                if state not in seen:
                    seen.add(state)
                    todo.append(state)
        return min(found, key=_NIC_PATH_ORDER.index, default=NicPath.PCIE_SWITCH)

    return tuple(nearest(g) for g in gpus)


class NcclFlows:
    """NCCL's choice and loads for the transfers on one machine's links (cached per shape)."""

    def __init__(self, fabric: Fabric, cfg: NcclConfig):
        self.fabric = fabric
        self.cfg = cfg
        topo = fabric.topology
        assert topo is not None, "the loader requires a topology with nccl:"
        self.gpus_per_node = topo.gpus_per_node
        self._node_network_gb_per_s = sum(l.bandwidth_gb_per_s for l in topo.links if NETWORK_VERTEX in (l.a, l.b))
        self._has_nvswitch = any(k is VertexKind.NVSWITCH for _, k in topo.vertices)
        self._nic_paths = nic_paths(topo)
        """Per GPU of a node (local index), how it reaches its nearest NIC."""
        self._network_channels = frozenset(c for c, (a, b) in enumerate(fabric.ends) if NETWORK_VERTEX in (a, b))
        """Channels between a NIC and the network."""
        self._nic_channels: dict[int, int] = {}
        self._p2p_comms: dict[tuple[int, ...], nccl.P2pComm] = {}
        self._layouts: dict[tuple[int, ...], nccl.Layout] = {}
        self._choices: dict[tuple, nccl.Choice] = {}
        self._shapes: dict[tuple, tuple[dict[int, float], float]] = {}
        self._coflows: dict[tuple, Coflow] = {}
        self._chains: dict[tuple, nccl.Chain] = {}

    # ---- the group ----------------------------------------------------------------------

    def layout(self, ranks: tuple[int, ...]) -> nccl.Layout:
        """Where the group's ranks sit, and what NCCL's graphs would see between them."""
        lay = self._layouts.get(ranks)
        if lay is None:
            lay = self._layouts[ranks] = self._layout(ranks)
        return lay

    def _layout(self, ranks: tuple[int, ...]) -> nccl.Layout:
        g = self.gpus_per_node
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(r // g, []).append(r)
        nodes = tuple(tuple(m) for m in by_node.values())
        fabric = self.fabric
        hop, width = HopKind.NVLINK, _INF
        for members in nodes:
            if len(members) < 2:
                continue
            for a, b in zip(members, members[1:] + members[:1]):
                route = fabric.route(a, b, Transport.NCCL)
                chans = route.channels
                if route.staged or any(fabric.kinds[c] is not LinkKind.NVLINK for c in chans):
                    hop = HopKind.PCIE
                width = min(width, min((self._graph_gb_per_s(c) for c in chans), default=_INF))
        mesh_widths = [] if self._has_nvswitch or any(len(m) < 3 for m in nodes) else [self._mesh_width(m) for m in nodes]
        mesh = bool(mesh_widths) and all(mesh_widths)
        if mesh:
            width = min(mesh_widths)  # NCCL's rings spread over every link of the mesh (`nccl.ring_orders`)
        ppn = max(len(m) for m in nodes)
        inter, nic_path = _INF, None
        if len(nodes) > 1:
            inter = self._node_network_gb_per_s * self._graph_factor("nic") * min(1.0, ppn / g)
            # the node whose best member is farthest from a NIC decides
            paths = [min((self._nic_paths[r % g] for r in members), key=_NIC_PATH_ORDER.index) for members in nodes]
            nic_path = max(paths, key=_NIC_PATH_ORDER.index)
        return nccl.Layout(ranks, nodes, hop, width, inter, self._has_nvswitch, mesh, nic_path)

    def _mesh_width(self, members: tuple[int, ...]) -> float:
        """Where every two of `members` are joined by an NVLink of their own (one link,
        nothing staged), the least over them of a GPU's links to the others, summed; else 0."""
        fabric, width = self.fabric, _INF
        for a in members:
            total = 0.0
            for b in members:
                if b == a:
                    continue
                route = fabric.route(a, b, Transport.NCCL)
                if route.staged or len(route.channels) != 1 or fabric.kinds[route.channels[0]] is not LinkKind.NVLINK:
                    return 0.0
                total += self._graph_gb_per_s(route.channels[0])
            width = min(width, total)
        return width

    def _graph_gb_per_s(self, c: int) -> float:
        """Fabric channel `c`'s rate as NCCL's topology search sees it (`NcclConfig.graph_scale`)."""
        kind = self.fabric.kinds[c]
        link = "nic" if c in self._network_channels else kind.value if kind in (LinkKind.NVLINK, LinkKind.PCIE) else None
        return self.fabric.bandwidth_gb_per_s[c] * self._graph_factor(link)

    def _graph_factor(self, link: str | None) -> float:
        """`NcclConfig.graph_factor` of a kind of link (1: none, or no NCCL model)."""
        return self.cfg.graph_factor(link) if link is not None and self.cfg is not None else 1.0

    # ---- the choice ---------------------------------------------------------------------

    def choose(self, op: Op, ranks: tuple[int, ...]) -> nccl.Choice:
        """NCCL's algorithm x protocol for `op` on the group `ranks` (cached)."""
        key = (ranks, op.kind, op.size_bytes, op.algo, op.proto, op.rank, op.peer) if op.kind.is_p2p else (ranks, op.kind, op.size_bytes, op.algo, op.proto)
        c = self._choices.get(key)
        if c is None:
            algo = op.algo
            if algo is Algo.CHAIN and op.kind in (OpKind.BROADCAST, OpKind.REDUCE):
                algo = Algo.RING  # NCCL calls the pipelined chain of broadcast/reduce RING
            if algo is Algo.DIRECT and op.kind in nccl.P2P_BASED:
                algo = None
            if op.kind is OpKind.SEND or op.kind is OpKind.RECV:
                pair = (op.rank, op.peer) if op.kind is OpKind.SEND else (op.peer, op.rank)
                c = nccl.p2p_choice(self.cfg, op.kind, self.layout(pair), op.size_bytes, op.proto, self.p2p_comm(ranks), op)
            else:
                c = nccl.select(self.cfg, op.kind, self.layout(ranks), op.size_bytes, algo, op.proto, op)
            self._choices[key] = c
        return c

    def p2p_comm(self, group: tuple[int, ...]) -> nccl.P2pComm:
        """The communicator of the ranks `group`, as NCCL's P2P channel counts see it: its
        size, its nodes, and across nodes the least NIC bandwidth of its GPUs and the NICs
        they use on the node that uses the fewest (0 when that is every NIC of a node).
        Cached per group: every send of a communicator asks it."""
        comm = self._p2p_comms.get(group)
        if comm is None:
            comm = self._p2p_comms[group] = self._p2p_comm(group)
        return comm

    def _p2p_comm(self, group: tuple[int, ...]) -> nccl.P2pComm:
        g = self.gpus_per_node
        by_node: dict[int, set[int]] = {}
        for r in group:
            by_node.setdefault(r // g, set()).add(r % g)
        if len(by_node) <= 1:
            return nccl.P2pComm(max(len(group), 2), 1)
        nic = min(self._nic_gb_per_s(i) for locals_ in by_node.values() for i in locals_)
        used = min(len({self._nic_channel(i) for i in locals_}) for locals_ in by_node.values())
        every = len({self._nic_channel(i) for i in range(g)})
        return nccl.P2pComm(max(len(group), 2), len(by_node), nic, used if used < every else 0)

    def _nic_gb_per_s(self, local: int) -> float:
        """The bandwidth of the NIC that GPU `local` of a node reaches the network through
        (its link to the network, as NCCL's search sees it; a NIC that GPUs share counts
        whole, as NCCL counts it)."""
        c = self._nic_channel(local)
        return self._graph_gb_per_s(c) if c >= 0 else 0.0

    def _nic_channel(self, local: int) -> int:
        """The channel from the NIC that GPU `local` of a node uses into the network (-1: none)."""
        c = self._nic_channels.get(local)
        if c is None:
            up = self.fabric.cross_up(local, local, Transport.NCCL)
            c = self._nic_channels[local] = next((c for c in up if c in self._network_channels), -1)
        return c

    def choice_of(self, kind: OpKind, ranks: tuple[int, ...], size: int, algo: Algo, proto: Protocol,
                  group: tuple[int, ...] = ()) -> nccl.Choice:  # fmt: skip
        """The choice of a transfer whose algorithm and protocol are known, with its channels
        (a send's depend on its communicator, the ranks `group`; empty: the pair alone)."""
        lay = self.layout(ranks)
        if kind is OpKind.BARRIER:
            kind, size = OpKind.ALL_REDUCE, 4
        if kind in nccl.P2P_BASED:
            return nccl.p2p_choice(self.cfg, kind, lay, size, proto, self.p2p_comm(group or ranks))
        return nccl.Choice(algo, proto, nccl.collective_channels(self.cfg, algo, proto, lay, size))

    # ---- the loads ----------------------------------------------------------------------

    def coflow(self, kind: OpKind, ranks: tuple[int, ...], size: int, root: int | None, algo: Algo, proto: Protocol,
               group: tuple[int, ...] = ()) -> Coflow:  # fmt: skip
        """The loads, cap and latency of one transfer (see the module doc; cached)."""
        key = (kind, ranks, size, root, algo, proto, group)
        co = self._coflows.get(key)
        if co is None:
            co = self._coflows[key] = self._coflow(kind, ranks, size, root, algo, proto, group)
        return co

    def _coflow(self, kind: OpKind, ranks: tuple[int, ...], size: int, root: int | None, algo: Algo, proto: Protocol,
                group: tuple[int, ...]) -> Coflow:  # fmt: skip
        if algo is Algo.CHAIN:
            algo = Algo.RING
        choice = self.choice_of(kind, ranks, size, algo, proto, group)
        lay = self.layout(ranks)
        key = (kind, ranks, choice.algo, choice.channels, root)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = self._shape(kind, lay, choice, root)
        loads, serial = shape
        eff = nccl.efficiency(self.cfg, choice)
        if choice.algo in (Algo.NVLS, Algo.NVLS_TREE) and size > 0:
            # the pipeline fill, as bytes moved at the op's rate (`nccl.nvls_fill_bytes`)
            grow = 1.0 + nccl.nvls_fill_bytes(choice.algo, lay, choice.channels, size) / size
            loads = {c: b * grow for c, b in loads.items()}
        net = self._network_channels
        if kind in nccl.P2P_BASED and self.cfg.p2p_net_efficiency != 1.0:
            loads = {c: (b / self.cfg.p2p_net_efficiency if c in net else b) for c, b in loads.items()}
        cap_gb = nccl.channel_cap_gb_per_s(self.cfg, choice, kind, lay.num_nodes)
        cap = cap_gb * 1e3 / serial if serial > 0 else _INF
        latency = nccl.latency_us(self.cfg, kind, lay, choice.algo, choice.proto)
        if choice.algo is Algo.NVLS_TREE:
            # the switch's part at NVLS's efficiency; the tree between nodes is NCCL's
            # Simple protocol over PCIe and the network (net transport), the NICs' bytes
            # data alone (module doc)
            simple = self.cfg.protocol(Protocol.SIMPLE).efficiency
            kinds = self.fabric.kinds
            wire = nccl.net_efficiency(self.cfg, choice, kind)
            return Coflow(tuple((c, b / (eff if kinds[c] is LinkKind.NVLINK else wire if c in net else simple)) for c, b in loads.items()),
                          cap, latency)  # fmt: skip
        eff_net = nccl.net_efficiency(self.cfg, choice, kind)
        return Coflow(tuple((c, b / (eff_net if c in net else eff)) for c, b in loads.items()), cap, latency)

    def chain(self, kind: OpKind, ranks: tuple[int, ...], size: int, root: int | None, algo: Algo, proto: Protocol) -> nccl.Chain:
        """A ring broadcast / reduce as a chain whose members go one after another
        (`nccl.Chain`), its bytes at the op's solo rate on the links (cached)."""
        key = (kind, ranks, size, root, algo, proto)
        ch = self._chains.get(key)
        if ch is None:
            co = self.coflow(kind, ranks, size, root, algo, proto)
            choice = self.choice_of(kind, ranks, size, Algo.RING, proto)
            rate = co.solo_rate(self.fabric.capacity)
            ch = self._chains[key] = nccl.chain(self.cfg, kind, self.layout(ranks), choice, root, float(size), rate)
        return ch

    def _shape(self, kind: OpKind, lay: nccl.Layout, choice: nccl.Choice, root: int | None) -> tuple[dict[int, float], float]:
        """(channel -> data bytes per byte of size, the busiest rank's bytes per byte of size)."""
        n = lay.n
        algo, channels = choice.algo, choice.channels
        loads: dict[int, float] = {}
        if n <= 1:
            return loads, 0.0
        if kind is OpKind.SEND or kind is OpKind.RECV:
            self._charge(loads, {(lay.ranks[0], lay.ranks[1]): 1.0})
            return loads, 1.0
        if kind is OpKind.ALL_TO_ALL:
            self._all_to_all(loads, lay)
            return loads, (n - 1) / n
        if kind is OpKind.GATHER or kind is OpKind.SCATTER:
            pairs = {((r, root) if kind is OpKind.GATHER else (root, r)): 1.0 / n for r in lay.ranks if r != root}
            self._charge(loads, pairs)
            return loads, (n - 1) / n
        if kind is OpKind.BARRIER:
            kind = OpKind.ALL_REDUCE
        # PAT (all_gather, reduce_scatter) sends each rank's (n-1)/n of the data out through
        # its NIC and takes as much in, as a ring does; its peers differ (a binomial tree's),
        # but with one GPU a node the NICs are all it loads, so the ring's edges load them alike.
        if algo is Algo.RING or algo is Algo.PAT:
            if kind in (OpKind.BROADCAST, OpKind.REDUCE):
                pairs: dict[tuple[int, int], float] = {}
                for ring in nccl.ring_orders(lay, channels):
                    start = ring.index(root) if root in ring else 0
                    chain = ring[start:] + ring[:start]
                    for a, b in zip(chain, chain[1:]):
                        key = (b, a) if kind is OpKind.REDUCE else (a, b)
                        pairs[key] = pairs.get(key, 0.0) + 1.0 / channels
                self._charge(loads, pairs)
                return loads, 1.0
            factor = 2 * (n - 1) / n if kind is OpKind.ALL_REDUCE else (n - 1) / n
            self._charge(loads, nccl.ring_edges(lay, channels, factor / channels))
            return loads, factor
        if algo is Algo.TREE:
            self._charge(loads, nccl.tree_edges(lay, channels, 1.0))
            return loads, 2.0
        if algo in (Algo.NVLS, Algo.NVLS_TREE):
            for members in lay.nodes:
                m = len(members)
                up, down = {OpKind.ALL_REDUCE: (1 + 1 / m, 1 + 1 / m), OpKind.ALL_GATHER: (1 / m, 1.0),
                            OpKind.REDUCE_SCATTER: (1.0, 1 / m)}[kind]  # fmt: skip
                for r in members:
                    self._switch(loads, r, up, down)
            if algo is Algo.NVLS_TREE:
                self._charge(loads, nccl.head_tree_edges(lay, 1.0))
            return loads, 1.0
        if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
            for members in lay.nodes:
                m = len(members)
                if m > 1:  # a ring all_reduce inside the node
                    node = nccl.Layout(members, (members,), lay.intra_hop, lay.intra_gb_per_s, _INF, lay.nvswitch, lay.mesh)
                    self._charge(loads, nccl.ring_edges(node, channels, 2 * (m - 1) / m / channels))
                for r in members:
                    self._network(loads, r, 1.0 / m)
            return loads, 2.0
        raise AssertionError(f"no loads for {kind.value} with {algo.value}")

    def _charge(self, loads: dict[int, float], pairs: dict[tuple[int, int], float]) -> None:
        route = self.fabric.route
        for (a, b), nbytes in pairs.items():
            for c in route(a, b, Transport.NCCL).channels:
                loads[c] = loads.get(c, 0.0) + nbytes

    def _switch(self, loads: dict[int, float], rank: int, up: float, down: float) -> None:
        """`up` bytes from `rank`'s GPU into its NVSwitch(es), `down` back (split evenly)."""
        fabric = self.fabric
        v = fabric.device_vertex[rank]
        outs = [(w, c) for w, c in fabric.adj[v] if fabric.vertex_kinds[w] is VertexKind.NVSWITCH]
        assert outs, "nvls needs an NVSwitch next to every GPU (checked by the loader)"
        for w, c in outs:
            loads[c] = loads.get(c, 0.0) + up / len(outs)
            back = next(c2 for x, c2 in fabric.adj[w] if x == v)
            loads[back] = loads.get(back, 0.0) + down / len(outs)

    def _network(self, loads: dict[int, float], rank: int, nbytes: float) -> None:
        """`nbytes` from `rank` to the network (which reduces) and back: CollNet's share."""
        fabric, i = self.fabric, rank % self.gpus_per_node
        for c in fabric.cross_up(rank, i, Transport.NCCL) + fabric.cross_down(i, rank, Transport.NCCL):
            loads[c] = loads.get(c, 0.0) + nbytes

    def _all_to_all(self, loads: dict[int, float], lay: nccl.Layout) -> None:
        """Every ordered pair 1/n: pairs inside a node one by one; pairs across nodes summed
        per (source, destination's local index) on the way to the network and per (source's
        local index, destination) on the way from it, O(nodes x ppn^2) in all."""
        share = 1.0 / lay.n
        g = self.gpus_per_node
        for members in lay.nodes:
            self._charge(loads, {(a, b): share for a in members for b in members if a != b})
        if len(lay.nodes) == 1:
            return
        fabric = self.fabric
        total = [0] * g  # members per local index, over all nodes
        for members in lay.nodes:
            for r in members:
                total[r % g] += 1
        for members in lay.nodes:
            here = [0] * g
            for r in members:
                here[r % g] += 1
            away = [(j, (total[j] - here[j]) * share) for j in range(g) if total[j] > here[j]]
            for r in members:
                for j, nbytes in away:  # r sends to every rank with local index j on other nodes...
                    for c in fabric.cross_up(r, j, Transport.NCCL):
                        loads[c] = loads.get(c, 0.0) + nbytes
                    for c in fabric.cross_down(j, r, Transport.NCCL):  # ...and receives from each of them
                        loads[c] = loads.get(c, 0.0) + nbytes
