"""Compute ops as real work, sized from the op.

* FLOPs given (`compute F 4GFLOP`): square matrix multiplies whose FLOPs add up to
  the op's (2·n³ each): repeats of a block multiply (`flop_block`: 256 on CPU, 2048 on
  CUDA), or one smaller multiply for small ops, in the op's dtype when it is a floating type (fp32, bf16, fp16, fp64),
  so work runs at the rate the machine model lists for that dtype; other dtypes
  (int8, fp8, ...) run in the device's default float type.
* Explicit duration (`compute F 2ms`, which wins over FLOPs): a matrix multiply
  repeated as many times as the block's timing says fits the duration; on CPU, a
  256 x 256 multiply for the bulk and a 64 x 64 one for the remainder. `time_blocks`
  times the multiplies on this rank while the other ranks time theirs too, so it sees
  the contention of a shared CPU; `compute_timing` agrees on one time per host and
  re-checks it between iterations. Comm threads competing later still stretch
  durations on an oversubscribed CPU, and the run says so (see docs/executor.md).
  `--duration-mode sleep` makes the (CPU) stream sleep instead: exact, but no real work.
* Bytes only (`compute C bytes=1GiB`): a device-memory copy that reads and writes
  size/2 bytes each.

Operands are allocated once per stream at start-up (`Kernels.prepare`).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from commdsl.ir import Dtype, Op
from commdsl.run.config import DurationMode

FLOP_BLOCK_CPU = 256
FLOP_BLOCK_CUDA = 2048
"""Side of the square matmul repeated for FLOP-sized work. Calibration takes the
machine's compute rate (`peak_tflops`) at exactly this side, so a simulated op runs at
the rate the executor's op does (a line fitted over several sizes misses the rate at
any one size, and predicts such ops too fast or too slow). On a GPU a 256 x 256 multiply is launch-bound (a few
microseconds for 34 MFLOP); 2048 x 2048 ones (17 GFLOP) run near the device's rate."""


def flop_block(device_type: str) -> int:
    """The FLOP-sized work's matmul side on a device of this type ("cpu", "cuda")."""
    return FLOP_BLOCK_CUDA if device_type == "cuda" else FLOP_BLOCK_CPU

DURATION_BLOCKS_CPU = (256, 64)
DURATION_BLOCKS_CUDA = (1024,)
"""Sides of the square matmuls repeated for duration-sized work: the first for the
bulk, the second (if any) for the remainder. On CPU the bulk is a 256 x 256 multiply: a
loop of small multiplies calls into torch so often that the calls slow the rank's gloo
threads, an artifact a GPU kernel does not have. The 64 x 64 remainder keeps durations exact to a few microseconds. On a GPU one 1024 x
1024 multiply is large enough that launch overhead does not dominate."""


def compute_threads(device: torch.device) -> int | None:
    """Intra-op threads per compute thread (`Kernels.threads`): 1 on CPU, where every
    stream thread is one engine of the emulated device with its own intra-op team, and
    concurrent teams oversubscribe the cores and wait on each other's barriers (calibrated
    work then takes several times its duration); None (torch's default) where
    OMP_NUM_THREADS says otherwise (torchrun sets 1 for several ranks), and on GPUs."""
    return 1 if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ else None


STABLE_WITHIN = 0.05
STABLE_ATTEMPTS = 5
"""Start-up timing of a duration block is repeated until two timings in a row agree
within STABLE_WITHIN (relative), at most STABLE_ATTEMPTS times (`Kernels.time_blocks`)."""


def _agree(timings: list[float], within: float) -> bool:
    """Whether the (two) timings agree within `within` of the smaller."""
    return len(timings) == 2 and abs(timings[0] - timings[1]) <= within * min(timings)


MATMUL_DTYPES = {Dtype.FP32: torch.float32, Dtype.BF16: torch.bfloat16, Dtype.FP16: torch.float16, Dtype.FP64: torch.float64}
"""Op dtypes whose FLOP-sized work runs as matmuls of that very dtype."""


@dataclass(frozen=True)
class KernelSpec:
    """What one compute op runs."""

    side: int = 0
    """Matmul side (0: no matmul)."""
    dtype: torch.dtype | None = None
    """Matmul element type (None: the device default)."""
    repeats: int = 0
    tail_side: int = 0
    """A second matmul run `tail_repeats` times after the first (0: none)."""
    tail_repeats: int = 0
    copy_bytes: int = 0
    """Memory copy size, for bytes-only compute."""
    sleep_s: float = 0.0
    """Sleep instead of work (duration mode `sleep`)."""


class Kernels:
    """Operands and calibration of one rank's compute."""

    def __init__(self, device: torch.device, mode: DurationMode, threads: int | None = None):
        self.device = device
        self.mode = mode
        self.threads = threads
        """Intra-op threads of every thread running compute (None: torch's default).
        OpenMP keeps this per thread: setting it on the main thread leaves new threads
        at the default (seen: a stream thread's 256 x 256 multiply at twice the speed
        calibration measured)."""
        self.dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        self._operands: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._outputs: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
        self._copy: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.blocks = DURATION_BLOCKS_CPU if device.type == "cpu" else DURATION_BLOCKS_CUDA
        self.flop_block = flop_block(device.type)
        self.cal_us: dict[int, float] = {}
        """Per duration block side, the time of one multiply the ops are sized with (us):
        `calibrate`'s own timing, or the host's agreed one (`compute_timing`)."""

    def set_thread_count(self) -> None:
        """Apply `threads` to the calling thread: first thing on every compute thread."""
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def spec(self, op: Op) -> KernelSpec:
        if op.duration_us is not None:
            if self.mode is DurationMode.SLEEP:
                return KernelSpec(sleep_s=op.duration_us * 1e-6)
            if not self.cal_us:
                return KernelSpec()
            bulk = self.blocks[0]
            if len(self.blocks) == 1:
                return KernelSpec(side=bulk, repeats=max(0, round(op.duration_us / self.cal_us[bulk])))
            reps = int(op.duration_us // self.cal_us[bulk])
            tail = self.blocks[1]
            tail_reps = max(0, round((op.duration_us - reps * self.cal_us[bulk]) / self.cal_us[tail]))
            return KernelSpec(side=bulk, repeats=reps, tail_side=tail, tail_repeats=tail_reps)
        if op.flops:
            dtype = MATMUL_DTYPES.get(op.dtype, self.dtype)
            block = self.flop_block
            block_flops = 2 * block**3
            if op.flops >= block_flops:
                return KernelSpec(side=block, dtype=dtype, repeats=max(1, round(op.flops / block_flops)))
            return KernelSpec(side=max(4, round((op.flops / 2) ** (1 / 3))), dtype=dtype, repeats=1)
        if op.size_bytes:
            return KernelSpec(copy_bytes=max(1, op.size_bytes // 2))
        return KernelSpec()

    def prepare(self, stream: str, spec: KernelSpec) -> None:
        """Allocate what `run(stream, spec)` needs, once."""
        dtype = spec.dtype or self.dtype
        for side in (spec.side, spec.tail_side):
            if side and (side, dtype) not in self._operands:
                g = torch.Generator(device="cpu").manual_seed(side)
                a = torch.rand(side, side, generator=g).to(self.device, dtype)
                self._operands[(side, dtype)] = (a, a.clone())
            if side and (stream, side, dtype) not in self._outputs:
                self._outputs[(stream, side, dtype)] = torch.empty(side, side, device=self.device, dtype=dtype)
        if spec.copy_bytes:
            have = self._copy.get(stream)
            if have is None or have[0].numel() < spec.copy_bytes:
                self._copy[stream] = (torch.zeros(spec.copy_bytes, dtype=torch.uint8, device=self.device),
                                      torch.zeros(spec.copy_bytes, dtype=torch.uint8, device=self.device))  # fmt: skip

    def run(self, stream: str, spec: KernelSpec) -> None:
        """Enqueue (CUDA) or run (CPU) the work on the current stream / thread."""
        if spec.sleep_s:
            time.sleep(spec.sleep_s)
            return
        dtype = spec.dtype or self.dtype
        for side, repeats in ((spec.side, spec.repeats), (spec.tail_side, spec.tail_repeats)):
            if repeats:
                a, b = self._operands[(side, dtype)]
                out = self._outputs[(stream, side, dtype)]
                for _ in range(repeats):
                    torch.mm(a, b, out=out)
        if spec.copy_bytes:
            src, dst = self._copy[stream]
            dst[: spec.copy_bytes].copy_(src[: spec.copy_bytes])

    def calibrate(self, rounds: int = 7, round_us: float = 2000.0) -> float:
        """Time the duration blocks (`time_blocks`) and size duration work from them;
        returns the bulk block's microseconds per multiply."""
        self.cal_us = self.time_blocks(rounds, round_us)
        return self.cal_us[self.blocks[0]]

    def time_blocks(self, rounds: int = 7, round_us: float = 2000.0, *, stable_within: float = STABLE_WITHIN,
                    attempts: int = STABLE_ATTEMPTS) -> dict[int, float]:  # fmt: skip
        """Microseconds of one multiply of each duration block, timed on a compute
        thread: each timing is the median of `rounds` rounds of about `round_us`, and is
        repeated until two in a row agree within `stable_within` (relative), at most
        `attempts` times; the block's time is the median of its timings. A timing
        disturbed by a burst of load elsewhere on the machine is then outvoted."""
        out: dict[int, float] = {}

        def measure() -> None:
            for side in self.blocks:
                timings = [self._time_block(side, self.dtype, rounds, round_us)]
                while len(timings) < attempts and not _agree(timings[-2:], stable_within):
                    timings.append(self._time_block(side, self.dtype, rounds, round_us))
                us = statistics.median(timings)
                out[side] = us if math.isfinite(us) and us > 0 else 1.0

        self._on_compute_thread(measure)
        return out

    def flop_block_tflops(self, dtypes: list[Dtype], rounds: int = 7, round_us: float = 2000.0) -> dict[Dtype, float]:
        """The FLOP block's rate (TFLOP/s) in each of `dtypes` at start-up, as calibration
        measured the machine's `peak_tflops`: so that `commdsl compare` can tell the
        machine's speed that day from the model (a CPU's rate for the same multiply moves
        with its load and clocks)."""
        rates: dict[Dtype, float] = {}

        def measure() -> None:
            for dtype in dtypes:
                us = self._time_block(self.flop_block, MATMUL_DTYPES.get(dtype, self.dtype), rounds, round_us)
                if math.isfinite(us) and us > 0:
                    rates[dtype] = 2.0 * self.flop_block**3 / us / 1e6

        self._on_compute_thread(measure)
        return rates

    def _on_compute_thread(self, fn: Callable[[], None]) -> None:
        """Run fn where compute runs: on CPU, a fresh thread set up as the stream threads
        are (`set_thread_count`); on CUDA, the current stream."""
        if self.device.type == "cuda":
            fn()
            return

        def body() -> None:
            self.set_thread_count()
            fn()

        thread = threading.Thread(target=body, name="commdsl-calibrate")
        thread.start()
        thread.join()

    def _time_block(self, side: int, dtype: torch.dtype, rounds: int, round_us: float) -> float:
        """Microseconds of one side x side multiply in dtype: median of `rounds` rounds of
        about `round_us` each."""
        first = self._time_rounds(side, dtype, 1, 1)  # also warms up
        return self._time_rounds(side, dtype, rounds, max(1, round(round_us / max(first, 1e-3))))

    def _time_rounds(self, side: int, dtype: torch.dtype, rounds: int, reps: int) -> float:
        spec = KernelSpec(side=side, dtype=dtype, repeats=reps)
        self.prepare("calibration", spec)
        samples = []
        for _ in range(rounds + 1):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.run("calibration", spec)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / reps)
            else:
                t0 = time.perf_counter()
                self.run("calibration", spec)
                samples.append((time.perf_counter() - t0) * 1e6 / reps)
        return statistics.median(samples[1:])  # the first round warms caches
