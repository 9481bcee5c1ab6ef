"""Load and validate machine descriptions (YAML) and find presets.

Files are read with the safe loader; we keep the composed node tree so every error
names file:line:col, shows the line, and prints the value that is wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

from commdsl.errors import MachineError, SourceLoc, UsageError
from commdsl.ir import Dtype, Transport
from commdsl.machine.model import DeviceSpec, LinkSpec, Machine

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_MACHINE = "h100-nvlink"
DEFAULT_CHUNK_BYTES = 512 * 1024

_TOP_KEYS = ("name", "doc", "devices", "device", "kernel_launch_us", "comm_launch_us", "host_link", "transports", "chunk_bytes")
_DEVICE_KEYS = ("name", "peak_tflops", "memory_bandwidth_gb_per_s", "sm_count")
_LINK_KEYS = ("latency_us", "bandwidth_gb_per_s")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_machine(arg: str | None) -> Machine:
    """`--machine NAME|PATH`: a machine file, or the name of a preset (default h100-nvlink)."""
    arg = arg or DEFAULT_MACHINE
    path = Path(arg)
    if path.is_file():
        return load_machine(path)
    if "/" not in arg and "\\" not in arg:
        preset = PRESETS_DIR / f"{arg[:-5] if arg.endswith('.yaml') else arg}.yaml"
        if preset.is_file():
            return load_machine(preset, display=preset.stem)
    raise UsageError(f"no such machine file or preset: {arg}", hint="presets: " + ", ".join(preset_names()))


def load_machine(path: str | Path, display: str | None = None) -> Machine:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read machine file {path}: {e}") from None
    return load_machine_text(text, str(path), default_name=display or Path(path).stem)


def load_machine_text(text: str, file: str = "<machine>", default_name: str | None = None) -> Machine:
    return _MachineReader(text, file).read(default_name or Path(file).stem)


class _MachineReader:
    def __init__(self, text: str, file: str):
        self.file = file
        self.lines = text.splitlines()
        try:
            self.root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            raise MachineError(f"invalid YAML: {e.problem or e.context}", self._mark_loc(mark) if mark else None) from None
        except yaml.YAMLError as e:
            raise MachineError(f"invalid YAML in {file}: {e}") from None
        self._constructor = SafeConstructor()

    # ---- helpers ------------------------------------------------------------------

    def _mark_loc(self, mark) -> SourceLoc:
        line = mark.line + 1
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return SourceLoc(self.file, line, mark.column + 1, text)

    def loc(self, node: yaml.Node) -> SourceLoc:
        return self._mark_loc(node.start_mark)

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
                raise self.fail(f"{what}: unknown key '{key}' (known: {', '.join(known)})", k)
            out[key] = (k, v)
        for key in required:
            if key not in out:
                raise self.fail(f"{what} is missing '{key}' (needs: {', '.join(required)})", node)
        return out

    def text(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.ScalarNode):
            return repr(node.value) if node.tag.endswith(":str") else node.value
        return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"

    def value(self, node: yaml.Node) -> object:
        try:
            return self._constructor.construct_object(node, deep=True)
        except ConstructorError as e:
            raise self.fail(f"invalid value: {e.problem}", node) from None

    def number(self, node: yaml.Node, what: str, *, positive: bool = False, allow_inf: bool = False) -> float:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            hint = None
            if isinstance(v, str):
                hint = "YAML reads 1e12 as text; write 1.0e+12, or use the unit in the key (TFLOP/s, GB/s, us)"
            raise self.fail(f"{what} must be a number, got {self.text(node)}", node, hint=hint)
        v = float(v)
        if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
            raise self.fail(f"{what} must be a finite number{' or .inf' if allow_inf else ''}, got {node.value}", node)
        if positive and v <= 0:
            raise self.fail(f"{what} must be greater than 0, got {node.value}", node)
        if v < 0:
            raise self.fail(f"{what} must not be negative, got {node.value}", node)
        return v

    def integer(self, node: yaml.Node, what: str, minimum: int) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"{what} must be a whole number, got {self.text(node)}", node)
        if v < minimum:
            raise self.fail(f"{what} must be at least {minimum}, got {v}", node)
        return v

    def string(self, node: yaml.Node, what: str) -> str:
        v = self.value(node)
        if not isinstance(v, str):
            raise self.fail(f"{what} must be text, got {self.text(node)}", node)
        return v

    def link(self, node: yaml.Node, what: str) -> LinkSpec:
        keys = self.mapping(node, what, _LINK_KEYS, _LINK_KEYS)
        return LinkSpec(
            latency_us=self.number(keys["latency_us"][1], f"{what}.latency_us"),
            bandwidth_gb_per_s=self.number(keys["bandwidth_gb_per_s"][1], f"{what}.bandwidth_gb_per_s", positive=True, allow_inf=True),
        )

    # ---- the file -----------------------------------------------------------------

    def read(self, default_name: str) -> Machine:
        if self.root is None:
            raise MachineError("the machine file is empty", SourceLoc(self.file, 1, 1))
        required = ("devices", "device", "kernel_launch_us", "comm_launch_us", "host_link", "transports")
        top = self.mapping(self.root, "the machine", _TOP_KEYS, required)
        dev = self.mapping(top["device"][1], "device", _DEVICE_KEYS, _DEVICE_KEYS)
        rates_node = dev["peak_tflops"][1]
        rates = []
        for key, (knode, vnode) in self.mapping(rates_node, "device.peak_tflops", None).items():
            try:
                dtype = Dtype(key)
            except ValueError:
                raise self.fail(f"device.peak_tflops: unknown dtype '{key}' (known: {', '.join(d.value for d in Dtype)})", knode) from None
            rates.append((dtype, self.number(vnode, f"device.peak_tflops.{key}", positive=True, allow_inf=True)))
        if not rates:
            raise self.fail("device.peak_tflops lists no dtype", rates_node)
        transports = []
        for key, (knode, vnode) in self.mapping(top["transports"][1], "transports", None).items():
            try:
                transport = Transport(key)
            except ValueError:
                raise self.fail(f"transports: unknown transport '{key}' (known: {', '.join(t.value for t in Transport)})", knode) from None
            transports.append((transport, self.link(vnode, f"transports.{key}")))
        if not transports:
            raise self.fail("transports lists no transport", top["transports"][1])
        device = DeviceSpec(
            name=self.string(dev["name"][1], "device.name"),
            peak_tflops=tuple(rates),
            memory_bandwidth_gb_per_s=self.number(dev["memory_bandwidth_gb_per_s"][1], "device.memory_bandwidth_gb_per_s", positive=True, allow_inf=True),
            sm_count=self.integer(dev["sm_count"][1], "device.sm_count", 1),
        )
        return Machine(
            name=self.string(top["name"][1], "name") if "name" in top else default_name,
            doc=self.string(top["doc"][1], "doc") if "doc" in top else "",
            source=self.file,
            num_devices=self.integer(top["devices"][1], "devices", 1),
            device=device,
            kernel_launch_us=self.number(top["kernel_launch_us"][1], "kernel_launch_us"),
            comm_launch_us=self.number(top["comm_launch_us"][1], "comm_launch_us"),
            host_link=self.link(top["host_link"][1], "host_link"),
            transports=tuple(transports),
            chunk_bytes=self.integer(top["chunk_bytes"][1], "chunk_bytes", 1) if "chunk_bytes" in top else DEFAULT_CHUNK_BYTES,
        )
