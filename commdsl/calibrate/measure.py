"""Measurements on a live torch.distributed world (needs torch; run under torchrun).

Communication is timed through the executor's own code path (`commdsl.run.comm`), so
a calibrated machine describes exactly the calls `commdsl.run` makes. Every timing is
the median over `repeats` after `warmup` runs; a collective's time is the slowest
rank's (all ranks start after a barrier, and we take the max over ranks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.errors import SourceLoc
from commdsl.ir import Dtype, Op, OpKind, ReduceOp, Transport
from commdsl.run.comm import launch, make_plan
from commdsl.run.tensors import TORCH_DTYPE, BufferPool

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

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _median_time_us(probe: Probe, fn: Callable[[], None], *, reduce_max: bool, warmup: int | None = None) -> float:
    """Median over repeats of fn's wall time; with reduce_max, the slowest rank's time.
    `warmup` untimed runs first (default: the probe's)."""
    warmup = probe.warmup if warmup is None else max(warmup, probe.warmup)
    samples = []
    for i in range(warmup + probe.repeats):
        if reduce_max:
            dist.barrier(group=probe.cpu_group)
        probe.sync()
        start = time.perf_counter()
        fn()
        probe.sync()
        elapsed = (time.perf_counter() - start) * 1e6
        if reduce_max:
            t = torch.tensor([elapsed], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=probe.cpu_group)
            elapsed = float(t.item())
        if i >= warmup:
            samples.append(elapsed)
    return statistics.median(samples)


def comm_op(kind: OpKind, size_bytes: int, rank: int, *, peer: int | None = None, root: int | None = None,
            dtype: Dtype = Dtype.FP32) -> Op:  # fmt: skip
    """A synthetic IR op, as the executor would receive it from a schedule."""
    return Op(
        rank=rank, index=0, kind=kind, name=f"calibrate.{kind.value}", stream="compute", loc=_LOC,
        size_bytes=size_bytes, dtype=dtype, peer=peer, group="world", root=root,
        reduce_op=ReduceOp.SUM if kind in (OpKind.ALL_REDUCE, OpKind.REDUCE, OpKind.REDUCE_SCATTER) else None,
        transport=Transport.NCCL,
    )  # fmt: skip


ROTATION_BYTES = 256 * 2**20
"""Communication is timed on up to 8 sets of distinct buffers, used in turn, with up to
this many bytes in all: in a schedule every op moves its own tensors, which are not in
the caches, and a benchmark that reuses one buffer would measure a warm cache."""


def _rotating(probe: Probe, make_ops, size_bytes: int):
    """A function running the next of several plans of the ops `make_ops(suffix)` builds,
    each on its own buffers (a fresh pool: the buffers go when the measurement ends)."""
    pool = BufferPool(probe.device, probe.backend, per_op=False)
    count = max(1, min(8, ROTATION_BYTES // max(size_bytes, 1)))
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


def collective_us(probe: Probe, kind: OpKind, size_bytes: int, dtype: Dtype = Dtype.FP32) -> float:
    """Time of one collective of `size_bytes` (nccl-tests size convention) on all ranks."""
    root = 0 if kind in (OpKind.BROADCAST, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER) else None
    op = comm_op(kind, size_bytes, probe.rank, root=root, dtype=dtype)
    next_plan = _rotating(probe, lambda sfx: (_renamed(op, sfx),), size_bytes)

    def run() -> None:
        for work in launch(next_plan()):
            work.wait()

    return _median_time_us(probe, run, reduce_max=True, warmup=next_plan.count)


def p2p_us(probe: Probe, size_bytes: int) -> float:
    """One-way time of a message between ranks 0 and 1: half a ping-pong."""
    if probe.rank > 1:
        return _median_time_us(probe, lambda: None, reduce_max=True)
    peer = 1 - probe.rank
    send = comm_op(OpKind.SEND, size_bytes, probe.rank, peer=peer)
    recv = comm_op(OpKind.RECV, size_bytes, probe.rank, peer=peer)
    next_send = _rotating(probe, lambda sfx: (_renamed(send, sfx),), size_bytes)
    next_recv = _rotating(probe, lambda sfx: (_renamed(recv, sfx),), size_bytes)

    def ping_pong() -> None:
        first, second = (next_send(), next_recv()) if probe.rank == 0 else (next_recv(), next_send())
        for plan in (first, second):
            for work in launch(plan):
                work.wait()
            probe.sync()

    return _median_time_us(probe, ping_pong, reduce_max=True, warmup=next_send.count) / 2


def exchange_us(probe: Probe, size_bytes: int) -> float:
    """Time of a batched exchange (isend + irecv both ways) of size_bytes between ranks 0 and 1."""
    if probe.rank > 1:
        return _median_time_us(probe, lambda: None, reduce_max=True)
    peer = 1 - probe.rank
    send = comm_op(OpKind.SEND, size_bytes, probe.rank, peer=peer)
    recv = comm_op(OpKind.RECV, size_bytes, probe.rank, peer=peer)
    next_plan = _rotating(probe, lambda sfx: (_renamed(send, sfx, batch=0), _renamed(recv, sfx, index=1, batch=0)), size_bytes)

    def exchange() -> None:
        for work in launch(next_plan()):
            work.wait()

    return _median_time_us(probe, exchange, reduce_max=True, warmup=next_plan.count)


def matmul_us(probe: Probe, n: int, dtype: Dtype) -> float:
    """Time of one n x n x n matmul (2 n^3 FLOPs) on this rank's device."""
    a = torch.randn(n, n, device=probe.device).to(TORCH_DTYPE[dtype])
    b = torch.randn(n, n, device=probe.device).to(TORCH_DTYPE[dtype])
    out = torch.empty(n, n, device=probe.device, dtype=TORCH_DTYPE[dtype])
    return _median_time_us(probe, lambda: torch.mm(a, b, out=out), reduce_max=False)


COPY_FOOTPRINT_BYTES = 256 * 2**20
"""Copies rotate through distinct buffers up to this many bytes per side, so each copy
starts with cold caches, as copies of distinct tensors in a real schedule do."""


def copy_us(probe: Probe, size_bytes: int, *, host_to_device: bool) -> float:
    """Time of a device-memory copy (or a pinned host-to-device copy) of size_bytes."""
    numel = max(size_bytes // 4, 1)
    buffers = max(1, min(64, COPY_FOOTPRINT_BYTES // max(size_bytes, 1)))
    pinned = host_to_device and probe.device.type == "cuda"
    pairs = [
        (torch.zeros(numel, pin_memory=True) if pinned else torch.zeros(numel, device=probe.device),
         torch.zeros(numel, device=probe.device))
        for _ in range(buffers)
    ]  # fmt: skip
    turn = iter(range(1 << 62))

    def copy() -> None:
        src, dst = pairs[next(turn) % buffers]
        dst.copy_(src, non_blocking=True)

    return _median_time_us(probe, copy, reduce_max=False)


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
    return kernel_us, statistics.median(samples[probe.warmup :])


def slowdown_under_comm(probe: Probe, n: int, comm_bytes: int, pool: BufferPool) -> float:
    """Matmul time while an all_reduce runs concurrently, over the matmul time alone."""
    alone = matmul_us(probe, n, Dtype.FP32)
    op = comm_op(OpKind.ALL_REDUCE, comm_bytes, probe.rank)
    plan = make_plan((op,), dist.group.WORLD, probe.world_size, (pool.comm(op, probe.world_size),), probe.backend, probe.device)
    a = torch.randn(n, n, device=probe.device)
    b = torch.randn(n, n, device=probe.device)
    ratios = []
    for _ in range(probe.repeats):
        dist.barrier(group=probe.cpu_group)
        works = launch(plan)
        probe.sync()
        start = time.perf_counter()
        torch.mm(a, b)
        probe.sync()
        during = (time.perf_counter() - start) * 1e6
        for w in works:
            w.wait()
        ratios.append(during / alone)
    return max(statistics.median(ratios), 1.0)


def comm_slowdown_under_compute(probe: Probe, n: int, comm_bytes: int, pool: BufferPool) -> float:
    """All_reduce time while a loop of n x n matmuls runs on every rank, over its time
    alone (both the slowest rank's median). The loop runs in a Python thread (torch
    releases the GIL in mm; on CUDA on its own stream, so timing the all_reduce waits
    only for the main thread's stream); it is stopped and joined before returning."""
    alone = collective_us(probe, OpKind.ALL_REDUCE, comm_bytes)
    op = comm_op(OpKind.ALL_REDUCE, comm_bytes, probe.rank)
    plan = make_plan((op,), dist.group.WORLD, probe.world_size, (pool.comm(op, probe.world_size),), probe.backend, probe.device)
    a = torch.randn(n, n, device=probe.device)
    b = torch.randn(n, n, device=probe.device)
    out = torch.empty(n, n, device=probe.device)
    side = torch.cuda.Stream(probe.device) if probe.device.type == "cuda" else None
    stop, running = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def matmul_loop() -> None:
        try:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                while not stop.is_set():
                    torch.mm(a, b, out=out)
                    if side is not None:
                        side.synchronize()  # one matmul in flight at a time: stops promptly
                    running.set()
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)
        finally:
            running.set()

    def timed_all_reduce() -> float:
        dist.barrier(group=probe.cpu_group)
        start = time.perf_counter()
        for work in launch(plan):
            work.wait()
        if side is not None:
            torch.cuda.current_stream(probe.device).synchronize()  # not the matmul stream
        t = torch.tensor([(time.perf_counter() - start) * 1e6], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=probe.cpu_group)
        return float(t.item())

    probe.sync()
    thread = threading.Thread(target=matmul_loop, name="calibrate-matmul-loop", daemon=True)
    thread.start()
    try:
        running.wait()
        samples = [timed_all_reduce() for _ in range(probe.warmup + probe.repeats)][probe.warmup :]
    finally:
        stop.set()
        thread.join()
    probe.sync()
    if errors:
        raise errors[0]
    return max(statistics.median(samples) / alone, 1.0)
