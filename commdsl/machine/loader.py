"""Load and validate machine descriptions (YAML) and find presets.

Files are read with the safe loader; we keep the composed node tree so every error
names file:line:col, shows the line, and prints the value that is wrong.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

from commdsl.arguments import whole_number
from commdsl.errors import MachineError, SourceLoc, UsageError, did_you_mean
from commdsl.files import is_file, read_text
from commdsl.ir import COLLECTIVE_KINDS, REDUCING_KINDS, Dtype, OpKind, ReduceOp, Transport
from commdsl.limits import (MAX_FACTOR, MAX_MACHINE_COUNT, MAX_MACHINE_TIME_US, MAX_SIZE_BYTES, MAX_STALLS_PER_S, MAX_WORLD_SIZE,
                            MIN_BANDWIDTH_GB_PER_S, MIN_TFLOPS)
from commdsl.machine.nccl_loader import read_nccl
from commdsl.machine.model import (ANY_DTYPE, IMPLIED_LINK_KINDS, NETWORK_VERTEX, Calibration, ComputeNoise, CpuContention,
                                   DeviceKind, DeviceSpec, GpuContention, LinkKind, LinkSpec, Machine, OpInterference, Topology,
                                   TopologyLink, VertexKind)
from commdsl.yamldoc import YamlDocument

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_MACHINE = "h100-nvlink"
DEFAULT_CHUNK_BYTES = 512 * 1024

_TOP_KEYS = (
    "name", "doc", "devices", "device", "kernel_launch_us", "comm_launch_us", "host_link", "host_memcpy_gb_per_s", "transports",
    "chunk_bytes",
    "topology", "comm_compute_slowdown", "compute_comm_slowdown", "copy_compute_slowdown", "compute_copy_slowdown", "copy_measured_us",
    "compute_noise", "interference_by_op", "nccl", "calibration",
)  # fmt: skip
_CALIBRATION_KEYS = ("by", "date", "source", "quick")
_DEVICE_KEYS = ("name", "peak_tflops", "memory_bandwidth_gb_per_s", "sm_count", "kind", "memory_gib")
_DEVICE_REQUIRED = _DEVICE_KEYS[:4]
_CPU_ONLY_KEYS = ("copy_compute_slowdown", "compute_copy_slowdown", "compute_noise")
"""Knobs of the CPU-host contention model: a rank's threads sharing the host's cores."""
_LINK_KEYS = ("latency_us", "bandwidth_gb_per_s")
_PROFILE_KEYS = ("measured_us", "measured_ranks", "measured_us_by_dtype", "measured_us_by_op")
"""A collective's measured tables (see `Machine.collective_profiles`)."""
_TRANSPORT_KEYS = (*_LINK_KEYS, "staged", "collectives", "shared_bandwidth_gb_per_s")
_TOPOLOGY_KEYS = ("nodes", "gpus_per_node", "vertices", "links", "peer_access", "copy_engines", "nccl_sms",
                  "host_memory_bandwidth_gb_per_s")
_TOPOLOGY_LINK_KEYS = ("kind", "bandwidth_gb_per_s", "latency_us", "between", "line_rate_gb_per_s")
_TOPOLOGY_LINK_REQUIRED = ("kind", "bandwidth_gb_per_s", "latency_us", "between")
_LIMITS_HINT = "the limits keep simulated times finite; see docs/limits.md"
_NUMBER_TEXT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")
"""A number as a user writes it (YAML 1.1 reads some as text: 1e12, 1.5e3)."""


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_machine(arg: str | Path | None, *, nodes: int | None = None) -> Machine:
    """`--machine NAME|PATH [--nodes N]`: a machine file, or the name of a preset (default
    h100-nvlink); `nodes` makes a cluster of N nodes of a machine with a topology."""
    machine = _find_machine(str(arg) if arg is not None else DEFAULT_MACHINE)
    if nodes is None:
        return machine
    nodes = whole_number("--nodes", nodes)
    if machine.topology is None:
        raise UsageError(f"--nodes needs a machine with a topology; {machine.name} has none",
                         hint="try --machine dgx-h100 or dgx-a100")  # fmt: skip
    devices = nodes * machine.topology.gpus_per_node
    if devices > MAX_WORLD_SIZE:
        raise UsageError(f"--nodes {nodes:,}: {nodes:,} x {machine.topology.gpus_per_node} GPUs = {devices:,} devices, "
                         f"more than the limit of {MAX_WORLD_SIZE:,}", hint="see docs/limits.md")  # fmt: skip
    return machine.with_nodes(nodes)


def _find_machine(arg: str) -> Machine:
    if is_file(arg):
        return load_machine(arg)
    if "/" not in arg and "\\" not in arg:
        preset = PRESETS_DIR / f"{arg[:-5] if arg.endswith('.yaml') else arg}.yaml"
        if is_file(preset):
            return load_machine(preset, display=preset.stem)
    raise UsageError(f"no such machine file or preset: {arg}", hint="presets: " + ", ".join(preset_names()))


def load_machine(path: str | Path, display: str | None = None) -> Machine:
    text = read_text(path, str(path), MachineError, "machine file")
    return load_machine_text(text, str(path), default_name=display or Path(path).stem)


def load_machine_text(text: str, file: str = "<machine>", default_name: str | None = None) -> Machine:
    return _MachineReader(text, file).read(default_name or Path(file).stem)


class _MachineReader:
    def __init__(self, text: str, file: str):
        self.file = file
        self.doc = YamlDocument(text, file, MachineError)
        self.root = self.doc.root

    # ---- helpers ------------------------------------------------------------------

    def loc(self, node: yaml.Node) -> SourceLoc:
        return self.doc.loc(node)

    def fail(self, message: str, node: yaml.Node, hint: str | None = None) -> MachineError:
        return MachineError(message, self.loc(node), hint=hint)

    def mapping(self, node: yaml.Node, what: str, known: tuple[str, ...] | None, required: tuple[str, ...] = ()) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(f"{what} must be a mapping (key: value lines), got {self.text(node)}", node)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if not key:
                raise self.fail(f"{what}: keys must be names", k)
            if key in out:
                raise self.fail(f"{what}: key '{key}' appears twice (first at line {out[key][0].start_mark.line + 1})", k)
            if known is not None and key not in known:
                raise self.fail(f"{what}: unknown key '{key}' (known: {', '.join(known)})", k, hint=did_you_mean(key, known))
            out[key] = (k, v)
        for key in required:
            if key not in out:
                raise self.fail(f"{what} is missing '{key}' (needs: {', '.join(required)})", node)
        return out

    def text(self, node: yaml.Node) -> str:
        return self.doc.scalar_text(node)

    def value(self, node: yaml.Node) -> object:
        return self.doc.construct(node)

    def number(self, node: yaml.Node, what: str, *, positive: bool = False, allow_inf: bool = False,
               minimum: float | None = None, maximum: float | None = None) -> float:  # fmt: skip
        """A number of the file; `minimum` and `maximum` are the limits of docs/limits.md
        (an allowed .inf is above any maximum)."""
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            hint = None
            if isinstance(node, yaml.ScalarNode) and not node.style and _NUMBER_TEXT.fullmatch(node.value):
                # Plain (unquoted) text that is a number to the user, not to YAML 1.1, which
                # wants a '.' and a signed exponent: 1e12, 1.5e3; not a word such as `fast`.
                hint = "YAML reads 1e12 as text; write 1.0e+12, or use the unit in the key (TFLOP/s, GB/s, us)"
            raise self.fail(f"{what} must be a number, got {self.text(node)}", node, hint=hint)
        try:
            v = float(v)
        except OverflowError:
            v = math.inf
        if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
            raise self.fail(f"{what} must be a finite number{' or .inf' if allow_inf else ''}, got {self.text(node)}", node)
        if positive and v <= 0:
            raise self.fail(f"{what} must be greater than 0, got {self.text(node)}", node)
        if v < 0:
            raise self.fail(f"{what} must not be negative, got {self.text(node)}", node)
        if minimum is not None and v < minimum:
            raise self.fail(f"{what} is {self.text(node)}, below the limit of {minimum:g}", node, hint=_LIMITS_HINT)
        if maximum is not None and maximum < v < math.inf:
            raise self.fail(f"{what} is {self.text(node)}, above the limit of {maximum:g}", node, hint=_LIMITS_HINT)
        return v

    def rate(self, node: yaml.Node, what: str, minimum: float) -> float:
        """A bandwidth or compute rate: at least `minimum`, or .inf (takes no time)."""
        return self.number(node, what, positive=True, allow_inf=True, minimum=minimum)

    def time_us(self, node: yaml.Node, what: str, *, positive: bool = False) -> float:
        """A latency, overhead or measured time of the machine, in microseconds."""
        return self.number(node, what, positive=positive, maximum=MAX_MACHINE_TIME_US)

    def integer(self, node: yaml.Node, what: str, minimum: int, maximum: int = MAX_MACHINE_COUNT) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"{what} must be a whole number, got {self.text(node)}", node)
        if v < minimum:
            raise self.fail(f"{what} must be at least {minimum}, got {v}", node)
        if v > maximum:
            raise self.fail(f"{what} is {v:,}, above the limit of {maximum:,}", node, hint=_LIMITS_HINT)
        return v

    def string(self, node: yaml.Node, what: str) -> str:
        v = self.value(node)
        if not isinstance(v, str):
            raise self.fail(f"{what} must be text, got {self.text(node)}", node)
        return v

    def link(self, node: yaml.Node, what: str) -> LinkSpec:
        return self.link_from(self.mapping(node, what, _LINK_KEYS, _LINK_KEYS), what)

    def link_from(self, keys: dict[str, tuple[yaml.Node, yaml.Node]], what: str) -> LinkSpec:
        return LinkSpec(
            latency_us=self.time_us(keys["latency_us"][1], f"{what}.latency_us"),
            bandwidth_gb_per_s=self.rate(keys["bandwidth_gb_per_s"][1], f"{what}.bandwidth_gb_per_s", MIN_BANDWIDTH_GB_PER_S),
        )

    def dtype(self, key: str, node: yaml.Node, what: str) -> Dtype:
        """A dtype name used as a key of `what`."""
        try:
            return Dtype(key)
        except ValueError:
            known = [d.value for d in Dtype]
            raise self.fail(f"{what}: unknown dtype '{key}' (known: {', '.join(known)})", node, hint=did_you_mean(key, known)) from None

    def profiles(self, keys: dict, what: str, kind: OpKind) -> list[tuple[Dtype, ReduceOp | None, tuple[tuple[float, float], ...]]]:
        """A collective's measured tables (`Machine.collective_profiles`): measured_us (fp32;
        reductions with sum), measured_us_by_dtype {dtype: table}, and for reductions
        measured_us_by_op {op: {dtype: table}} (any op but sum, which the others measure)."""
        tables = [(Dtype.FP32, None, self.profile(keys["measured_us"][1], f"{what}.measured_us"))]
        if "measured_us_by_dtype" in keys:
            dwhat = f"{what}.measured_us_by_dtype"
            for dkey, (dknode, dvnode) in self.mapping(keys["measured_us_by_dtype"][1], dwhat, None).items():
                tables.append((self.dtype(dkey, dknode, dwhat), None, self.profile(dvnode, f"{dwhat}.{dkey}")))
        if "measured_us_by_op" in keys:
            owhat = f"{what}.measured_us_by_op"
            if kind not in REDUCING_KINDS:
                raise self.fail(f"{owhat}: only reductions ({', '.join(sorted(k.value for k in REDUCING_KINDS))}) have a reduce op, "
                                f"not {kind.value}", keys["measured_us_by_op"][0])  # fmt: skip
            others = [o.value for o in ReduceOp if o is not ReduceOp.SUM]
            for okey, (oknode, ovnode) in self.mapping(keys["measured_us_by_op"][1], owhat, None).items():
                if okey not in others:
                    where = " (sum's tables are measured_us and measured_us_by_dtype)" if okey == ReduceOp.SUM.value else ""
                    raise self.fail(f"{owhat}: reduce op '{okey}' has no place here{where}; known: {', '.join(others)}", oknode,
                                    hint=did_you_mean(okey, others))  # fmt: skip
                for dkey, (dknode, dvnode) in self.mapping(ovnode, f"{owhat}.{okey}", None).items():
                    dtype = self.dtype(dkey, dknode, f"{owhat}.{okey}")
                    tables.append((dtype, ReduceOp(okey), self.profile(dvnode, f"{owhat}.{okey}.{dkey}")))
        return tables

    def profile(self, node: yaml.Node, what: str) -> tuple[tuple[float, float], ...]:
        """[[size_bytes, time_us], ...]: at least two points, sizes increasing, times positive."""
        if not isinstance(node, yaml.SequenceNode) or len(node.value) < 2:
            raise self.fail(f"{what} must be a list of at least two [size_bytes, time_us] pairs", node)
        points: list[tuple[float, float]] = []
        for item in node.value:
            if not isinstance(item, yaml.SequenceNode) or len(item.value) != 2:
                raise self.fail(f"{what}: each entry is a pair [size_bytes, time_us]", item)
            size = self.number(item.value[0], f"{what} size", positive=True, maximum=MAX_SIZE_BYTES)
            time_us = self.time_us(item.value[1], f"{what} time", positive=True)
            if points and size <= points[-1][0]:
                raise self.fail(f"{what}: sizes must increase ({size:g} after {points[-1][0]:g})", item)
            points.append((size, time_us))
        return tuple(points)

    # ---- the file -----------------------------------------------------------------

    def read(self, default_name: str) -> Machine:
        if self.root is None:
            raise MachineError("the machine file is empty", SourceLoc(self.file, 1, 1))
        required = ("devices", "device", "kernel_launch_us", "comm_launch_us", "host_link", "transports")
        if isinstance(self.root, yaml.MappingNode) and any(isinstance(k, yaml.ScalarNode) and k.value == "topology" for k, _ in self.root.value):
            required = required[1:]  # a topology gives the number of devices
        top = self.mapping(self.root, "the machine", _TOP_KEYS, required)
        dev = self.mapping(top["device"][1], "device", _DEVICE_KEYS, _DEVICE_REQUIRED)
        rates_node = dev["peak_tflops"][1]
        rates = []
        for key, (knode, vnode) in self.mapping(rates_node, "device.peak_tflops", None).items():
            rates.append((self.dtype(key, knode, "device.peak_tflops"), self.rate(vnode, f"device.peak_tflops.{key}", MIN_TFLOPS)))
        if not rates:
            raise self.fail("device.peak_tflops lists no dtype", rates_node)
        transports, staged, overrides, shared, profiles = [], [], [], [], []
        for key, (knode, vnode) in self.mapping(top["transports"][1], "transports", None).items():
            try:
                transport = Transport(key)
            except ValueError:
                known = [t.value for t in Transport]
                raise self.fail(f"transports: unknown transport '{key}' (known: {', '.join(known)})", knode,
                                hint=did_you_mean(key, known)) from None  # fmt: skip
            what = f"transports.{key}"
            keys = self.mapping(vnode, what, _TRANSPORT_KEYS, _LINK_KEYS)
            transports.append((transport, self.link_from(keys, what)))
            if "staged" in keys:
                staged.append((transport, self.link(keys["staged"][1], f"{what}.staged")))
            if "shared_bandwidth_gb_per_s" in keys:
                node = keys["shared_bandwidth_gb_per_s"][1]
                shared.append((transport, self.rate(node, f"{what}.shared_bandwidth_gb_per_s", MIN_BANDWIDTH_GB_PER_S)))
            if "collectives" in keys:
                for ckey, (cknode, cvnode) in self.mapping(keys["collectives"][1], f"{what}.collectives", None).items():
                    try:
                        kind = OpKind(ckey)
                    except ValueError:
                        kind = None
                    if kind not in COLLECTIVE_KINDS:
                        known = sorted(k.value for k in COLLECTIVE_KINDS)
                        raise self.fail(f"{what}.collectives: unknown collective '{ckey}' (known: {', '.join(known)})", cknode,
                                        hint=did_you_mean(ckey, known))  # fmt: skip
                    cwhat = f"{what}.collectives.{ckey}"
                    ckeys = self.mapping(cvnode, cwhat, (*_LINK_KEYS, *_PROFILE_KEYS), _LINK_KEYS)
                    overrides.append((transport, kind, self.link_from(ckeys, cwhat)))
                    if ("measured_us" in ckeys) != ("measured_ranks" in ckeys):
                        raise self.fail(f"{cwhat}: measured_us and measured_ranks go together (the group size the times were measured on)", cknode)
                    for extra in ("measured_us_by_dtype", "measured_us_by_op"):
                        if extra in ckeys and "measured_us" not in ckeys:
                            raise self.fail(f"{cwhat}: {extra} needs measured_us (the fp32 table) and measured_ranks", cknode)
                    if "measured_us" in ckeys:
                        ranks = self.integer(ckeys["measured_ranks"][1], f"{cwhat}.measured_ranks", 2, MAX_WORLD_SIZE)
                        profiles += [(transport, kind, ranks, dtype, op, points) for dtype, op, points in self.profiles(ckeys, cwhat, kind)]
        if not transports:
            raise self.fail("transports lists no transport", top["transports"][1])
        device = DeviceSpec(
            name=self.string(dev["name"][1], "device.name"),
            peak_tflops=tuple(rates),
            memory_bandwidth_gb_per_s=self.rate(dev["memory_bandwidth_gb_per_s"][1], "device.memory_bandwidth_gb_per_s", MIN_BANDWIDTH_GB_PER_S),
            sm_count=self.integer(dev["sm_count"][1], "device.sm_count", 1),
            kind=self.enum(dev["kind"][1], DeviceKind, "device.kind") if "kind" in dev else DeviceKind.GPU,
            memory_gib=self.number(dev["memory_gib"][1], "device.memory_gib", positive=True) if "memory_gib" in dev else None,
        )
        topology = self.topology(top["topology"][1]) if "topology" in top else None
        if topology is None:
            num_devices = self.integer(top["devices"][1], "devices", 1, MAX_WORLD_SIZE)
        elif "devices" in top:
            num_devices = self.integer(top["devices"][1], "devices", 1, MAX_WORLD_SIZE)
            if num_devices != topology.num_devices:
                raise self.fail(f"devices is {num_devices} but the topology has {topology.nodes} x {topology.gpus_per_node} = "
                                f"{topology.num_devices}", top["devices"][1], hint="leave `devices` out: the topology gives it")  # fmt: skip
        else:
            num_devices = topology.num_devices
        copies = {}
        if "copy_measured_us" in top:
            for key, (_, vnode) in self.mapping(top["copy_measured_us"][1], "copy_measured_us", ("host", "to_host", "pageable", "pageable_to_host", "device")).items():
                copies[key] = self.profile(vnode, f"copy_measured_us.{key}")
        contention = self.contention(top, device)
        nccl = None
        if "nccl" in top:
            nccl = read_nccl(self, top["nccl"][1], topology)
        return Machine(
            name=self.string(top["name"][1], "name") if "name" in top else default_name,
            doc=self.string(top["doc"][1], "doc") if "doc" in top else "",
            source=self.file,
            num_devices=num_devices,
            device=device,
            kernel_launch_us=self.time_us(top["kernel_launch_us"][1], "kernel_launch_us"),
            comm_launch_us=self.time_us(top["comm_launch_us"][1], "comm_launch_us"),
            host_link=self.link(top["host_link"][1], "host_link"),
            transports=tuple(transports),
            chunk_bytes=self.integer(top["chunk_bytes"][1], "chunk_bytes", 1, MAX_SIZE_BYTES) if "chunk_bytes" in top else DEFAULT_CHUNK_BYTES,
            topology=topology,
            staged=tuple(staged),
            shared=tuple(shared),
            collective_overrides=tuple(overrides),
            collective_profiles=tuple(profiles),
            host_copy_profile=copies.get("host", ()),
            to_host_copy_profile=copies.get("to_host", ()),
            pageable_copy_profile=copies.get("pageable", ()),
            pageable_to_host_copy_profile=copies.get("pageable_to_host", ()),
            host_memcpy_gb_per_s=(self.rate(top["host_memcpy_gb_per_s"][1], "host_memcpy_gb_per_s", MIN_BANDWIDTH_GB_PER_S)
                                  if "host_memcpy_gb_per_s" in top else None),
            device_copy_profile=copies.get("device", ()),
            contention=contention,
            nccl=nccl,
            calibration=self.calibration(top["calibration"][1]) if "calibration" in top else None,
        )

    def calibration(self, node: yaml.Node) -> Calibration:
        keys = self.mapping(node, "calibration", _CALIBRATION_KEYS, _CALIBRATION_KEYS[:3])
        quick = False
        if "quick" in keys:
            qnode = keys["quick"][1]
            quick = self.value(qnode)
            if not isinstance(quick, bool):
                raise self.fail(f"calibration.quick must be true or false, got {self.text(qnode)}", qnode)
        return Calibration(*(self.string(keys[k][1], f"calibration.{k}") for k in _CALIBRATION_KEYS[:3]), quick=quick)

    def contention(self, top: dict, device: DeviceSpec) -> GpuContention | CpuContention:
        """The contention model of the device's kind, with its factors (see the model's docs)."""
        slowdown = self.factor(top, "comm_compute_slowdown", None)  # None: the model's default
        comm_slowdown = self.factor(top, "compute_comm_slowdown")
        by_op = self.interference_by_op(top["interference_by_op"][1]) if "interference_by_op" in top else ()
        if device.kind is DeviceKind.GPU:
            for key in _CPU_ONLY_KEYS:
                if key in top:
                    raise self.fail(f"{key} describes a CPU host (its threads sharing cores), but device.kind is gpu", top[key][0],
                                    hint="add `kind: cpu` under `device:` if the ranks run on CPUs")  # fmt: skip
            nccl_sms = None
            if "topology" in top:
                tkeys = self.mapping(top["topology"][1], "topology", None)
                if "nccl_sms" in tkeys:
                    node = tkeys["nccl_sms"][1]
                    nccl_sms = self.integer(node, "topology.nccl_sms", 0)
                    if nccl_sms >= device.sm_count:
                        raise self.fail(f"topology.nccl_sms ({nccl_sms}) must be less than device.sm_count ({device.sm_count})", node)
            return GpuContention(device.sm_count, nccl_sms, slowdown, comm_slowdown, by_op)
        noise = None
        if "compute_noise" in top:
            fields = ("stalls_per_s", "stall_us", "wake_stall_probability", "wake_stall_us", "duration_stretch")
            nkeys = self.mapping(top["compute_noise"][1], "compute_noise", fields, fields[:2])
            values = {k: self.noise_field(k, v) for k, (_, v) in nkeys.items()}
            if values.get("wake_stall_probability", 0.0) >= 1.0:
                raise self.fail(f"compute_noise.wake_stall_probability must be below 1, got {values['wake_stall_probability']:g}",
                                nkeys["wake_stall_probability"][1])  # fmt: skip
            noise = ComputeNoise(**values)
        return CpuContention(slowdown, comm_slowdown, self.factor(top, "copy_compute_slowdown"),
                             self.factor(top, "compute_copy_slowdown"), by_op, noise)  # fmt: skip

    # ---- the topology -------------------------------------------------------------

    def factor(self, top: dict, key: str, default: float | None = 1.0, what: str | None = None) -> float | None:
        """An optional interference factor: at least 1.0 (1.0: none); `default` when absent.
        `what` names it in messages (default: key)."""
        if key not in top:
            return default
        node = top[key][1]
        what = what or key
        value = self.number(node, what, maximum=MAX_FACTOR)
        if value < 1.0:
            raise self.fail(f"{what} must be at least 1.0 (1.0: no interference), got {node.value}", node)
        return value

    def interference_by_op(self, node: yaml.Node) -> tuple[tuple[OpKind, Dtype | None, OpInterference], ...]:
        """`interference_by_op: {KIND: {DTYPE or any: {comm_compute_slowdown, compute_comm_slowdown}}}`."""
        fields = ("comm_compute_slowdown", "compute_comm_slowdown")
        comm_kinds = [k.value for k in OpKind if k.is_comm]
        entries = []
        for kind_name, (knode, by_dtype) in self.mapping(node, "interference_by_op", None).items():
            if kind_name not in comm_kinds:
                raise self.fail(f"interference_by_op: '{kind_name}' is not a comm op (known: {', '.join(comm_kinds)})", knode,
                                hint=did_you_mean(kind_name, comm_kinds))  # fmt: skip
            kind = OpKind(kind_name)
            for dtype_name, (dnode, fnode) in self.mapping(by_dtype, f"interference_by_op.{kind_name}", None).items():
                dtype = None if dtype_name == ANY_DTYPE else self.dtype(dtype_name, dnode, f"interference_by_op.{kind_name} (or '{ANY_DTYPE}')")
                where = f"interference_by_op.{kind_name}.{dtype_name}"
                keys = self.mapping(fnode, where, fields, fields)
                entries.append((kind, dtype, OpInterference(*(self.factor(keys, f, what=f"{where}.{f}") for f in fields))))
        return tuple(entries)

    def topology(self, node: yaml.Node) -> Topology:
        """`topology:` (see `commdsl.machine.model.Topology`); every name is checked here."""
        top = self.mapping(node, "topology", _TOPOLOGY_KEYS, ("gpus_per_node", "links"))
        nodes = self.integer(top["nodes"][1], "topology.nodes", 1, MAX_WORLD_SIZE) if "nodes" in top else 1
        gpus = self.integer(top["gpus_per_node"][1], "topology.gpus_per_node", 1, MAX_WORLD_SIZE)
        if nodes * gpus > MAX_WORLD_SIZE:
            raise self.fail(f"topology: {nodes:,} nodes x {gpus:,} GPUs = {nodes * gpus:,} devices, above the limit of {MAX_WORLD_SIZE:,}",
                            node, hint=_LIMITS_HINT)  # fmt: skip
        gpu_names = {f"gpu{i}": i for i in range(gpus)}
        vertices: dict[str, VertexKind] = {}
        if "vertices" in top:
            for name, (knode, vnode) in self.mapping(top["vertices"][1], "topology.vertices", None).items():
                if name in gpu_names or name == NETWORK_VERTEX:
                    raise self.fail(f"topology.vertices: '{name}' is reserved (gpu0..gpu{gpus - 1} are the devices, "
                                    f"'{NETWORK_VERTEX}' the fabric between nodes)", knode)  # fmt: skip
                kind = self.enum(vnode, VertexKind, f"topology.vertices.{name}")
                if kind is VertexKind.GPU or kind is VertexKind.NETWORK:
                    raise self.fail(f"topology.vertices.{name}: kind '{kind.value}' is implied (devices come from gpus_per_node, "
                                    f"the fabric is '{NETWORK_VERTEX}')", vnode)  # fmt: skip
                vertices[name] = kind
        known = {**{g: VertexKind.GPU for g in gpu_names}, **vertices, NETWORK_VERTEX: VertexKind.NETWORK}
        links: list[TopologyLink] = []
        seen: dict[frozenset[str], yaml.Node] = {}
        links_node = top["links"][1]
        if not isinstance(links_node, yaml.SequenceNode) or not links_node.value:
            raise self.fail("topology.links must be a non-empty list of link entries", links_node)
        for i, entry in enumerate(links_node.value):
            what = f"topology.links[{i}]"
            keys = self.mapping(entry, what, _TOPOLOGY_LINK_KEYS, _TOPOLOGY_LINK_REQUIRED)
            kind = self.enum(keys["kind"][1], LinkKind, f"{what}.kind")
            if kind in IMPLIED_LINK_KINDS:
                raise self.fail(f"{what}.kind: '{kind.value}' is implied by the topology, not a link to declare",
                                keys["kind"][1], hint="host memory: topology.host_memory_bandwidth_gb_per_s; NCCL's SHM path: "
                                "transports.nccl.staged")  # fmt: skip
            bw = self.rate(keys["bandwidth_gb_per_s"][1], f"{what}.bandwidth_gb_per_s", MIN_BANDWIDTH_GB_PER_S)
            lat = self.time_us(keys["latency_us"][1], f"{what}.latency_us")
            line = None
            if "line_rate_gb_per_s" in keys:
                line = self.rate(keys["line_rate_gb_per_s"][1], f"{what}.line_rate_gb_per_s", MIN_BANDWIDTH_GB_PER_S)
                if line < bw:
                    raise self.fail(f"{what}.line_rate_gb_per_s ({line:g}) is below its bandwidth_gb_per_s ({bw:g}): nothing moves "
                                    "faster than the link signals", keys["line_rate_gb_per_s"][1])  # fmt: skip
            between = keys["between"][1]
            if not isinstance(between, yaml.SequenceNode) or not between.value:
                raise self.fail(f"{what}.between must be a list of [end, end] pairs", between)
            for pair in between.value:
                if not isinstance(pair, yaml.SequenceNode) or len(pair.value) != 2:
                    raise self.fail(f"{what}.between: each entry must be a pair [end, end], got {self.text(pair)}", pair)
                ends = []
                for end in pair.value:
                    name = self.string(end, f"{what}.between")
                    if name not in known:
                        raise self.fail(f"{what}.between: unknown link end '{name}' (the node has: {', '.join(known)})", end,
                                        hint=did_you_mean(name, known))  # fmt: skip
                    ends.append(name)
                a, b = ends
                if a == b:
                    raise self.fail(f"{what}.between: a link joins two different vertices, got [{a}, {b}]", pair)
                key = frozenset(ends)
                if key in seen:
                    raise self.fail(f"{what}.between: {a} and {b} are linked twice (first at line {seen[key].start_mark.line + 1}); "
                                    "write one link with the sum of the bandwidths", pair)  # fmt: skip
                seen[key] = pair
                links.append(TopologyLink(kind, a, b, bw, lat, line))
        peer_access = None
        if "peer_access" in top:
            pnode = top["peer_access"][1]
            if isinstance(pnode, yaml.ScalarNode) and pnode.value == "all":
                peer_access = None
            elif isinstance(pnode, yaml.ScalarNode) and pnode.value == "none":
                peer_access = ()  # consumer cards on PCIe, or NCCL_P2P_DISABLE: every pair stages through host memory
            elif isinstance(pnode, yaml.SequenceNode):
                sets = []
                for group in pnode.value:
                    if not isinstance(group, yaml.SequenceNode) or len(group.value) < 2:
                        raise self.fail(f"topology.peer_access: each entry lists two or more GPUs, got {self.text(group)}", group)
                    members = set()
                    for g in group.value:
                        name = self.string(g, "topology.peer_access")
                        if name not in gpu_names:
                            raise self.fail(f"topology.peer_access: '{name}' is not a GPU of the node (gpu0..gpu{gpus - 1})", g)
                        members.add(gpu_names[name])
                    sets.append(frozenset(members))
                peer_access = tuple(sets)
            else:
                raise self.fail(f"topology.peer_access must be 'all', 'none' or a list of GPU groups, got {self.text(pnode)}", pnode)
        self._check_connected(node, gpus, nodes, known, links)
        return Topology(
            nodes=nodes,
            gpus_per_node=gpus,
            vertices=tuple(vertices.items()),
            links=tuple(links),
            peer_access=peer_access,
            copy_engines=self.integer(top["copy_engines"][1], "topology.copy_engines", 1) if "copy_engines" in top else None,
            host_memory_bandwidth_gb_per_s=(self.rate(top["host_memory_bandwidth_gb_per_s"][1], "topology.host_memory_bandwidth_gb_per_s",
                                                      MIN_BANDWIDTH_GB_PER_S)
                                            if "host_memory_bandwidth_gb_per_s" in top else None),
        )  # fmt: skip

    def _check_connected(self, node: yaml.Node, gpus: int, nodes: int, known: dict[str, VertexKind], links: list[TopologyLink]) -> None:
        """Every device reaches gpu0 and host memory (a cpu vertex) inside its node, and the
        nodes reach each other through `network`."""
        adj: dict[str, list[str]] = {name: [] for name in known}
        for link in links:
            adj[link.a].append(link.b)
            adj[link.b].append(link.a)

        def reach(start: str, through_network: bool) -> set[str]:
            seen, todo = {start}, [start]
            while todo:
                v = todo.pop()
                for w in adj[v]:
                    if w not in seen and (through_network or w != NETWORK_VERTEX):
                        seen.add(w)
                        todo.append(w)
            return seen

        inside = reach("gpu0", through_network=False)
        for i in range(gpus):
            if f"gpu{i}" not in inside:
                raise self.fail(f"topology: gpu{i} is not connected to gpu0 (no path of links inside the node)", node)
        for i in range(gpus):
            if not any(known[v] is VertexKind.CPU for v in reach(f"gpu{i}", through_network=False)):
                raise self.fail(f"topology: gpu{i} has no path to host memory (a vertex of kind cpu)", node,
                                hint="add a cpu vertex and the PCIe links to it")  # fmt: skip
        if nodes > 1 and NETWORK_VERTEX not in reach("gpu0", through_network=True):
            raise self.fail(f"topology: {nodes} nodes but no link reaches '{NETWORK_VERTEX}', so the nodes are disconnected", node,
                            hint=f"link each NIC to '{NETWORK_VERTEX}'")  # fmt: skip

    def noise_field(self, key: str, node: yaml.Node) -> float:
        """One field of `compute_noise` (see `ComputeNoise`), within its limit."""
        what = f"compute_noise.{key}"
        if key == "stalls_per_s":
            return self.number(node, what, maximum=MAX_STALLS_PER_S)
        if key == "duration_stretch":
            return self.number(node, what, positive=True, maximum=MAX_FACTOR)
        if key == "wake_stall_probability":
            return self.number(node, what)
        return self.time_us(node, what)

    def enum(self, node: yaml.Node, enum_cls, what: str):
        value = self.string(node, what)
        try:
            return enum_cls(value)
        except ValueError:
            known = ", ".join(e.value for e in enum_cls)
            raise self.fail(f"{what}: unknown kind '{value}' (known: {known})", node, hint=did_you_mean(value, [e.value for e in enum_cls])) from None
