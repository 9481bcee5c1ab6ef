"""Compute ops as real work, sized from the op.

* FLOPs given (`compute F 4GFLOP`): square matrix multiplies whose FLOPs add up to
  the op's (2·n³ each): repeats of a BLOCK×BLOCK multiply, or one smaller multiply for
  small ops, in the op's dtype when it is a floating type (fp32, bf16, fp16, fp64),
  so work runs at the rate the machine model lists for that dtype; other dtypes
  (int8, fp8, ...) run in the device's default float type.
* Explicit duration (`compute F 2ms`, which wins over FLOPs): a small matrix multiply
  repeated as many times as start-up calibration says fits the duration. Calibration
  times the multiply on this rank while the other ranks calibrate too, so it sees the
  contention of a shared CPU; it cannot foresee comm threads competing later, so on
  an oversubscribed CPU durations stretch (see docs/executor.md). `--duration-mode
  sleep` makes the (CPU) stream sleep instead: exact, but no real work.
* Bytes only (`compute C bytes=1GiB`): a device-memory copy that reads and writes
  size/2 bytes each.

Operands are allocated once per stream at start-up (`Kernels.prepare`).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from commdsl.ir import Dtype, Op
from commdsl.run.config import DurationMode

BLOCK = 256
"""Side of the square matmul used for FLOP-sized work."""
CAL_BLOCK_CPU = 64
CAL_BLOCK_CUDA = 1024
"""Side of the square matmul repeated for duration-sized work: small on CPU (about
50 us a repeat), large enough on a GPU that launch overhead does not dominate."""


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
    copy_bytes: int = 0
    """Memory copy size, for bytes-only compute."""
    sleep_s: float = 0.0
    """Sleep instead of work (duration mode `sleep`)."""


class Kernels:
    """Operands and calibration of one rank's compute."""

    def __init__(self, device: torch.device, mode: DurationMode):
        self.device = device
        self.mode = mode
        self.dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        self._operands: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._outputs: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
        self._copy: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.cal_side = CAL_BLOCK_CPU if device.type == "cpu" else CAL_BLOCK_CUDA
        self.cal_us_per_rep = 0.0
        """Measured time of one calibration matmul, microseconds."""

    def spec(self, op: Op) -> KernelSpec:
        if op.duration_us is not None:
            if self.mode is DurationMode.SLEEP:
                return KernelSpec(sleep_s=op.duration_us * 1e-6)
            reps = max(0, round(op.duration_us / self.cal_us_per_rep)) if self.cal_us_per_rep else 0
            return KernelSpec(side=self.cal_side, repeats=reps)
        if op.flops:
            dtype = MATMUL_DTYPES.get(op.dtype, self.dtype)
            block_flops = 2 * BLOCK**3
            if op.flops >= block_flops:
                return KernelSpec(side=BLOCK, dtype=dtype, repeats=max(1, round(op.flops / block_flops)))
            return KernelSpec(side=max(4, round((op.flops / 2) ** (1 / 3))), dtype=dtype, repeats=1)
        if op.size_bytes:
            return KernelSpec(copy_bytes=max(1, op.size_bytes // 2))
        return KernelSpec()

    def prepare(self, stream: str, spec: KernelSpec) -> None:
        """Allocate what `run(stream, spec)` needs, once."""
        dtype = spec.dtype or self.dtype
        if spec.side and (spec.side, dtype) not in self._operands:
            g = torch.Generator(device="cpu").manual_seed(spec.side)
            a = torch.rand(spec.side, spec.side, generator=g).to(self.device, dtype)
            self._operands[(spec.side, dtype)] = (a, a.clone())
        if spec.side and (stream, spec.side, dtype) not in self._outputs:
            self._outputs[(stream, spec.side, dtype)] = torch.empty(spec.side, spec.side, device=self.device, dtype=dtype)
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
        if spec.repeats:
            dtype = spec.dtype or self.dtype
            a, b = self._operands[(spec.side, dtype)]
            out = self._outputs[(stream, spec.side, dtype)]
            for _ in range(spec.repeats):
                torch.mm(a, b, out=out)
        if spec.copy_bytes:
            src, dst = self._copy[stream]
            dst[: spec.copy_bytes].copy_(src[: spec.copy_bytes])

    def calibrate(self, rounds: int = 7, reps: int = 200) -> float:
        """Time one calibration matmul; returns microseconds per repeat (median of rounds).

        On CPU the timing runs on a fresh thread, as the work later runs on stream
        threads (measured on the main thread, the same multiply came out 35% slower
        than on a stream thread)."""
        if self.device.type == "cuda":
            self.cal_us_per_rep = self._time_rounds(rounds, reps)
        else:
            result: list[float] = []
            thread = threading.Thread(target=lambda: result.append(self._time_rounds(rounds, reps)), name="commdsl-calibrate")
            thread.start()
            thread.join()
            self.cal_us_per_rep = result[0] if result else 0.0
        if not math.isfinite(self.cal_us_per_rep) or self.cal_us_per_rep <= 0:
            self.cal_us_per_rep = 1.0
        return self.cal_us_per_rep

    def _time_rounds(self, rounds: int, reps: int) -> float:
        spec = KernelSpec(side=self.cal_side, repeats=reps)
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
