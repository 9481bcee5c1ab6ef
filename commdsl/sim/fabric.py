"""The machine's links as directed channels, and the route of every transfer.

A full-duplex link of the topology becomes two channels (one per direction), each with
its bandwidth and latency. Devices are vertices too: rank r runs on device r (device i
of node k is rank k * gpus_per_node + i).

Routing (docs/simulator.md, "Topologies and routes"): for a pair of devices and a transport,

  * direct: between GPUs with peer access (NVLink, NVSwitch, PCIe P2P), and for NCCL
    between nodes (GPU -> PCIe -> NIC -> network -> NIC -> PCIe -> GPU, GPUDirect RDMA);
  * staged through host memory: between GPUs of one node without peer access, and
    always for gloo (a CPU library): device -> the source's nearest CPU socket, then
    that socket -> destination (crossing the link between sockets if needed). With
    `topology.host_memory_bandwidth_gb_per_s`, the socket's memory is a channel the route
    crosses twice (each byte written, then read back); an NCCL route also crosses the
    source GPU's and the destination GPU's SHM channels (NCCL's host-memory path with its
    proxy, at the nccl transport's `staged` bandwidth per GPU and direction), which every
    staged NCCL transfer of that GPU shares.

A path is the widest one (largest bottleneck bandwidth), then the one with fewest hops;
ties go to the order links are written in the machine file. Paths never pass through
another device. memcpy between nodes is impossible (a MachineError).

A machine without a topology gets the implied star: per transport one switch, and per
rank one link to it at the transport's bandwidth (zero link latency: the transport's
latency is charged per algorithm step).

A transport with a machine-wide shared bandwidth (`Machine.shared`, e.g. gloo over
loopback TCP, where the CPUs copy every byte) gets one more channel that every route
of that transport crosses, in either direction.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from commdsl.errors import MachineError
from commdsl.ir import Algo, OpKind, Transport
from commdsl.machine.model import IMPLIED_LINK_KINDS, NETWORK_VERTEX, LinkKind, LinkSpec, Machine, VertexKind
from commdsl.sim.collectives import CommPlan, edges


@dataclass(frozen=True, slots=True)
class Route:
    """How bytes go from one device to another with one transport."""

    legs: tuple[tuple[int, ...], ...]
    """Channel ids per leg: one leg (direct), or two (staged: to host memory, from it)."""
    staged: bool
    """Staged through host memory."""
    latency_us: float
    """Sum of the link latencies over all legs (added to every step)."""
    spec: LinkSpec
    """The transport's per-step latency and bandwidth cap on this kind of path."""

    @property
    def channels(self) -> tuple[int, ...]:
        return tuple(c for leg in self.legs for c in leg)


class Fabric:
    """Channels (directed links) of a machine for a world of `world_size` ranks, and routes."""

    def __init__(self, machine: Machine, world_size: int):
        self.machine = machine
        self.names: list[str] = []
        """Per channel: "a->b" with node prefixes on multi-node machines."""
        self.ends: list[tuple[str, str]] = []
        self.kinds: list[LinkKind] = []
        self.bandwidth_gb_per_s: list[float] = []
        self.capacity: list[float] = []
        """Bytes per microsecond (bandwidth_gb_per_s * 1e3)."""
        self.latency_us: list[float] = []
        self._routes: dict[tuple[int, int, Transport], Route] = {}
        self.topology = machine.topology
        if self.topology is None:
            self._build_star(world_size)
        else:
            self._build_topology()
        self.shared_channel: dict[Transport, int] = {
            t: self._channel(f"{t.value} shared", f"{t.value} shared", LinkKind.NETWORK, bw, 0.0) for t, bw in machine.shared
        }
        """Per transport with a shared bandwidth, the channel all its routes cross."""

    def device_channels(self, ranks: Iterable[int]) -> frozenset[int]:
        """The channels that belong to the devices of `ranks`: every channel of their nodes
        (a topology), or their own links to each transport's switch (the implied star);
        and the machine-wide ones."""
        out: set[int] = set(self.shared_channel.values())
        if self.topology is None:
            for channels in (*self._up.values(), *self._down.values()):
                out.update(channels[r] for r in ranks)
        else:
            per_node = self._per_node
            for node in {r // self.topology.gpus_per_node for r in ranks}:
                out.update(range(node * per_node, (node + 1) * per_node))
            out.update(range(self._node_channels, len(self.names)))
        return frozenset(out)

    def _channel(self, a: str, b: str, kind: LinkKind, bw: float, latency_us: float, name: str | None = None) -> int:
        self.names.append(name or f"{a}->{b}")
        self.ends.append((a, b))
        self.kinds.append(kind)
        self.bandwidth_gb_per_s.append(bw)
        self.capacity.append(bw * 1e3)
        self.latency_us.append(latency_us)
        return len(self.names) - 1

    # ---- the implied star --------------------------------------------------------------

    def _build_star(self, world_size: int) -> None:
        self._up: dict[Transport, list[int]] = {}
        self._down: dict[Transport, list[int]] = {}
        for t, spec in self.machine.transports:
            bw = spec.bandwidth_gb_per_s
            # The link kind is only a label here: "network" for every transport's star.
            self._up[t] = [self._channel(f"rank{r}", t.value, LinkKind.NETWORK, bw, 0.0) for r in range(world_size)]
            self._down[t] = [self._channel(t.value, f"rank{r}", LinkKind.NETWORK, bw, 0.0) for r in range(world_size)]

    # ---- an explicit topology ----------------------------------------------------------

    def _build_topology(self) -> None:
        topo = self.topology
        multi = topo.nodes > 1
        self.vertex_names: list[str] = []
        self.vertex_kinds: list[VertexKind] = []
        self.adj: list[list[tuple[int, int]]] = []
        """Per vertex: (neighbour, channel id) in file order."""
        self.device_vertex: list[int] = []
        self.node_of_vertex: list[int] = []
        network = self._vertex(NETWORK_VERTEX, VertexKind.NETWORK, -1)
        local: list[dict[str, int]] = []
        for k in range(topo.nodes):
            prefix = f"n{k}." if multi else ""
            names = {}
            for i in range(topo.gpus_per_node):
                names[f"gpu{i}"] = v = self._vertex(f"{prefix}gpu{i}", VertexKind.GPU, k)
                self.device_vertex.append(v)
            for name, kind in topo.vertices:
                names[name] = self._vertex(prefix + name, kind, k)
            names[NETWORK_VERTEX] = network
            local.append(names)
        self._memory: dict[int, int] = {}
        """CPU vertex -> the channel of its memory (with host_memory_bandwidth_gb_per_s)."""
        self._shm: dict[int, tuple[int, int]] = {}
        """Device vertex -> its NCCL SHM channels (out, in), on machines where some GPUs
        lack peer access."""
        memory_bw = topo.host_memory_bandwidth_gb_per_s
        nccl_staged = self.machine.staged_transport(Transport.NCCL) if topo.peer_access is not None else None
        for k in range(topo.nodes):
            names = local[k]
            for link in topo.links:
                a, b = names[link.a], names[link.b]
                for x, y in ((a, b), (b, a)):
                    c = self._channel(self.vertex_names[x], self.vertex_names[y], link.kind, link.bandwidth_gb_per_s, link.latency_us)
                    self.adj[x].append((y, c))
            # Implied channels, inside the node's block so that moving routes between nodes moves them too.
            if memory_bw is not None:
                for name, kind in topo.vertices:
                    if kind is VertexKind.CPU:
                        v = names[name]
                        cpu = self.vertex_names[v]
                        self._memory[v] = self._channel(cpu, cpu, LinkKind.MEMORY, memory_bw, 0.0, f"{cpu} memory")
            if nccl_staged is not None:
                for i in range(topo.gpus_per_node):
                    v = names[f"gpu{i}"]
                    gpu, bw = self.vertex_names[v], nccl_staged.bandwidth_gb_per_s
                    self._shm[v] = (self._channel(gpu, gpu, LinkKind.SHM, bw, 0.0, f"{gpu} shm out"),
                                    self._channel(gpu, gpu, LinkKind.SHM, bw, 0.0, f"{gpu} shm in"))  # fmt: skip
        self._per_node = len(self.names) // topo.nodes
        """Channels of one node (its links, both directions, and its implied channels);
        node k's come k-th."""
        self._node_channels = self._per_node * topo.nodes
        """Channels of all nodes (machine-wide ones follow)."""
        self._widths = sorted(set(self.capacity), reverse=True)
        self._trees: dict[int, dict[int, tuple[int, ...]]] = {}
        self._host: dict[int, int] = {}

    def _vertex(self, name: str, kind: VertexKind, node: int) -> int:
        self.vertex_names.append(name)
        self.vertex_kinds.append(kind)
        self.adj.append([])
        self.node_of_vertex.append(node)
        return len(self.vertex_names) - 1

    def _paths_from(self, src: int) -> dict[int, tuple[int, ...]]:
        """Widest-then-shortest path (channel ids) from vertex `src` to every vertex it
        reaches, never passing through a device. One BFS per distinct bandwidth.

        The search stays in nodes 0 and 1 and the network: routes are searched there only
        and moved to other nodes (`_moved`). A path between them never passes a third
        node (it would have to leave the network and enter it again), and leaving the
        other nodes out changes no vertex's order in the search, so the paths are those
        of the whole cluster, at the cost of two nodes rather than thousands."""
        cached = self._trees.get(src)
        if cached is not None:
            return cached
        paths: dict[int, tuple[int, ...]] = {src: ()}
        kinds, cap, node = self.vertex_kinds, self.capacity, self.node_of_vertex
        for width in self._widths:
            parent: dict[int, tuple[int, int]] = {src: (-1, -1)}
            todo = deque([src])
            while todo:
                v = todo.popleft()
                if v != src and kinds[v] is VertexKind.GPU:
                    continue  # reached, never a transit
                for w, c in self.adj[v]:
                    if w not in parent and cap[c] >= width and node[w] <= 1:
                        parent[w] = (v, c)
                        todo.append(w)
            for v in parent:
                if v not in paths:
                    chans = []
                    x = v
                    while x != src:
                        x, c = parent[x]
                        chans.append(c)
                    paths[v] = tuple(reversed(chans))
        self._trees[src] = paths
        return paths

    def _host_of(self, v: int) -> int:
        """The CPU socket (host memory) nearest to vertex v: fewest hops, then file order."""
        host = self._host.get(v)
        if host is None:
            seen, todo = {v}, deque([v])
            while todo and host is None:
                x = todo.popleft()
                for w, _ in self.adj[x]:
                    if w in seen or self.vertex_kinds[w] is VertexKind.GPU or self.vertex_kinds[w] is VertexKind.NETWORK:
                        continue
                    if self.vertex_kinds[w] is VertexKind.CPU:
                        host = w
                        break
                    seen.add(w)
                    todo.append(w)
            assert host is not None, "the loader checks every device reaches a cpu"
            self._host[v] = host
        return host

    # ---- routes ----------------------------------------------------------------------

    def route(self, src: int, dst: int, transport: Transport) -> Route:
        """The path from rank `src` to rank `dst` with `transport` (cached). On a cluster the
        path is searched once per pair of node-local GPUs (inside node 0, or from node 0 to
        node 1) and moved to the nodes asked for: nodes are copies of each other, so the
        search is the same, and thousands of ranks cost a handful of searches."""
        key = (src, dst, transport)
        r = self._routes.get(key)
        if r is None:
            topo = self.topology
            if topo is None or topo.nodes == 1:
                r = self._route(src, dst, transport)
            else:
                r = self._moved(src, dst, transport)
            self._routes[key] = r
        return r

    def _moved(self, src: int, dst: int, transport: Transport) -> Route:
        """`route` on a cluster: node 0's (or node 0 to node 1's) route of the same local GPUs,
        its channels moved to the source's and destination's nodes."""
        g = self.topology.gpus_per_node
        k, i = divmod(src, g)
        m, j = divmod(dst, g)
        if (k == 0 and m in (0, 1) and (m == 1) == (k != m)) or (transport is Transport.MEMCPY and k != m):
            return self._route(src, dst, transport)  # a template itself (or memcpy's error, naming these ranks)
        template = self.route(i, j if k == m else g + j, transport)
        per, local = self._per_node, self._node_channels
        src_shift, dst_shift = k * per, (m if k == m else m - 1) * per
        # A machine-wide channel (a shared bandwidth, at `local` and above) stays.
        legs = tuple(tuple([c if c >= local else c + (src_shift if c < per else dst_shift) for c in leg]) for leg in template.legs)
        return Route(legs, template.staged, template.latency_us, template.spec)

    def cross_up(self, src: int, dst_local: int, transport: Transport) -> tuple[int, ...]:
        """The channels in `src`'s node (to the network) of a route from rank `src` to the GPU
        `dst_local` of any other node: the same for every other node."""
        up, _ = self._cross(src % self.topology.gpus_per_node, dst_local, transport)
        return tuple(c + (src // self.topology.gpus_per_node) * self._per_node if c < self._per_node else c for c in up)

    def cross_down(self, src_local: int, dst: int, transport: Transport) -> tuple[int, ...]:
        """The channels in `dst`'s node (from the network) of a route to rank `dst` from the
        GPU `src_local` of any other node."""
        _, down = self._cross(src_local, dst % self.topology.gpus_per_node, transport)
        return tuple(c + (dst // self.topology.gpus_per_node - 1) * self._per_node for c in down)

    def _cross(self, i: int, j: int, transport: Transport) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Node 0's GPU i to node 1's GPU j: (channels of node 0 and machine-wide ones,
        channels of node 1)."""
        chans = self.route(i, self.topology.gpus_per_node + j, transport).channels
        per = self._per_node
        return tuple(c for c in chans if c < per or c >= self._node_channels), tuple(c for c in chans if per <= c < 2 * per)

    def _route(self, src: int, dst: int, transport: Transport) -> Route:
        route = self._path(src, dst, transport)
        shared = self.shared_channel.get(transport)
        if shared is None:
            return route
        first, *rest = route.legs
        return Route(((*first, shared), *rest), route.staged, route.latency_us, route.spec)

    def _path(self, src: int, dst: int, transport: Transport) -> Route:
        machine = self.machine
        if self.topology is None:
            spec = machine.transport(transport)
            return Route(((self._up[transport][src], self._down[transport][dst]),), False, 0.0, spec)
        topo = self.topology
        a, b = self.device_vertex[src], self.device_vertex[dst]
        same_node = self.node_of_vertex[a] == self.node_of_vertex[b]
        g = topo.gpus_per_node
        if transport is Transport.MEMCPY and not same_node:
            raise MachineError(
                f"machine {machine.name}: memcpy cannot copy between nodes (rank {src} on node {src // g}, rank {dst} on node {dst // g})",
                hint="use transport=nccl between nodes",
            )  # fmt: skip
        direct = transport is not Transport.GLOO and (not same_node or topo.peers(src % g, dst % g))
        if direct:
            legs: tuple[tuple[int, ...], ...] = (self._paths_from(a)[b],)
            spec = machine.transport(transport)
        else:
            host = self._host_of(a)
            first, second = self._paths_from(a)[host], self._paths_from(host)[b]
            memory = self._memory.get(host)
            if memory is not None:  # written into host memory, then read back
                first, second = (*first, memory), (memory, *second)
            if transport is Transport.NCCL and self._shm:
                first, second = (self._shm[a][0], *first), (*second, self._shm[b][1])
            legs = (first, second)
            spec = machine.staged_transport(transport)
        latency = sum(self.latency_us[c] for leg in legs for c in leg)
        return Route(legs, not direct, latency, spec)

    def p2p_time_us(self, src: int, dst: int, transport: Transport, size_bytes: float) -> tuple[float, float]:
        """(time, latency part) of a point-to-point transfer alone on its route: latency +
        size at the rate of the channel it fills first, or the transport's cap (the flow
        network's time for it when nothing else moves)."""
        route = self.route(src, dst, transport)
        crossings: dict[int, int] = {}
        for c in route.channels:
            crossings[c] = crossings.get(c, 0) + 1
        rate = min([route.spec.bandwidth_gb_per_s * 1e3] + [self.capacity[c] / n for c, n in crossings.items()])
        latency = route.spec.latency_us + route.latency_us
        return latency + (size_bytes / rate if size_bytes else 0.0), latency

    def collective_load(self, kind: OpKind, algo: Algo, ranks: tuple[int, ...], size_bytes: float, transport: Transport,
                        root: int | None, p: CommPlan) -> tuple[dict[int, float], float, float]:  # fmt: skip
        """(bytes per channel, rate cap in bytes/us, latency per step) of a collective run by
        its algorithm's pairs of ranks (`edges`), each pair on its route: the channels are
        charged every pair's bytes, the cap is the slowest route's transport cap, a step
        takes the slowest route's latency. A collective without bytes (a barrier) steps
        around the ring. An all_to_all on the implied star is summed per channel instead
        (`_star_all_to_all_load`): the same loads without visiting its n(n-1) pairs."""
        if kind is OpKind.ALL_TO_ALL and self.topology is None and len(ranks) > 1 and p.serial_bytes:
            return self._star_all_to_all_load(ranks, size_bytes, transport)
        return self._pairwise_load(kind, algo, ranks, size_bytes, transport, root, p)

    def _pairwise_load(self, kind: OpKind, algo: Algo, ranks: tuple[int, ...], size_bytes: float, transport: Transport,
                       root: int | None, p: CommPlan) -> tuple[dict[int, float], float, float]:  # fmt: skip
        """`collective_load` pair by pair: every pair of `edges` on its route."""
        channel_bytes: dict[int, float] = {}
        cap = math.inf
        step_latency_us = 0.0
        pairs = edges(kind, algo, ranks, size_bytes, root, p)
        if not pairs and len(ranks) > 1:
            pairs = [(ranks[i], ranks[(i + 1) % len(ranks)], 0.0) for i in range(len(ranks))]
        for a, b, nbytes in pairs:
            route = self.route(a, b, transport)
            if nbytes:
                for c in route.channels:
                    channel_bytes[c] = channel_bytes.get(c, 0.0) + nbytes
            cap = min(cap, route.spec.bandwidth_gb_per_s * 1e3)
            step_latency_us = max(step_latency_us, route.spec.latency_us + route.latency_us)
        return channel_bytes, cap, step_latency_us

    def _star_all_to_all_load(self, ranks: tuple[int, ...], size_bytes: float, transport: Transport) -> tuple[dict[int, float], float, float]:
        """`collective_load` of an all_to_all on the implied star, summed per channel. The
        route of every pair (a, b) is a's channel up to the transport's switch, then b's
        channel down from it (and the transport's shared channel, if any), with the same
        transport spec and no link latency. So a's up channel carries its n - 1 sends of
        S / n, b's down channel its n - 1 receives, and the shared channel all n (n - 1):
        the loads of charging every pair (`edges`), exactly, in O(n) instead of O(n^2)
        (4,096 ranks are 16.8 M pairs)."""
        route = self.route(ranks[0], ranks[1], transport)  # every pair's spec and latency
        n = len(ranks)
        share = float(size_bytes) / n
        per_rank = 0.0
        for _ in range(n - 1):  # summed as the pairs' bytes are, to the same float
            per_rank += share
        up, down = self._up[transport], self._down[transport]
        shared = self.shared_channel.get(transport)
        # In the order the pairs would charge them (the first pair: up, down, shared; the
        # first source's other destinations; the second source and its first destination...),
        # so that traces list the links' counters as before.
        order = [up[ranks[0]], down[ranks[1]], *(() if shared is None else (shared,)), *(down[r] for r in ranks[2:]),
                 up[ranks[1]], down[ranks[0]], *(up[r] for r in ranks[2:])]  # fmt: skip
        channel_bytes = dict.fromkeys(order, per_rank)
        if shared is not None:
            channel_bytes[shared] = n * per_rank
        return channel_bytes, route.spec.bandwidth_gb_per_s * 1e3, route.spec.latency_us + route.latency_us

    def collective_time_us(self, kind: OpKind, algo: Algo, ranks: tuple[int, ...], size_bytes: float, transport: Transport,
                           root: int | None, p: CommPlan) -> tuple[float, float]:  # fmt: skip
        """(time, latency part) of a collective alone on its routes (`collective_load`): its
        steps' latency, then `p.serial_bytes` at the rate of the channel it fills first or
        its cap (the flow network's time for it when nothing else moves)."""
        channel_bytes, cap, step_latency_us = self.collective_load(kind, algo, ranks, size_bytes, transport, root, p)
        latency = p.latency_steps * step_latency_us
        if not p.serial_bytes:
            return latency, latency
        demands = ((c, b / p.serial_bytes) for c, b in channel_bytes.items())
        return latency + p.serial_bytes / solo_rate(self.capacity, demands, cap), latency

    def describe(self, route: Route) -> str:
        """"gpu0 -> cpu0 -> gpu2" style text of a route (tests, errors)."""
        parts = []
        for leg in route.legs:
            for c in leg:
                if self.kinds[c] in IMPLIED_LINK_KINDS:
                    continue  # a socket's memory, a GPU's SHM path: not a hop
                a, b = self.ends[c]
                if not parts or parts[-1] != a:
                    parts.append(a)
                parts.append(b)
        return " -> ".join(parts)


def solo_rate(capacity: list[float], demands: Iterable[tuple[int, float]], cap: float) -> float:
    """Bytes per microsecond of a flow alone on its channels: its `cap`, or the rate at
    which it fills its first channel (`demands`: channel, bytes on it per byte of the
    flow; `capacity`: bytes per microsecond per channel, `Fabric.capacity`)."""
    rate = cap
    for c, w in demands:
        if w > 0 and capacity[c] / w < rate:
            rate = capacity[c] / w
    return rate
