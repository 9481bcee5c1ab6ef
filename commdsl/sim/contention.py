"""How work on a device slows other work on it, and the noise of a shared CPU.

The engine runs the execution semantics; it asks this module only about speed: how many
times longer a running compute op or copy takes while other work runs on its device,
whether a transfer slows while its devices compute, and (a sampled simulation on a CPU
host) how long a compute op stalls and how late a woken stream goes on. The machine's
contention spec picks the model (`contention_model`):

  * `Exact`: nothing slows anything, no noise. The engine then keeps no bookkeeping at all.
  * `GpuModel` (`GpuContention`): an NCCL kernel holds SMs (its channels) from the moment
    it is active, even while it waits for its peers, so compute on that GPU runs at the
    largest factor of the kernels active there; compute bound by its bytes instead shares
    the device's memory bandwidth with the NCCL transfers moving there. Copies (and memcpy
    transfers) run on copy engines: they slow nothing and nothing slows them. Compute
    slows transfers only where the machine says so.
  * `CpuHostModel` (`CpuContention`): a rank is a process whose streams, comm queues and
    copies are threads sharing the host's cores. Comm ops and compute slow each other
    (per-op factors) while the comm op's transfer moves bytes: a posted recv, or a
    collective waiting for its last member, waits in a blocked thread and costs the
    cores nothing. Copies and compute slow each other, explicit durations stretch, and
    in a sampled simulation compute ops stall and woken threads go on late.

The engine's side of the interface (`Contention`):

    timed / timed_copies    compute ops (and copies) run on timers that are re-timed
                            when their factor changes; False: fixed durations
    tracks_kernels          report NCCL ops becoming active and finishing: kernel()
    tracks_traffic          report transfers starting and ending: transfer()
    factor(rank, op)        the current slowdown of a compute op or a copy on `rank`
    work(rank, is_copy, +1/-1)  a compute op or copy started / ended on `rank`
    duration_stretch        explicit compute durations run this many times long
    noisy                   draw stalls (noisy_compute) and late wake-ups (woken, wake_us)
    rank_local              a rank's factors and its transfers' speed depend on work on
                            that rank only (`commdsl.sim.symmetry` may then fold ranks)

`kernel()` and `work()` return True when the factors on that rank changed, and
`transfer()` the ranks where they may have, so the engine re-times what runs there. The
model also tells the network when a device starts or stops computing
(`Network.compute_changed`) where compute slows transfers.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from itertools import repeat
from statistics import NormalDist

from commdsl.ir import Dtype, Op, OpKind, Transport
from commdsl.machine.model import CpuContention, GpuContention, Machine
from commdsl.sim.network import Network, Transfer
from commdsl.sim.shape_memo import shape_table

_STANDARD_NORMAL = NormalDist()
# Enum members bound once: a member read through its class is a Python-level lookup (the
# enum's metaclass), dear where this module is compiled.
_COPY, _COMPUTE, _SEND, _RECV, _NCCL = OpKind.COPY, OpKind.COMPUTE, OpKind.SEND, OpKind.RECV, Transport.NCCL
_exp = math.exp  # bound once: it runs per compute op of a sampled run


class Contention:
    """The exact model: nothing slows anything (see the module doc for the interface).
    Where this module is compiled (`commdsl.native`) the models are C-struct classes
    (`contention.pxd`): the engine calls their methods in C, and they read their own
    fields without lookups."""

    def __init__(self) -> None:
        self.timed = False
        self.timed_copies = False
        self.tracks_kernels = False
        self.tracks_traffic = False
        self.noisy = False
        self.duration_stretch = 1.0
        self.rank_local = True

    def kernel(self, g: int, op: Op, started: bool) -> bool:
        """NCCL op `op` (the engine's op g) became active (`started`) or finished on its rank."""
        return False

    def work(self, rank: int, is_copy: bool, delta: int) -> bool:
        """A compute op (or a copy) started (+1) or ended (-1) on `rank`."""
        return False

    def transfer(self, transfer: Transfer, started: bool) -> tuple[int, ...]:
        """A transfer started or ended moving bytes: the ranks whose factors changed
        (called only with `tracks_traffic`)."""
        return ()

    def factor(self, rank: int, op: Op) -> float:
        """The current slowdown of compute op or copy `op` on `rank`."""
        return 1.0

    def traffic_matters(self, memory_bound: bool) -> bool:
        """Whether a program's transfers can change a factor (with `tracks_traffic`):
        `memory_bound`, some compute op of it is bound by its bytes (`Wiring.memory_bound`)."""
        return True

    def noisy_compute(self, g: int, start_us: float, duration_us: float, now: float) -> float:
        """Compute op g, starting at `start_us` (now or later) for `duration_us`: its
        duration with its random stall (called only where `noisy`)."""
        return duration_us

    def woken(self, entry: int, t: float, now: float) -> tuple[float, bool]:
        """A stream entry goes on at `t` (at the latest `now`), when another thread's work
        ended: (when it goes on, whether a late wake-up is left to the compute op right
        after it)."""
        return t, False

    def wake_us(self, entry: int) -> float:
        return 0.0


Exact = Contention


class _KernelFactors(Contention):
    """Compute slowed by the comm kernels active on its device: the largest of their
    factors (`Machine.interference`, looked up once per op kind and dtype)."""

    def __init__(self, machine: Machine, world_size: int, num_ops: int):
        super().__init__()
        self.machine = machine
        self.tracks_kernels = machine.contention.slows_compute()
        self.kernels: list[list[float]] = [[] for _ in range(world_size)]
        """Per rank, the compute slowdowns of its active comm kernels."""
        self.top: list[float] = [1.0] * world_size
        """Per rank, the largest of `kernels` (1.0 while none is active)."""
        self._factor_of: dict[tuple[OpKind, Dtype], float] = {}
        """A comm op's slowdown of compute by its (kind, dtype) (`_kernel_at`)."""
        self._machine_factor: dict[tuple, float] = shape_table(machine, ("kernel_factor", type(self).__name__, world_size))
        """`kernel_factor` by `kernel_key`, for every program on this machine
        (`commdsl.sim.shape_memo`)."""
        self._op_factor: dict[tuple[int, int, int], float] = {}
        """`kernel`'s factor by (id of the op's spec, its kind, its rank), which fix
        its `kernel_key`: the ops one statement makes share a spec, so this is looked up
        without building the key. The engine holds the program, so the ids stay its ops'."""
        self.factor_at = array("d", bytes(8 * num_ops))
        """Per op (g), `kernel`'s factor once looked up (0.0: not yet; a factor is at least
        1). It follows from the program, the machine and the network model alone, so the
        engine keeps it with the program's `Wiring` and hands it to the next run's model."""

    def kernel_factor(self, op: Op) -> float:
        """Compute's slowdown while comm op `op` runs on its device."""
        return self.machine.interference(op.kind, op.dtype).comm_compute_slowdown

    def kernel_key(self, op: Op) -> tuple:
        """What `kernel_factor` reads of `op`, as values (no program's names): its key in
        the machine's table."""
        return op.kind, op.dtype

    def kernel(self, g: int, op: Op, started: bool) -> bool:
        rank = op.rank
        factor = self.factor_at[g]
        if factor == 0.0:  # its first start: by its spec, else by its values, else worked out
            of_op = (id(op.spec), op.kind, rank)
            known = self._op_factor.get(of_op)
            if known is None:
                key = self.kernel_key(op)
                known = self._machine_factor.get(key)
                if known is None:
                    known = self._machine_factor[key] = self.kernel_factor(op)
                self._op_factor[of_op] = known
            factor = self.factor_at[g] = known
        return _push_slowdown(self.kernels[rank], self.top, rank, factor, started)

    def _kernel_at(self, rank: int, kind: OpKind, dtype: Dtype, started: bool) -> bool:
        """A comm op of `kind` began (`started`) or ended slowing compute on `rank`."""
        key = (kind, dtype)
        factor = self._factor_of.get(key)
        if factor is None:
            factor = self._factor_of[key] = self.machine.interference(kind, dtype).comm_compute_slowdown
        return _push_slowdown(self.kernels[rank], self.top, rank, factor, started)

    def _kernel_factor(self, rank: int) -> float:
        return self.top[rank]


def _push_slowdown(kernels: list[float], top: list[float], rank: int, factor: float, started: bool) -> bool:
    """Add (`started`) or remove one of `rank`'s compute slowdowns `factor` (`kernels`, its
    list of them; `top`, every rank's largest); whether its largest changed. A function,
    not a method, so that where this module is compiled the model calls it in C."""
    before = top[rank]
    if started:
        kernels.append(factor)
        value = factor if len(kernels) == 1 or factor > before else before
    else:
        kernels.remove(factor)
        value = before if kernels and factor < before else (max(kernels) if kernels else 1.0)
    top[rank] = value
    return value != before


class GpuModel(_KernelFactors):
    """NCCL kernels hold SMs and memory bandwidth; copy engines leave compute alone (see
    the module doc and `GpuContention`)."""

    def __init__(self, machine: Machine, network: Network, world_size: int, num_ops: int, group_ranks: dict[str, tuple[int, ...]]):
        super().__init__(machine, world_size, num_ops)
        spec: GpuContention = machine.contention
        self.network = network
        self.group_ranks = group_ranks
        self.sm_count = spec.sm_count
        sm_share = machine.nccl_sm_share()
        self.tracks_kernels = spec.slows_compute() or sm_share
        self.memory_bytes_per_us = machine.device.memory_bandwidth_gb_per_s * 1e3
        self.tracks_traffic = sm_share and self.memory_bytes_per_us < math.inf
        self.traffic = [0.0] * world_size
        """Per rank, the device memory traffic (bytes/us) of the NCCL transfers moving there."""
        self._traffic_of: dict[int, tuple[float, tuple[int, ...], Transfer]] = shape_table(
            machine, ("traffic", network.name, world_size))
        """By id of a `Transfer` (the engine makes one per shape on the machine), for every
        simulation on this machine and network (`commdsl.sim.shape_memo`): its memory
        traffic, the ranks it loads (none: not an NCCL transfer), and the transfer (which
        keeps its id from being reused)."""
        self._memory_bound: dict[tuple[int, int], bool] = {}
        """`memory_bound` of a compute op by (id of its spec, its kind)."""
        self._machine_memory_bound: dict[tuple, bool] = shape_table(machine, ("memory_bound",))
        """`memory_bound` by the op fields it reads, for every program on this machine:
        `_memory_bound`'s misses."""
        self.slows_comm = spec.slows_comm()
        self.timed = self.tracks_kernels or self.slows_comm or self.tracks_traffic
        self.rank_local = not self.slows_comm  # the network hears which devices compute

    def kernel_factor(self, op: Op) -> float:
        """Compute's slowdown while NCCL op `op` runs on its device: a measured factor, else
        the SM share of its channels."""
        spec: GpuContention = self.machine.contention
        own = spec.own_interference(op.kind, op.dtype)
        if own is not None:
            return own.comm_compute_slowdown
        if spec.comm_compute_slowdown is not None:
            return spec.comm_compute_slowdown
        if self.network.nccl is not None and op.transport is _NCCL:
            sms = self.network.nccl.choose(op, self.group_ranks[op.group]).channels
        else:
            sms = spec.nccl_sms or 0
        sms = min(sms, self.sm_count - 1)
        return self.sm_count / (self.sm_count - sms)

    def kernel_key(self, op: Op) -> tuple:
        # NCCL's channels depend on the op's group's ranks, size and choices (a send's on its peer too).
        spec = op.spec  # (its fields, read without the op's properties)
        key = (op.kind, spec.dtype, self.group_ranks[spec.group], spec.size_bytes, spec.algo, spec.proto, spec.transport)
        return key + (op.rank, spec.peer) if op.kind.is_p2p else key

    def work(self, rank: int, is_copy: bool, delta: int) -> bool:
        if self.slows_comm and not is_copy:
            self.network.compute_changed(rank, delta > 0)
        return False

    def transfer(self, transfer: Transfer, started: bool) -> tuple[int, ...]:
        """An NCCL transfer reads and writes device memory on every member while it moves:
        about twice its bytes over its uncontended time (what it sends it reads, what it
        receives it writes)."""
        known = self._traffic_of.get(id(transfer))
        if known is None:
            if transfer.transport is not _NCCL or not transfer.size_bytes:
                known = (0.0, (), transfer)
            else:
                known = (2.0 * self.network.solo_rate(transfer), tuple(dict.fromkeys(transfer.ranks)), transfer)
            self._traffic_of[id(transfer)] = known
        rate, ranks, _ = known
        if not started:
            rate = -rate
        traffic = self.traffic
        for r in ranks:
            traffic[r] = max(0.0, traffic[r] + rate)
        return ranks

    def factor(self, rank: int, op: Op) -> float:
        kind = op.kind
        if kind is _COPY:
            return 1.0
        if self.tracks_traffic and self._is_memory_bound(op, kind):
            # Its bytes share the memory with NCCL's traffic (at most 90% of it is taken).
            traffic = min(self.traffic[rank], 0.9 * self.memory_bytes_per_us)
            return self.memory_bytes_per_us / (self.memory_bytes_per_us - traffic)
        return self.top[rank]

    def traffic_matters(self, memory_bound: bool) -> bool:
        """NCCL's memory traffic slows only compute bound by its bytes: without such ops,
        the program's transfers change no factor, and the engine need not report them."""
        return memory_bound

    def _is_memory_bound(self, op: Op, kind: OpKind) -> bool:
        """`memory_bound(machine, op)`, once per spec and kind."""
        key = (id(op.spec), kind)
        bound = self._memory_bound.get(key)
        if bound is None:
            spec = op.spec  # (its fields, read without the op's properties)
            shape = (kind, spec.duration_us is None, spec.size_bytes, spec.flops, spec.dtype)
            bound = self._machine_memory_bound.get(shape)
            if bound is None:
                bound = self._machine_memory_bound[shape] = memory_bound(self.machine, op)
            self._memory_bound[key] = bound
        return bound


class CpuHostModel(_KernelFactors):
    """A rank's streams, comm queues and copies are threads on shared cores (see the
    module doc). Counts, per rank, the compute ops and copies running there."""

    def __init__(self, machine: Machine, network: Network, world_size: int, num_ops: int, rng: random.Random | None):
        super().__init__(machine, world_size, 0)  # (`kernel` is not called: see `tracks_kernels`)
        spec: CpuContention = machine.contention
        # Comm slows compute while its transfer moves bytes (`transfer`), not from the
        # moment the op is active as an NCCL kernel on a GPU does (`kernel`).
        self.tracks_traffic = spec.slows_compute()
        self.tracks_kernels = False
        self.network = network
        self.spec = spec
        noise = spec.noise
        self.noisy = rng is not None and noise is not None
        self.duration_stretch = noise.duration_stretch if noise is not None else 1.0
        self.slows_comm = spec.slows_comm()
        self.timed_copies = spec.copy_compute_slowdown != 1.0 or spec.compute_copy_slowdown != 1.0
        self.timed = self.tracks_traffic or self.slows_comm or spec.compute_copy_slowdown != 1.0 or self.timed_copies
        # Late wake-ups ask whether some rank computes (`woken`). Timed compute ops report
        # their start and end (`work`), so they are counted; an untimed op's end is known
        # when it is scheduled, so its interval is kept instead, at no event of its own.
        self._counts_compute = self.slows_comm or spec.compute_copy_slowdown != 1.0 or (self.noisy and self.timed)
        # Each rank draws its own noise; the network hears which ranks compute.
        self.rank_local = not (self.noisy or self.slows_comm)
        self.computing = [0] * world_size
        """Per rank, compute ops running (counted only where something depends on it)."""
        self.copying = [0] * world_size
        """Per rank, copies running (counted only with `timed_copies`)."""
        self.ranks_computing = 0
        """Ranks with a compute op running (late wake-ups happen only while cores are busy),
        counted where compute is timed."""
        self._busy_until = 0.0
        """Untimed compute: the latest end of the compute ops started so far."""
        self._starting: list[tuple[float, float]] = []
        """Untimed compute: a heap of (start, end) of the compute ops not started yet."""
        # Each op's draws come from its own uniforms, drawn up front: a sample is fixed by
        # its seed, not by the order in which the engine meets ops at equal times.
        self._stall_bits = random_words(rng, num_ops) if self.noisy else array("Q")
        """Per op (g), the random 64-bit word its stall count is drawn from (`poisson`)."""
        self._wake_bits = random_words(rng, num_ops) if self.noisy else array("Q")
        """Per op (g), the random word its late wake-up is drawn from: an op has one at most
        (a comm op's stream going on after it, a wait, or a compute op or copy)."""
        self._wake_below = round(noise.wake_stall_probability * 2**64) if noise is not None else 0
        """A word below this wakes late: `wake_stall_probability` of them."""
        self._stalls_per_us = noise.stalls_per_s / 1e6 if noise is not None else 0.0

    def work(self, rank: int, is_copy: bool, delta: int) -> bool:
        counts = self.copying if is_copy else self.computing
        if not is_copy and not self._counts_compute:
            return False
        before = counts[rank]
        counts[rank] = before + delta
        if (before == 0) == (counts[rank] == 0):
            return False  # still running (or still idle): no factor changes
        if is_copy:
            return True
        self.ranks_computing += 1 if before == 0 else -1
        if self.slows_comm:
            self.network.compute_changed(rank, before == 0)
        return self.spec.compute_copy_slowdown != 1.0

    def transfer(self, transfer: Transfer, started: bool) -> tuple[int, ...]:
        """An NCCL-transport transfer slows compute on its ranks while it moves: each at
        its own op's factor (a send's on the source, a recv's on the destination)."""
        if transfer.transport is not _NCCL:
            return ()
        kinds = (_SEND, _RECV) if transfer.kind is _SEND else repeat(transfer.kind)
        changed = []  # a loop, not a generator: a compiled method makes no closures
        for rank, kind in zip(dict.fromkeys(transfer.ranks), kinds):
            if self._kernel_at(rank, kind, transfer.dtype, started):
                changed.append(rank)
        return tuple(changed)

    def factor(self, rank: int, op: Op) -> float:
        spec = self.spec
        if op.kind is _COPY:
            return spec.compute_copy_slowdown if self.computing[rank] else 1.0
        factor = self._kernel_factor(rank)
        if self.copying[rank]:
            factor *= spec.copy_compute_slowdown
        return factor

    def noisy_compute(self, g: int, start_us: float, duration_us: float, now: float) -> float:
        """The op's duration plus its random stall time: a Poisson number of stalls,
        `stalls_per_s` per second of its duration on average, each `stall_us` long (a timed
        op whose start is delayed comes back here, to the same draw). On a slowed device
        the stall is slowed with the op's work (a simplification)."""
        mean = self._stalls_per_us * duration_us
        bits = self._stall_bits[g]
        if bits >= _exp(-mean) * 2.0**64:  # else no stall (`poisson`'s first step, as a word: most ops)
            duration_us += poisson((bits >> 11) * 2.0**-53, mean) * self.spec.noise.stall_us  # top 53 bits: [0, 1)
        if not self.timed:  # untimed, it runs from `start_us` to its end as scheduled now, once
            end = start_us + duration_us
            if start_us > now:
                heapq.heappush(self._starting, (start_us, end))
            elif end > self._busy_until:
                self._busy_until = end
        return duration_us

    def woken(self, entry: int, t: float, now: float) -> tuple[float, bool]:
        """A thread wakes late only while the cores are busy (a compute op runs on some
        rank `now`; an untimed one from its start, included, to its end, excluded): drawn
        here then; else left to a compute or copy op that starts right then, as calibration
        measures it (a compute op starting late after the comm op it waited for); blocking
        collectives back to back, with nothing computing, follow each other closely."""
        if self.timed:
            busy = self.ranks_computing > 0
        else:
            starting = self._starting
            while starting and starting[0][0] <= now:
                end = heapq.heappop(starting)[1]
                if end > self._busy_until:
                    self._busy_until = end
            busy = self._busy_until > now
        if not busy:
            return t, True
        if self._wake_bits[entry >> 2] < self._wake_below:  # `wake_us`, inlined (once per comm op's wait)
            return t + self.spec.noise.wake_stall_us, False
        return t, False

    def wake_us(self, entry: int) -> float:
        """The late wake-up of `entry` (`woken`): `wake_stall_us` with probability
        `wake_stall_probability`."""
        return self.spec.noise.wake_stall_us if self._wake_bits[entry >> 2] < self._wake_below else 0.0


def contention_model(machine: Machine, network: Network, world_size: int, num_ops: int, rng: random.Random | None,
                     group_ranks: dict[str, tuple[int, ...]]) -> Contention:  # fmt: skip
    """The model for `machine`'s contention spec (`Exact` where nothing would change) for
    a program of `num_ops` ops on `world_size` ranks; `rng` draws a sample's noise."""
    spec = machine.contention
    if isinstance(spec, CpuContention):
        model: Contention = CpuHostModel(machine, network, world_size, num_ops, rng)
    elif isinstance(spec, GpuContention):
        model = GpuModel(machine, network, world_size, num_ops, group_ranks)
    else:
        raise AssertionError(f"unknown contention spec {type(spec).__name__}")
    if not (model.timed or model.noisy or model.duration_stretch != 1.0):
        return Exact()
    return model


def compute_us(machine: Machine, op: Op) -> tuple[float, float]:
    """(FLOP time, memory time) of a compute op's work at the device's rates (it takes the
    larger): its FLOPs at the dtype's rate; its bytes read half and written half, as a
    device copy of size/2."""
    flops_us = op.flops / (machine.device.tflops(op.dtype) * 1e6) if op.flops else 0.0
    bytes_us = machine.device_copy_us(op.size_bytes / 2) if op.size_bytes else 0.0
    return flops_us, bytes_us


def memory_bound(machine: Machine, op: Op) -> bool:
    """A compute op whose time is its bytes' (`bytes=`, no explicit duration)."""
    if op.kind is not _COMPUTE or op.duration_us is not None or not op.size_bytes:
        return False
    flops_us, bytes_us = compute_us(machine, op)
    return bytes_us >= flops_us


def random_words(rng: random.Random, n: int) -> array:
    """`n` random 64-bit words from `rng`, in one C-level call."""
    return array("Q", rng.randbytes(8 * n))


def poisson(u: float, mean: float) -> int:
    """The Poisson(`mean`) count at uniform `u` in [0, 1) (the inverse of its CDF, so a
    uniform `u` gives a Poisson draw): by summing the probabilities for small means (the
    usual case: a compute op sees well under one stall), by the normal approximation
    beyond 30."""
    if mean > 30.0:
        return max(0, round(mean + math.sqrt(mean) * _STANDARD_NORMAL.inv_cdf(max(u, 1e-300))))
    k, p = 0, math.exp(-mean)
    cdf = p
    while u >= cdf and p > 0.0:  # p underflows within a few hundred terms: the loop ends
        k += 1
        p *= mean / k
        cdf += p
    return k
