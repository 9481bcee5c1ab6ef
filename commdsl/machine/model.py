"""Machine description v1: what one device computes and how fast bytes move.

A `Machine` holds the rates the simulator turns work into time: compute rate per dtype,
memory bandwidth, host-side launch overheads, and per-transport latency and bandwidth.
There is no topology yet: every pair of ranks is connected the way the transport says
(the flow network of a later version adds links, paths and contention).

Units are in the field names: `_us` microseconds, `_gb_per_s` gigabytes (10^9 bytes)
per second, as nccl-tests reports bus bandwidth (not gigabits), `_tflops` 10^12
floating-point operations per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from commdsl.ir import Dtype, Transport


@dataclass(frozen=True)
class LinkSpec:
    """How one transfer over a transport (or the host link) behaves."""

    latency_us: float
    """Fixed cost of one latency-bound step (one message, one ring step)."""
    bandwidth_gb_per_s: float
    """Bytes per second one rank moves in one direction, in GB/s (10^9 B/s); may be
    `.inf` in a machine file to make transfers free (for closed-form tests)."""

    def transfer_us(self, size_bytes: float) -> float:
        """Time of one message of `size_bytes`: latency + size / bandwidth."""
        return self.latency_us + size_bytes / (self.bandwidth_gb_per_s * 1e3)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU socket share for CPU machines)."""

    name: str
    """Human name, e.g. "H100 SXM5 80GB"."""
    peak_tflops: tuple[tuple[Dtype, float], ...]
    """Dense compute rate per dtype in TFLOP/s. A compute op given as work (FLOPs) in a
    dtype that is not listed is an error, never a guess."""
    memory_bandwidth_gb_per_s: float
    """Device memory bandwidth in GB/s: time of memory-bound compute (`bytes=`) and of
    device-to-device copies (read + write)."""
    sm_count: int
    """Streaming multiprocessors (compute units); the contention model of a later
    version charges the SMs comm kernels occupy."""

    def tflops(self, dtype: Dtype) -> float | None:
        for d, rate in self.peak_tflops:
            if d is dtype:
                return rate
        return None


@dataclass(frozen=True)
class Machine:
    """A machine description: one kind of device, its host, and its transports."""

    name: str
    """Preset name or file stem; recorded in every timeline."""
    doc: str
    """One line saying what the machine is and where its numbers come from."""
    source: str
    """File the description was read from (preset path or user file)."""
    num_devices: int
    """Devices in the machine. A schedule with more ranks still simulates (v1 has no
    topology), with a warning."""
    device: DeviceSpec
    """The device every rank runs on."""
    kernel_launch_us: float
    """Host time to issue one device op: compute, copy, record, stream wait."""
    comm_launch_us: float
    """Host time to issue one communication op (torch.distributed call + NCCL enqueue)."""
    host_link: LinkSpec
    """Host <-> device copies (h2d, d2h): PCIe or the CPU-GPU interconnect."""
    transports: tuple[tuple[Transport, LinkSpec], ...]
    """Per transport (nccl, gloo, memcpy): latency per step and bandwidth per rank."""
    chunk_bytes: int
    """Pipelining chunk of chain (broadcast, reduce) collectives; NCCL's default is
    NCCL_BUFFSIZE (4 MiB) / NCCL_STEPS (8) = 512 KiB."""

    def transport(self, transport: Transport) -> LinkSpec | None:
        for t, spec in self.transports:
            if t is transport:
                return spec
        return None

    def to_json(self) -> dict:
        """The description as it goes into a timeline's metadata (stable key order)."""
        return {
            "name": self.name,
            "doc": self.doc,
            "num_devices": self.num_devices,
            "device": {
                "name": self.device.name,
                "peak_tflops": {d.value: r for d, r in self.device.peak_tflops},
                "memory_bandwidth_gb_per_s": self.device.memory_bandwidth_gb_per_s,
                "sm_count": self.device.sm_count,
            },
            "kernel_launch_us": self.kernel_launch_us,
            "comm_launch_us": self.comm_launch_us,
            "host_link": _link_json(self.host_link),
            "transports": {t.value: _link_json(s) for t, s in self.transports},
            "chunk_bytes": self.chunk_bytes,
        }


def _link_json(link: LinkSpec) -> dict:
    # JSON has no infinity: a free link is written as the string "inf".
    bw = link.bandwidth_gb_per_s
    return {"latency_us": link.latency_us, "bandwidth_gb_per_s": bw if bw != float("inf") else "inf"}


def timeless_machine() -> Machine:
    """A machine on which every op takes no time: for checks whose verdict does not
    depend on durations (deadlock: every blocking relation is an ordering)."""
    free = LinkSpec(latency_us=0.0, bandwidth_gb_per_s=float("inf"))
    inf = float("inf")
    return Machine(
        name="timeless",
        doc="every op takes no time",
        source="<builtin>",
        num_devices=1 << 30,
        device=DeviceSpec("timeless", tuple((d, inf) for d in Dtype), inf, 1),
        kernel_launch_us=0.0,
        comm_launch_us=0.0,
        host_link=free,
        transports=tuple((t, free) for t in Transport),
        chunk_bytes=1 << 62,
    )
