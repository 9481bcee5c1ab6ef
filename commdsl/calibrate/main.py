"""`torchrun --nproc_per_node=N -m commdsl.calibrate --out machine.yaml`.

(`--from-nccl-tests LOG...` instead fits a GPU cluster's machine file to the nccl-tests
logs of it, without torch: `commdsl.calibrate.nccl_tests`.)

Measures this machine (compute rate per dtype, memory and host-link bandwidth, host
issue overheads, P2P latency and bandwidth, every collective over sizes, compute
slowdown while communication runs), fits the machine model's parameters, prints the fit
quality, and writes a machine description `commdsl simulate --machine FILE` reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml
from rich.console import Console
from rich.table import Table

from commdsl.calibrate.fit import LinearFit, StepFit, comm_mean_us, expected_us, fit_linear, fit_steps, monotone, pass_ratios
from commdsl.dsl.values import ValueFault, format_bytes, parse_quantity, Unit
from commdsl.errors import CommdslError, UsageError, require_output_folder
from commdsl.ir import CopyDir, Dtype, OpKind, ReduceOp
from commdsl.limits import MIN_BANDWIDTH_GB_PER_S
from commdsl.machine.model import ANY_DTYPE, Calibration
from commdsl.progress import Progress
from commdsl.run.cli import UsageParser
from commdsl.run.launch import ArgumentRecorder
from commdsl.sim.collectives import DEFAULT_ALGO, plan

if TYPE_CHECKING:
    from commdsl.calibrate.executor_probes import NoiseResult, Overlap, OverlapPieces

COLLECTIVES = (
    OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.BROADCAST,
    OpKind.REDUCE, OpKind.ALL_TO_ALL, OpKind.GATHER, OpKind.SCATTER,
)  # fmt: skip
REDUCED_DTYPES = (Dtype.BF16,)
"""Reductions are also timed in these dtypes: a reduction's cost depends on the element
type (gloo reduces bf16 far slower per byte than fp32 on a CPU)."""
REDUCING = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.REDUCE)
AVERAGING = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER)
"""Reductions also timed with op=avg, in fp32 and REDUCED_DTYPES: data parallelism
averages gradients with them (DDP, FSDP), and gloo's avg costs more than its sum
(docs/validation.md, Calibration's design figures)."""
PASSES = 3
"""Compute rates and communication are measured in this many passes over every series
and size, each point's runs pooled (`measure.Pooled`): a point then averages the
machine's speed over the calibration instead of taking that of the few seconds it was
measured in (docs/validation.md, Calibration's design figures)."""
PASS_DRIFT_WARN = 0.15
"""calibrate warns when one pass ran this much slower than another (`fit.pass_ratios`):
a shared machine's speed moves between a calibration and the runs after it (docs/validation.md, Calibration's design figures)."""
REPEATS = 30
"""Timed runs per point at least, over its passes (`--repeats`)."""
NOISE_PIECES = 3
"""The compute-stall probe runs in this many pieces (`executor_probes.PROBE_ITERS`
iterations each), and the piece with the median stall rate is the machine's."""
OVERLAP_PIECES = 3
"""Each overlap probe runs in this many pieces (`executor_probes.OVERLAP_ITERS`
iterations each), round robin over OVERLAP_OPS, and each factor is the median over the
pieces (`executor_probes.OverlapPieces`)."""
CHUNK_BYTES = 512 * 1024
"""Pipelining chunk of chain collectives written to the machine (NCCL's default)."""
SLOWDOWN_SIZE_BYTES = 16 * 2**20
"""Compute's slowdown under communication, and communication's under compute, are
measured over an all_reduce of this size (or the largest calibrated size below it): the
bucket and activation sizes of typical schedules (the slowdowns shrink as sizes grow). Copies' mutual slowdowns with compute are measured on copies from
host of this size (or the largest calibrated)."""
OVERLAP_OPS: tuple[tuple[OpKind, Dtype | None], ...] = (
    (OpKind.ALL_REDUCE, Dtype.FP32), (OpKind.ALL_REDUCE, Dtype.BF16), (OpKind.REDUCE_SCATTER, Dtype.FP32),
    (OpKind.REDUCE_SCATTER, Dtype.BF16), (OpKind.ALL_GATHER, None), (OpKind.SEND, None),
)  # fmt: skip
"""Comm ops whose interference with compute is measured inside the executor, at
SLOWDOWN_SIZE_BYTES (dtype None: any; SEND: a send/recv pair, written for both kinds).
The fp32 all_reduce's factors are the machine-wide ones, for every op not listed: what
an op costs the cores differs (a bf16 reduction is CPU-bound on a CPU, an all_gather
mostly copies), so the ops of the bundled schedules get their own."""
OVERLAP_MIN_COMPUTE_US = 10_000.0
"""The overlap probe's compute ops run at least this long, and at least 4x the comm op
alone, so they outlast it slowed."""
PEER_COPY_MAX_BYTES = 64 * 2**20
"""Largest peer copy the peer-copy probe times: each size has its buffer on both ranks
(on CPU in /dev/shm), and a copy's rate is flat well before this."""
STORE_TIMEOUT_S = 120.0
"""How long a rank waits for a key of the rendezvous store (another rank's buffer)."""
NOISE_MSG_BYTES = 4 * 2**20
"""Message size of the compute-stall probe (`commdsl.calibrate.executor_probes.STALL_PROBE`), or the
largest calibrated size below it."""


@dataclass(frozen=True)
class Effort:
    """How much calibrate measures beyond the sizes and repeats of its options."""

    passes: int
    """Passes over every series and size (`PASSES`)."""
    averaging: tuple[OpKind, ...]
    """Reductions also timed with op=avg (`AVERAGING`)."""
    overlap_ops: tuple[tuple[OpKind, Dtype | None], ...]
    """Comm ops whose interference with compute is probed (`OVERLAP_OPS`)."""
    overlap_pieces: int
    noise_pieces: int
    max_size: str
    """--max-size where the command line gives none."""
    repeats: int
    """--repeats where the command line gives none."""
    matmul_sizes_cpu: tuple[int, ...]
    """Matmul sides on a CPU where --matmul-sizes gives none (on GPUs: 1024..8192)."""
    rough: bool
    """The file is a first try, and says so (`--quick`)."""


FULL = Effort(PASSES, AVERAGING, OVERLAP_OPS, OVERLAP_PIECES, NOISE_PIECES, "256MiB", REPEATS, (64, 128, 256, 384, 512), rough=False)
QUICK = Effort(1, (), ((OpKind.ALL_REDUCE, Dtype.FP32),), 1, 1, "16MiB", 10, (128, 256, 512), rough=True)
"""`--quick`: one pass, sizes up to 16 MiB, 10 runs a point, no avg reductions, one piece
of the interference probe (the fp32 all_reduce's machine-wide factors and copies') and of
the compute-stall probe. A rough machine file for a first comparison (see docs/executor.md
for how long each takes); it says so in its `doc`."""


ROUGH_DOC = "ROUGH (quick calibration: one pass, small sizes, few runs): "
"""Starts the `doc` of a machine file written with --quick, and a line of its header."""


@dataclass(frozen=True)
class CalibrateConfig:
    out: str
    """Machine file to write."""
    raw: str | None
    """Optional JSON file for the raw expected times, to re-fit or plot later."""
    name: str
    """Machine name recorded in the file."""
    min_size_bytes: int
    max_size_bytes: int
    size_factor: int
    """Consecutive sizes differ by this factor (4: 1K, 4K, 16K ...)."""
    repeats: int
    warmup: int
    backend: str
    """"auto", "gloo" or "nccl"."""
    matmul_sizes: tuple[int, ...]
    """Square matmul sizes n (2 n^3 FLOPs) used to fit the compute rate."""
    warm_up_s: float = 0.0
    """Seconds of load before measuring (`measure.warm_up`): a CPU that has idled
    can run the same multiply slower than one that has been busy (clocks, caches), so a
    warm-up makes the first calibration measure what the runs after it see."""
    from_nccl_tests: tuple[str, ...] = ()
    """nccl-tests logs to fit a machine file to (`commdsl.calibrate.nccl_tests`), instead of measuring."""
    base_machine: str | None = None
    """With `from_nccl_tests`: the preset or file whose topology the cluster has."""
    nccl_algo: str | None = None
    """With `from_nccl_tests`: NCCL_ALGO of the runs whose logs do not say."""
    nccl_proto: str | None = None
    check: bool = False
    """With `from_nccl_tests`: time the logs on the base machine as it is and report each
    size's error, fitting and writing nothing."""
    effort: Effort = FULL
    """`FULL`, or `QUICK` with --quick."""


def _size(text: str, flag: str) -> int:
    try:
        q = parse_quantity(text)
    except ValueFault as e:
        raise UsageError(f"{flag}: {e}") from None
    if q.unit is not Unit.SIZE or q.value < 1:
        raise UsageError(f"{flag} takes a size such as 1KiB or 256MiB, got {text!r}")
    return int(q.value)


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="torchrun --nproc_per_node=N -m commdsl.calibrate", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter, help_command="python -m commdsl.calibrate --help")  # fmt: skip
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Calibrate's options (also `commdsl calibrate`'s); returns the actions added, in order."""
    add = ArgumentRecorder(p)
    add("--out", help="machine description to write (YAML); needed but with --check")
    add("--quick", action="store_true",
        help="a rough machine file for a first try, in a minute or two on a small machine: one pass, sizes up to 16MiB, "
             "10 runs a point, the interference and stall probes once; the file says it is rough")  # fmt: skip
    add("--name", default="calibrated", help="machine name in the file")
    add("--raw", metavar="OUT.json", help="also write the raw medians (microseconds) as JSON")
    add("--min-size", default="1KiB", help="smallest message (default 1KiB)")
    add("--max-size", default=None, help=f"largest message (default {FULL.max_size}; {QUICK.max_size} with --quick)")
    add("--size-factor", type=int, default=4, help="ratio between consecutive sizes (default 4)")
    # gloo on a small shared CPU stalls for a scheduler slice (milliseconds) in a good
    # fraction of calls; the expected time keeps that share, and needs enough runs to
    # estimate it: with too few, a point's estimate stops as soon as a few runs happen to
    # agree and moves between calibrations. Communication also takes 0.1 s of runs (`fit.precise`).
    add("--repeats", type=int, default=None, help="timed runs per point at least, over its passes (communication: more, for at least 0.1 s and while the estimate is loose, their mean kept; matmuls: this many per pass, their trimmed mean kept) "
        f"(default {FULL.repeats}; {QUICK.repeats} with --quick)")  # fmt: skip
    add("--warmup", type=int, default=2, help="untimed runs per point (default 2)")
    add("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    add("--matmul-sizes", default="", help="comma-separated n for n x n matmuls (default by device)")
    add("--warm-up", type=float, default=0.0, metavar="SECONDS",
        help="keep every rank busy with matrix multiplies this long before measuring, so that a machine "
             "that was idle is measured at the speed it runs under load (default 0)")  # fmt: skip
    add("--from-nccl-tests", nargs="+", metavar="LOG", default=(),
        help="fit a GPU cluster's NCCL model to these nccl-tests logs, as saved (TOOL=LOG for a log that does not name "
             "its tool, TOOL:GPUS=LOG for a table without nccl-tests' header) instead of measuring; needs no torch")  # fmt: skip
    add("--machine", help="with --from-nccl-tests: base preset or file with the cluster's topology (default: by GPU name); "
        "with one rank: the preset or file whose transports the file takes, which one rank cannot measure "
        "(default: h100-nvlink on a GPU, cpu-loopback on a CPU)")  # fmt: skip
    add("--nccl-algo", help="with --from-nccl-tests: NCCL_ALGO of runs whose logs do not report it (ring, tree, nvls, ...)")
    add("--nccl-proto", help="with --from-nccl-tests: NCCL_PROTO of runs whose logs do not report it (ll, ll128, simple)")
    add("--check", action="store_true",
        help="with --from-nccl-tests: fit nothing; time every size of the logs on --machine (default: by GPU name) as it is "
             "and print the measured and predicted times and the errors")  # fmt: skip
    return add.actions


def parse_args(argv: list[str] | None) -> CalibrateConfig:
    return config_from_args(build_parser().parse_args(argv))


def config_from_args(args: argparse.Namespace) -> CalibrateConfig:
    """Calibrate's settings from parsed options (`add_arguments`), every value checked."""
    if args.check and not args.from_nccl_tests:
        raise UsageError("--check goes with --from-nccl-tests LOG... (it times nccl-tests logs on a machine)")
    if args.out is None and not args.check:
        raise UsageError("the following arguments are required: --out", hint="name the machine file to write: --out machine.yaml")
    if args.out is not None and args.check:
        raise UsageError("--check writes no machine file: leave --out out", hint="drop --check to fit and write one")
    if args.from_nccl_tests:
        return CalibrateConfig(args.out, None, args.name, 0, 0, 0, 0, 0, "auto", (), from_nccl_tests=tuple(args.from_nccl_tests),
                               base_machine=args.machine, nccl_algo=args.nccl_algo, nccl_proto=args.nccl_proto, check=args.check)  # fmt: skip
    effort = QUICK if args.quick else FULL
    repeats = effort.repeats if args.repeats is None else args.repeats
    lo, hi = _size(args.min_size, "--min-size"), _size(args.max_size or effort.max_size, "--max-size")
    if lo > hi:
        raise UsageError(f"--min-size {format_bytes(lo)} is larger than --max-size {format_bytes(hi)}")
    if args.size_factor < 2 or repeats < 1 or args.warmup < 0 or not 0 <= args.warm_up < math.inf:
        raise UsageError(f"--size-factor must be >= 2, --repeats >= 1, --warmup >= 0 and --warm-up a finite number of "
                         f"seconds >= 0; got {args.size_factor}, {repeats}, {args.warmup} and {args.warm_up:g}")  # fmt: skip
    if lo * args.size_factor > hi:  # every fit is a line through the sizes: it needs two
        raise UsageError(f"--min-size {format_bytes(lo)} and --max-size {format_bytes(hi)} with --size-factor {args.size_factor} "
                         "give one message size, and calibrate fits a line through at least two",
                         hint=f"use --max-size {format_bytes(lo * args.size_factor)} or more")  # fmt: skip
    words = [x.strip() for x in args.matmul_sizes.split(",") if x.strip()]
    if not all(w.isascii() and w.isdigit() and len(w) <= 6 and 1 <= int(w) <= MAX_MATMUL_SIDE for w in words):
        raise UsageError(f"--matmul-sizes takes whole numbers from 1 to {MAX_MATMUL_SIDE:,} like 128,256,512, got {args.matmul_sizes!r}")
    mm = tuple(int(w) for w in words)
    require_output_folder("--out", args.out)
    require_output_folder("--raw", args.raw)
    return CalibrateConfig(args.out, args.raw, args.name, lo, hi, args.size_factor, repeats, args.warmup, args.backend, mm,
                           warm_up_s=args.warm_up, effort=effort)  # fmt: skip


MAX_MATMUL_SIDE = 32_768
"""Largest n of --matmul-sizes: an fp32 n x n matmul's three matrices are 12 GiB there."""


def message_sizes(cfg: CalibrateConfig, world_size: int) -> list[int]:
    """Sizes from min to max, each a whole number of fp32 elements per rank."""
    unit = 4 * world_size
    sizes, s = [], cfg.min_size_bytes
    while s <= cfg.max_size_bytes:
        sizes.append(max(unit, s // unit * unit))
        s *= cfg.size_factor
    return sorted(set(sizes))


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
        if cfg.from_nccl_tests:
            from commdsl.calibrate.nccl_tests import main_from_nccl_tests

            return main_from_nccl_tests(list(cfg.from_nccl_tests), cfg.out, cfg.base_machine, cfg.nccl_algo, cfg.nccl_proto, cfg.check)
        return _calibrate(cfg)
    except CommdslError as err:
        print(err.format(), file=sys.stderr)
        return err.exit_code


def _calibrate(cfg: CalibrateConfig) -> int:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UsageError("calibrate measures communication between processes: run it under torchrun",
                         hint="torchrun --nproc_per_node=2 -m commdsl.calibrate --out machine.yaml")  # fmt: skip
    from commdsl.run.launch import torch_required

    with torch_required("torchrun -m commdsl.calibrate"):
        import torch
        import torch.distributed as dist

        from commdsl.calibrate import measure
        from commdsl.run.backend import DistEnv, all_gather_objects, connect_store, hostname
        from commdsl.run.timing import measure_clock

    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("--backend nccl needs CUDA, which this torch cannot see")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    try:
        cpu_group = dist.new_group(backend="gloo")
        # The peer-copy probe exchanges its buffers through the rendezvous store.
        store = dist.PrefixStore("commdsl/calibrate", connect_store(DistEnv.from_environ(world), STORE_TIMEOUT_S, host=False))
        # Collectives are timed from their last member's start to their last member's
        # end, read on rank 0's clock: ranks on other hosts need the offset.
        hosts = all_gather_objects(hostname(), cpu_group, world)
        clock = measure_clock(cpu_group, rank, world, hosts)
        probe = measure.Probe(rank, world, backend, device, cfg.repeats, cfg.warmup, cpu_group, clock.applied_offset_ns, store)
        sizes = message_sizes(cfg, world)
        matmul_sizes = cfg.matmul_sizes or ((1024, 2048, 4096, 8192) if device.type == "cuda" else cfg.effort.matmul_sizes_cpu)
        from commdsl.run.compute import flop_block

        # The compute rate is taken at the executor's FLOP block: always measure it.
        matmul_sizes = tuple(sorted({*matmul_sizes, flop_block(device.type)}))
        dtypes = (Dtype.FP32, Dtype.BF16, Dtype.FP16)
        if cfg.warm_up_s > 0:
            if rank == 0:
                print(f"warming up: {cfg.warm_up_s:g} s of matrix multiplies on every rank", flush=True)
            measure.warm_up(probe, flop_block(device.type), cfg.warm_up_s)
        results = _measure_all(probe, sizes, matmul_sizes, dtypes, measure, cfg.effort)
        if rank == 0:
            machine, report = build_machine(cfg, results, world, backend, device, torch.__version__)
            _print_report(report, results, cfg.effort)
            header = _header(cfg, world, backend, torch.__version__, report, results)
            with open(cfg.out, "w") as f:
                f.write(header + yaml.safe_dump(machine, sort_keys=False))
            if cfg.raw:
                with open(cfg.raw, "w") as f:
                    json.dump(results.to_json(), f, indent=1)
            console = Console(highlight=False)
            console.print(f"wrote {cfg.out}: use it with `commdsl simulate SCHEDULE --machine {cfg.out}`")
            if cfg.effort.rough:
                console.print(f"[yellow]rough[/]: {ROUGH_DOC}calibrate without --quick before trusting predictions from it")
        dist.barrier(group=cpu_group)
    finally:
        dist.destroy_process_group()
    return 0


@dataclass
class Results:
    """Raw expected times (see `fit.expected_us` and `fit.comm_mean_us`), in microseconds."""

    matmul: dict[Dtype, list[tuple[int, float]]]
    copy: list[tuple[int, float]]
    host_copy: list[tuple[int, float]]
    p2p: list[tuple[int, float]]
    exchange: list[tuple[int, float]]
    """Batched exchange: both directions at once."""
    collectives: dict[OpKind, list[tuple[int, float]]]
    reductions_by_dtype: dict[Dtype, dict[OpKind, list[tuple[int, float]]]]
    """Reducing collectives timed in other dtypes than fp32."""
    barrier_us: float
    """Expected time of a barrier (no bytes: one number)."""
    kernel_launch_us: float
    comm_launch_us: float
    skipped: list[str]
    noise: NoiseResult | None = None
    """Compute stalls inside the executor (`commdsl.calibrate.executor_probes`): the
    median of `noise_pieces`."""
    noise_pieces: list[NoiseResult] = dataclasses.field(default_factory=list)
    """The stall probe's pieces (NOISE_PIECES of them)."""
    reductions_by_op: dict[ReduceOp, dict[Dtype, dict[OpKind, list[tuple[int, float]]]]] = dataclasses.field(default_factory=dict)
    """Reducing collectives timed with other ops than sum (AVERAGING), per op and dtype."""
    pass_ratios: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    """Per family ("communication", "matmul"), how fast each pass ran (`fit.pass_ratios`):
    each point's pass over all its runs, the median over points."""
    peer_copy: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """Peer copies (rank 0 into rank 1's memory) inside the executor, per size; empty
    where the probe could not run (`skipped` says why)."""
    to_host_copy: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """Device -> host copies (`host_copy` is host -> device), per size."""
    pageable_copy: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """Host -> device copies from pageable memory, per size (GPUs only: on a CPU every
    buffer is ordinary memory and `host_copy` is the same measurement)."""
    pageable_to_host_copy: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """Device -> host copies into pageable memory, per size (GPUs only)."""
    overlaps: dict[tuple[OpKind, Dtype | None], OverlapPieces] = dataclasses.field(default_factory=dict)
    """Per comm op kind and dtype (None: any), its interference with compute inside the
    executor (`executor_probes.interference`, OVERLAP_PIECES pieces); the fp32
    all_reduce's gives the machine-wide factors, (COPY, None) copies' factors."""

    def _factors(self, kind: OpKind, dtype: Dtype | None) -> tuple[float, float]:
        """(compute's slowdown beside the op, the op's beside compute) from its overlap
        probe; 1.0 each where it was not measured."""
        o = self.overlaps.get((kind, dtype))
        return (o.comm_compute_slowdown, o.compute_comm_slowdown) if o is not None else (1.0, 1.0)

    @property
    def slowdown(self) -> float:
        """Compute's slowdown while an fp32 all_reduce runs (inside the executor)."""
        return self._factors(OpKind.ALL_REDUCE, Dtype.FP32)[0]

    @property
    def comm_slowdown(self) -> float:
        """An fp32 all_reduce's slowdown while compute runs (inside the executor)."""
        return self._factors(OpKind.ALL_REDUCE, Dtype.FP32)[1]

    @property
    def copy_slowdown(self) -> float:
        """Compute's slowdown while a copy from host runs (inside the executor)."""
        return self._factors(OpKind.COPY, None)[0]

    @property
    def copy_slowed(self) -> float:
        """A copy from host's slowdown while compute runs (inside the executor)."""
        return self._factors(OpKind.COPY, None)[1]

    def to_json(self) -> dict:
        return {
            "matmul_us": {d.value: pts for d, pts in self.matmul.items()},
            "copy_us": self.copy,
            "host_copy_us": self.host_copy,
            "to_host_copy_us": self.to_host_copy,
            "pageable_copy_us": self.pageable_copy,
            "pageable_to_host_copy_us": self.pageable_to_host_copy,
            "p2p_us": self.p2p,
            "exchange_us": self.exchange,
            "collectives_us": {k.value: pts for k, pts in self.collectives.items()},
            "reductions_us_by_dtype": {d.value: {k.value: pts for k, pts in by.items()} for d, by in self.reductions_by_dtype.items()},
            "reductions_us_by_op": {o.value: {d.value: {k.value: pts for k, pts in by.items()} for d, by in by_dtype.items()}
                                    for o, by_dtype in self.reductions_by_op.items()},  # fmt: skip
            "barrier_us": self.barrier_us,
            "peer_copy_us": self.peer_copy,
            "kernel_launch_us": self.kernel_launch_us,
            "comm_launch_us": self.comm_launch_us,
            "compute_slowdown_under_comm": self.slowdown,
            "comm_slowdown_under_compute": self.comm_slowdown,
            "compute_slowdown_under_copy": self.copy_slowdown,
            "copy_slowdown_under_compute": self.copy_slowed,
            "skipped": self.skipped,
            "pass_ratios": {family: list(r) for family, r in self.pass_ratios.items()},
            "compute_noise": {**dataclasses.asdict(self.noise), **self.noise.machine_json()} if self.noise is not None else None,
            "compute_noise_pieces": [p.machine_json() for p in self.noise_pieces],
            "interference_by_op": [{"kind": k.value, "dtype": d.value if d else ANY_DTYPE, **_overlap_json(o),
                                    "loop_alone_us": o.loop_alone_us,
                                    "pieces": [{**dataclasses.asdict(p), **_overlap_json(p)} for p in o.pieces]}
                                   for (k, d), o in self.overlaps.items()],  # fmt: skip
        }


def _overlap_json(o: Overlap | OverlapPieces) -> dict[str, float]:
    return {"comm_alone_us": o.comm_alone_us, "comm_beside_us": o.comm_beside_us,
            "compute_comm_slowdown": o.compute_comm_slowdown, "comm_compute_slowdown": o.comm_compute_slowdown}  # fmt: skip


def _measured_at(res: Results, kind: OpKind, dtype: Dtype | None, size: int) -> float | None:
    """The calibrated time of `kind` (in `dtype`) at `size`, if it was measured."""
    if kind.is_p2p:
        points = res.p2p
    elif dtype in (None, Dtype.FP32):
        points = res.collectives.get(kind, [])
    else:
        points = res.reductions_by_dtype.get(dtype, {}).get(kind, [])
    return dict(points).get(size)


def _measure_all(probe, sizes, matmul_sizes, dtypes, measure, effort: Effort) -> Results:
    from commdsl.calibrate.executor_probes import (OverlapPieces, PeerCopyFailed, barrier_us, combine_pieces, compute_noise, interference,
                                                   peer_copy_us)  # fmt: skip

    # Every series measured in passes (label, its sizes, time of one pass at a size), in
    # the order of a pass: matmuls (side n) and communication (bytes). One rank has
    # nothing to communicate with: its compute, copies and launches only.
    single = probe.world_size == 1
    Series = tuple[str, tuple[int, ...], Callable[[int, measure.Pooled], float]]
    pass_series: list[Series] = [
        (f"matmul {dtype.value}", matmul_sizes, lambda n, pooled, dtype=dtype: measure.matmul_us(probe, n, dtype, pooled=pooled))
        for dtype in dtypes
    ]
    pass_series += [] if single else [
        ("p2p", sizes, lambda s, pooled: measure.p2p_us(probe, s, pooled=pooled)),
        ("exchange", sizes, lambda s, pooled: measure.exchange_us(probe, s, pooled=pooled)),
        *((kind.value, sizes, lambda s, pooled, kind=kind: measure.collective_us(probe, kind, s, pooled=pooled)) for kind in COLLECTIVES),
        *((f"{kind.value} {dtype.value}", sizes,
           lambda s, pooled, kind=kind, dtype=dtype: measure.collective_us(probe, kind, s, dtype, pooled=pooled))
          for dtype in REDUCED_DTYPES for kind in REDUCING),
        *((f"{kind.value} {dtype.value} avg", sizes,
           lambda s, pooled, kind=kind, dtype=dtype: measure.collective_us(probe, kind, s, dtype, ReduceOp.AVG, pooled=pooled))
          for dtype in (Dtype.FP32, *REDUCED_DTYPES) for kind in effort.averaging),
    ]  # fmt: skip
    passes = effort.passes
    steps = (passes * sum(len(xs) for _, xs, _ in pass_series) + 2 * len(sizes)
             + effort.overlap_pieces * ((0 if single else len(effort.overlap_ops)) + 1)
             + 3 + effort.noise_pieces)  # fmt: skip
    res = Results({}, [], [], [], [], {}, {}, 0.0, 0.0, 0.0, [])
    with Progress("commdsl calibrate", enabled=probe.rank == 0) as progress:
        progress.phase("calibrating", total=steps, unit="steps")

        def step(what: str) -> None:
            progress.advance(1, description=f"measured {what}")

        res.kernel_launch_us, res.comm_launch_us = measure.launch_overheads_us(probe)
        step("launch overheads")
        def series(label: str, xs, fn) -> list[tuple[int, float]] | None:
            """Measure fn(x) for each x; None if the backend or device lacks the operation."""
            points = []
            for x in xs:
                try:
                    points.append((x, fn(x)))
                except RuntimeError as e:  # e.g. bf16 matmul on an old CPU, a collective gloo lacks
                    res.skipped.append(f"{label}: {str(e).splitlines()[0]}")
                    return None
                finally:
                    step(f"{label} {x}")
            return points if len(points) >= 2 else None

        for s in sizes:
            res.copy.append((s, measure.copy_us(probe, s, CopyDir.D2D)))
            res.host_copy.append((s, measure.copy_us(probe, s, CopyDir.H2D)))
            res.to_host_copy.append((s, measure.copy_us(probe, s, CopyDir.D2H)))
            if probe.device.type == "cuda":
                res.pageable_copy.append((s, measure.copy_us(probe, s, CopyDir.H2D, pageable=True)))
                res.pageable_to_host_copy.append((s, measure.copy_us(probe, s, CopyDir.D2H, pageable=True)))
            step(f"copies {format_bytes(s)}")
            step(f"copies {format_bytes(s)}")
        # `passes` passes over every series and size, each point's runs pooled over the
        # passes (`measure.Pooled`).
        pools = {label: {x: measure.Pooled(passes) for x in xs} for label, xs, _ in pass_series}
        points: dict[str, list[tuple[int, float]] | None] = {}
        for n in range(passes):
            for label, xs, time_us in pass_series:
                if n == 0 or points[label] is not None:
                    points[label] = series(f"{label} (pass {n + 1}/{passes})", xs,
                                           lambda x, label=label, time_us=time_us: time_us(x, pools[label][x]))  # fmt: skip
        matmul_labels = {f"matmul {dtype.value}" for dtype in dtypes}
        complete = {label: [pool.by_pass for pool in by_x.values() if len(pool.pass_counts) == passes] for label, by_x in pools.items()}
        ratios = {
            "communication": pass_ratios([p for label, ps in complete.items() if label not in matmul_labels for p in ps], comm_mean_us),
            "matmul": pass_ratios([p for label in matmul_labels for p in complete[label]], expected_us),
        }
        # A family whose every series was skipped has none; one pass has nothing to compare.
        res.pass_ratios = {family: r for family, r in ratios.items() if r} if passes > 1 else {}
        for dtype in dtypes:
            if points[f"matmul {dtype.value}"]:
                res.matmul[dtype] = points[f"matmul {dtype.value}"]
        if single:
            pass
        elif not points["p2p"] or not points["exchange"]:
            raise CommdslError(f"calibrate could not time point-to-point messages: {'; '.join(res.skipped)}")
        else:
            res.p2p, res.exchange = points["p2p"], points["exchange"]
        for kind in COLLECTIVES:
            if points.get(kind.value):
                res.collectives[kind] = points[kind.value]
        for dtype in REDUCED_DTYPES:
            for kind in REDUCING:
                if points.get(f"{kind.value} {dtype.value}"):
                    res.reductions_by_dtype.setdefault(dtype, {})[kind] = points[f"{kind.value} {dtype.value}"]
        for dtype in (Dtype.FP32, *REDUCED_DTYPES):
            for kind in effort.averaging:
                if points.get(f"{kind.value} {dtype.value} avg"):
                    res.reductions_by_op.setdefault(ReduceOp.AVG, {}).setdefault(dtype, {})[kind] = points[f"{kind.value} {dtype.value} avg"]
        # The barrier and interference are timed inside the executor, with its own threads
        # and compute ops.
        if single:
            res.skipped.append("communication, the barrier and peer copies: one rank has no one to talk to")
        else:
            res.barrier_us = barrier_us(probe)
            try:
                res.peer_copy = peer_copy_us(probe, [s for s in sizes if s <= PEER_COPY_MAX_BYTES] or sizes[:1])
            except PeerCopyFailed as e:
                res.skipped.append(f"peer copy (memcpy keeps the P2P link): {e}")
        step("barrier inside the executor")
        step("peer copies inside the executor")
        size = max([s for s in sizes if s <= SLOWDOWN_SIZE_BYTES], default=sizes[0])

        # (op, dtype, bytes, its loop time alone: it sizes the probe's compute ops and, for
        # comm ops, is the denominator of the op's slowdown), the copy from host last.
        overlap_ops = [(kind, dtype, size, _measured_at(res, kind, dtype, size)) for kind, dtype in effort.overlap_ops
                       if not single and not (kind.is_p2p and probe.world_size % 2)]  # the probe pairs ranks  # fmt: skip
        copy_bytes = min(sizes[-1], SLOWDOWN_SIZE_BYTES)
        overlap_ops.append((OpKind.COPY, None, copy_bytes, dict(res.host_copy)[copy_bytes]))
        # Round robin, so that each op's pieces lie a minute apart and one slow spell of
        # the machine falls on one piece of each op at most.
        pieces: dict[tuple[OpKind, Dtype | None], list[Overlap]] = {}
        for n in range(effort.overlap_pieces):
            for kind, dtype, nbytes, alone_us in overlap_ops:
                if alone_us is not None:
                    piece = interference(probe, kind, dtype, nbytes, max(OVERLAP_MIN_COMPUTE_US, 4 * alone_us))
                    pieces.setdefault((kind, dtype), []).append(piece)
                step(f"{kind.value} {dtype.value if dtype else ''} beside compute ({n + 1}/{effort.overlap_pieces})")
        loop_us = {(kind, dtype): alone_us for kind, dtype, _, alone_us in overlap_ops if kind is not OpKind.COPY}
        res.overlaps = {key: OverlapPieces(tuple(ps), loop_us.get(key)) for key, ps in pieces.items()}
        # Compute stalls last, after minutes of load, as a schedule run after calibration
        # meets them: pieces placed after each pass instead counted 2-9 a second against
        # 3-11 at the end, and predicted 28 of 30 schedules short. In pieces, so that one
        # stall episode is outvoted.
        for n in range(effort.noise_pieces):
            res.noise_pieces.append(compute_noise(probe, min(sizes[-1], NOISE_MSG_BYTES)))
            step(f"compute stalls inside the executor ({n + 1}/{effort.noise_pieces})")
        res.noise = combine_pieces(res.noise_pieces)
    return res


@dataclass(frozen=True)
class FitReport:
    compute: dict[Dtype, LinearFit]
    memory: LinearFit
    host_link: LinearFit
    p2p: LinearFit | None
    """None: one rank, no communication measured (as `exchange`)."""
    exchange: LinearFit | None
    collectives: dict[OpKind, StepFit]
    p2p_model_residuals: dict[OpKind, tuple[float, ...]]
    """Per collective, residuals (%) of the analytic model with the P2P-fitted link."""
    ranks: int
    """The group size the collectives were measured on (the calibration's world)."""
    peer_copy: LinearFit | None = None
    """Peer copies' line (the `memcpy` transport); None: not measured, memcpy has the P2P link."""
    to_host: LinearFit | None = None
    """Device -> host copies' line (`host_link` is host -> device's); None: not measured."""
    transports_from: str | None = None
    """One rank: the preset or file the machine's transports were taken from (not measured)."""


def build_machine(cfg: CalibrateConfig, res: Results, world: int, backend: str, device, torch_version: str) -> tuple[dict, FitReport]:
    """Fit every series and lay out a machine description (commdsl/machine schema)."""
    compute = {d: fit_linear([2.0 * n**3 for n, _ in pts], [t for _, t in pts]) for d, pts in res.matmul.items()}
    # The simulator runs compute at FLOPs / peak_tflops; the executor runs FLOP-sized ops
    # as repeats of one block multiply, so the rate that predicts them is that block's
    # (the fitted line's slope ignores each call's fixed cost and is reported only).
    from commdsl.run.compute import flop_block

    if not res.matmul:
        raise UsageError("no matmul was measured (every dtype's series was skipped, as said above): the machine would have no "
                         "compute rate, so none is written", hint="see the skipped series' reasons; --matmul-sizes")  # fmt: skip
    block = flop_block(device.type)
    block_tflops = {d: 2.0 * block**3 / dict(pts)[block] / 1e6 for d, pts in res.matmul.items()}
    # A copy reads and writes every byte.
    memory = fit_linear([2.0 * s for s, _ in res.copy], [t for _, t in res.copy])
    host_link = fit_linear([float(s) for s, _ in res.host_copy], [t for _, t in res.host_copy])
    to_host = fit_linear([float(s) for s, _ in res.to_host_copy], [t for _, t in res.to_host_copy]) if len(res.to_host_copy) >= 2 else None
    if world == 1:
        return _one_rank_machine(cfg, res, backend, device, torch_version, compute, block_tflops, memory, host_link, to_host)
    p2p = fit_linear([float(s) for s, _ in res.p2p], [t for _, t in res.p2p])
    exchange = fit_linear([float(s) for s, _ in res.exchange], [t for _, t in res.exchange])
    collectives, p2p_resid = {}, {}
    for kind, pts in res.collectives.items():
        plans = [plan(kind, DEFAULT_ALGO[kind], world, s, CHUNK_BYTES) for s, _ in pts]
        ts = [t for _, t in pts]
        collectives[kind] = fit_steps([float(p.latency_steps) for p in plans], [p.serial_bytes for p in plans], ts)
        predicted = [p.latency_steps * p2p.intercept + p.serial_bytes * p2p.slope for p in plans]
        p2p_resid[kind] = tuple(100.0 * (q - t) / t for q, t in zip(predicted, ts))
    link = {"latency_us": round(p2p.intercept, 3), "bandwidth_gb_per_s": _gb_per_s(p2p.rate / 1e3)}
    if backend == "gloo":
        # Over loopback TCP the host's CPUs copy every byte: an exchange moves 2 S in the
        # time measured, and that total is what all of gloo's transfers share.
        link["shared_bandwidth_gb_per_s"] = _gb_per_s(2 * exchange.rate / 1e3)
    # Peer copies, where the probe timed them at two sizes or more: a copy's own line.
    peer_copy = fit_linear([float(s) for s, _ in res.peer_copy], [t for _, t in res.peer_copy]) if len(res.peer_copy) >= 2 else None
    memcpy_link = dict(link) if peer_copy is None else {"latency_us": round(peer_copy.intercept, 3),
                                                        "bandwidth_gb_per_s": _gb_per_s(peer_copy.rate / 1e3)}  # fmt: skip
    by_op: dict[str, dict[str, dict[str, float]]] = {}
    for (kind, dtype), o in res.overlaps.items():
        if (kind, dtype) in ((OpKind.ALL_REDUCE, Dtype.FP32), (OpKind.COPY, None)):
            continue  # the machine-wide factors, and copies' own
        factors = {"comm_compute_slowdown": round(o.comm_compute_slowdown, 3), "compute_comm_slowdown": round(o.compute_comm_slowdown, 3)}
        for k in (OpKind.SEND, OpKind.RECV) if kind.is_p2p else (kind,):
            by_op.setdefault(k.value, {})[dtype.value if dtype else ANY_DTYPE] = factors
    machine = {
        **_device_entries(cfg, res, world, backend, device, torch_version, block_tflops, memory, host_link),
        # The executor runs nccl and gloo ops on the active backend, so both get the
        # measured P2P link; memcpy gets the peer copies' (a copy into the other rank's
        # memory, as the executor runs `copy ... to RANK`). Each collective keeps its own
        # fitted latency per step and bandwidth: real implementations (gloo's above all)
        # are not the textbook ring that a P2P link alone would imply.
        "transports": {
            "nccl": {**link, "collectives": _collective_overrides(collectives, res, world)},
            "gloo": {**link, "collectives": _collective_overrides(collectives, res, world)},
            "memcpy": memcpy_link,
        },
        "chunk_bytes": CHUNK_BYTES,
        "copy_measured_us": _copy_profiles(res),
        # Measured inside the executor: compute's slowdown while an fp32 all_reduce runs.
        "comm_compute_slowdown": round(max(res.slowdown, 1.0), 3),
        # Measured inside the executor: an fp32 all_reduce's slowdown while compute runs.
        "compute_comm_slowdown": round(max(res.comm_slowdown, 1.0), 3),
        # Measured inside the executor: each op's interference with compute (the fp32
        # all_reduce's are the machine-wide factors above).
        **({"interference_by_op": by_op} if by_op else {}),
    }
    machine.update(_host_model_entries(res, device))
    return machine, FitReport(compute, memory, host_link, p2p, exchange, collectives, p2p_resid, world, peer_copy, to_host)


def _device_entries(cfg: CalibrateConfig, res: Results, world: int, backend: str, device, torch_version: str,
                    block_tflops: dict[Dtype, float], memory: LinearFit, host_link: LinearFit) -> dict:
    """The machine file's entries about its devices, host and launches (every world size)."""
    if device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        dev_name, sms = props.name, props.multi_processor_count
    else:
        dev_name, sms = f"{platform.machine()} CPU ({platform.processor() or 'unknown'})", 1
    where = f"{socket.gethostname()}, {world} {backend} rank{'s' if world != 1 else ''}, torch {torch_version}"
    return {
        "name": cfg.name,
        "doc": (ROUGH_DOC if cfg.effort.rough else "") + f"calibrated on {where}",
        "calibration": dataclasses.asdict(Calibration.now("commdsl calibrate", where, quick=cfg.effort.rough)),
        "devices": world,
        "device": {
            "name": dev_name,
            "peak_tflops": {d.value: float(f"{tflops:.6g}") for d, tflops in block_tflops.items()},  # 6 significant digits
            "memory_bandwidth_gb_per_s": _gb_per_s(memory.rate / 1e3),
            "sm_count": sms,
            "kind": "gpu" if device.type == "cuda" else "cpu",
        },
        "kernel_launch_us": round(res.kernel_launch_us, 3),
        "comm_launch_us": round(res.comm_launch_us, 3),
        "host_link": {"latency_us": round(host_link.intercept, 3), "bandwidth_gb_per_s": _gb_per_s(host_link.rate / 1e3)},
    }


def _copy_profiles(res: Results) -> dict[str, list[list]]:
    """Copies run from the caches when small and from memory when large: their measured
    profiles per direction (the host link's line stays for what a profile does not cover)."""
    out = {"host": _table(res.host_copy), "device": _table(res.copy)}
    for key, points in (("to_host", res.to_host_copy), ("pageable", res.pageable_copy), ("pageable_to_host", res.pageable_to_host_copy)):
        if points:
            out[key] = _table(points)
    return out


def _host_model_entries(res: Results, device) -> dict:
    """The CPU-host model's own knobs (threads sharing the cores); none on a GPU, whose
    copies run on copy engines (their measured interference is in the report and --raw)."""
    if device.type == "cuda":
        return {}
    out = {
        # Measured: a matmul loop's time while copies run on every rank, over its time alone.
        "copy_compute_slowdown": round(max(res.copy_slowdown, 1.0), 3),
        # Measured: a copy's time while a matmul loop runs on every rank, over its time alone.
        "compute_copy_slowdown": round(max(res.copy_slowed, 1.0), 3),
    }
    if res.noise is not None:  # compute ops' stalls inside the executor (drawn by `simulate --samples N`)
        out["compute_noise"] = res.noise.machine_json()
    return out


def _one_rank_machine(cfg: CalibrateConfig, res: Results, backend: str, device, torch_version: str, compute: dict[Dtype, LinearFit],
                      block_tflops: dict[Dtype, float], memory: LinearFit, host_link: LinearFit,
                      to_host: LinearFit | None) -> tuple[dict, FitReport]:  # fmt: skip
    """A one-rank calibration's machine: its device, host link, copies and launches as
    measured; its transports, which one rank cannot measure, from the base machine
    (`--machine`, by default `one_rank_base(device)`), and the file says so."""
    from commdsl.machine import resolve_machine

    base_name = cfg.base_machine or one_rank_base(device.type)
    base = resolve_machine(base_name).to_json()
    machine = {
        **_device_entries(cfg, res, 1, backend, device, torch_version, block_tflops, memory, host_link),
        # Not measured (one rank): the base machine's, as its file gives them.
        "transports": base["transports"],
        "chunk_bytes": base.get("chunk_bytes", CHUNK_BYTES),
        "copy_measured_us": _copy_profiles(res),
        **_host_model_entries(res, device),
    }
    report = FitReport(compute, memory, host_link, None, None, {}, {}, 1, None, to_host, transports_from=base_name)
    return machine, report


def one_rank_base(device_type: str) -> str:
    """The preset whose transports a one-rank calibration's file takes where `--machine`
    names none: a one-GPU machine gets a GPU node's, a CPU the loopback host's."""
    return "h100-nvlink" if device_type == "cuda" else "cpu-loopback"


def _table(points: list[tuple[int, float]]) -> list[list]:
    """A measured profile as written: [[size_bytes, time_us], ...], non-decreasing in size (`monotone`)."""
    return [[int(size), round(t, 3)] for size, t in monotone(points)]


def _gb_per_s(rate: float) -> float:
    """A fitted rate as the machine file holds it: rounded, and never below what a machine
    file may give (`MIN_BANDWIDTH_GB_PER_S`): a fit over sizes too small to show a
    bandwidth can come out near zero (the report says which, `_collective_notes`)."""
    return rate if math.isinf(rate) else max(round(rate, 4), MIN_BANDWIDTH_GB_PER_S)


def _collective_overrides(fits: dict[OpKind, StepFit], res: Results, ranks: int) -> dict:
    """Per collective: the fitted line, and the measured points as its profile (the
    simulator interpolates them: real collectives are not linear in size), in fp32 and,
    for reductions, per dtype. Profiles are made non-decreasing in size (`monotone`)."""
    out = {}
    for kind, f in fits.items():
        entry = {
            "latency_us": round(f.latency_us, 3),
            "bandwidth_gb_per_s": _gb_per_s(f.bandwidth_gb_per_s),
            "measured_ranks": ranks,
            "measured_us": _table(res.collectives[kind]),
        }
        by_dtype = {d.value: _table(by[kind]) for d, by in res.reductions_by_dtype.items() if kind in by}
        if by_dtype:
            entry["measured_us_by_dtype"] = by_dtype
        by_op = {o.value: {d.value: _table(by[kind]) for d, by in per_dtype.items() if kind in by} for o, per_dtype in res.reductions_by_op.items()}
        by_op = {o: tables for o, tables in by_op.items() if tables}
        if by_op:
            entry["measured_us_by_op"] = by_op
        out[kind.value] = entry
    if res.barrier_us > 0:
        # A barrier moves no bytes: its measured time spread over its latency steps.
        steps = plan(OpKind.BARRIER, DEFAULT_ALGO[OpKind.BARRIER], ranks, 0, CHUNK_BYTES).latency_steps or 1
        out[OpKind.BARRIER.value] = {"latency_us": round(res.barrier_us / steps, 3), "bandwidth_gb_per_s": math.inf}
    return out


def _header(cfg: CalibrateConfig, world: int, backend: str, torch_version: str, report: FitReport, res: Results) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Machine description written by commdsl.calibrate on {socket.gethostname()}, {now}.",
        *([f"# {ROUGH_DOC}made by `commdsl calibrate --quick`."] if cfg.effort.rough else []),
        f"# {world} rank{'s' if world != 1 else ''}, backend {backend}, torch {torch_version}, sizes {format_bytes(cfg.min_size_bytes)}"
        f"..{format_bytes(cfg.max_size_bytes)}, at least {cfg.repeats} runs a point (in {cfg.effort.passes} pass(es)).",
        (f"# P2P fit: latency {p2p.intercept:.2f} us, {p2p.rate / 1e3:.3f} GB/s, R^2 {p2p.r2:.4f}, "
         f"worst residual {p2p.max_abs_residual_pct:.1f}%." if (p2p := report.p2p) is not None
         else f"# One rank: communication not measured; the transports are {report.transports_from}'s."),
        (f"# Peer copy fit (memcpy): latency {pc.intercept:.2f} us, {pc.rate / 1e3:.3f} GB/s, R^2 {pc.r2:.4f}."
         if (pc := report.peer_copy) is not None else "# Peer copies not measured: memcpy has the P2P link."),
    ]
    if res.pass_ratios:
        lines.append(f"# Passes, time over the pooled time (median over points): {_pass_speeds(res.pass_ratios)}.")
    for kind, fit in report.collectives.items():
        lines.append(f"# {kind.value}: {_step_law(fit, 2)}, R^2 {fit.r2:.4f}, worst residual {fit.max_abs_residual_pct:.1f}%.")
    if report.collectives:
        lines += [f"# {line}" for line in _collective_notes(report)]
    return "\n".join(lines) + "\n"


def _step_law(fit: StepFit, digits: int = 1) -> str:
    """A collective's fitted law in words; `*` marks one without a bandwidth term."""
    if math.isinf(fit.bandwidth_gb_per_s):
        return f"{fit.latency_us:.{digits}f} us/step, no bandwidth term (*)"
    if fit.bandwidth_gb_per_s < MIN_BANDWIDTH_GB_PER_S:
        return f"{fit.latency_us:.{digits}f} us/step + {fit.bandwidth_gb_per_s:.2g} GB/s (**)"
    return f"{fit.latency_us:.{digits}f} us/step + {fit.bandwidth_gb_per_s:.3f} GB/s"


def _collective_notes(report: FitReport) -> list[str]:
    """What the collectives' fits mean, and which law the simulator uses."""
    notes = [
        f"Collectives: groups of {report.ranks} ranks (the size measured) are simulated from the measured times, "
        "interpolated between sizes; the fitted law (steps x latency + bytes / bandwidth, over the steps and bytes "
        "of the collective's plan in commdsl.sim.collectives) times other group sizes only, and its residuals are "
        "what those carry.",
    ]
    flat = [kind.value for kind, fit in report.collectives.items() if math.isinf(fit.bandwidth_gb_per_s)]
    if flat:
        notes.append(f"(*) {', '.join(flat)}: the law cannot fit the measured times: its plan pipelines large messages in "
                     f"{format_bytes(CHUNK_BYTES)} steps that each pay the latency, and at large sizes a step took less "
                     "than the latency small messages took. The best fit puts all the time in latency per step (no bytes "
                     "term); other group sizes are timed by that.")  # fmt: skip
    tiny = [kind.value for kind, fit in report.collectives.items() if fit.bandwidth_gb_per_s < MIN_BANDWIDTH_GB_PER_S]
    if tiny:
        notes.append(f"(**) {', '.join(tiny)}: the sizes measured are too small to show a bandwidth (the fit's comes out near "
                     f"zero); the file holds the least a machine may give, {MIN_BANDWIDTH_GB_PER_S:g} GB/s, for other group "
                     "sizes: calibrate up to larger sizes (--max-size) to fit one.")  # fmt: skip
    return notes


def _pass_speeds(ratios_by_family: dict[str, tuple[float, ...]]) -> str:
    """`Results.pass_ratios` in one line: "communication 1.01/0.98/1.00, matmul ..."."""
    return ", ".join(f"{family} {'/'.join(f'{r:.2f}' for r in ratios)}" for family, ratios in ratios_by_family.items())


def drift_warnings(ratios_by_family: dict[str, tuple[float, ...]]) -> list[str]:
    """One warning per family (`Results.pass_ratios`) whose slowest pass ran more than
    PASS_DRIFT_WARN slower than its fastest."""
    out = []
    for family, ratios in ratios_by_family.items():
        spread = max(ratios) / min(ratios) - 1 if ratios else 0.0
        if spread > PASS_DRIFT_WARN:
            out.append(f"{family} ran {100 * spread:.0f}% slower in one pass than in another (x{min(ratios):.2f} to "
                       f"x{max(ratios):.2f} of the pooled time): the machine's speed moved during calibration, and "
                       "predictions from this file carry that much doubt; calibrate again on a quieter machine")
    return out


def _print_report(report: FitReport, res: Results, effort: Effort) -> None:
    console = Console(highlight=False)
    table = Table(title="fit quality (residual = model - measured, % of measured)", box=None, pad_edge=False)
    for col in ("series", "parameters", "R²", "worst |residual|", "residuals by size"):
        table.add_column(col)

    def row(name: str, params: str, r2: float, resid: tuple[float, ...]) -> None:
        table.add_row(name, params, f"{r2:.4f}", f"{max(abs(r) for r in resid):.1f}%", " ".join(f"{r:+.0f}" for r in resid))

    for d, f in report.compute.items():
        row(f"matmul {d.value}", f"{f.rate * 1e6 / 1e12:.4f} TFLOP/s + {f.intercept:.1f} us", f.r2, f.residuals_pct)
    row("memory copy", f"{report.memory.rate / 1e3:.2f} GB/s", report.memory.r2, report.memory.residuals_pct)
    row("host link", f"{report.host_link.rate / 1e3:.2f} GB/s + {report.host_link.intercept:.1f} us", report.host_link.r2, report.host_link.residuals_pct)
    if (th := report.to_host) is not None:
        row("device to host", f"{th.rate / 1e3:.2f} GB/s + {th.intercept:.1f} us", th.r2, th.residuals_pct)
    if (p2p := report.p2p) is not None and (ex := report.exchange) is not None:
        row("p2p", f"{p2p.intercept:.1f} us + {p2p.rate / 1e3:.3f} GB/s", p2p.r2, p2p.residuals_pct)
        row("exchange", f"{ex.intercept:.1f} us + {ex.rate / 1e3:.3f} GB/s each way", ex.r2, ex.residuals_pct)
    if (pc := report.peer_copy) is not None:
        row("peer copy", f"{pc.intercept:.1f} us + {pc.rate / 1e3:.3f} GB/s (memcpy)", pc.r2, pc.residuals_pct)
    for kind, f in report.collectives.items():
        row(kind.value, _step_law(f), f.r2, f.residuals_pct)
        resid = report.p2p_model_residuals[kind]
        table.add_row("  (p2p link)", "analytic model with the p2p link", "", f"{max(abs(r) for r in resid):.1f}%", " ".join(f"{r:+.0f}" for r in resid))
    console.print(table)
    for note in _collective_notes(report) if report.collectives else ():
        console.print(note)
    console.print(f"host issue: kernel {res.kernel_launch_us:.1f} us, comm {res.comm_launch_us:.1f} us; barrier {res.barrier_us:.1f} us")
    if res.overlaps:
        table = Table(title=f"interference inside the executor (ms, medians of {effort.overlap_pieces} piece(s))", box=None, pad_edge=False)
        for col in ("op", "loop", "alone", "beside", "op slowed", "compute slowed"):
            table.add_column(col, no_wrap=True)
        for (kind, dtype), o in res.overlaps.items():
            loop = f"{o.loop_alone_us / 1e3:.2f}" if o.loop_alone_us else ""
            table.add_row(f"{kind.value} {dtype.value if dtype else ''}", loop, f"{o.comm_alone_us / 1e3:.2f}",
                          f"{o.comm_beside_us / 1e3:.2f}", f"x{o.compute_comm_slowdown:.2f}", f"x{o.comm_compute_slowdown:.2f}")  # fmt: skip
        table.caption = "loop: the op alone in the loops above; alone, beside compute: in the probe; op slowed: beside / loop"
        console.print(table)
    if res.noise is not None:
        n = res.noise
        console.print(f"compute stalls inside the executor: {n.compute.stalled} of {n.compute.samples} ops, "
                      f"{n.stalls_per_s:.1f} per second of compute, {n.compute.mean_us / 1e3:.2f} ms each; late wake-ups after comm: "
                      f"{n.wake.stalled} of {n.wake.samples}, {n.wake.mean_us / 1e3:.2f} ms each (drawn by `commdsl simulate --samples N`); "
                      f"the median compute op ran x{n.duration_stretch:.3f} its requested duration")  # fmt: skip
        if len(res.noise_pieces) > 1:
            rates = ", ".join(f"{p.stalls_per_s:.1f}" for p in res.noise_pieces)
            stretches = ", ".join(f"x{p.duration_stretch:.3f}" for p in res.noise_pieces)
            console.print(f"  the median of {len(res.noise_pieces)} pieces (stalls per second: {rates}; median op: {stretches})")
    if res.pass_ratios:
        console.print(f"speed of the {effort.passes} passes (each point's time in a pass over its pooled time, median over points): "
                      f"{_pass_speeds(res.pass_ratios)}")
        for warning in drift_warnings(res.pass_ratios):
            console.print(f"[yellow]warning[/] {warning}")
    for s in res.skipped:
        console.print(f"[yellow]skipped[/] {s}")
