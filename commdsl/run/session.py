"""One rank's run, start to end: load, set up, iterate, gather, write.

    load the schedule (every rank, same Program) -> check the torchrun environment
    -> store, process groups (control group first, then the schedule's, in order)
    -> clock alignment, compute calibration, buffers, expected values
    -> watchdog on -> warm-up + measured iterations -> gather to rank 0
    -> rank 0 writes the timeline (and --dump-values), prints the summary
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from commdsl.comparison import DURATION_DRIFT_PCT, duration_drifts
from commdsl.errors import CommdslError, UsageError
from commdsl.files import write_text
from commdsl.ir import OpKind, Program
from commdsl.progress import Progress
from commdsl.run.backend import (DistEnv, all_gather_objects, broadcast_object, connect_store, gather_objects, hostname,
                                 init_distributed, resolve_backend)
from commdsl.run.check import Checker, CheckError, Fill, load_values
from commdsl.run.compute import MATMUL_DTYPES, Kernels, compute_threads
from commdsl.run.compute_timing import ComputeTiming, skew_from_environ
from commdsl.interop.kineto_read import TRACE_FILE
from commdsl.run.config import DurationMode, RunConfig, load_program
from commdsl.run.executor import Executor, RankSetup, make_executor
from commdsl.run.tensors import declared_peak_bytes, estimate_bytes
from commdsl.run.timing import ClockSync, IterRecord, RankResult, build_timeline, iteration_records, measure_clock, now_ns
from commdsl.run.watchdog import Watchdog
from commdsl.timeline import FLOP_RATE_META, MEMORY_PEAK_META, Timeline

Comparer = Callable[[Program, RunConfig, Timeline, dict], None]


def comparison_machine(config: RunConfig, backend: str) -> str:
    """The machine `--compare` simulates on: `--machine`, else cpu-loopback on gloo and
    the simulator's default on NCCL."""
    from commdsl.machine import DEFAULT_MACHINE

    return config.machine or ("cpu-loopback" if backend == "gloo" else DEFAULT_MACHINE)


def check_comparable(program: Program, config: RunConfig, backend: str) -> None:
    """--compare: simulate the program on the comparison's machine before any process
    group exists, on every rank alike, so that a machine that cannot run it (no compute
    rate for a dtype, too few devices) stops the run at once, not after it."""
    from commdsl.machine import resolve_machine
    from commdsl.sim import simulate

    simulate(program, resolve_machine(comparison_machine(config, backend)), config.network)
"""What prints `--compare`'s comparison, given the program that ran, the run's settings,
the measured timeline and its meta."""


def run(config: RunConfig, compare: Comparer | None = None) -> int:
    """Runs `config` on this rank; returns the exit code every rank agreed on. Rank 0
    writes the outputs, prints the summary, and with `config.compare` hands the program,
    the measured timeline and its meta to `compare` (the command line prints the
    comparison: `commdsl.run.cli`)."""
    program = load_program(config)
    env = DistEnv.from_environ(program.world_size)
    backend = resolve_backend(config.backend, env)
    device = torch.device("cuda", env.local_rank) if backend == "nccl" else torch.device("cpu")
    if config.duration_mode is DurationMode.SLEEP and backend == "nccl":
        raise UsageError("--duration-mode sleep is for CPU runs; on GPUs compute runs calibrated matmuls")
    if config.compare:
        check_comparable(program, config, backend)
    skew = skew_from_environ()
    values = load_values(config.values_file) if config.values_file else None
    filled = config.check or values is not None or config.dump_values is not None
    _check_memory(program, env, device, per_op=filled)
    profiler = RankProfiler(config.profile_dir, env.rank, device) if config.profile_dir else None

    store = connect_store(env, config.timeout_s + 60, host=True)
    groups = init_distributed(env, backend, store, program, pg_timeout_s=config.timeout_s + 120)
    rank = env.rank
    prefix = f"commdsl/watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    wd_store = connect_store(env, 30, host=False) if env.launched else store
    results_holder: dict = {}

    def write_partial(payloads: list[dict]) -> str | None:
        partial = [_result_from_payload(p) for p in payloads if "record" in p]
        if not partial:
            return None
        meta = dict(results_holder.get("meta", {}), partial=True)
        tl = build_timeline(program, partial, meta, now=max(p["now_ns"] for p in payloads))
        tl.write(config.out, streams=program.streams)
        return config.out

    watchdog = Watchdog(wd_store, rank, env.world_size, config.timeout_s, prefix, write_partial)
    watchdog.start()
    with Progress("commdsl run", enabled=rank == 0 and not config.quiet) as progress:
        progress.phase("setting up: clock alignment, compute timing, buffers")
        watchdog.phase = ("set-up (clock alignment, calibration)", now_ns())
        hosts: list[str] = all_gather_objects(hostname(), groups.control, env.world_size)
        clock = measure_clock(groups.control, rank, env.world_size, hosts)
        kernels = Kernels(device, config.duration_mode, compute_threads(device))
        # Every rank times the duration blocks if any rank runs duration-sized compute: the
        # timings are shared (collectives), and every rank's timing helps its host agree.
        timing = None
        if config.duration_mode is DurationMode.BUSY and any(
            op.kind is OpKind.COMPUTE and op.duration_us is not None for op in program.all_ops()
        ):
            timing = ComputeTiming(kernels, groups.control, rank, env.world_size, hosts, skew)
            timing.start()
        flop_dtypes = sorted({op.dtype for op in program.ops[rank] if op.kind is OpKind.COMPUTE and op.duration_us is None
                              and op.flops and op.dtype in MATMUL_DTYPES}, key=lambda d: d.value)  # fmt: skip
        flop_tflops = {d.value: round(r, 6) for d, r in kernels.flop_block_tflops(flop_dtypes).items()}
        fill = Fill(values, config.values_file or "")
        try:
            checker = Checker(program, rank, fill) if filled else None
            setup = RankSetup(program, rank, backend, device, groups.by_id, groups.control, config, kernels, checker, store)
            executor: Executor = make_executor(setup)
        except CommdslError as err:
            watchdog.abort([err.format()], err.exit_code)
            raise
        meta = {
            **({"profile": config.profile_dir} if config.profile_dir else {}),
            "params": dict(program.params), "backend": backend, "device": device.type, "torch": torch.__version__,
            "warmup": config.warmup, "iters": config.iters, "stat": "median", "check": config.check,
            "duration_mode": config.duration_mode.value, "hosts": hosts,
        }  # fmt: skip
        results_holder["meta"] = meta
        watchdog.partial_payload = lambda: {"rank": rank, "clock": asdict(clock), "record": asdict(executor.rec)}
        watchdog.executor = executor
        watchdog.phase = None

        records: list[IterRecord] = []
        failures: list[str] = []
        values_dump: dict = {}
        cuda_base = 0
        total = config.warmup + config.iters
        checking = ", checking every result" if filled else ""
        progress.phase(f"running {config.warmup} warm-up + {config.iters} measured iterations{checking}", total=total, unit="iterations")
        try:
            for it in range(total):
                if profiler is not None and it == config.warmup:
                    profiler.start()
                if timing is not None and it > 0:
                    watchdog.phase = ("re-checking the compute timing (waiting for the other ranks)", now_ns())
                    if timing.recheck(it):
                        executor.size_compute()
                    watchdog.phase = None
                if it == config.warmup:  # memory peaks count the measured iterations
                    executor.memory.reset_peak()
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                        cuda_base = torch.cuda.memory_allocated(device)
                if profiler is not None and it >= config.warmup:
                    executor.step_name = PROFILER_STEP.format(step=it - config.warmup)
                rec = executor.run_iteration()
                if it >= config.warmup:
                    records.append(rec)
                if not failures:
                    failures = executor.verify()
                progress.advance(1)
            if profiler is not None:
                progress.phase(f"writing the profiler's trace to {config.profile_dir}")
                profiler.write()
            if config.dump_values:
                values_dump = executor.dump_values()
        except CommdslError as err:
            watchdog.abort([f"rank {rank}: " + err.format()], err.exit_code)

        progress.phase("gathering results on rank 0")
        watchdog.phase = ("gathering results on rank 0 (waiting for the other ranks)", now_ns())
        if timing is not None:
            meta["compute_timing"] = timing.meta()
        memory = {}
        if any(op.kind is OpKind.ALLOC for op in program.ops[rank]):
            memory = {"peak_bytes": executor.memory.peak_bytes, "live_at_peak": executor.memory.live_at_peak}
            if device.type == "cuda":
                memory["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device) - cuda_base
        mine = RankResult(rank, clock, records, failures, values_dump, kernels.cal_us.get(kernels.blocks[0], 0.0), flop_tflops, memory)
        gathered: list[RankResult] | None = gather_objects(mine, groups.control, env.world_size, rank)
    code = 0
    if rank == 0:
        code = _report(program, config, gathered, meta, compare)
    status = broadcast_object(code, groups.control, rank)
    watchdog.stop()
    executor.close()
    dist.destroy_process_group()
    if status == 1 and rank == 0:
        raise CheckError(_check_summary(gathered))
    return status


def _report(program: Program, config: RunConfig, results: list[RankResult], meta: dict, compare: Comparer | None) -> int:
    """Rank 0: write the timeline (and values), print the summary; 1 if a check failed."""
    meta["clock"] = {str(r.rank): asdict(r.clock) for r in results}
    meta["calibration_us_per_matmul"] = {str(r.rank): round(r.calibration_us, 3) for r in results}
    if any(r.flop_block_tflops for r in results):
        meta[FLOP_RATE_META] = {str(r.rank): r.flop_block_tflops for r in results}
    if any(r.memory for r in results):
        # The GPU's own count where there is one (it sees every allocation the run makes),
        # else the executor's accounting of the declared buffers.
        cuda = all("cuda_peak_bytes" in r.memory for r in results if r.memory)
        meta[MEMORY_PEAK_META] = {str(r.rank): r.memory["cuda_peak_bytes" if cuda else "peak_bytes"] for r in results if r.memory}
        meta["memory_peak_source"] = "torch.cuda.max_memory_allocated" if cuda else "declared buffers (executor accounting)"
        meta["declared_memory"] = {str(r.rank): r.memory for r in results if r.memory}
    tl = build_timeline(program, results, meta)
    out = Path(config.out)
    tl.write(out, streams=program.streams)
    if config.trace_dir:
        from commdsl.interop.kineto_write import torch_device, write_kineto_traces

        write_kineto_traces(tl, program, config.trace_dir, backend=meta["backend"], device=torch_device(meta["device"], program.world_size))
    if config.records_out:
        write_text(config.records_out, json.dumps(iteration_records(program, results)) + "\n", "--records")
    if config.dump_values:
        merged = {}
        for r in results:
            merged.update(r.values)
        write_text(config.dump_values, json.dumps(merged, indent=1, sort_keys=True) + "\n", "--dump-values")
    failures = [f for r in results for f in r.check_failures]
    if not config.quiet:
        spans = tl.meta["iteration_makespans_us"]
        med = statistics.median(spans) / 1e3
        bounds = [r.clock.bound_ns for r in results]
        self_check = max(abs(r.clock.measured_offset_ns) for r in results) / 1e3
        lines = [
            f"{program.name}: {program.world_size} rank(s), {meta['backend']} ({meta['device']}), "
            f"{config.warmup} warm-up + {config.iters} measured iteration(s)",
            f"makespan: median {med:.3f} ms (min {min(spans) / 1e3:.3f}, max {max(spans) / 1e3:.3f}) over {len(spans)} iteration(s)",
            # The self-check is the ping-pong's own error where the true offset is 0; ranks on
            # rank 0's host are never corrected by it (they share its clock).
            f"clock alignment: error bound {max(bounds) / 1e3:.1f} us; the ping-pong, on rank 0's host where the true offset "
            f"is 0, measured {self_check:.1f} us (not applied)",
        ]  # fmt: skip
        if config.check:
            n = sum(1 for op in program.all_ops() if op.kind.is_comm or op.is_peer_copy)
            lines.append(f"check: {n} communication results on {len(results)} rank(s): "
                         + ("all correct" if not failures else f"{len(failures)} wrong"))  # fmt: skip
        lines += _duration_lines(tl, warn=not config.compare)  # --compare's comparison warns itself
        lines.append(f"measured timeline: {out} ({len(tl.exec_spans())} ops); open it in Perfetto or `commdsl compare`")
        print("\n".join(lines), flush=True)
    else:  # quiet: still say that the run did not run the schedule's durations
        for d in duration_drifts(tl):
            if d.drifted:
                print(f"warning: {d.warning()}", file=sys.stderr, flush=True)
    if config.compare and compare is not None:
        compare(program, config, tl, meta)
    return 1 if failures else 0


def _duration_lines(tl: Timeline, *, warn: bool) -> list[str]:
    """The summary's lines on compute with explicit durations: the compute block's timing
    (`ComputeTiming.meta`), how the ops ran against their requested durations, and (with
    `warn`) a warning for every rank whose ops ran more than DURATION_DRIFT_PCT off."""
    timing = tl.meta.get("compute_timing")
    drifts = duration_drifts(tl)
    lines = []
    if timing:
        bulk = str(timing["blocks"][0])
        used = sorted({t[bulk] for t in timing["used_us"].values()})
        startup = ", ".join(f"{t[bulk]:.1f}" for _, t in sorted(timing["startup_us"].items(), key=lambda rt: int(rt[0])))
        resized = len(timing["adopted"])
        lines.append(f"compute timing: a {bulk}x{bulk} matmul takes {', '.join(f'{u:.1f}' for u in used)} us (ranks timed "
                     f"{startup} us at start-up; each host takes its ranks' lower median), re-checked {timing['rechecks']} "
                     f"time(s) between iterations, ops re-sized {resized} time(s)")  # fmt: skip
    if drifts:
        lines.append("compute with explicit durations ran " + ", ".join(f"x{d.median_ratio:.2f} on rank {d.rank}" for d in drifts)
                     + f" of the requested durations (median; {DURATION_DRIFT_PCT:g}% is tolerated)")  # fmt: skip
    if warn:
        lines += [f"warning: {d.warning()}" for d in drifts if d.drifted]
    return lines


def _check_summary(results: list[RankResult]) -> str:
    failures = [f for r in results for f in r.check_failures]
    shown = "\n  ".join(failures[:20])
    more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
    return f"{len(failures)} communication result(s) differ from their semantics:\n  {shown}{more}"


def _result_from_payload(p: dict) -> RankResult:
    rec = IterRecord(**p["record"])
    return RankResult(p["rank"], ClockSync(**p["clock"]), [rec])


def _check_memory(program: Program, env: DistEnv, device: torch.device, *, per_op: bool) -> None:
    need = estimate_bytes(program, env.rank, per_op)
    if device.type == "cuda":
        need += declared_peak_bytes(program, env.rank)  # on a CPU `torch.empty` only reserves the pages
        free, _ = torch.cuda.mem_get_info(device)
        limit, where = int(free * 0.8), "of free GPU memory"
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        limit, where = total // (2 * max(env.local_world_size, 1)), "of this rank's share of host memory"
    if need > limit:
        raise UsageError(
            f"rank {env.rank} would allocate {need / 2**30:.2f} GiB of buffers, more than {limit / 2**30:.2f} GiB "
            f"{where}",
            hint="use smaller params (e.g. -p act=1MiB) for CPU runs",
        )


PROFILER_STEP = "ProfilerStep#{step}"
"""The range around each measured iteration, named as `torch.profiler.profile.step` names
its steps (Kineto trace readers, HTA and `commdsl compare` split a trace into steps by it)."""


class RankProfiler:
    """`--profile DIR`: `torch.profiler` over the measured iterations of one rank (the
    executor puts each in a `ProfilerStep#<k>` range); `write` saves the rank's Kineto
    trace (`TRACE_FILE`, as `--trace-dir` names them).

    On CPU the ops run on the executor's stream and comm-queue threads, which the
    profiler records only with `profile_all_threads`; on CUDA it records the GPU's
    kernels, copies and NCCL kernels too."""

    def __init__(self, folder: str, rank: int, device: torch.device):
        from torch.profiler import ProfilerActivity, profile

        self.path = Path(folder) / TRACE_FILE.format(rank=rank)
        if device.type == "cuda":  # the ranges are on the host thread, around the launches
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)
            return
        try:
            config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        except TypeError:  # an older torch's profiler records the thread that started it only
            raise UsageError(f"--profile on CPU needs a torch whose profiler records every thread (profile_all_threads); "
                             f"this is torch {torch.__version__}", hint="pip install torch==2.13.0") from None
        self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, experimental_config=config)

    def start(self) -> None:
        self.prof.start()

    def write(self) -> None:
        self.prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.prof.export_chrome_trace(str(self.path))
        except OSError as err:
            raise UsageError(f"--profile: cannot write {self.path}: {err.strerror or err}") from None
