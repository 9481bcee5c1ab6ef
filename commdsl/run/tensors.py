"""Buffers: allocated once, from the schedule's sizes and dtypes, reused every iteration.

Each communication op gets an input and/or output buffer laid out as its torch call
needs it (n = group size, N = elements of `size_bytes`, the op's largest buffer):

    send                 in N                 recv            out N
    broadcast, reduce,   in-place N           all_gather      in N/n, out N
    all_reduce                                reduce_scatter  in N,   out N/n
    gather               in N/n, out N (root) scatter         in N (root), out N/n
    all_to_all           in N, out N          barrier         none

Buffers are shared by ops that name the same tensor in the same role with the same
dtype and size (so a loop that all-reduces `grad[b]` every step reuses one buffer).
With `--check` (or `--values`/`--dump-values`) every op gets buffers of its own, so the
values of each op can be filled before the iteration and verified after it.

Copies (`copy x 1MiB from host`) get a host buffer and a device buffer; on CUDA the
host side is pinned memory so the copy is a real asynchronous DMA. A copy to another
rank (`copy x 1MiB to 2`) gets its source buffer here; the buffer it writes is the
destination's (its *landing buffer*, `landings`), opened at start-up by
`commdsl.run.peer`, which builds on this module.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from commdsl.errors import ScheduleError
from commdsl.ir import REDUCING_KINDS, CopyDir, Dtype, HostMemory, Op, OpKind, Program

TORCH_DTYPE: dict[Dtype, torch.dtype] = {
    Dtype.BF16: torch.bfloat16, Dtype.FP16: torch.float16, Dtype.FP32: torch.float32,
    Dtype.FP64: torch.float64, Dtype.FP8: torch.float8_e4m3fn, Dtype.INT8: torch.int8,
    Dtype.UINT8: torch.uint8, Dtype.INT16: torch.int16, Dtype.INT32: torch.int32,
    Dtype.INT64: torch.int64, Dtype.BOOL: torch.bool,
}  # fmt: skip

_GLOO_UNSUPPORTED = frozenset({Dtype.FP8, Dtype.INT16})
"""dtypes gloo rejects; moved as raw bytes (uint8 views) when no reduction is involved."""


@dataclass
class CommBuffers:
    """The tensors one comm op passes to torch.distributed (None where unused)."""

    inp: torch.Tensor | None
    """What this rank contributes: send buffer, collective input (in-place: same as out)."""
    out: torch.Tensor | None
    """Where results land: recv buffer, collective output."""


@dataclass
class CopyBuffers:
    src: torch.Tensor
    dst: torch.Tensor


def wire_dtype(dtype: Dtype, backend: str) -> torch.dtype:
    """The dtype handed to torch.distributed (a uint8 view for types gloo lacks)."""
    if backend == "gloo" and dtype in _GLOO_UNSUPPORTED:
        return torch.uint8
    return TORCH_DTYPE[dtype]


def check_supported(op: Op, backend: str) -> None:
    if backend == "gloo" and op.kind in REDUCING_KINDS and op.dtype in _GLOO_UNSUPPORTED:
        raise ScheduleError(
            f"{op.label}: gloo cannot reduce {op.dtype.value} tensors", op.loc, rank=op.rank,
            hint="run on NCCL (GPU), or give the op another dtype (dtype=fp32)",
        )  # fmt: skip


def layout(op: Op, group_size: int) -> tuple[int | None, int | None, bool]:
    """(input elements, output elements, in_place) of a comm op on its rank; None = no buffer."""
    numel = op.size_bytes // op.dtype.itemsize
    chunk = numel // max(group_size, 1)
    kind = op.kind
    if kind is OpKind.SEND:
        return numel, None, False
    if kind is OpKind.RECV:
        return None, numel, False
    if kind in (OpKind.BROADCAST, OpKind.REDUCE, OpKind.ALL_REDUCE):
        return numel, numel, True
    if kind is OpKind.ALL_GATHER:
        return chunk, numel, False
    if kind is OpKind.REDUCE_SCATTER:
        return numel, chunk, False
    if kind is OpKind.GATHER:
        return chunk, (numel if op.rank == op.root else None), False
    if kind is OpKind.SCATTER:
        return (numel if op.rank == op.root else None), chunk, False
    if kind is OpKind.ALL_TO_ALL:
        return numel, numel, False
    return None, None, False  # barrier


class BufferPool:
    """Allocates the buffers of one rank's ops on its device, once."""

    def __init__(self, device: torch.device, backend: str, per_op: bool):
        self.device = device
        self.backend = backend
        self.per_op = per_op
        self._cache: dict[tuple, torch.Tensor] = {}
        self.total_bytes = 0

    def _tensor(self, key: tuple, numel: int, dtype: torch.dtype, *, pinned: bool = False, host: bool = False) -> torch.Tensor:
        t = self._cache.get(key)
        if t is None:
            device = torch.device("cpu") if host else self.device
            pin = pinned and self.device.type == "cuda"
            t = torch.zeros(numel, dtype=dtype, device=device, pin_memory=pin)
            self._cache[key] = t
            self.total_bytes += t.numel() * t.element_size()
        return t

    def _key(self, op: Op, role: str, numel: int) -> tuple:
        return (op.index,) if self.per_op else (op.name, role, op.dtype, numel)

    def comm(self, op: Op, group_size: int) -> CommBuffers:
        n_in, n_out, in_place = layout(op, group_size)
        dtype = wire_dtype(op.dtype, self.backend)
        scale = op.dtype.itemsize if dtype == torch.uint8 and op.dtype.itemsize > 1 else 1
        if in_place:
            t = self._tensor(self._key(op, "inout", n_in) + ("inout",), n_in * scale, dtype)
            return CommBuffers(t, t)
        inp = None if n_in is None else self._tensor(self._key(op, "in", n_in) + ("in",), n_in * scale, dtype)
        out = None if n_out is None else self._tensor(self._key(op, "out", n_out) + ("out",), n_out * scale, dtype)
        return CommBuffers(inp, out)

    def peer_source(self, op: Op) -> torch.Tensor:
        """The device buffer a copy to another rank reads."""
        numel = op.size_bytes // op.dtype.itemsize
        return self._tensor(self._key(op, "dev", numel) + ("dev",), numel, TORCH_DTYPE[op.dtype])

    def copy(self, op: Op) -> CopyBuffers:
        numel = op.size_bytes // op.dtype.itemsize
        dtype = TORCH_DTYPE[op.dtype]
        # A pageable buffer is ordinary host memory: on a GPU the copy then goes through
        # the driver's staging buffers and blocks the host (the executor waits for it).
        pinned = op.host_memory is not HostMemory.PAGEABLE
        role = "host" if pinned else "host-pageable"
        host_side = self._tensor(self._key(op, role, numel) + (role,), numel, dtype, pinned=pinned, host=True)
        dev_a = self._tensor(self._key(op, "dev", numel) + ("dev",), numel, dtype)
        if op.copy_dir is CopyDir.H2D:
            return CopyBuffers(host_side, dev_a)
        if op.copy_dir is CopyDir.D2H:
            return CopyBuffers(dev_a, host_side)
        dev_b = self._tensor(self._key(op, "dev2", numel) + ("dev2",), numel, dtype)
        return CopyBuffers(dev_a, dev_b)


class DeclaredMemory:
    """The buffers one rank's `alloc` / `free` ops hold, allocated for real on its device
    (`torch.empty`: on a GPU the caching allocator hands out device memory; on a CPU the
    pages are reserved, not touched), and their accounting: live bytes, the peak, and
    what is live at the peak. Stream threads allocate and free concurrently (CPU), so
    the accounting takes a lock."""

    def __init__(self, device: torch.device):
        self.device = device
        self._lock = threading.Lock()
        self._live: dict[str, torch.Tensor] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live_at_peak: list[tuple[str, int]] = []
        """(name, bytes) of every buffer live when the peak was reached."""

    def alloc(self, op: Op) -> None:
        tensor = torch.empty(op.size_bytes, dtype=torch.uint8, device=self.device)
        with self._lock:
            self._live[op.name] = tensor
            self.live_bytes += op.size_bytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
                self.live_at_peak = [(name, t.numel()) for name, t in self._live.items()]

    def free(self, op: Op) -> None:
        with self._lock:
            tensor = self._live.pop(op.name)
            self.live_bytes -= tensor.numel()

    def release_all(self) -> None:
        """End of the program: whatever it did not free goes (weights, optimizer state...)."""
        with self._lock:
            self._live.clear()
            self.live_bytes = 0

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.live_bytes
            self.live_at_peak = []


@dataclass(frozen=True)
class Landing:
    """One buffer of a rank that peer copies write."""

    rank: int
    """The rank that holds it (the copies' destination)."""
    key: tuple
    """What tells it apart on its rank: (name, dtype, elements), or with per-op buffers
    (`--check`) the copy's (source rank, op index)."""
    dtype: Dtype
    numel: int


def landing_key(op: Op, per_op: bool) -> tuple:
    """The key of the landing buffer peer copy `op` writes (see `Landing.key`)."""
    if per_op:
        return (op.rank, op.index)
    return (op.dest, op.dtype.value, op.size_bytes // op.dtype.itemsize)


def landings(program: Program, per_op: bool) -> dict[int, list[Landing]]:
    """Per destination rank, its landing buffers in Program order: every rank computes the
    same lists, so list positions name the buffers in the store."""
    out: dict[int, list[Landing]] = {}
    seen: set[tuple[int, tuple]] = set()
    for op in program.all_ops():
        if not op.is_peer_copy:
            continue
        key = landing_key(op, per_op)
        if (op.peer, key) not in seen:
            seen.add((op.peer, key))
            out.setdefault(op.peer, []).append(Landing(op.peer, key, op.dtype, op.size_bytes // op.dtype.itemsize))
    return out


def estimate_bytes(program: Program, rank: int, per_op: bool) -> int:
    """Upper bound of the bytes one rank allocates for comm and copy buffers, and for the
    buffers other ranks copy into."""
    seen: set[tuple] = set()
    total = 0
    for op in program.ops[rank]:
        if op.kind.is_comm or op.kind is OpKind.COPY:
            key = (op.index,) if per_op else (op.kind, op.name, op.dtype, op.size_bytes)
            if key not in seen:
                seen.add(key)
                total += op.size_bytes if op.is_peer_copy else 3 * op.size_bytes if op.kind is OpKind.COPY else 2 * op.size_bytes
    return total + sum(land.numel * land.dtype.itemsize for land in landings(program, per_op).get(rank, []))


def declared_peak_bytes(program: Program, rank: int) -> int:
    """Peak of one rank's declared buffers (`alloc`/`free`) in program order: what its
    `DeclaredMemory` holds at most when each stream runs its own ops in order."""
    live = peak = 0
    for op in program.ops[rank]:
        if op.kind is OpKind.ALLOC:
            live += op.size_bytes
            peak = max(peak, live)
        elif op.kind is OpKind.FREE:
            live -= op.size_bytes
    return peak
