"""Measurements on a live torch.distributed world (needs torch; run under torchrun).

Communication is timed through the executor's own code path (`commdsl.run.comm`), so
a calibrated machine describes exactly the calls `commdsl.run` makes.

Every timing is the *expected* time of at least `repeats` runs after `warmup`, not the
median: a schedule's makespan is a sum of many op times, and a sum follows the means of
its parts. On a small shared CPU a gloo call stalls for a scheduler slice (milliseconds)
in a fraction of runs, which the median of one op hides and a run of a hundred ops does
not. Communication takes the plain mean (`fit.comm_mean_us`) of more runs, for at least
0.1 s and while the estimate is loose (`fit.precise`), in passes spread over the
calibration (`Pooled`); local ops the trimmed mean (`fit.expected_us`).

A collective runs from the moment its last member arrives to the moment its last member
finishes, as the simulator's rendezvous has it: every rank reads the shared monotonic
clock (offset-corrected across hosts) before and after its part, and the time is
max(end) - max(start) over the members. A rank that leaves the preceding barrier late
therefore does not charge its lateness to the collective.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.calibrate.fit import comm_mean_us, expected_us, precise
from commdsl.errors import SourceLoc
from commdsl.ir import REDUCING_KINDS, CopyDir, Dtype, Op, OpKind, ReduceOp, Transport
from commdsl.run.comm import launch, make_plan
from commdsl.run.tensors import TORCH_DTYPE, BufferPool
from commdsl.run.timing import now_ns

_LOC = SourceLoc("<calibrate>", 1, 1, "")


@dataclass(frozen=True)
class Probe:
    """Where and how measurements run."""

    rank: int
    world_size: int
    backend: str
    """"gloo" or "nccl"."""
    device: torch.device
    repeats: int
    warmup: int
    cpu_group: dist.ProcessGroup
    """gloo group of all ranks: timings travel on it, so reading them never syncs a device."""
    clock_offset_ns: int = 0
    """Added to this rank's monotonic clock to read rank 0's (0 on rank 0's host)."""
    store: dist.Store | None = None
    """The rendezvous store, for probes whose peer copies exchange their buffers there
    (`executor_probes.peer_copy_us`); None: those probes cannot run."""

    def sync(self) -> None:
        """Wait for the work of the current stream (only: a side stream may run on)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def _local_time_us(probe: Probe, fn: Callable[[], None], *, warmup: int | None = None, pooled: Pooled | None = None) -> float:
    """Expected wall time of fn on this rank alone (`repeats` runs; with `pooled`, one pass
    of several, its runs joining theirs)."""
    pooled = Pooled(1) if pooled is None else pooled
    warmup = probe.warmup if warmup is None else max(warmup, probe.warmup)
    samples = []
    for i in range(warmup + probe.repeats):
        probe.sync()
        start = time.perf_counter()
        fn()
        probe.sync()
        if i >= warmup:
            samples.append((time.perf_counter() - start) * 1e6)
    pooled.add_pass(samples)
    return pooled.expected_us


@dataclass
class Pooled:
    """One point (a communication, a matmul) measured in several passes spread over the
    calibration, its runs pooled: a shared machine's communication speed drifts within a
    minute (docs/validation.md, Calibration's design figures), and a point measured in one burst takes the speed of its moment.
    Each pass adds its share of the runs (`fit.precise`); every rank holds the same
    samples, so all ranks stop after the same chunk."""

    passes: int
    samples: list[float] = dataclasses.field(default_factory=list)
    pass_counts: list[int] = dataclasses.field(default_factory=list)
    """How many runs each pass so far added, in order."""

    def add_pass(self, samples: list[float]) -> None:
        self.samples += samples
        self.pass_counts.append(len(samples))

    @property
    def by_pass(self) -> list[list[float]]:
        """The runs of each pass, in order."""
        out, at = [], 0
        for n in self.pass_counts:
            out.append(self.samples[at : at + n])
            at += n
        return out

    @property
    def expected_us(self) -> float:
        """Of a local op (`fit.expected_us`)."""
        return expected_us(self.samples)

    @property
    def comm_mean_us(self) -> float:
        """Of a communication (`fit.comm_mean_us`)."""
        return comm_mean_us(self.samples)


TIMING_CHUNK = 5
"""Communication runs timed between two exchanges of their timings: one all_reduce per
chunk instead of one per run saves most of what each run spends outside its own timing
(a barrier and an exchange), which pays for the runs that `fit.precise` asks for."""


def _group_time_us(probe: Probe, fn: Callable[[], None], *, member: bool = True, warmup: int | None = None,
                   pooled: Pooled | None = None) -> float:  # fmt: skip
    """Expected time of a communication every rank with `member` takes part in: from
    the last member's start to the last member's end (see the module doc). Every rank
    calls this, members or not, since the timings travel in collectives.

    At least `repeats` timed runs; more, while the estimate is loose (see `precise`).
    Every rank holds the same samples (they come out of the all_reduce), so all ranks
    decide to stop after the same chunk of runs (`TIMING_CHUNK`). With `pooled`, one
    pass of a point measured in several: its runs join the earlier passes' and the time
    is that of all of them."""
    pooled = Pooled(1) if pooled is None else pooled
    warmup = probe.warmup if warmup is None else max(warmup, probe.warmup)
    for _ in range(warmup):
        dist.barrier(group=probe.cpu_group)
        if member:
            fn()
        probe.sync()
    samples: list[float] = []
    while not precise(samples, probe.repeats, earlier=pooled.samples, passes=pooled.passes):
        stamps: list[int] = []
        for _ in range(TIMING_CHUNK):
            dist.barrier(group=probe.cpu_group)
            probe.sync()
            start = now_ns() + probe.clock_offset_ns
            if member:
                fn()
            probe.sync()
            end = now_ns() + probe.clock_offset_ns
            # Non-members report the earliest possible times, which never win the max.
            stamps += [start, end] if member else [0, 0]
        t = torch.tensor(stamps, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=probe.cpu_group)
        samples += [(int(t[i + 1]) - int(t[i])) / 1e3 for i in range(0, len(stamps), 2)]
    pooled.add_pass(samples)
    return pooled.comm_mean_us


def comm_op(kind: OpKind, size_bytes: int, rank: int, *, peer: int | None = None, root: int | None = None,
            dtype: Dtype = Dtype.FP32, reduce_op: ReduceOp = ReduceOp.SUM) -> Op:  # fmt: skip
    """A synthetic IR op, as the executor would receive it from a schedule (reductions
    with `reduce_op`)."""
    return Op(
        rank=rank, index=0, kind=kind, name=f"calibrate.{kind.value}", stream="compute", loc=_LOC,
        size_bytes=size_bytes, dtype=dtype, peer=peer, group="world", root=root,
        reduce_op=reduce_op if kind in REDUCING_KINDS else None,
        transport=Transport.NCCL,
    )  # fmt: skip


ROTATION_BYTES = 256 * 2**20
"""Communication is timed on up to 8 sets of distinct buffers, used in turn, with up to
this many bytes in all: in a schedule every op moves its own tensors, which are not in
the caches, and a benchmark that reuses one buffer would measure a warm cache."""


def rotation_count(size_bytes: int) -> int:
    """How many buffer sets `_rotating` uses for messages of size_bytes: also the
    warm-up count, which ranks outside a P2P measurement must match call for call."""
    return max(1, min(8, ROTATION_BYTES // max(size_bytes, 1)))


def _rotating(probe: Probe, make_ops, size_bytes: int):
    """A function running the next of several plans of the ops `make_ops(suffix)` builds,
    each on its own buffers (a fresh pool: the buffers go when the measurement ends)."""
    pool = BufferPool(probe.device, probe.backend, per_op=False)
    count = rotation_count(size_bytes)
    plans = []
    for i in range(count):
        ops = make_ops(f"#{i}")
        plans.append(make_plan(ops, dist.group.WORLD, probe.world_size, tuple(pool.comm(op, probe.world_size) for op in ops),
                               probe.backend, probe.device))  # fmt: skip
    turn = iter(range(1 << 62))
    next_plan = lambda: plans[next(turn) % count]  # noqa: E731
    next_plan.count = count  # callers warm every buffer set once before timing
    return next_plan


def _renamed(op: Op, suffix: str, **changes) -> Op:
    return dataclasses.replace(op, name=op.name + suffix, **changes)


def _collective_runner(probe: Probe, kind: OpKind, size_bytes: int, dtype: Dtype = Dtype.FP32,
                       reduce_op: ReduceOp = ReduceOp.SUM) -> tuple[Callable[[], None], int]:  # fmt: skip
    """A function running one collective of `size_bytes` (nccl-tests size convention) on
    the next of its rotating buffer sets, and its warm-up count (`rotation_count`)."""
    root = 0 if kind in (OpKind.BROADCAST, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER) else None
    op = comm_op(kind, size_bytes, probe.rank, root=root, dtype=dtype, reduce_op=reduce_op)
    next_plan = _rotating(probe, lambda sfx: (_renamed(op, sfx),), size_bytes)

    def run() -> None:
        for work in launch(next_plan()):
            work.wait()

    return run, next_plan.count


def collective_us(probe: Probe, kind: OpKind, size_bytes: int, dtype: Dtype = Dtype.FP32, reduce_op: ReduceOp = ReduceOp.SUM, *,
                  pooled: Pooled | None = None) -> float:  # fmt: skip
    """Time of one collective of `size_bytes` (nccl-tests size convention) on all ranks
    (a reduction with `reduce_op`; with `pooled`: one pass of it, see `Pooled`)."""
    run, warmup = _collective_runner(probe, kind, size_bytes, dtype, reduce_op)
    return _group_time_us(probe, run, warmup=warmup, pooled=pooled)


def _pair_ops(probe: Probe, size_bytes: int) -> tuple[Op, Op]:
    """This rank's send to and recv from the other of ranks 0 and 1."""
    peer = 1 - probe.rank
    return (comm_op(OpKind.SEND, size_bytes, probe.rank, peer=peer), comm_op(OpKind.RECV, size_bytes, probe.rank, peer=peer))


def _outside_pair_us(probe: Probe, size_bytes: int, pooled: Pooled | None) -> float:
    """What ranks other than 0 and 1 do while those two measure: the same calls, as non-members."""
    return _group_time_us(probe, lambda: None, member=False, warmup=rotation_count(size_bytes), pooled=pooled)


def p2p_us(probe: Probe, size_bytes: int, *, pooled: Pooled | None = None) -> float:
    """One-way time of a message between ranks 0 and 1: half a ping-pong (`pooled`: the
    round trips, see `Pooled`)."""
    if probe.rank > 1:
        return _outside_pair_us(probe, size_bytes, pooled) / 2
    send, recv = _pair_ops(probe, size_bytes)
    next_send = _rotating(probe, lambda sfx: (_renamed(send, sfx),), size_bytes)
    next_recv = _rotating(probe, lambda sfx: (_renamed(recv, sfx),), size_bytes)

    def ping_pong() -> None:
        first, second = (next_send(), next_recv()) if probe.rank == 0 else (next_recv(), next_send())
        for plan in (first, second):
            for work in launch(plan):
                work.wait()
            probe.sync()

    return _group_time_us(probe, ping_pong, warmup=next_send.count, pooled=pooled) / 2


def exchange_us(probe: Probe, size_bytes: int, *, pooled: Pooled | None = None) -> float:
    """Time of a batched exchange (isend + irecv both ways) of size_bytes between ranks 0
    and 1 (with `pooled`: one pass of it)."""
    if probe.rank > 1:
        return _outside_pair_us(probe, size_bytes, pooled)
    send, recv = _pair_ops(probe, size_bytes)
    next_plan = _rotating(probe, lambda sfx: (_renamed(send, sfx, batch=0), _renamed(recv, sfx, index=1, batch=0)), size_bytes)

    def exchange() -> None:
        for work in launch(next_plan()):
            work.wait()

    return _group_time_us(probe, exchange, warmup=next_plan.count, pooled=pooled)


def matmul_us(probe: Probe, n: int, dtype: Dtype, *, pooled: Pooled | None = None) -> float:
    """Time of one n x n x n matmul (2 n^3 FLOPs) on this rank's device (with `pooled`:
    one pass of it)."""
    a = torch.randn(n, n, device=probe.device).to(TORCH_DTYPE[dtype])
    b = torch.randn(n, n, device=probe.device).to(TORCH_DTYPE[dtype])
    out = torch.empty(n, n, device=probe.device, dtype=TORCH_DTYPE[dtype])
    return _local_time_us(probe, lambda: torch.mm(a, b, out=out), pooled=pooled)


def warm_up(probe: Probe, side: int, seconds: float) -> None:
    """Keep this rank busy with side x side multiplies for `seconds`, then wait for the
    others (see `CalibrateConfig.warm_up_s`)."""
    a = torch.rand(side, side, device=probe.device)
    out = torch.empty_like(a)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            torch.mm(a, a, out=out)
        probe.sync()
    dist.barrier(group=probe.cpu_group)


COPY_FOOTPRINT_BYTES = 256 * 2**20
"""Copies rotate through distinct buffers up to this many bytes per side, so each copy
starts with cold caches, as copies of distinct tensors in a real schedule do."""


def copy_us(probe: Probe, size_bytes: int, direction: CopyDir, *, pageable: bool = False) -> float:
    """Time of a copy of size_bytes: within device memory (D2D), from a pinned (or
    `pageable`) host buffer to the device (H2D) or back (D2H); on a CPU the "host"
    buffer is ordinary memory too."""
    numel = max(size_bytes // 4, 1)
    buffers = max(1, min(64, COPY_FOOTPRINT_BYTES // max(size_bytes, 1)))
    pinned = direction is not CopyDir.D2D and probe.device.type == "cuda" and not pageable

    def host() -> torch.Tensor:
        return torch.zeros(numel, pin_memory=pinned)  # host memory, whatever the probe's device

    def device() -> torch.Tensor:
        return torch.zeros(numel, device=probe.device)

    src_of, dst_of = {CopyDir.D2D: (device, device), CopyDir.H2D: (host, device), CopyDir.D2H: (device, host)}[direction]
    pairs = [(src_of(), dst_of()) for _ in range(buffers)]
    turn = iter(range(1 << 62))

    def copy() -> None:
        src, dst = pairs[next(turn) % buffers]
        dst.copy_(src, non_blocking=True)

    return _local_time_us(probe, copy)


def launch_overheads_us(probe: Probe) -> tuple[float, float]:
    """Host time to issue a tiny device op, and a tiny async collective."""
    x = torch.zeros(1, device=probe.device)
    n = 200
    probe.sync()
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    kernel_us = (time.perf_counter() - start) * 1e6 / n
    probe.sync()
    samples = []
    for _ in range(probe.warmup + max(probe.repeats, 5)):
        dist.barrier(group=probe.cpu_group)
        start = time.perf_counter()
        work = dist.all_reduce(x, async_op=True)
        samples.append((time.perf_counter() - start) * 1e6)
        work.wait()
    probe.sync()
    return kernel_us, expected_us(samples[probe.warmup :])
