"""Simulate nccl-tests, and calibrate a GPU cluster's machine file from its nccl-tests logs.

    commdsl calibrate --from-nccl-tests LOG... --out machine.yaml [--machine BASE]
    python -m commdsl.calibrate --from-nccl-tests LOG... --out machine.yaml

nccl-tests (`all_reduce_perf -b 8 -e 8G -f 2 -g 8`) times a loop of back-to-back ops and
reports the time per op. `simulate_run` does the same on a machine: a schedule of a few
ops in a row on every rank, the steady-state time per op. The thread of a process that
drives G GPUs (`-g G`) launches each op on each of them in turn, so every GPU gets an op
only every G launches: its issue cost is G x NCCL's launch (`nccl.launch_us` +
`nccl.launch_per_channel_us` x channels); with CUDA graphs (`-G`) there is none.

`from_nccl_tests` fits the NCCL physics of a base machine (a preset with the topology of
the cluster) to the logs: every parameter of `LATENCIES`, `NCCL_SCALARS`,
`PROTOCOL_SCALARS` and `RATES` that some point depends on (the rest keep the base
machine's values). It minimises a soft-L1 log error of every point, each point timed by
a closed form of the simulator's model (`_Point`: NCCL's choice, the loads and the
latency coefficients taken from the model on the machine, linear in the parameters),
then writes the fitted machine file and recomputes the points on it, again until NCCL's
choices no longer move, so that the closed form is the simulator on the training points.
The report is the simulator's: every point of every log simulated on the written machine
(`simulated_errors`), with the parameters each log fitted. `holdout_errors` fits part of
each log's sizes and predicts the rest (calibrate-then-predict).
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from commdsl.calibrate.nccl_logs import Channels, NcclTestsLog, Point, read_logs
from commdsl.dsl import load_schedule_text
from commdsl.calibrate.fit import nelder_mead
from commdsl.errors import CommdslError, LogError, SourceLoc, UsageError, require_output_folder
from commdsl.files import write_text
from commdsl.ir import Algo, Dtype, Op, OpKind, Protocol, Transport
from commdsl.machine.loader import load_machine, load_machine_text, resolve_machine
from commdsl.machine.model import NETWORK_VERTEX, Calibration, LinkKind, LinkSpec, Machine, shm_link
from commdsl.machine.nccl import GRAPH_LINKS, HopKind, NcclConfig, NcclVersion, format_nccl_version, parse_nccl_version
from commdsl.progress import Progress
from commdsl.sim import nccl
from commdsl.sim.chain_times import ChainTerms
from commdsl.sim.collectives import bus_factor
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows
from commdsl.sim.simulate import simulate

ITERS = 5
"""Ops in a row per simulated point: the steady state is reached after the first."""
TIMED_ITERS = 20
"""nccl-tests' timed ops per size (`-n`, its default 20): what a chain's fill is spread over."""

DEVICE_PRESETS = {
    "NVIDIA H100 80GB HBM3": "dgx-h100", "NVIDIA H200": "dgx-h200", "NVIDIA H800": "hgx-h800", "NVIDIA B200": "dgx-b200",
    "NVIDIA A100-SXM4-80GB": "dgx-a100", "NVIDIA A100-SXM4-40GB": "dgx-a100",
    "A100-SXM4-80GB": "dgx-a100", "A100-SXM4-40GB": "dgx-a100",  # as older drivers name them
    "NVIDIA GeForce RTX 4090": "pcie-rtx4090", "NVIDIA GH200 120GB": "gh200-quad",
}  # fmt: skip
"""Base machine per GPU name as nccl-tests prints it, when `--machine` is not given (the
SXM parts of the presets; an H200 NVL, H100 PCIe and others print other names)."""


@dataclass(frozen=True)
class Run:
    """How an nccl-tests run was launched: what `simulate_run` reproduces."""

    op: OpKind
    ranks: int
    gpus_per_process: int = 1
    """GPUs one thread launches for (`-g`)."""
    graph: bool = False
    """Ops launched from CUDA graphs (`-G`): no host launch per op."""
    dtype: Dtype = Dtype.FP32
    algo: Algo | None = None
    """An algorithm forced on every op of the run (`calibrate --algo`, a bench point's
    NCCL_ALGO; None: NCCL's choice among `algos`, else the machine's)."""
    proto: Protocol | None = None
    max_channels: int | None = None
    """NCCL_MAX_NCHANNELS of the run (None: NCCL's own)."""
    ranks_per_node: int | None = None
    """GPUs of the run on each node (None: the base machine's nodes filled in turn)."""
    channels: Channels | None = None
    """NCCL's channel counts as the run's log reports them (None: the machine's)."""
    nccl_version: NcclVersion | None = None
    """The NCCL release of the run, as its log prints it (None: the machine's `nccl.version`)."""
    collnet: bool | None = None
    """CollNet (IB SHARP) on or off in the run, as its log says (None: the machine's `nccl.collnet`)."""
    algos: frozenset[Algo] | None = None
    """The algorithms NCCL_ALGO left the run to choose among (None: the machine's `nccl.algo`)."""
    protos: frozenset[Protocol] | None = None
    """The protocols NCCL_PROTO left it (None: the machine's `nccl.proto`)."""

    @staticmethod
    def of(log: NcclTestsLog, algo: Algo | None = None, proto: Protocol | None = None) -> Run:
        """The run a log records: NCCL chooses among what the log's NCCL_ALGO / NCCL_PROTO
        enable, else `algo` / `proto` force the choice."""
        per_node = log.ranks_per_node if log.nodes is not None and log.nodes > 1 else None
        version = parse_nccl_version(log.nccl_version) if log.nccl_version else None
        return Run(log.op, log.ranks, log.gpus_per_process, log.graph, log.dtype, algo if log.algos is None else None,
                   proto if log.protos is None else None, ranks_per_node=per_node, channels=log.channels, nccl_version=version,
                   collnet=log.collnet, algos=log.algos, protos=log.protos)  # fmt: skip


def bench_machine(machine: Machine, run: Run) -> Machine:
    """The machine with enough nodes for the run's GPUs, and NCCL's channels as the run had them."""
    topo, cfg = machine.topology, machine.nccl
    if topo is None or cfg is None:
        raise UsageError(f"machine {machine.name} has no NCCL model (nccl: and topology:), so nccl-tests cannot be simulated on it",
                         hint="use a preset such as dgx-h100 or dgx-a100")  # fmt: skip
    if run.ranks_per_node is not None and run.ranks_per_node > topo.gpus_per_node:
        raise UsageError(f"the run has {run.ranks_per_node} GPUs on each of {run.ranks // run.ranks_per_node} nodes, and machine "
                         f"{machine.name} has {topo.gpus_per_node} a node", hint="name a base machine with the cluster's nodes: --machine")  # fmt: skip
    per_node = run.ranks_per_node or topo.gpus_per_node
    nodes = -(-run.ranks // per_node)
    m = machine if nodes == topo.nodes else machine.with_nodes(nodes)
    if run.max_channels is not None:
        p2p = min(cfg.p2p_channels, 1 << (run.max_channels - 1).bit_length())
        cfg = replace(cfg, channels=min(cfg.channels, run.max_channels), nvls_channels=min(cfg.nvls_channels, run.max_channels),
                      p2p_channels=p2p, p2p_channels_per_peer=min(cfg.p2p_channels_per_peer, p2p))  # fmt: skip
    if run.nccl_version is not None:
        cfg = replace(cfg, version=run.nccl_version)  # its table chooses as the run's NCCL did
    if run.algos is not None or run.protos is not None:  # NCCL_ALGO / NCCL_PROTO of the run
        cfg = replace(cfg, algos=run.algos if run.algos is not None else cfg.algos, protos=run.protos if run.protos is not None else cfg.protos)
    if run.collnet is not None and run.collnet != cfg.collnet:
        cfg = replace(cfg, collnet=run.collnet)  # NCCL_COLLNET_ENABLE of the run: its SHARP switches, or none
    if run.channels is not None:
        ch = run.channels
        cfg = replace(cfg, channels=max(ch.coll, 1), p2p_channels=max(ch.p2p, 1), p2p_channels_per_peer=max(ch.p2p_per_peer, 1))
        if ch.nvls is not None:  # 0: NCCL found no NVLS (or it was turned off)
            cfg = replace(cfg, nvls=cfg.nvls and ch.nvls > 0, nvls_channels=max(ch.nvls, 1))
    return m if cfg is machine.nccl else replace(m, nccl=cfg)


def placement(machine: Machine, run: Run) -> tuple[int, tuple[int, ...]]:
    """The GPUs of `machine` (a `bench_machine`) the run's ranks are, in rank order, and how
    many GPUs the machine has: every GPU of its nodes (or the first of one node), or on a
    run with fewer GPUs a node than the machine's, the first `ranks_per_node` of each node
    (nccl-tests' rank k of node n on its local GPU k, as launchers place them)."""
    per_node = machine.topology.gpus_per_node
    if run.ranks_per_node is None or run.ranks_per_node == per_node:
        return run.ranks, tuple(range(run.ranks))
    g = run.ranks_per_node
    nodes = run.ranks // g
    return nodes * per_node, tuple(n * per_node + k for n in range(nodes) for k in range(g))


def _op(run: Run, size: int, members: tuple[int, ...]) -> Op:
    """The op the run's first rank issues (what NCCL's choice is asked about)."""
    algo = run.algo
    if run.op in (OpKind.BROADCAST, OpKind.REDUCE) and algo is Algo.RING:
        algo = Algo.CHAIN
    peer = members[1 % len(members)] if run.op is OpKind.SEND else None
    root = members[0] if run.op in (OpKind.BROADCAST, OpKind.REDUCE) else None
    return Op(members[0], 0, run.op, "x", "s", SourceLoc("<nccl-tests>", 1, 1), size_bytes=size, dtype=run.dtype, peer=peer,
              group="world", root=root, transport=Transport.NCCL, algo=algo, proto=run.proto)  # fmt: skip


def choice(machine: Machine, run: Run, size: int, flows: NcclFlows | None = None) -> nccl.Choice:
    """What NCCL runs for one size of `run` on `machine` (a `bench_machine`)."""
    world, members = placement(machine, run)
    flows = flows or NcclFlows(Fabric(machine, world), machine.nccl)
    return flows.choose(_op(run, size, members), members)


def host_us(machine: Machine, run: Run, c: nccl.Choice) -> float:
    """Host time between two ops' launches on one GPU (see the module doc)."""
    return 0.0 if run.graph else run.gpus_per_process * machine.nccl.launch_host_us(c.channels)


_SCHEDULE = """
name: nccl_tests
params: {{iters: {iters}}}
world: {ranks}
streams: [s]
program: |
  for i in range(iters):
{body}
"""
_PART_SCHEDULE = """
name: nccl_tests
params: {{iters: {iters}}}
world: {ranks}
groups:
  run: {members}
streams: [s]
program: |
  if rank % {per_node} < {g}:
    for i in range(iters):
{body}
"""
"""A run on the first `g` GPUs of each node: its ranks are the group `run`."""


def _body(run: Run, size: int, per_node: int | None = None) -> str:
    """The loop's body; with `per_node` (a run on part of each node) its ops are the group
    `run`'s, a send going to the next member (index i: GPU i // g * per_node + i % g)."""
    opts = f" dtype={run.dtype.value}"
    if run.algo is not None:
        opts += f" algo={'chain' if run.op in (OpKind.BROADCAST, OpKind.REDUCE) and run.algo is Algo.RING else run.algo.value}"
    if run.proto is not None:
        opts += f" proto={run.proto.value}"
    s = f"{size}B"
    if per_node is not None:
        g, n = run.ranks_per_node, run.ranks
        opts += " group=run"
        index = f"(rank // {per_node} * {g} + rank % {per_node})"

        def gpu(i: str) -> str:
            return f"(({i}) // {g} * {per_node} + ({i}) % {g})"

        nxt, prev = gpu(f"({index} + 1) % {n}"), gpu(f"({index} + {n - 1}) % {n}")
    else:
        nxt, prev = "(rank + 1) % world_size", "(rank + world_size - 1) % world_size"
    if run.op is OpKind.SEND:
        return (f"      batch:\n          isend x[i] {s} to {nxt}{opts}\n"
                f"          irecv x[i] {s} from {prev}{opts}")  # fmt: skip
    root = " src=0" if run.op is OpKind.BROADCAST else " dst=0" if run.op is OpKind.REDUCE else ""
    return f"      {run.op.value} x[i] {s}{root}{opts}"


def simulate_run(machine: Machine, run: Run, size: int, network: str = "flow") -> float:
    """nccl-tests' time per op (us) for `size` on `machine`, by the simulator: ITERS ops in
    a row on every rank, the steady-state time between two ends on rank 0. Broadcast and
    reduce, whose members go one after another (`commdsl.sim.chains`), are timed as
    nccl-tests times them: `TIMED_ITERS` ops in a row from a common start, each rank's
    time to its last op's end over the ops, averaged over the ranks (common.cu: the
    timed loop after a barrier, then `Allreduce(&deltaSec, average)`, its default mean)."""
    m = bench_machine(machine, run)
    c = choice(m, run, size)
    m = replace(m, comm_launch_us=host_us(m, run, c), kernel_launch_us=0.0)
    chained = run.op in (OpKind.BROADCAST, OpKind.REDUCE)
    iters = TIMED_ITERS if chained else ITERS
    world, members = placement(m, run)
    if world == run.ranks:
        text = _SCHEDULE.format(iters=iters, ranks=run.ranks, body=_body(run, size))
    else:
        per_node = m.topology.gpus_per_node
        body = "\n".join("  " + line for line in _body(run, size, per_node).split("\n"))
        text = _PART_SCHEDULE.format(iters=iters, ranks=world, members=list(members), per_node=per_node, g=run.ranks_per_node, body=body)
    raw = simulate(load_schedule_text(text, "<nccl-tests>"), m, network).raw
    if chained:
        last = dict.fromkeys(members, 0.0)
        for g, op in enumerate(raw.ops):
            if op.kind.is_comm:
                last[op.rank] = max(last[op.rank], raw.end[g])
        return statistics.fmean(last.values()) / iters
    ends = sorted(raw.end[g] for g, op in enumerate(raw.ops) if op.rank == members[0] and op.kind.is_comm)
    if run.op is OpKind.SEND:
        ends = ends[1::2]  # a batch's two ops end together
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def busbw_gb_per_s(op: OpKind, ranks: int, size: int, time_us: float) -> float:
    return size / (time_us * 1e3) * bus_factor(op, ranks)


# ---- the closed form the fit uses ------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A bandwidth of the machine the fit scales: the channels of one kind of link (or an
    implied channel), scaled together by the parameter `scale.NAME`."""

    name: str
    covers: Callable[[LinkKind, bool], bool]
    """Whether a fabric channel of this kind (and touching the network or not) is this rate's."""
    write: Callable[[dict, float], None]
    """Scale it in a machine file (YAML as a dict) by the factor."""
    ring_reference: bool = False
    """NCCL's protocol efficiencies are measured against it: where a ring or tree crosses it,
    the time fits the protocol's efficiency, and only NVLS and P2P fit the rate."""


def _scale_links(doc: dict, factor: float, match: Callable[[dict], bool]) -> None:
    for link in (doc.get("topology") or {}).get("links", ()):
        if match(link):
            link["bandwidth_gb_per_s"] = _round(float(link["bandwidth_gb_per_s"]) * factor)


def _touches_network(link: dict) -> bool:
    return NETWORK_VERTEX in {e for pair in link["between"] for e in pair}


def _scale_entry(doc: dict, keys: tuple[str, ...], factor: float) -> None:
    entry = doc
    for key in keys[:-1]:
        entry = entry.get(key) or {}
    if isinstance(entry.get(keys[-1]), (int, float)):
        entry[keys[-1]] = _round(float(entry[keys[-1]]) * factor)


def _scale_shm(doc: dict, factor: float) -> None:
    nccl = doc["transports"]["nccl"]
    if "staged" not in nccl and factor != 1.0:  # derived from host_link (Machine.nccl_shm_link): write it, then scale it
        spec = shm_link(_link_of(nccl), _link_of(doc["host_link"]))
        nccl["staged"] = {"latency_us": spec.latency_us, "bandwidth_gb_per_s": spec.bandwidth_gb_per_s}
    _scale_entry(doc, ("transports", "nccl", "staged", "bandwidth_gb_per_s"), factor)


def _link_of(entry: dict) -> LinkSpec:
    return LinkSpec(float(entry["latency_us"]), float(entry["bandwidth_gb_per_s"]))


RATES = (
    Rate("nic", lambda kind, net: net, lambda doc, f: _scale_links(doc, f, _touches_network)),
    Rate("nvlink", lambda kind, net: kind is LinkKind.NVLINK, lambda doc, f: _scale_links(doc, f, lambda l: l["kind"] == "nvlink"),
         ring_reference=True),
    Rate("pcie", lambda kind, net: kind is LinkKind.PCIE and not net, lambda doc, f: _scale_links(doc, f, lambda l: l["kind"] == "pcie" and not _touches_network(l))),
    Rate("numa", lambda kind, net: kind is LinkKind.NUMA, lambda doc, f: _scale_links(doc, f, lambda l: l["kind"] == "numa")),
    Rate("memory", lambda kind, net: kind is LinkKind.MEMORY, lambda doc, f: _scale_entry(doc, ("topology", "host_memory_bandwidth_gb_per_s"), f)),
    Rate("shm", lambda kind, net: kind is LinkKind.SHM, lambda doc, f: _scale_shm(doc, f)),
)  # fmt: skip
"""Every rate the fit may scale, the first that covers a channel being its rate: a new
one (a transport of a new model) is one entry. A channel none covers keeps its rate."""
_NIC = 0
_FIXED = len(RATES)

_CONFIG_FIELDS = frozenset(f.name for f in fields(NcclConfig))
NCCL_SCALARS = tuple(name for name in ("launch_us", "launch_per_channel_us", "nvls_latency_us", "net_latency_us", "tree_net_scale", "nvls_efficiency",
                                       "p2p_channel_bandwidth_gb_per_s", "p2p_net_channel_bandwidth_gb_per_s", "p2p_net_efficiency") if name in _CONFIG_FIELDS)  # fmt: skip
"""The `nccl:` numbers the fit may set (`NcclConfig` fields), beside each protocol's
latencies, efficiency and per-channel rate (`PROTOCOL_SCALARS`) and the rates (`RATES`).
How each enters an op's time is the closed form's (`_predict`): the latencies through
`LATENCIES`, the rates through `RATES`."""
PROTOCOL_SCALARS = ("base_latency_us", "efficiency", "channel_bandwidth_gb_per_s")


def _set_hops(cfg: NcclConfig, proto: Protocol, value: float, network: bool) -> NcclConfig:
    spec = cfg.protocol(proto)
    hops = tuple((h, value if (h is HopKind.NETWORK) == network else us) for h, us in spec.hop_latency_us)
    return _with_protocol(cfg, proto, replace(spec, hop_latency_us=hops))


def _with_protocol(cfg: NcclConfig, proto: Protocol, spec) -> NcclConfig:
    return replace(cfg, protocols=tuple((p, spec if p is proto else s) for p, s in cfg.protocols))


@dataclass(frozen=True)
class Latency:
    """A latency of NCCL's model the fit sets: an op's latency is linear in them, and its
    coefficient (how many of it the op pays) is read off the model with this latency at 1
    and every other at 0."""

    name: Callable[[Protocol, HopKind], str]
    """Its parameter's name for a point of this protocol whose steps inside a node cross this hop kind."""
    set: Callable[[NcclConfig, Protocol, float], NcclConfig]


LATENCIES = (
    Latency(lambda proto, intra: f"protocols.{proto.value}.base_latency_us",
            lambda cfg, proto, v: _with_protocol(cfg, proto, replace(cfg.protocol(proto), base_latency_us=v))),
    Latency(lambda proto, intra: f"protocols.{proto.value}.hop.{intra.value}", lambda cfg, proto, v: _set_hops(cfg, proto, v, False)),
    Latency(lambda proto, intra: f"protocols.{proto.value}.hop.network", lambda cfg, proto, v: _set_hops(cfg, proto, v, True)),
    Latency(lambda proto, intra: "nvls_latency_us", lambda cfg, proto, v: replace(cfg, nvls_latency_us=v)),
    # The network's own latency per message (TCPXO, RoCE), in NCCL models that have it.
    *([Latency(lambda proto, intra: "net_latency_us", lambda cfg, proto, v: replace(cfg, net_latency_us=v))]
      if "net_latency_us" in _CONFIG_FIELDS else []),
    # A tree level across nodes, as a factor on NCCL's own figure (the latency is linear in it).
    Latency(lambda proto, intra: "tree_net_scale", lambda cfg, proto, v: replace(cfg, tree_net_scale=v)),
)  # fmt: skip
"""Every latency the fit may set: a new one of NCCL's model is one entry."""
LATENCY_FLOOR_US = 0.1
"""Where the fit starts a latency the base machine has at 0 (it fits logarithms)."""


@dataclass
class _Point:
    """One measured point and what its predicted time depends on, precomputed on a machine
    (the choice, loads and hops do not depend on the fitted rates; `fit` recomputes them
    on the fitted machine until NCCL's choices stay the same)."""

    log: int
    size: float
    measured_us: float
    proto: Protocol
    nvls: bool
    p2p: bool
    latency: tuple[float, ...]
    """Per entry of `LATENCIES`, how many of it the point's latency is."""
    per_byte: tuple[float, ...]
    """Per rate of `RATES` (and last, the channels none covers), the largest data bytes per
    byte of size over the base machine's capacity (us/B)."""
    channels: int
    serial: float
    host_gpus: int
    intra: HopKind
    """What the run's steps inside a node cross (NVLink or PCIe)."""
    choice: tuple
    """NCCL's choice (algorithm, protocol, channels) the coefficients hold for."""
    chain: ChainTerms | None = None
    """Broadcast / reduce (`nccl.Chain`): its rings' orders and, per ring and member, its
    lead's and its part's latency coefficients (per entry of `LATENCIES`), bytes and fixed
    part (`_chain_terms`), timed by `ChainTerms.run_us` as the simulator times them."""
    net_p2p: bool = False
    """A point-to-point based op whose paced pair spans nodes: its P2P channels also run at
    most at NCCL's per-channel network rate (`nccl.channel_cap_gb_per_s`)."""
    fixed_us: float = 0.0
    """The part of its latency no fitted latency scales: the proxies' posting of an
    all_to_all's remote peers (`nccl.proxy_posts_us`, the host's network overhead)."""
    nic_efficiency: float = 0.0
    """Data per wire byte on the NICs where that is a protocol's wire format, which no fit
    moves (`nccl.net_wire_format`); 0: the point's fitted efficiency (point-to-point based
    ops, NVLS)."""


def _points(machine: Machine, base: Machine, logs: list[NcclTestsLog], runs: list[Run]) -> list[_Point]:
    """The points of the logs on `machine` (a fitted one), rates relative to `base`'s."""
    out = []
    for li, (log, run) in enumerate(zip(logs, runs)):
        m = bench_machine(machine, run)
        world, _ = placement(m, run)
        flows = NcclFlows(Fabric(m, world), m.nccl)
        base_fabric = Fabric(bench_machine(base, run), world)
        cls = _classes(base_fabric)
        for p in log.points:
            try:
                c = choice(m, run, p.size_bytes, flows)
            except CommdslError as e:
                raise _at_point(log, p, f"machine {m.name} cannot run this point as the log ran it", e) from None
            out.append(_point(li, m, flows, base_fabric.capacity, cls, run, p.size_bytes, p.time_us, c))
    return out


def _classes(fabric: Fabric) -> list[int]:
    """Per channel of the fabric, the index of its rate in `RATES` (`_FIXED`: none)."""
    out = []
    for c, kind in enumerate(fabric.kinds):
        net = NETWORK_VERTEX in fabric.ends[c]
        out.append(next((k for k, r in enumerate(RATES) if r.covers(kind, net)), _FIXED))
    return out


def _point(li: int, m: Machine, flows: NcclFlows, capacity, cls: list[int], run: Run, size: int, measured: float, c: nccl.Choice) -> _Point:
    _, ranks = placement(m, run)
    lay = flows.layout(ranks)
    kind = run.op
    pairs = [(r, ranks[(i + 1) % len(ranks)]) for i, r in enumerate(ranks)] if kind is OpKind.SEND else [ranks]
    per = [0.0] * (len(RATES) + 1)
    serial = 1.0
    net_p2p = False
    nic_wire = 0.0
    root = ranks[0] if kind in (OpKind.BROADCAST, OpKind.REDUCE) else None
    undo = m.nccl.p2p_net_efficiency if kind in nccl.P2P_BASED else 1.0  # kept apart: a parameter of its own
    for group in pairs:
        co = flows.coflow(kind, group, size, root, c.algo, c.proto, ranks)
        used = flows.choice_of(kind, group, size, c.algo, c.proto, ranks)
        eff, eff_net = nccl.efficiency(m.nccl, used), nccl.net_efficiency(m.nccl, used, kind)
        if nccl.net_wire_format(used, kind):
            nic_wire = eff_net
        for ch, wire in co.channel_bytes:
            data = wire * (eff_net * undo if cls[ch] == _NIC else eff)
            per[cls[ch]] = max(per[cls[ch]], data / capacity[ch])
        if co.cap < math.inf:
            nodes = flows.layout(group).num_nodes
            serial = nccl.channel_cap_gb_per_s(m.nccl, used, kind, nodes) * 1e3 / co.cap
            net_p2p = kind in nccl.P2P_BASED and nodes > 1
    # Latency is linear in the latency parameters: read its coefficients off unit machines.
    # A ring of sends goes at the pace of its slowest hop: the pair with the most latency
    # (across nodes, one that crosses the network), as its per-byte cost is the worst pair's.
    slowest = max(pairs, key=lambda pair: nccl.latency_us(m.nccl, kind, flows.layout(pair), c.algo, c.proto))
    zero = m.nccl
    for lat in LATENCIES:
        zero = lat.set(zero, c.proto, 0.0)
    # What is left with every latency at 0 (the proxies' posting, `nccl.proxy_posts_us`) is fixed.
    fixed = nccl.latency_us(zero, kind, flows.layout(slowest), c.algo, c.proto)
    coeff = tuple(nccl.latency_us(lat.set(zero, c.proto, 1.0), kind, flows.layout(slowest), c.algo, c.proto) - fixed for lat in LATENCIES)
    chain = _chain_terms(zero, kind, lay, flows.choice_of(kind, ranks, size, c.algo, c.proto), size) if kind in (OpKind.BROADCAST, OpKind.REDUCE) else None
    return _Point(li, float(size), measured, c.proto, c.algo in (Algo.NVLS, Algo.NVLS_TREE), kind in nccl.P2P_BASED,
                  coeff, tuple(per), c.channels, serial, 0 if run.graph else run.gpus_per_process, lay.intra_hop,
                  (c.algo, c.proto, c.channels), chain, net_p2p, fixed, nic_wire)  # fmt: skip


def _chain_terms(zero: NcclConfig, kind: OpKind, lay: nccl.Layout, c: nccl.Choice, size: int) -> ChainTerms:
    """A chain op's parts, linear in the latencies and in 1 / rate, plus what depends on
    neither (the proxy's cost per network message, `nccl.chain_message_us`): read off unit
    machines (`zero`: every latency 0) with no bytes (the fixed part), with one latency at 1
    and no bytes, then with bytes at rate 1, each less the fixed part."""
    fixed = nccl.chain(zero, kind, lay, c, 0, float(size), math.inf)
    per_latency = [nccl.chain(lat.set(zero, c.proto, 1.0), kind, lay, c, 0, float(size), math.inf) for lat in LATENCIES]
    moved = nccl.chain(zero, kind, lay, c, 0, float(size), 1.0)
    rings, members = range(len(moved.orders)), range(lay.n)

    def less_fixed(values: tuple[tuple[float, ...], ...], base: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(values[j][k] - base[j][k] for k in members) for j in rings)

    lead = tuple(tuple(tuple(ch.lead_us[j][k] - fixed.lead_us[j][k] for ch in per_latency) for k in members) for j in rings)
    part = tuple(tuple(tuple(ch.part_us[j][k] - fixed.part_us[j][k] for ch in per_latency) for k in members) for j in rings)
    return ChainTerms(moved.orders, lead, less_fixed(moved.lead_us, fixed.lead_us), fixed.lead_us,
                      part, less_fixed(moved.part_us, fixed.part_us), fixed.part_us)  # fmt: skip


def _predict(points: list[_Point], values: dict[str, float]) -> list[float]:
    """Each point's time by the closed form, with the parameters' `values`."""
    out = []
    for p in points:
        proto = p.proto.value
        lat = p.fixed_us + sum(k * values[entry.name(p.proto, p.intra)] for k, entry in zip(p.latency, LATENCIES) if k)
        eff = values["nvls_efficiency"] if p.nvls else values[f"protocols.{proto}.efficiency"]
        worst = p.per_byte[_FIXED]
        for k, rate in enumerate(RATES):
            if p.per_byte[k]:
                scale = values[f"scale.{rate.name}"] * (values["p2p_net_efficiency"] if p.p2p and k == _NIC else 1.0)
                if k == _NIC and p.nic_efficiency:
                    scale *= p.nic_efficiency / eff  # the NICs carry the protocol's wire format, not the fitted efficiency
                worst = max(worst, p.per_byte[k] / scale)
        rate = eff / worst if worst > 0 else math.inf
        per_channel = values["p2p_channel_bandwidth_gb_per_s"] if p.p2p else values[f"protocols.{proto}.channel_bandwidth_gb_per_s"]
        if p.net_p2p:
            per_channel = min(per_channel, values["p2p_net_channel_bandwidth_gb_per_s"])
        if not p.nvls:
            rate = min(rate, p.channels * per_channel * 1e3 / p.serial)
        host = p.host_gpus * (values["launch_us"] + values["launch_per_channel_us"] * p.channels)
        if p.chain is not None:
            unit = array("d", [values.get(entry.name(p.proto, p.intra), 0.0) for entry in LATENCIES])
            out.append(p.chain.run_us(unit, rate, host, TIMED_ITERS))
            continue
        kernel = lat + p.size / rate
        out.append(max(kernel, host))
    return out


def _parameters(machine: Machine) -> dict[str, float]:
    """Every parameter's value on the machine (`RATES` as factors of 1)."""
    cfg = machine.nccl
    vals = {f"scale.{r.name}": 1.0 for r in RATES}
    for name in NCCL_SCALARS:
        vals[name] = getattr(cfg, name)
    for proto, spec in cfg.protocols:
        v = proto.value
        for name in PROTOCOL_SCALARS:
            vals[f"protocols.{v}.{name}"] = getattr(spec, name)
        for hop, us in spec.hop_latency_us:
            vals[f"protocols.{v}.hop.{hop.value}"] = us
    return vals


def _uses(p: _Point, vals: dict[str, float]) -> set[str]:
    """The parameters a point's time depends on."""
    v = p.proto.value
    used: set[str] = set()
    if p.host_gpus:
        used |= {"launch_us", "launch_per_channel_us"}
    used |= {entry.name(p.proto, p.intra) for k, entry in zip(p.latency, LATENCIES) if k}
    if p.nvls:
        used.add("nvls_efficiency")
    elif not p.p2p and p.proto is not Protocol.LL and any(p.per_byte[:_FIXED]):
        used.add(f"protocols.{v}.efficiency")  # LL's is its format: half of every word is flag
    for k, rate in enumerate(RATES):
        if p.per_byte[k] and (p.nvls or p.p2p or not rate.ring_reference):
            used.add(f"scale.{rate.name}")  # a ring over the reference link fits the efficiency instead
    if p.p2p:
        # Of the two per-channel rates, the one that binds (both are NCCL's own figures).
        net_binds = p.net_p2p and vals["p2p_net_channel_bandwidth_gb_per_s"] < vals["p2p_channel_bandwidth_gb_per_s"]
        used.add("p2p_net_channel_bandwidth_gb_per_s" if net_binds else "p2p_channel_bandwidth_gb_per_s")
        if p.per_byte[_NIC]:
            used.add("p2p_net_efficiency")
    elif not p.nvls and math.isfinite(vals[f"protocols.{v}.channel_bandwidth_gb_per_s"]):
        used.add(f"protocols.{v}.channel_bandwidth_gb_per_s")
    latencies = {entry.name(p.proto, p.intra) for entry in LATENCIES}
    return {k for k in used if k in vals and math.isfinite(vals[k]) and (vals[k] > 0 or (k in latencies and vals[k] == 0))}


PRIOR = 0.0002
"""Weight of each parameter's pull towards the base machine's value (log scale): keeps
the ones the logs barely constrain where NCCL's constants put them."""
SCALE = 0.05
"""Relative error at which a point's loss turns from square to linear (soft-L1): a
noisy point (nccl-tests has them) pulls the fit less than a systematic error."""
ROUNDS = 4
"""Most fits of the closed form, each on the machine the one before wrote (NCCL's choices
of algorithm, protocol and channels follow the fitted rates)."""


@dataclass(frozen=True)
class Fitted:
    """What `fit` found."""

    values: dict[str, float]
    """The fitted parameters (machine-file names: `launch_us`, `protocols.ll.base_latency_us`, `scale.nic`)."""
    machine: Machine
    """The base machine with them, as its machine file holds them (rounded)."""
    text: str
    """That machine file."""
    uses: tuple[frozenset[str], ...]
    """Per log, the parameters its points depend on."""


def fit(base: Machine, base_text: str, logs: list[NcclTestsLog], runs: list[Run], sources: list[str],
        progress: Callable[[str], None] = lambda _: None) -> Fitted:  # fmt: skip
    """Fit the parameters the logs' points depend on (see the module doc): the closed form
    is minimised on the choices of the machine of the round before, until the fitted
    machine makes the same choices (the closed form then is the simulator's model)."""
    start_vals = _parameters(base)
    caps = _rate_caps(base)
    values: dict[str, float] = {}
    points = _points(base, base, logs, runs)
    best: tuple[float, dict[str, float], Machine, str, list[_Point]] | None = None
    for r in range(ROUNDS):
        free = sorted(set().union(*(_uses(p, start_vals) for p in points)))
        values = _minimise(points, start_vals, free, {**start_vals, **values}, lambda msg: progress(f"round {r + 1}: {msg}"), caps)
        text = fitted_machine_text(base_text, values, sources)
        machine = load_machine_text(text, "<fitted machine>")
        again = _points(machine, base, logs, runs)
        # The fitted machine on its own choices, as the simulator times it: a round whose
        # fit moved NCCL's choices to where the model fits worse does not replace a better one.
        misfit = _misfit(again, {**start_vals, **values})
        if best is None or misfit < best[0]:
            best = (misfit, values, machine, text, again)
        if [p.choice for p in again] == [p.choice for p in points]:
            break
        changed = sum(a.choice != b.choice for a, b in zip(again, points))
        progress(f"round {r + 1}: NCCL's choice moved at {changed} of {len(points)} points on the fitted machine; fitting again")
        points = again
    _, values, machine, text, points = best
    uses = tuple(frozenset(set().union(*(_uses(p, start_vals) for p in points if p.log == li))) for li in range(len(logs)))
    return Fitted(values, machine, text, uses)


def _misfit(points: list[_Point], values: dict[str, float]) -> float:
    """The points' soft-L1 log error with the parameters' `values` (`SCALE`): what
    `_minimise` minimises, without the pull towards the base machine."""
    total = 0.0
    for pred, p in zip(_predict(points, values), points):
        e = math.log(pred / p.measured_us) / SCALE
        total += 2.0 * (math.sqrt(1.0 + e * e) - 1.0)
    return total


def _rate_caps(machine: Machine) -> dict[str, float]:
    """Per rate (`scale.NAME`), the most the fit may scale it: no link it covers may move
    faster than its line rate (`TopologyLink.line_rate_gb_per_s`; links without one bound nothing)."""
    caps: dict[str, float] = {}
    for link in machine.topology.links if machine.topology is not None else ():
        if link.line_rate_gb_per_s is None:
            continue
        net = NETWORK_VERTEX in (link.a, link.b)
        rate = next((r for r in RATES if r.covers(link.kind, net)), None)
        if rate is not None:
            name = f"scale.{rate.name}"
            caps[name] = min(caps.get(name, math.inf), link.line_rate_gb_per_s / link.bandwidth_gb_per_s)
    return caps


def _minimise(points: list[_Point], base_vals: dict[str, float], free: list[str], start: dict[str, float],
              progress: Callable[[str], None], caps: dict[str, float] | None = None) -> dict[str, float]:  # fmt: skip
    """The free parameters' values minimising the points' soft-L1 log error, pulled towards
    `base_vals` (`PRIOR`), from `start`, no rate above its cap (`_rate_caps`)."""
    caps = caps or {}
    centre = [math.log(base_vals[k] or LATENCY_FLOOR_US) for k in free]
    x0 = [math.log(start[k] or LATENCY_FLOOR_US) for k in free]
    vals = dict(start)

    def loss(x: list[float]) -> float:
        for k, xi in zip(free, x):
            vals[k] = math.exp(xi)
        if any(vals[k] > 1.0 for k in free if k.endswith("efficiency")):
            return math.inf  # a fraction of the link
        if any(vals[k] > caps[k] for k in free if k in caps):
            return math.inf  # faster than the link signals
        return _misfit(points, vals) + PRIOR / SCALE**2 * sum((xi - si) ** 2 for xi, si in zip(x, centre))

    best = nelder_mead(loss, x0, progress)
    return {k: math.exp(xi) for k, xi in zip(free, best)}


# ---- the machine file -------------------------------------------------------------------


def fitted_machine_text(base_text: str, values: dict[str, float], sources: list[str]) -> str:
    """The base machine file with the fitted values in place (YAML)."""
    doc = yaml.safe_load(base_text)
    nccl_doc = doc.setdefault("nccl", {})
    protocols = nccl_doc.setdefault("protocols", {})
    rates = {f"scale.{r.name}": r for r in RATES}
    for name, v in values.items():
        parts = name.split(".")
        if name in rates:
            rates[name].write(doc, v)
            if parts[1] in GRAPH_LINKS and v != 1.0:
                # NCCL's search keeps seeing the base's speeds: a fitted rate moves times, not NCCL's choices
                graph = nccl_doc.setdefault("graph_scale", {})
                graph[parts[1]] = _round(graph.get(parts[1], 1.0) / v)
        elif parts[0] == "protocols":
            entry = protocols.setdefault(parts[1], {})
            if parts[2] == "hop":
                hops = entry.setdefault("hop_latency_us", {})
                hops[parts[3]] = _round(v)
            else:
                entry[parts[2]] = _round(v)
        else:
            nccl_doc[name] = _round(v)
    doc["doc"] = f"{doc.get('doc', '')} NCCL physics fitted to nccl-tests logs ({', '.join(Path(s).name for s in sources)})."
    return yaml.safe_dump(doc, sort_keys=False)


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def base_machine(logs: list[NcclTestsLog], name: str | None) -> Machine:
    """The machine the logs are fitted from: `name` (a preset or machine file), else the
    preset of the GPU the first log names (`DEVICE_PRESETS`); it must have an NCCL model."""
    preset = name or DEVICE_PRESETS.get(logs[0].device)
    if preset is None:
        raise UsageError(f"no base machine for GPU '{logs[0].device or 'not named in the logs'}': name one with --machine (a preset "
                         "or file with nccl: and the cluster's node topology)", hint="e.g. --machine dgx-h100")  # fmt: skip
    machine = resolve_machine(preset)
    if machine.nccl is None:
        raise UsageError(f"machine {machine.name} has no nccl: section to fit", hint="use dgx-h100 or dgx-a100 as the base")
    return machine


def from_nccl_tests(paths: list[str], out: str, base: str | None = None, algo: Algo | None = None, proto: Protocol | None = None,
                    echo: Callable[[str], None] = print, progress: Progress | None = None) -> Machine:  # fmt: skip
    """Fit a machine to nccl-tests logs and write it to `out` (see the module doc); returns
    the machine read back from the file. `algo`/`proto`: NCCL_ALGO / NCCL_PROTO of the
    runs whose logs do not say (NCCL INFO lines). Nothing is left at `out` if it fails."""
    require_output_folder("--out", out)  # before any work
    progress = progress or Progress("calibrate", enabled=False)
    logs, machine, runs = _read_runs(paths, base, algo, proto, echo)
    echo(f"calibrate: {sum(len(l.points) for l in logs)} points in {len(logs)} log(s), base machine {machine.name}")
    progress.phase("fitting")
    fitted = fit(machine, Path(machine.source).read_text(), logs, runs, paths, lambda msg: progress.phase(f"fitting, {msg}"))
    doc = yaml.safe_load(fitted.text)
    doc["name"] = Path(out).stem
    versions = {run.nccl_version for run in runs}
    if len(versions) == 1 and None not in versions:
        # the cluster's NCCL release, so that the machine chooses as its NCCL does
        doc["nccl"]["version"] = format_nccl_version(versions.pop())
    collnets = {run.collnet for run in runs if run.ranks_per_node is not None}  # runs across nodes
    if len(collnets) == 1 and None not in collnets:
        doc["nccl"]["collnet"] = collnets.pop()  # the cluster's SHARP switches as its runs had them
    doc["calibration"] = asdict(Calibration.now("commdsl calibrate --from-nccl-tests", ", ".join(Path(p).name for p in paths)))
    header = (f"# Written by `commdsl calibrate --from-nccl-tests` from {len(paths)} nccl-tests log(s):\n"
              + "".join(f"#   {p}\n" for p in paths) + f"# base machine: {machine.name} ({machine.source})\n")  # fmt: skip
    text = header + yaml.safe_dump(doc, sort_keys=False)
    machine_out = load_machine_text(text, out)
    report = simulated_errors(machine_out, logs, runs, progress)
    # Written last (through a temporary file renamed into place): a failure before leaves
    # nothing claiming to be a calibration.
    write_text(out, text, "--out")
    _report(machine, logs, fitted, report, echo)
    return load_machine(out)


def _read_runs(paths: list[str], base: str | None, algo: Algo | None, proto: Protocol | None,
               echo: Callable[[str], None]) -> tuple[list[NcclTestsLog], Machine, list[Run]]:  # fmt: skip
    """The logs (what reading them noted, told), the base machine, and each log's run, every
    run's layout one the base machine can run: checked before any work."""
    notes: list[str] = []
    logs = read_logs(paths, notes)
    for note in notes:
        echo(f"calibrate: {note}")
    machine = base_machine(logs, base)
    runs = [Run.of(log, algo, proto) for log in logs]
    for log, run in zip(logs, runs):
        _check_nodes(machine, log)
        bench_machine(machine, run)
    return logs, machine, runs


def check_nccl_tests(paths: list[str], base: str | None = None, algo: Algo | None = None, proto: Protocol | None = None,
                     echo: Callable[[str], None] = print, progress: Progress | None = None) -> list[list[float]]:  # fmt: skip
    """Time every size of the logs on a machine as it is (`base`, else the preset of the
    logs' GPU), fitting nothing: per log, each size's measured and predicted time and error,
    then the median and worst. Returns the errors (predicted / measured - 1) per log."""
    progress = progress or Progress("calibrate", enabled=False)
    logs, machine, runs = _read_runs(paths, base, algo, proto, echo)
    errors = simulated_errors(machine, logs, runs, progress, "on the machine")
    for log, errs in zip(logs, errors):
        where = f", {log.nodes} node(s)" if log.nodes is not None else ""
        echo(f"{log.path}: {log.tool} on {log.ranks} GPUs{where}, on {machine.name}")
        echo(f"  {'size':>14} {'measured us':>12} {'predicted us':>13} {'error':>8}")
        for p, e in zip(log.points, errs):
            echo(f"  {p.size_bytes:>14} {p.time_us:>12.2f} {p.time_us * (1 + e):>13.2f} {100 * e:>+7.1f}%")
        echo(f"  median {100 * statistics.median(abs(e) for e in errs):.1f}%, worst {100 * max(abs(e) for e in errs):.1f}% over {len(errs)} sizes")
    return errors


def _check_nodes(machine: Machine, log: NcclTestsLog) -> None:
    """A log's GPUs on each node fit the base machine's node. `bench_machine` checks a run
    across nodes; a run on one node (whose `Run` leaves the layout to the machine) is checked
    here, or its GPUs would be spread over several of the machine's nodes."""
    topo = machine.topology
    if topo is not None and log.ranks_per_node is not None and log.ranks_per_node > topo.gpus_per_node:
        nodes = "one node" if log.nodes == 1 else f"each of {log.nodes} nodes"
        raise LogError(f"the run has {log.ranks_per_node} GPUs on {nodes}, and machine {machine.name} has {topo.gpus_per_node} a node",
                       SourceLoc(log.file, log.line, 1), hint="name a base machine with the cluster's nodes: --machine")  # fmt: skip


def _at_point(log: NcclTestsLog, p: Point, what: str, e: CommdslError) -> LogError:
    """The simulator's error on a log's point, named at the point's line of the log (not the
    simulated schedule's): NCCL_ALGO / NCCL_PROTO from the log's INFO lines that the machine
    does not have, say."""
    # The settings `Run.of` takes from the log.
    said = " and ".join(f"NCCL_{name} {', '.join(sorted(x.value for x in v))}" for name, v in (("ALGO", log.algos), ("PROTO", log.protos))
                        if v is not None)  # fmt: skip
    hint = f"the log's NCCL INFO lines set {said}: name a base machine that has it (--machine)" if said else e.hint
    return LogError(f"{what}: {e.message}", SourceLoc(log.file, p.line, 1), hint=hint)


def simulated_errors(machine: Machine, logs: list[NcclTestsLog], runs: list[Run], progress: Progress | None = None,
                     which: str = "on the fitted machine") -> list[list[float]]:  # fmt: skip
    """Per log, the simulator's relative error (predicted / measured - 1) at every point."""
    progress = progress or Progress("calibrate", enabled=False)
    progress.phase(f"simulating the logs' points {which}", sum(len(log.points) for log in logs), "points")
    out = []
    for log, run in zip(logs, runs):
        errs = []
        for p in log.points:
            try:
                errs.append(simulate_run(machine, run, p.size_bytes) / p.time_us - 1.0)
            except CommdslError as e:
                raise _at_point(log, p, f"the machine {machine.name} cannot simulate this point", e) from None
            progress.advance()
        out.append(errs)
    return out


SPLIT_BYTES = 64 * 2**20
"""Calibrate-then-predict (`holdout_errors`) splits each log's sizes here."""


def holdout_errors(base: Machine, logs: list[NcclTestsLog], runs: list[Run], split_bytes: int = SPLIT_BYTES,
                   progress: Callable[[str], None] = lambda _: None) -> dict[str, list[float]]:  # fmt: skip
    """Calibrate-then-predict: fit the logs' sizes <= `split_bytes` and simulate the larger
    ones on the fitted machine, then the reverse. The simulator's relative errors on the
    points left out, by direction ("small->large", "large->small"); a direction whose
    training or held-out side is empty in every log is left out."""
    text = Path(base.source).read_text()
    out = {}
    for name, train_small in (("small->large", True), ("large->small", False)):
        train, held, kept = [], [], []
        for log, run in zip(logs, runs):
            small = tuple(p for p in log.points if p.size_bytes <= split_bytes)
            large = tuple(p for p in log.points if p.size_bytes > split_bytes)
            fit_pts, test_pts = (small, large) if train_small else (large, small)
            if fit_pts:
                train.append(replace(log, points=fit_pts))
                kept.append(run)
                held.append((run, test_pts))
        if not train or not any(pts for _, pts in held):
            continue
        fitted = fit(base, text, train, kept, [log.path for log in train], progress)
        out[name] = [simulate_run(fitted.machine, run, p.size_bytes) / p.time_us - 1.0 for run, pts in held for p in pts]
    return out


def _report(base: Machine, logs: list[NcclTestsLog], fitted: Fitted, errors: list[list[float]], echo: Callable[[str], None]) -> None:
    """Per log: the simulator's error on its points, and which parameters the logs fitted."""
    every = set(_parameters(base))
    for li, log in enumerate(logs):
        errs = [abs(e) for e in errors[li]]
        used = sorted(fitted.uses[li] & set(fitted.values))
        where = f" ({log.nodes} node(s)" + (", CollNet" if log.collnet else "") + ")" if log.nodes is not None else ""
        echo(f"  {log.path}: {log.tool} on {log.ranks} GPUs{where}: simulator's error median "
             f"{100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}% over {len(errs)} sizes")  # fmt: skip
        echo(f"    fitted: {', '.join(used) or 'nothing'}; from {base.name}: the other {len(every) - len(used)} parameters and the topology")
    rest = sorted(every - set(fitted.values))
    echo(f"  not fitted (no point depends on them), from {base.name}: {', '.join(rest)}")


def main_from_nccl_tests(paths: list[str], out: str | None, base: str | None, algo: str | None, proto: str | None,
                         check: bool = False) -> int:  # fmt: skip
    """The command-line entry (`--from-nccl-tests`), without torch."""
    a = _enum(Algo, algo, "--nccl-algo")
    p = _enum(Protocol, proto, "--nccl-proto")
    if check:  # (--out with --check, or neither, is refused with the options: `config_from_args`)
        with Progress("calibrate") as progress:
            check_nccl_tests(paths, base, a, p, echo=print, progress=progress)
        return 0
    with Progress("calibrate") as progress:
        from_nccl_tests(paths, out, base, a, p, echo=lambda s: print(s, file=sys.stderr, flush=True), progress=progress)
    print(out)
    return 0


def _enum(cls, text: str | None, flag: str):
    if text is None:
        return None
    try:
        return cls(text.lower())
    except ValueError:
        raise UsageError(f"{flag}: unknown name '{text}' (known: {', '.join(e.value for e in cls)})") from None

