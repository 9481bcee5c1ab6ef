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
the cluster) to the logs: protocol latencies, the NVLink and NIC rates NCCL reaches, the
per-channel rates, NVLS, P2P and the launch cost, whichever the logs' points depend on
(a parameter no point depends on keeps the base machine's value). It minimises the
squared log error of every point, each point timed by the closed form of the same model
(`_Point`), then checks the fit with the simulator itself, writes the machine file and
prints the error per log.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from commdsl.calibrate.nccl_logs import Channels, NcclTestsLog, read_logs
from commdsl.dsl import load_schedule_text
from commdsl.errors import SourceLoc, UsageError, require_output_folder
from commdsl.ir import Algo, Dtype, Op, OpKind, Protocol, Transport
from commdsl.machine.loader import load_machine, resolve_machine
from commdsl.machine.model import NETWORK_VERTEX, Calibration, LinkKind, Machine
from commdsl.machine.nccl import HopKind, NcclConfig
from commdsl.sim import nccl
from commdsl.sim.fabric import Fabric
from commdsl.sim.nccl_flows import NcclFlows
from commdsl.sim.simulate import simulate

ITERS = 5
"""Ops in a row per simulated point: the steady state is reached after the first."""

BUS_FACTOR = {
    OpKind.ALL_REDUCE: lambda n: 2 * (n - 1) / n, OpKind.ALL_GATHER: lambda n: (n - 1) / n,
    OpKind.REDUCE_SCATTER: lambda n: (n - 1) / n, OpKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    OpKind.SEND: lambda n: 1.0, OpKind.BROADCAST: lambda n: 1.0, OpKind.REDUCE: lambda n: 1.0,
}  # fmt: skip
"""nccl-tests' busbw = algbw x factor (its doc/PERFORMANCE.md)."""

DEVICE_PRESETS = {"NVIDIA H100 80GB HBM3": "dgx-h100", "NVIDIA A100-SXM4-80GB": "dgx-a100", "NVIDIA A100-SXM4-40GB": "dgx-a100"}
"""Base machine per GPU name as nccl-tests prints it, when `--machine` is not given."""


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
    """NCCL_ALGO forced for the run (None: NCCL's choice among the machine's)."""
    proto: Protocol | None = None
    max_channels: int | None = None
    """NCCL_MAX_NCHANNELS of the run (None: NCCL's own)."""
    ranks_per_node: int | None = None
    """GPUs of the run on each node (None: the base machine's nodes filled in turn)."""
    channels: Channels | None = None
    """NCCL's channel counts as the run's log reports them (None: the machine's)."""

    @staticmethod
    def of(log: NcclTestsLog, algo: Algo | None = None, proto: Protocol | None = None) -> Run:
        """The run a log records; NCCL_ALGO / NCCL_PROTO from the log, else `algo` / `proto`."""
        a = next(iter(log.algos)) if log.algos is not None and len(log.algos) == 1 else algo
        p = next(iter(log.protos)) if log.protos is not None and len(log.protos) == 1 else proto
        per_node = log.ranks_per_node if log.nodes > 1 else None
        return Run(log.op, log.ranks, log.gpus_per_process, log.graph, log.dtype, a, p, ranks_per_node=per_node, channels=log.channels)


def bench_machine(machine: Machine, run: Run) -> Machine:
    """The machine with enough nodes for the run's GPUs, and NCCL's channels as the run had them."""
    topo, cfg = machine.topology, machine.nccl
    if topo is None or cfg is None:
        raise UsageError(f"machine {machine.name} has no NCCL model (nccl: and topology:), so nccl-tests cannot be simulated on it",
                         hint="use a preset such as dgx-h100 or dgx-a100")  # fmt: skip
    if run.ranks_per_node is not None and run.ranks_per_node != topo.gpus_per_node:
        # Fabric numbers rank k of node n as GPU k of it: a run on part of each node is another topology.
        raise UsageError(f"the run has {run.ranks_per_node} GPU(s) on each of {run.ranks // run.ranks_per_node} nodes, and machine "
                         f"{machine.name} has {topo.gpus_per_node} per node: commdsl simulates runs on whole nodes",
                         hint="calibrate with the logs of runs that use every GPU of their nodes (or of one node)")  # fmt: skip
    nodes = -(-run.ranks // topo.gpus_per_node)
    m = machine if nodes == topo.nodes else machine.with_nodes(nodes)
    if run.max_channels is not None:
        p2p = min(cfg.p2p_channels, 1 << (run.max_channels - 1).bit_length())
        cfg = replace(cfg, channels=min(cfg.channels, run.max_channels), nvls_channels=min(cfg.nvls_channels, run.max_channels),
                      p2p_channels=p2p, p2p_channels_per_peer=min(cfg.p2p_channels_per_peer, p2p))  # fmt: skip
    if run.channels is not None:
        ch = run.channels
        cfg = replace(cfg, channels=max(ch.coll, 1), p2p_channels=max(ch.p2p, 1), p2p_channels_per_peer=max(ch.p2p_per_peer, 1))
        if ch.nvls is not None:  # 0: NCCL found no NVLS (or it was turned off)
            cfg = replace(cfg, nvls=cfg.nvls and ch.nvls > 0, nvls_channels=max(ch.nvls, 1))
    return m if cfg is machine.nccl else replace(m, nccl=cfg)


def _op(run: Run, size: int, rank: int = 0) -> Op:
    """The op rank `rank` issues (what NCCL's choice is asked about)."""
    algo = run.algo
    if run.op in (OpKind.BROADCAST, OpKind.REDUCE) and algo is Algo.RING:
        algo = Algo.CHAIN
    peer = (rank + 1) % run.ranks if run.op is OpKind.SEND else None
    root = 0 if run.op in (OpKind.BROADCAST, OpKind.REDUCE) else None
    return Op(rank, 0, run.op, "x", "s", SourceLoc("<nccl-tests>", 1, 1), size_bytes=size, dtype=run.dtype, peer=peer,
              group="world", root=root, transport=Transport.NCCL, algo=algo, proto=run.proto)  # fmt: skip


def choice(machine: Machine, run: Run, size: int, flows: NcclFlows | None = None) -> nccl.Choice:
    """What NCCL runs for one size of `run` on `machine`."""
    flows = flows or NcclFlows(Fabric(machine, run.ranks), machine.nccl)
    return flows.choose(_op(run, size), tuple(range(run.ranks)))


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


def _body(run: Run, size: int) -> str:
    opts = f" dtype={run.dtype.value}"
    if run.algo is not None:
        opts += f" algo={'chain' if run.op in (OpKind.BROADCAST, OpKind.REDUCE) and run.algo is Algo.RING else run.algo.value}"
    if run.proto is not None:
        opts += f" proto={run.proto.value}"
    s = f"{size}B"
    if run.op is OpKind.SEND:
        return (f"      batch:\n          isend x[i] {s} to (rank + 1) % world_size{opts}\n"
                f"          irecv x[i] {s} from (rank + world_size - 1) % world_size{opts}")  # fmt: skip
    root = " src=0" if run.op is OpKind.BROADCAST else " dst=0" if run.op is OpKind.REDUCE else ""
    return f"      {run.op.value} x[i] {s}{root}{opts}"


def simulate_run(machine: Machine, run: Run, size: int, network: str = "flow") -> float:
    """nccl-tests' time per op (us) for `size` on `machine`, by the simulator: ITERS ops in
    a row on every rank, the steady-state time between two ends on rank 0."""
    m = bench_machine(machine, run)
    c = choice(m, run, size)
    m = replace(m, comm_launch_us=host_us(m, run, c), kernel_launch_us=0.0)
    program = load_schedule_text(_SCHEDULE.format(iters=ITERS, ranks=run.ranks, body=_body(run, size)), "<nccl-tests>")
    raw = simulate(program, m, network).raw
    ends = sorted(raw.end[g] for g, op in enumerate(raw.ops) if op.rank == 0 and op.kind.is_comm)
    if run.op is OpKind.SEND:
        ends = ends[1::2]  # a batch's two ops end together
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def busbw_gb_per_s(op: OpKind, ranks: int, size: int, time_us: float) -> float:
    return size / (time_us * 1e3) * BUS_FACTOR[op](ranks)


# ---- the closed form the fit uses ------------------------------------------------------

_FIXED, _NVLINK, _NIC = 0, 1, 2
"""Link classes whose bandwidth the fit scales (NVLink, the NICs' links to the network)."""


@dataclass
class _Point:
    """One measured point and what its predicted time depends on, precomputed on the base
    machine (the choice, loads and hops do not depend on the fitted rates)."""

    log: int
    size: float
    measured_us: float
    proto: Protocol
    nvls: bool
    p2p: bool
    latency: tuple[float, float, float, float]
    """Latency = [base, intra hop, network hop, nvls latency] . these coefficients."""
    per_byte: tuple[float, float, float]
    """Per link class, the largest data bytes per byte of size over the base capacity (us/B)."""
    channels: int
    serial: float
    host_channels: int
    host_gpus: int
    intra: HopKind
    """What the run's steps inside a node cross (NVLink or PCIe)."""


def _points(machine: Machine, logs: list[NcclTestsLog], runs: list[Run]) -> list[_Point]:
    out = []
    for li, (log, run) in enumerate(zip(logs, runs)):
        m = bench_machine(machine, run)
        flows = NcclFlows(Fabric(m, run.ranks), m.nccl)
        cls = _classes(flows.fabric)
        for p in log.points:
            c = choice(m, run, p.size_bytes, flows)
            out.append(_point(li, m, flows, cls, run, p.size_bytes, p.time_us, c))
    return out


def _classes(fabric: Fabric) -> list[int]:
    ends = fabric.ends
    out = []
    for c, kind in enumerate(fabric.kinds):
        if kind is LinkKind.NVLINK:
            out.append(_NVLINK)
        elif NETWORK_VERTEX in ends[c]:
            out.append(_NIC)
        else:
            out.append(_FIXED)
    return out


def _point(li: int, m: Machine, flows: NcclFlows, cls: list[int], run: Run, size: int, measured: float, c: nccl.Choice) -> _Point:
    ranks = tuple(range(run.ranks))
    lay = flows.layout(ranks)
    kind = run.op
    pairs = [(r, (r + 1) % run.ranks) for r in ranks] if kind is OpKind.SEND else [ranks]
    per = [0.0, 0.0, 0.0]
    serial = 1.0
    root = 0 if kind in (OpKind.BROADCAST, OpKind.REDUCE) else None
    undo = m.nccl.p2p_net_efficiency if kind in nccl.P2P_BASED else 1.0  # kept apart: a parameter of its own
    for group in pairs:
        co = flows.coflow(kind, group, size, root, c.algo, c.proto, run.ranks)
        used = flows.choice_of(kind, group, size, c.algo, c.proto, run.ranks)
        eff = nccl.efficiency(m.nccl, used)
        for ch, wire in co.channel_bytes:
            data = wire * eff * (undo if cls[ch] == _NIC else 1.0)
            per[cls[ch]] = max(per[cls[ch]], data / flows.fabric.capacity[ch])
        if co.cap < math.inf:
            serial = nccl.channel_cap_gb_per_s(m.nccl, used, kind) * 1e3 / co.cap
    # Latency is linear in the four latency parameters: read its coefficients off unit machines.
    coeff = []
    for unit in range(4):
        cfg = _unit_latencies(m.nccl, c.proto, unit)
        coeff.append(nccl.latency_us(cfg, kind, flows.layout(pairs[0]), c.algo, c.proto))
    return _Point(li, float(size), measured, c.proto, c.algo in (Algo.NVLS, Algo.NVLS_TREE), kind in nccl.P2P_BASED,
                  tuple(coeff), tuple(per), c.channels, serial, c.channels, 0 if run.graph else run.gpus_per_process,
                  lay.intra_hop)  # fmt: skip


def _unit_latencies(cfg: NcclConfig, proto: Protocol, unit: int) -> NcclConfig:
    spec = cfg.protocol(proto)
    hops = tuple((h, 1.0 if (unit == 1 and h is not HopKind.NETWORK) or (unit == 2 and h is HopKind.NETWORK) else 0.0)
                 for h, _ in spec.hop_latency_us)  # fmt: skip
    spec = replace(spec, base_latency_us=1.0 if unit == 0 else 0.0, hop_latency_us=hops)
    protocols = tuple((p, spec if p is proto else s) for p, s in cfg.protocols)
    return replace(cfg, protocols=protocols, nvls_latency_us=1.0 if unit == 3 else 0.0)


@dataclass(frozen=True)
class _Param:
    name: str
    """Its path in the machine file (`nccl.protocols.ll.base_latency_us`, `links.nvlink`)."""
    start: float


def _predict(points: list[_Point], values: dict[str, float], cfg: NcclConfig) -> list[float]:
    out = []
    for p in points:
        proto = p.proto.value
        base = values.get(f"protocols.{proto}.base_latency_us", 0.0)
        lat = (p.latency[0] * base + p.latency[1] * values.get(f"protocols.{proto}.hop.{p.intra.value}", 0.0)
               + p.latency[2] * values.get(f"protocols.{proto}.hop.network", 0.0) + p.latency[3] * values["nvls_latency_us"])  # fmt: skip
        eff = values["nvls_efficiency"] if p.nvls else values[f"protocols.{proto}.efficiency"]
        nic = values["scale.nic"] * (values["p2p_net_efficiency"] if p.p2p else 1.0)
        worst = max(p.per_byte[_FIXED], p.per_byte[_NVLINK] / values["scale.nvlink"], p.per_byte[_NIC] / nic)
        rate = eff / worst if worst > 0 else math.inf
        per_channel = values["p2p_channel_bandwidth_gb_per_s"] if p.p2p else values.get(f"protocols.{proto}.channel_bandwidth_gb_per_s", math.inf)
        if not p.nvls:
            rate = min(rate, p.channels * per_channel * 1e3 / p.serial)
        kernel = lat + p.size / rate
        host = p.host_gpus * (values["launch_us"] + values["launch_per_channel_us"] * p.host_channels)
        out.append(max(kernel, host))
    return out


def _parameters(machine: Machine, points: list[_Point]) -> dict[str, float]:
    """Every parameter's value on the base machine (those the points do not use included)."""
    cfg = machine.nccl
    vals = {"scale.nvlink": 1.0, "scale.nic": 1.0}
    for name in ("launch_us", "launch_per_channel_us", "nvls_latency_us", "nvls_efficiency", "p2p_channel_bandwidth_gb_per_s",
                 "p2p_net_efficiency"):  # fmt: skip
        vals[name] = getattr(cfg, name)
    intra = next((p.intra for p in points if p.latency[1]), HopKind.NVLINK)
    for proto, spec in cfg.protocols:
        v = proto.value
        vals[f"protocols.{v}.base_latency_us"] = spec.base_latency_us
        vals[f"protocols.{v}.hop.{intra.value}"] = spec.hop_us(intra)
        vals[f"protocols.{v}.hop.network"] = spec.hop_us(HopKind.NETWORK)
        vals[f"protocols.{v}.channel_bandwidth_gb_per_s"] = spec.channel_bandwidth_gb_per_s
        vals[f"protocols.{v}.efficiency"] = spec.efficiency
    return vals


def _free(points: list[_Point], vals: dict[str, float]) -> list[str]:
    """The parameters some point's time depends on (the rest keep the base machine's)."""
    used: set[str] = set()
    for p in points:
        v = p.proto.value
        if p.host_gpus:
            used |= {"launch_us", "launch_per_channel_us"}
        if p.latency[0]:
            used.add(f"protocols.{v}.base_latency_us")
        if p.latency[1]:
            used.add(f"protocols.{v}.hop.{p.intra.value}")
        if p.latency[2]:
            used.add(f"protocols.{v}.hop.network")
        if p.latency[3]:
            used.add("nvls_latency_us")
        if p.nvls:
            used.add("nvls_efficiency")
        elif not p.p2p and p.proto is not Protocol.LL and (p.per_byte[_NVLINK] or p.per_byte[_NIC]):
            used.add(f"protocols.{v}.efficiency")  # LL's is its format: half of every word is flag
        if p.per_byte[_NVLINK] and (p.nvls or p.p2p):
            used.add("scale.nvlink")  # else the protocols' efficiencies stand for it
        if p.per_byte[_NIC]:
            used.add("scale.nic")
        if p.p2p:
            used.add("p2p_channel_bandwidth_gb_per_s")
            if p.per_byte[_NIC]:
                used.add("p2p_net_efficiency")
        elif not p.nvls and math.isfinite(vals[f"protocols.{v}.channel_bandwidth_gb_per_s"]):
            used.add(f"protocols.{v}.channel_bandwidth_gb_per_s")
    return [k for k in vals if k in used and vals[k] > 0 and math.isfinite(vals[k])]


PRIOR = 0.0002
"""Weight of each parameter's pull towards the base machine's value (log scale): keeps
the ones the logs barely constrain where NCCL's constants put them."""
SCALE = 0.05
"""Relative error at which a point's loss turns from square to linear (soft-L1): a
noisy point (nccl-tests has them) pulls the fit less than a systematic error."""


def fit(machine: Machine, logs: list[NcclTestsLog], runs: list[Run], progress: Callable[[str], None] = lambda _: None) -> tuple[dict[str, float], list[_Point]]:
    """The values of the parameters the points depend on, fitted (see the module doc), and
    the points."""
    points = _points(machine, logs, runs)
    vals = _parameters(machine, points)
    free = _free(points, vals)
    start = [math.log(vals[k]) for k in free]
    cfg = machine.nccl
    measured = [p.measured_us for p in points]

    def loss(x: list[float]) -> float:
        v = dict(vals)
        for k, xi in zip(free, x):
            v[k] = math.exp(xi)
        if any(v[k] > 1.0 for k in free if k.endswith("efficiency")):
            return math.inf  # a fraction of the link
        total = 0.0
        for pred, meas in zip(_predict(points, v, cfg), measured):
            e = math.log(pred / meas) / SCALE
            total += 2.0 * (math.sqrt(1.0 + e * e) - 1.0)
        return total + PRIOR / SCALE**2 * sum((xi - si) ** 2 for xi, si in zip(x, start))

    best = _nelder_mead(loss, start, progress)
    return {k: math.exp(xi) for k, xi in zip(free, best)}, points


def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], progress: Callable[[str], None], rounds: int = 4) -> list[float]:
    """Minimise f from x0 (Nelder-Mead, restarted `rounds` times from the best point)."""
    x = list(x0)
    n = len(x)
    if n == 0:
        return x
    for r in range(rounds):
        simplex = [list(x)] + [[xi + (0.3 if i == j else 0.0) for j, xi in enumerate(x)] for i in range(n)]
        values = [f(s) for s in simplex]
        for _ in range(400 * n):
            order = sorted(range(n + 1), key=values.__getitem__)
            simplex = [simplex[i] for i in order]
            values = [values[i] for i in order]
            if values[-1] - values[0] < 1e-9 * (1.0 + abs(values[0])):
                break
            centre = [sum(s[j] for s in simplex[:-1]) / n for j in range(n)]
            worst = simplex[-1]
            refl = [c + (c - w) for c, w in zip(centre, worst)]
            fr = f(refl)
            if fr < values[0]:
                exp = [c + 2.0 * (c - w) for c, w in zip(centre, worst)]
                fe = f(exp)
                simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = refl, fr
            else:
                contr = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
                fc = f(contr)
                if fc < values[-1]:
                    simplex[-1], values[-1] = contr, fc
                else:
                    best = simplex[0]
                    simplex = [best] + [[b + 0.5 * (s - b) for b, s in zip(best, p)] for p in simplex[1:]]
                    values = [values[0]] + [f(p) for p in simplex[1:]]
        x = simplex[min(range(n + 1), key=values.__getitem__)]
        progress(f"fit round {r + 1}/{rounds}: loss {min(values):.4g}")
    return x


# ---- the machine file -------------------------------------------------------------------


def fitted_machine_dict(base_text: str, values: dict[str, float], sources: list[str]) -> dict:
    """The base machine file (YAML, as a dict) with the fitted values in place."""
    doc = yaml.safe_load(base_text)
    nccl_doc = doc.setdefault("nccl", {})
    protocols = nccl_doc.setdefault("protocols", {})
    for name, v in values.items():
        parts = name.split(".")
        if parts[0] == "scale":
            kind = parts[1]
            for link in doc["topology"]["links"]:
                is_nic = NETWORK_VERTEX in {e for pair in link["between"] for e in pair}
                if (kind == "nvlink" and link["kind"] == "nvlink") or (kind == "nic" and is_nic):
                    link["bandwidth_gb_per_s"] = _round(float(link["bandwidth_gb_per_s"]) * v)
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
    return doc


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def from_nccl_tests(paths: list[str], out: str, base: str | None = None, algo: Algo | None = None, proto: Protocol | None = None,
                    echo: Callable[[str], None] = print) -> Machine:  # fmt: skip
    """Fit a machine to nccl-tests logs and write it to `out` (see the module doc); returns
    the machine read back from the file. `algo`/`proto`: NCCL_ALGO / NCCL_PROTO of the
    runs whose logs do not say (NCCL INFO lines)."""
    require_output_folder("--out", out)
    logs = read_logs(paths)
    preset = base or DEVICE_PRESETS.get(logs[0].device)
    if preset is None:
        raise UsageError(f"no base machine for GPU '{logs[0].device}': name one with --machine (a preset or file with "
                         "nccl: and the cluster's node topology)", hint="e.g. --machine dgx-h100")  # fmt: skip
    machine = resolve_machine(preset)
    if machine.nccl is None:
        raise UsageError(f"machine {machine.name} has no nccl: section to fit", hint="use dgx-h100 or dgx-a100 as the base")
    runs = [Run.of(log, algo, proto) for log in logs]
    echo(f"calibrate: {sum(len(l.points) for l in logs)} points in {len(logs)} log(s), base machine {machine.name}")
    fitted, points = fit(machine, logs, runs, lambda msg: echo(f"calibrate: {msg}"))
    doc = fitted_machine_dict(Path(machine.source).read_text(), fitted, paths)
    doc["name"] = Path(out).stem
    doc["calibration"] = asdict(Calibration.now("commdsl calibrate --from-nccl-tests", ", ".join(Path(p).name for p in paths)))
    header = (f"# Written by `commdsl calibrate --from-nccl-tests` from {len(logs)} nccl-tests log(s):\n"
              + "".join(f"#   {p}\n" for p in paths) + f"# base machine: {machine.name} ({machine.source})\n")  # fmt: skip
    Path(out).write_text(header + yaml.safe_dump(doc, sort_keys=False))
    machine_out = load_machine(out)
    _report(machine_out, logs, runs, points, {**_parameters(machine, points), **fitted}, echo)
    return machine_out


def _report(machine: Machine, logs: list[NcclTestsLog], runs: list[Run], points: list[_Point], values: dict[str, float],
            echo: Callable[[str], None]) -> None:  # fmt: skip
    """Per log: the simulator's error on its points (the closed form's, for many points)."""
    pred = _predict(points, values, machine.nccl)
    for li, log in enumerate(logs):
        errs = [abs(p / pt.measured_us - 1.0) for p, pt in zip(pred, points) if pt.log == li]
        sims = [abs(simulate_run(machine, runs[li], pt.size_bytes) / pt.time_us - 1.0) for pt in _spread(log.points, 6)]
        echo(f"  {Path(log.path).name}: {log.tool} on {log.ranks} GPUs ({log.nodes} node(s)): median error "
             f"{100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}% over {len(errs)} sizes; simulator at "
             f"{len(sims)} sizes: worst {100 * max(sims):.1f}%")  # fmt: skip


def _spread(points: Iterable, k: int) -> list:
    pts = list(points)
    if len(pts) <= k:
        return pts
    return [pts[round(i * (len(pts) - 1) / (k - 1))] for i in range(k)]


def main_from_nccl_tests(paths: list[str], out: str | None, base: str | None, algo: str | None, proto: str | None) -> int:
    """The command-line entry (`--from-nccl-tests`), without torch."""
    if not out:
        raise UsageError("--from-nccl-tests needs --out FILE (the machine file to write)")
    a = _enum(Algo, algo, "--nccl-algo")
    p = _enum(Protocol, proto, "--nccl-proto")
    from_nccl_tests(paths, out, base, a, p, echo=lambda s: print(s, file=sys.stderr, flush=True))
    print(out)
    return 0


def _enum(cls, text: str | None, flag: str):
    if text is None:
        return None
    try:
        return cls(text.lower())
    except ValueError:
        raise UsageError(f"{flag}: unknown name '{text}' (known: {', '.join(e.value for e in cls)})") from None

