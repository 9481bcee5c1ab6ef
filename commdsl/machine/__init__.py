"""Machine descriptions: device rates, host overheads, transports; YAML presets."""

from commdsl.machine.loader import DEFAULT_MACHINE, load_machine, load_machine_text, preset_names, resolve_machine
from commdsl.machine.model import DeviceSpec, LinkSpec, Machine

__all__ = [
    "DEFAULT_MACHINE", "DeviceSpec", "LinkSpec", "Machine",
    "load_machine", "load_machine_text", "preset_names", "resolve_machine",
]  # fmt: skip
