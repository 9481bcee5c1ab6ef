"""Machine description: what one device computes, how fast bytes move, and over what.

A `Machine` holds the rates the simulator turns work into time: compute rate per dtype,
memory bandwidth, host-side launch overheads, per-transport latency and bandwidth, and
optionally a `Topology`: nodes of devices joined by links (NVLink, PCIe switches, CPU
sockets with their host memory, NICs, the network between nodes) that the flow network
routes transfers over and shares between them (max-min).

A machine without `topology` (every v1 file, and what `commdsl.calibrate` writes) gets
an implied one in the flow network: each rank is one device with one link per
transport to a switch, at that transport's bandwidth in each direction; the transport's
latency is charged per algorithm step. The analytic network needs no topology.

How transport parameters are used:
  * analytic network: time = plan steps x latency + serial bytes / bandwidth of the
    transport, or of the transport's per-collective override (`collectives:`);
  * flow network: a transfer's rate is the max-min share of every link on its path,
    and at most the transport's bandwidth (for NCCL: what one kernel reaches, its
    bus bandwidth); `staged:` gives the cap and latency instead when the path goes
    through host memory (no peer access between the GPUs, or gloo); NCCL without it
    takes its SHM path's rate from the host link (`Machine.nccl_shm_link`).

Units are in the field names: `_us` microseconds, `_gb_per_s` gigabytes (10^9 bytes)
per second, as nccl-tests reports bus bandwidth (not gigabits), `_tflops` 10^12
floating-point operations per second.
"""

from __future__ import annotations

import datetime
import enum
import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from commdsl.arguments import whole_number
from commdsl.errors import MachineError
from commdsl.ir import Dtype, OpKind, ReduceOp, Transport
from commdsl.machine.nccl import NcclConfig


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
class OpInterference:
    """How one kind of comm op (in one dtype) and compute slow each other on a device
    (`interference_by_op:`); the machine-wide `comm_compute_slowdown` and
    `compute_comm_slowdown` stand for every op not listed. What an op costs a device
    depends on what it does (on a CPU, a reduction in bf16 is slow CPU work; a gather only
    moves bytes), so calibration measures each op beside compute inside the executor."""

    comm_compute_slowdown: float
    """Compute runs this many times longer while the op runs on its device."""
    compute_comm_slowdown: float
    """The op moves its bytes this many times slower while compute runs on its devices."""


@dataclass(frozen=True)
class ComputeNoise:
    """Random stalls of compute on a shared CPU: the scheduler takes a compute thread off
    its core for a slice now and then, and a thread woken by another one sometimes wakes
    late. The stalls and late wake-ups are drawn only when the simulator draws samples
    (`simulate --samples N`); `duration_stretch`, the typical time, applies always. Each
    compute op stalls a Poisson number of times, `stalls_per_s` x its duration on average,
    each stall `stall_us` long. Ranks stall independently, and wherever ranks synchronise
    (a P2P, a collective) the late one sets the pace, so the expected makespan exceeds the
    makespan of expected durations."""

    stalls_per_s: float
    """Average stalls per second of compute (per rank; 0: none)."""
    stall_us: float
    """Length of one stall, microseconds (the mean of measured stalls)."""
    wake_stall_probability: float = 0.0
    """Probability that a stream kept waiting for another thread's work (a comm op's
    completion, another stream's event) starts `wake_stall_us` late: on a CPU the stream
    is a thread, woken when the work ends."""
    wake_stall_us: float = 0.0
    """Length of one late wake-up, microseconds (the mean of measured ones)."""
    duration_stretch: float = 1.0
    """A compute op with an explicit duration runs this many times it at the median,
    stalls aside. The executor times its duration-sized work at start-up, alone; inside a
    schedule, beside the comm threads, that work runs a little longer, and calibration
    measures by how much. FLOP-sized ops run at `peak_tflops`, which calibration measures
    directly."""


class _PerOpFactors:
    """The lookup both contention models share: an op's own factors, else the machine's."""

    comm_compute_slowdown: float | None
    compute_comm_slowdown: float
    interference_by_op: tuple[tuple[OpKind, Dtype | None, OpInterference], ...]

    def compute_slowdown(self) -> float:
        """Compute's slowdown while a comm op not listed in `interference_by_op` runs."""
        return self.comm_compute_slowdown if self.comm_compute_slowdown is not None else 1.0

    def interference(self, kind: OpKind, dtype: Dtype) -> OpInterference:
        """The factors of a comm op: its `interference_by_op` entry for its dtype, else for
        any dtype, else the machine-wide factors."""
        own = self.own_interference(kind, dtype)
        return own if own is not None else OpInterference(self.compute_slowdown(), self.compute_comm_slowdown)

    def own_interference(self, kind: OpKind, dtype: Dtype) -> OpInterference | None:
        """The `interference_by_op` entry of a comm op (its dtype's, else any dtype's), if any."""
        for want in (dtype, None):
            for k, d, f in self.interference_by_op:
                if k is kind and d is want:
                    return f
        return None

    def slows_compute(self) -> bool:
        """Whether any comm op slows compute (else the simulator skips the bookkeeping)."""
        return self.compute_slowdown() != 1.0 or any(f.comm_compute_slowdown != 1.0 for _, _, f in self.interference_by_op)

    def slows_comm(self) -> bool:
        """Whether compute slows any comm op."""
        return self.compute_comm_slowdown != 1.0 or any(f.compute_comm_slowdown != 1.0 for _, _, f in self.interference_by_op)


@dataclass(frozen=True)
class GpuContention(_PerOpFactors):
    """How work on a GPU slows other work on it. An NCCL kernel occupies SMs (one CTA per
    channel) from the moment it is active, even while it waits for its peers, and while
    it moves data it reads and writes device memory. Compute bound by its FLOPs (or given
    as a duration) keeps the other SMs: it runs sm_count / (sm_count - SMs held) times
    longer. Compute bound by its bytes (`bytes=`) shares memory bandwidth with the NCCL
    traffic of its device: it runs bandwidth / (bandwidth - traffic) times longer. The SMs
    an NCCL kernel holds are its channels where the machine has NCCL's model (`nccl:`,
    which chooses channels per op), else `nccl_sms`; with neither, compute is not slowed.
    A measured factor (`comm_compute_slowdown`, `interference_by_op`) replaces all this.
    Copies run on copy engines and take no SMs, so they slow nothing. Compute slows a
    transfer only where the machine says so (`compute_comm_slowdown`, a measured factor)."""

    sm_count: int = 1
    """SMs of the device (`device.sm_count`)."""
    nccl_sms: int | None = None
    """SMs one NCCL kernel occupies on a machine without NCCL's model (`topology.nccl_sms`:
    its channels); None: not modelled."""
    comm_compute_slowdown: float | None = None
    """Compute runs this many times longer while an NCCL kernel of its device runs, a
    measured factor (calibration on the GPUs) that covers SMs and memory bandwidth alike;
    None: from the SMs and memory traffic (see the class doc). `compute_slowdown()` is
    sm_count / (sm_count - nccl_sms) then, the SM share of one kernel."""
    compute_comm_slowdown: float = 1.0
    """A transfer with an endpoint on a device that computes moves its bytes this many
    times slower (1.0: none, the usual case on GPUs)."""
    interference_by_op: tuple[tuple[OpKind, Dtype | None, OpInterference], ...] = ()
    """Per comm op kind and dtype (None: any dtype), its own factors (see `OpInterference`)."""

    def compute_slowdown(self) -> float:
        if self.comm_compute_slowdown is not None:
            return self.comm_compute_slowdown
        if self.nccl_sms is not None:
            return self.sm_count / (self.sm_count - self.nccl_sms)
        return 1.0


@dataclass(frozen=True)
class CpuContention(_PerOpFactors):
    """How work slows other work when a rank is a process on a CPU host: its streams, its
    comm queues and its copies are threads sharing the host's cores and memory, so every
    activity slows the others, and the host's scheduler adds noise (`ComputeNoise`). Every
    factor is measured by calibration, inside the executor; 1.0 means none and costs the
    simulation nothing."""

    comm_compute_slowdown: float | None = None
    """Compute runs this many times longer while a comm op of its rank runs (None or 1.0:
    not at all); ops listed in `interference_by_op` have their own."""
    compute_comm_slowdown: float = 1.0
    """While compute runs on a rank, every transfer with an endpoint there (a collective:
    any member, as a ring progresses at its slowest member's pace) is capped at its
    uncontended rate / factor; on a shared bandwidth (`Machine.shared`: the host's CPUs
    copying bytes) each of its bytes costs factor times as much, and its latency, CPU work
    too, slows as well. Each factor follows the other activity's on/off state, not its
    slowed speed (no fixed point)."""
    copy_compute_slowdown: float = 1.0
    """Compute runs this many times longer while a copy op runs on its rank."""
    compute_copy_slowdown: float = 1.0
    """A copy op runs this many times longer while compute runs on its rank."""
    interference_by_op: tuple[tuple[OpKind, Dtype | None, OpInterference], ...] = ()
    """Per comm op kind and dtype (None: any dtype), its own factors (see `OpInterference`).
    While several comm ops run on a rank, compute runs at the largest of their factors."""
    noise: ComputeNoise | None = None
    """Random compute stalls and late wake-ups; None: exact."""


Contention = GpuContention | CpuContention
"""How work on a device slows other work on it: the GPU model or the CPU-host model."""


class DeviceKind(str, enum.Enum):
    """What a rank runs on: picks the contention model (`GpuContention`, `CpuContention`)."""

    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True)
class Calibration:
    """Where a machine file's numbers were measured (`calibration:`), written by
    `commdsl calibrate`; a file without it describes a kind of machine from datasheets and
    published measurements, not this one."""

    by: str
    """The command that measured it (`commdsl calibrate`, `commdsl calibrate --from-nccl-tests`)."""
    date: str
    """When, as an ISO 8601 UTC time."""
    source: str
    """What was measured: the host and ranks, or the nccl-tests logs."""
    quick: bool = False
    """A rough calibration (`--quick`: few sizes and runs)."""

    @classmethod
    def now(cls, by: str, source: str, quick: bool = False) -> Calibration:
        """A record of a calibration made now."""
        return cls(by, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), source, quick)


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
    """Streaming multiprocessors (compute units): the GPU contention model charges the
    SMs NCCL kernels occupy."""
    kind: DeviceKind = DeviceKind.GPU
    """`device.kind` in the machine file (default gpu): which contention model applies."""
    memory_gib: float | None = None
    """Device memory a rank may fill, in GiB (`device.memory_gib`): a simulation stops
    with an out-of-memory error when a rank's live buffers exceed it. None: no limit."""

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gib is None else int(self.memory_gib * 2**30)

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
    """Devices in the machine (nodes x gpus_per_node with a topology). Without a
    topology a schedule with more ranks still simulates, with a warning; with one it
    is an error (pick more `nodes`)."""
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
    topology: Topology | None = None
    """Nodes, devices and links; None: the implied one-switch-per-transport star (see
    the module doc)."""
    staged: tuple[tuple[Transport, LinkSpec], ...] = ()
    """Per transport, its latency per step and bandwidth cap when the path is staged
    through host memory (NCCL's SHM transport between GPUs without peer access; gloo
    always). NCCL not listed, on a topology where some GPUs lack peer access, gets its
    SHM path from the host link (`nccl_shm_link`); another transport not listed uses its
    own parameters when staged too."""
    collective_overrides: tuple[tuple[Transport, OpKind, LinkSpec], ...] = ()
    """Measured per-transport, per-collective parameters (`transports: {gloo:
    {collectives: {all_reduce: {latency_us, bandwidth_gb_per_s}}}}`, filled by
    calibration): the time of that collective is plan steps x latency_us + serial bytes
    / bandwidth (`commdsl.sim.collectives`), instead of the transport's parameters. The
    analytic network uses them as they are; the flow network uses them as the effective
    link parameters of that collective on the implied topology (no `topology`), so an
    uncontended collective takes exactly that time and a contended one its share of it.
    With a topology the links decide and overrides are not used by the flow network."""
    collective_profiles: tuple[tuple[Transport, OpKind, int, Dtype, ReduceOp | None, tuple[tuple[float, float], ...]], ...] = ()
    """Measured time of a collective by size on a group of `measured_ranks` ranks
    (`collectives: {all_reduce: {..., measured_ranks: 2, measured_us: [[size_bytes,
    time_us], ...], measured_us_by_dtype: {bf16: [...]}, measured_us_by_op: {avg:
    {fp32: [...], bf16: [...]}}}}`, written by calibration): a calibration profile, used
    for groups of that size only (others use the fitted line, which scales with the
    group). `measured_us` is measured in fp32 (reductions with op=sum; reduce op None
    here); an op of another dtype uses its own table where there is one (a reduction's
    cost depends on the element type: gloo reduces bf16 far slower per byte than fp32
    on a CPU), the fp32 table otherwise (moving bytes costs the same in any dtype).
    A reduction with another op uses that op's table where there is one (gloo's avg
    costs more than its sum; see `profile_for` for the order of the fallbacks). Real
    implementations are not linear in size (gloo on a CPU slows per byte once tensors
    outgrow the caches), so at an op's size the time is interpolated between the measured
    points (log-log; beyond the largest point, bandwidth-bound) and the op's bandwidth term
    set so that, alone, it takes exactly that time (see `sized_link`); contention still
    shares the links it crosses."""
    shared: tuple[tuple[Transport, float], ...] = ()
    """Per transport, a bandwidth (GB/s) that every concurrent transfer of it on the
    machine shares, whatever its direction (`transports: {gloo: {shared_bandwidth_gb_per_s:
    ..}}`): TCP over loopback, where the host's CPUs copy every byte, so an exchange
    (both directions at once) takes about twice a one-way send. Calibration measures it
    from a batched exchange. Transports not listed share only the links they cross."""
    host_copy_profile: tuple[tuple[float, float], ...] = ()
    """Measured time of one host -> device copy by size, [[size_bytes, time_us], ...]
    (`copy_measured_us: {host: ...}`, written by calibration), interpolated per op like
    a collective's profile; empty: `host_link`. A line fits copies badly where small
    ones run from the caches and large ones from memory. Device -> host copies too,
    unless `to_host_copy_profile` gives theirs."""
    to_host_copy_profile: tuple[tuple[float, float], ...] = ()
    """The same for a device -> host copy (`copy_measured_us: {to_host: ...}`); empty:
    as a host -> device copy (the two directions of a PCIe link run at different rates
    on some GPUs, which calibration measures)."""
    pageable_copy_profile: tuple[tuple[float, float], ...] = ()
    """Measured time of one copy from pageable host memory to the device by size
    (`copy_measured_us: {pageable: ...}`, written by calibration); device -> pageable
    host copies too, unless `pageable_to_host_copy_profile` gives theirs. Empty: from
    `host_memcpy_gb_per_s` (see `host_copy_us`)."""
    pageable_to_host_copy_profile: tuple[tuple[float, float], ...] = ()
    """The same for a copy from the device to pageable host memory
    (`copy_measured_us: {pageable_to_host: ...}`)."""
    host_memcpy_gb_per_s: float | None = None
    """Rate at which the host copies between pageable memory and the driver's pinned
    staging buffers (one CPU thread's memcpy). A pageable copy moves its bytes through
    that memcpy and the DMA at once, chunk by chunk, so it runs at the slower of the two.
    None: not known, and a pageable copy takes the time of a pinned one (it still blocks
    the host: that follows from the API, not from a rate)."""
    device_copy_profile: tuple[tuple[float, float], ...] = ()
    """The same for a device-memory copy (`copy_measured_us: {device: ...}`); empty:
    `device.memory_bandwidth_gb_per_s`, every byte read and written."""
    contention: Contention = GpuContention()
    """How work on a device slows other work on it (and, on a CPU, its noise)."""
    calibration: Calibration | None = None
    """Where the numbers were measured; None: an uncalibrated description (a preset)."""
    nccl: NcclConfig | None = None
    """How NCCL runs on the machine's GPUs (`nccl:`, needs a topology): with it, NCCL
    transfers follow NCCL's algorithms, protocols and channels over the topology's links
    (`commdsl.sim.nccl`); without it they take the nccl transport's latency per step and
    bandwidth."""

    @cached_property
    def memo(self) -> dict:
        """What the simulator works out from this machine alone and keeps for the next
        simulation on it (its links and routes, NCCL's layouts, choices and loads: see
        `commdsl.sim.nccl_flows.machine_links`). Not part of the machine's value: not
        compared, hashed or pickled; a changed copy (`replace`, `with_nodes`) starts empty."""
        return {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("memo", None)  # a cache, rebuilt where the machine is used
        return state

    def host_copy_us(self, size_bytes: float, to_host: bool = False, pageable: bool = False) -> float:
        """Time of a copy of size_bytes from host to device, or (`to_host`) back; from or
        to `pageable` host memory, the slower of the DMA and the host's staging memcpy."""
        if pageable:
            if to_host and self.pageable_to_host_copy_profile:
                return _interpolate(self.pageable_to_host_copy_profile, size_bytes)
            if self.pageable_copy_profile:
                return _interpolate(self.pageable_copy_profile, size_bytes)
            dma_us = self.host_copy_us(size_bytes, to_host)
            if self.host_memcpy_gb_per_s is None:
                return dma_us
            return max(dma_us, self.host_link.latency_us + size_bytes / (self.host_memcpy_gb_per_s * 1e3))
        if to_host and self.to_host_copy_profile:
            return _interpolate(self.to_host_copy_profile, size_bytes)
        if self.host_copy_profile:
            return _interpolate(self.host_copy_profile, size_bytes)
        return self.host_link.transfer_us(size_bytes)

    def device_copy_us(self, size_bytes: float) -> float:
        """Time of a copy of size_bytes within device memory (reads and writes each byte)."""
        if self.device_copy_profile:
            return _interpolate(self.device_copy_profile, size_bytes)
        return 2 * size_bytes / (self.device.memory_bandwidth_gb_per_s * 1e3)

    def transport(self, transport: Transport) -> LinkSpec | None:
        for t, spec in self.transports:
            if t is transport:
                return spec
        return None

    def staged_transport(self, transport: Transport) -> LinkSpec | None:
        """Parameters of `transport` on a host-staged path: the machine's `staged` entry;
        for NCCL without one, on a topology where some GPUs lack peer access, its SHM
        path derived from the host link (`nccl_shm_link`); else the transport's own."""
        for t, spec in self.staged:
            if t is transport:
                return spec
        if transport is Transport.NCCL and self.topology is not None and self.topology.peer_access is not None:
            return self.nccl_shm_link()
        return self.transport(transport)

    def nccl_shm_link(self) -> LinkSpec | None:
        """NCCL's SHM (host-memory) path of one GPU in one direction, derived from the
        machine where it does not give `transports.nccl.staged`. NCCL's SHM transport
        has no copy engine in it: the sending GPU's NCCL kernel stores each chunk into a
        buffer in host memory (the receiver's side, NCCL_SHM_LOCALITY's default) across
        its PCIe link, and the receiving GPU's kernel loads it back across its own, both
        with the few SMs of NCCL's channels. Those loads and stores reach a fixed share of
        what the DMA engines reach on the same link (`host_link`): `SHM_SHARE_OF_HOST_LINK`.
        Latency per step: the nccl transport's, plus the host link's twice (both PCIe
        crossings). None without an nccl transport."""
        nccl = self.transport(Transport.NCCL)
        return None if nccl is None else shm_link(nccl, self.host_link)

    def shared_bandwidth(self, transport: Transport) -> float | None:
        """The machine-wide bandwidth all transfers of `transport` share (GB/s), if any."""
        for t, bw in self.shared:
            if t is transport:
                return bw
        return None

    def collective_link(self, transport: Transport, kind: OpKind) -> LinkSpec | None:
        """The per-collective override of `transport` for `kind`, else the transport's."""
        for t, k, spec in self.collective_overrides:
            if t is transport and k is kind:
                return spec
        return self.transport(transport)

    def profile_for(self, transport: Transport, kind: OpKind, group_size: int, dtype: Dtype,
                    reduce_op: ReduceOp | None) -> tuple[tuple[float, float], ...] | None:  # fmt: skip
        """The measured profile of a collective (see `collective_profiles`), most specific
        first: its reduce op in its dtype, its dtype, its reduce op in fp32, fp32 (the
        dtype first: it moves a reduction's cost more than the op does); None without one
        for that group size. The plain tables of reductions are measured with sum."""
        tables = {(d, r): pts for t, k, n, d, r, pts in self.collective_profiles if t is transport and k is kind and n == group_size}
        op = None if reduce_op is ReduceOp.SUM else reduce_op
        for key in ((dtype, op), (dtype, None), (Dtype.FP32, op), (Dtype.FP32, None)):
            if key in tables:
                return tables[key]
        return None

    def sized_link(self, transport: Transport, kind: OpKind, group_size: int, size_bytes: float, latency_steps: int,
                   serial_bytes: float, dtype: Dtype = Dtype.FP32, reduce_op: ReduceOp | None = None) -> LinkSpec | None:  # fmt: skip
        """The effective link of one collective of `size_bytes` on `group_size` ranks: from
        its measured profile where there is one for that group size (latency per step and
        bandwidth such that latency_steps * latency + serial_bytes / bandwidth equals the
        interpolated measured time), else `collective_link`."""
        fitted = self.collective_link(transport, kind)
        points = self.profile_for(transport, kind, group_size, dtype, reduce_op)
        if points is None or serial_bytes <= 0 or size_bytes <= 0:
            return fitted
        time_us = _interpolate(points, size_bytes)
        # Keep the fitted latency, but never more than half the time: the rest is bytes.
        latency_part = min(latency_steps * fitted.latency_us, 0.5 * time_us)
        per_step = latency_part / latency_steps if latency_steps else 0.0
        return LinkSpec(per_step, serial_bytes / (time_us - latency_part) / 1e3)

    def has_override(self, transport: Transport, kind: OpKind) -> bool:
        return any(t is transport and k is kind for t, k, _ in self.collective_overrides)

    def with_nodes(self, nodes: int) -> Machine:
        """The same machine with `nodes` nodes (its topology copied). Raises `MachineError`
        where it has no topology, for fewer than one node, and for more than one where its
        node has no link to `network` (no NIC: the nodes could not reach each other)."""
        nodes = whole_number(f"machine {self.name}: nodes", nodes, error=MachineError)
        topo = self.topology
        if topo is None:
            raise MachineError(f"machine {self.name} has no topology, so it has no node to repeat {nodes:,} times",
                               hint="use a machine with a topology (docs/machines.md), such as dgx-h100")  # fmt: skip
        if nodes > 1 and not topo.networked:
            raise MachineError(f"machine {self.name}: {nodes:,} nodes, but its node has no link to '{NETWORK_VERTEX}' "
                               "(no NIC), so the nodes could not reach each other",
                               hint="give the node NICs linked to 'network' in a machine file (docs/machines.md), "
                                    "or use a machine that has them, such as dgx-h100")  # fmt: skip
        topo = replace(topo, nodes=nodes)
        return replace(self, topology=topo, num_devices=topo.num_devices)

    def with_peak_tflops(self, rates: dict[Dtype, float]) -> Machine:
        """The same machine with these dtypes' compute rates (TFLOP/s) instead of its own;
        other dtypes keep theirs (`commdsl.run --compare` re-simulates at the run's rate)."""
        kept = tuple((d, r) for d, r in self.device.peak_tflops if d not in rates)
        return replace(self, device=replace(self.device, peak_tflops=kept + tuple(rates.items())))

    @property
    def compute_noise(self) -> ComputeNoise | None:
        """The CPU host's random stalls (`CpuContention.noise`); None on GPUs or if not measured."""
        return self.contention.noise if isinstance(self.contention, CpuContention) else None

    def interference(self, kind: OpKind, dtype: Dtype) -> OpInterference:
        """The interference factors of a comm op (see `OpInterference`)."""
        return self.contention.interference(kind, dtype)

    def slows_comm(self) -> bool:
        """Whether compute slows any comm op (the networks then track compute per device)."""
        return self.contention.slows_comm()

    def nccl_sm_share(self) -> bool:
        """Whether NCCL slows compute by the SMs its kernels hold and the memory its transfers
        use (`GpuContention`): a GPU machine with no measured factor that says how many SMs
        a kernel holds (its NCCL model's channels, or `nccl_sms`)."""
        c = self.contention
        return (isinstance(c, GpuContention) and c.comm_compute_slowdown is None and not c.interference_by_op
                and (c.nccl_sms is not None or self.nccl is not None))  # fmt: skip

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
                "kind": self.device.kind.value,
                **({"memory_gib": self.device.memory_gib} if self.device.memory_gib is not None else {}),
            },
            "kernel_launch_us": self.kernel_launch_us,
            "comm_launch_us": self.comm_launch_us,
            "host_link": _link_json(self.host_link),
            "transports": {t.value: _link_json(s) for t, s in self.transports},
            "chunk_bytes": self.chunk_bytes,
            **({"host_memcpy_gb_per_s": self.host_memcpy_gb_per_s} if self.host_memcpy_gb_per_s is not None else {}),
            **({"topology": self.topology.to_json()} if self.topology is not None else {}),
            **({"staged": {t.value: _link_json(s) for t, s in self.staged}} if self.staged else {}),
            **({"shared_bandwidth_gb_per_s": {t.value: bw for t, bw in self.shared}} if self.shared else {}),
            **({"collectives": {f"{t.value}.{k.value}": _link_json(s) for t, k, s in self.collective_overrides}}
               if self.collective_overrides else {}),
            **({"copy_measured_us": profiles} if (profiles := {
                name: [list(p) for p in pts] for name, pts in
                (("host", self.host_copy_profile), ("to_host", self.to_host_copy_profile),
                 ("pageable", self.pageable_copy_profile), ("pageable_to_host", self.pageable_to_host_copy_profile),
                 ("device", self.device_copy_profile))
                if pts}) else {}),
            **_contention_json(self.contention),
            **({"nccl": self.nccl.to_json()} if self.nccl is not None else {}),
            **({"calibration": asdict(self.calibration)} if self.calibration is not None else {}),
        }


def _contention_json(c: Contention) -> dict:
    out: dict = {"comm_compute_slowdown": c.compute_slowdown(), "compute_comm_slowdown": c.compute_comm_slowdown}
    if isinstance(c, GpuContention) and c.nccl_sms is not None:
        out["nccl_sms"] = c.nccl_sms
    if isinstance(c, CpuContention):
        out.update(copy_compute_slowdown=c.copy_compute_slowdown, compute_copy_slowdown=c.compute_copy_slowdown)
    if c.interference_by_op:
        out["interference_by_op"] = _interference_json(c.interference_by_op)
    if isinstance(c, CpuContention) and c.noise is not None:
        out["compute_noise"] = asdict(c.noise)
    return out


def _interference_json(entries: tuple[tuple[OpKind, Dtype | None, OpInterference], ...]) -> dict:
    out: dict[str, dict[str, dict]] = {}
    for kind, dtype, f in entries:
        out.setdefault(kind.value, {})[dtype.value if dtype is not None else ANY_DTYPE] = asdict(f)
    return out


SHM_SHARE_OF_HOST_LINK = 0.25
"""The rate NCCL's SHM path reaches per GPU and direction, as a share of the rate copies
reach over the GPU's host link (`Machine.nccl_shm_link`): NCCL moves SHM bytes with its
kernel's SMs (one CTA per channel, loads and stores across PCIe), not with copy engines.
From a published measurement between GPUs without peer access (docs/validation.md, "PCIe,
memcpy and NCCL"): NCCL's send reached a third of a copy staged through host memory,
which itself reached three quarters of the link; a machine file that knows its own
rate gives `transports.nccl.staged`."""


def shm_link(nccl: LinkSpec, host_link: LinkSpec) -> LinkSpec:
    """NCCL's SHM path of one GPU and direction from the nccl transport and the host link
    (see `Machine.nccl_shm_link`)."""
    return LinkSpec(nccl.latency_us + 2 * host_link.latency_us, SHM_SHARE_OF_HOST_LINK * host_link.bandwidth_gb_per_s)


ANY_DTYPE = "any"
"""`interference_by_op` key of an entry for every dtype of its op kind."""


class VertexKind(str, enum.Enum):
    """What a vertex of the topology is."""

    GPU = "gpu"
    """A device (a rank runs on it); on CPU machines, a rank's process."""
    NVSWITCH = "nvswitch"
    PCIE_SWITCH = "pcie_switch"
    CPU = "cpu"
    """A CPU socket: its PCIe root complex and its host memory (staging happens here)."""
    NIC = "nic"
    NETWORK = "network"
    """The fabric between nodes (one per machine, non-blocking inside)."""


class LinkKind(str, enum.Enum):
    NVLINK = "nvlink"
    PCIE = "pcie"
    NUMA = "numa"
    """Between CPU sockets (UPI, xGMI)."""
    NETWORK = "network"
    """NIC to the fabric (InfiniBand, RoCE, Ethernet)."""
    LOOPBACK = "loopback"
    """A process to its host's TCP loopback stack (CPU machines)."""
    MEMORY = "memory"
    """A CPU socket's memory as a staged transfer sees it (`topology.host_memory_bandwidth_gb_per_s`):
    each byte is written into it and read back. Implied by the topology, never written in a file."""
    SHM = "shm"
    """NCCL's host-memory (SHM) path of one GPU in one direction, with its proxy: every
    staged NCCL transfer of the GPU shares it. Implied by the topology, never written in a file."""


IMPLIED_LINK_KINDS = frozenset({LinkKind.MEMORY, LinkKind.SHM})
"""Link kinds the simulator adds to a topology; a machine file cannot declare them."""


NETWORK_VERTEX = "network"
"""The name of the fabric vertex in link ends (it is outside every node)."""


@dataclass(frozen=True)
class TopologyLink:
    """One physical link of a node: full duplex, `bandwidth_gb_per_s` in each direction."""

    kind: LinkKind
    """What the link is (shown in `--links`; routing looks only at rates)."""
    a: str
    """One end: a vertex of the node (`gpu3`, `nvswitch`, ...) or `network`."""
    b: str
    """The other end."""
    bandwidth_gb_per_s: float
    """Per direction, GB/s (10^9 B/s); may be `.inf`."""
    latency_us: float
    """Added to every step of a transfer that crosses the link."""
    line_rate_gb_per_s: float | None = None
    """The link's signalling rate per direction, GB/s (a 400 Gb/s NIC: 50), where
    `bandwidth_gb_per_s` is what software reaches through it (NCCL: 47). Nothing moves
    faster: `calibrate --from-nccl-tests` never scales the rate above it. None: not said."""


@dataclass(frozen=True)
class Topology:
    """Identical nodes of `gpus_per_node` devices; the `network` vertex joins them.

    Device i of node k is global device (rank) k * gpus_per_node + i; inside a node it is
    named `gpu<i>`. Other vertices are named by the file (`vertices`). Links are written
    once per node with node-local names and copied to every node."""

    nodes: int
    """Number of nodes (`nodes: N` turns a one-node preset into a cluster)."""
    gpus_per_node: int
    """Devices per node, named gpu0 .. gpu<n-1> inside the node."""
    vertices: tuple[tuple[str, VertexKind], ...]
    """The node's other vertices (switches, CPU sockets, NICs), name and kind."""
    links: tuple[TopologyLink, ...]
    """The node's links (node-local names), copied to every node."""
    peer_access: tuple[frozenset[int], ...] | None
    """Sets of node-local GPU indices that can copy between each other directly (CUDA
    peer access); None: every pair in a node. Transfers between GPUs without peer access
    stage through host memory; transfers between nodes go through the NICs."""
    copy_engines: int | None = None
    """Copy engines per GPU, as CUDA counts them (deviceQuery's "Concurrent copy and
    kernel execution: Yes with N copy engine(s)"): the memcpy transfers between GPUs one
    GPU runs at once, in either direction. A direct copy holds one engine of its source
    GPU; a copy staged through host memory holds one of its source (the device->host leg)
    and one of its destination (the host->device leg) for its whole time. A transfer that
    finds no free engine waits for one, in the order transfers became ready on that GPU.
    None: not limited."""
    host_memory_bandwidth_gb_per_s: float | None = None
    """Per CPU socket, the memory bandwidth transfers staged through it share (each byte
    written once and read once); None: not limited."""

    @property
    def num_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def networked(self) -> bool:
        """Whether a node has a link to `network` (a NIC), so that nodes reach each other."""
        return any(NETWORK_VERTEX in (link.a, link.b) for link in self.links)

    def peers(self, a: int, b: int) -> bool:
        """Whether node-local GPUs a and b have peer access."""
        if self.peer_access is None:
            return True
        return any(a in s and b in s for s in self.peer_access)

    def to_json(self) -> dict:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "vertices": {n: k.value for n, k in self.vertices},
            "links": [
                {"kind": l.kind.value, "between": [l.a, l.b], "latency_us": l.latency_us,
                 "bandwidth_gb_per_s": l.bandwidth_gb_per_s if l.bandwidth_gb_per_s != float("inf") else "inf",
                 **({"line_rate_gb_per_s": l.line_rate_gb_per_s} if l.line_rate_gb_per_s is not None else {})}
                for l in self.links
            ],  # fmt: skip
            "peer_access": "all" if self.peer_access is None else [sorted(s) for s in self.peer_access],
            "copy_engines": self.copy_engines,
            **({"host_memory_bandwidth_gb_per_s": self.host_memory_bandwidth_gb_per_s}
               if self.host_memory_bandwidth_gb_per_s is not None else {}),
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


def _interpolate(points: tuple[tuple[float, float], ...], size: float) -> float:
    """Time at `size` from measured (size, time) points sorted by size: log-log linear
    between points, the smallest point's time below them (latency-bound), and the
    largest point's bandwidth above them (bandwidth-bound)."""
    if size <= points[0][0]:
        return points[0][1]
    if size >= points[-1][0]:
        s_max, t_max = points[-1]
        return t_max * size / s_max
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if s0 <= size <= s1:
            f = math.log(size / s0) / math.log(s1 / s0)
            return t0 * (t1 / t0) ** f
    raise AssertionError("unreachable: points are sorted")
