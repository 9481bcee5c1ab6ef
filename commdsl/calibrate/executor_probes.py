"""Measurements made with the executor itself: compute stalls (`Machine.compute_noise`),
how comm ops and compute slow each other (`Machine.interference_by_op`), the barrier and
peer copies (the `memcpy` transport).

On a small shared CPU what a schedule sees depends on the executor's threads (stream
threads, comm queues, gloo's I/O, the host) sharing the cores, which a benchmark loop
does not reproduce. So these are measured where they happen: small probe schedules run
through `commdsl.run`'s own executor on every rank (`run_probe`).

Stalls. Compute ops stall (run a scheduler slice longer) far more often inside a
schedule than in a compute loop alone (docs/validation.md, Calibration's design figures). `STALL_PROBE` runs compute ops
between exchanges and all_reduces, and every compute op's time over its requested
duration gives the stalls:

    stalled     excess over the requested duration > typical excess + STALL_MIN_US
    rate        stalled ops / seconds of compute (all ranks)
    stall_us    mean of (excess - typical excess) over the stalled ops

The same goes for late wake-ups: the gap between the end of the comm ops a compute op
waits for and its start (the stream thread being woken), over the typical gap, gives
`wake_stall_probability` and `wake_stall_us`. The simulator draws them only in a
sampled run (`simulate --samples N`).

The typical excess itself is not noise: it gives `duration_stretch`, the median compute
op's time over its requested duration (1 + typical excess / duration), which the
simulator applies to every op with an explicit duration. The executor times its work at
start-up, alone; inside a schedule, beside the comm threads, the same work runs a few
percent longer at the median, and without the stretch schedules of compute on one
stream are predicted that much short (docs/validation.md, Calibration's design figures).

Interference. `OVERLAP_PROBE` runs one comm op alone, a compute op alone, then the same
comm op on a comm stream beside a compute op started with it (`overlap`); or a copy
from host memory instead of the comm op, for copies' factors. With medians over every
round, iteration (and rank, for compute):

    compute_comm_slowdown  comm op beside compute / comm op alone   (last member's start
                           to last member's end, as the simulator's rendezvous has it)
    comm_compute_slowdown  o / (o - (D - C)), o the overlap of the comm op with the
                           compute op D on the rank and C the compute op alone: D did
                           C's work, o of its time at 1/slowdown and the rest at full
                           speed; the largest over the ranks (the slowest paces them all)

Why inside the executor rather than with loops of their own: loops (a matmul loop beside
an all_reduce loop) run differently from a schedule's ops, and their factors move far
more between calibrations. The ranks differ too, so the largest factor over the ranks is
kept. A copy on CPU can stop compute while it runs; its factors are then 1.0 and
MAX_SLOWDOWN.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from commdsl.calibrate.measure import Probe
from commdsl.dsl import load_schedule_text
from commdsl.errors import CommdslError
from commdsl.ir import Dtype, Op, OpKind
from commdsl.run.backend import all_gather_objects, hostname
from commdsl.run.compute import Kernels, compute_threads
from commdsl.run.compute_timing import ComputeTiming
from commdsl.run.config import DurationMode, RunConfig
from commdsl.run.executor import RankSetup, make_executor
from commdsl.run.timing import IterRecord

STALL_PROBE = """\
name: calibrate_noise
doc: compute ops between exchanges and all_reduces, to count the stalls of compute
params:
  rounds: 6
  t_compute: 10ms
  msg: 4MiB
world: {ranks}
streams: [compute]
program: |
  peer = rank + 1 - 2 * (rank % 2)   # the neighbour: 0<->1, 2<->3, ...
  for i in range(rounds):
      compute C[i] t_compute
      if peer < world_size:
          batch:
              isend a[i] msg to peer
              irecv b[i] msg from peer
      if i % 2 == 1:
          all_reduce r[i] msg
"""
"""The stall probe: every rank exchanges with its neighbour (0<->1, 2<->3...) and joins an
all_reduce every other round, so compute shares the cores with comm threads, as in the
bundled schedules."""

STALL_MIN_US = 1000.0
"""An op stalled if it ran this much longer than the typical op: below a scheduler
slice, above the spread of calibrated durations."""


@dataclass(frozen=True)
class Stalls:
    """Samples (op times or wake-up gaps) that ran over STALL_MIN_US longer than the typical one."""

    samples: int
    stalled: int
    mean_us: float
    """Mean of (sample - typical) over the stalled samples (0 without any)."""
    typical_us: float = 0.0
    """The median sample."""


def stalls(samples_us: list[float]) -> Stalls:
    if not samples_us:
        return Stalls(0, 0, 0.0)
    typical = statistics.median(samples_us)
    extra = [x - typical for x in samples_us if x - typical > STALL_MIN_US]
    return Stalls(len(samples_us), len(extra), statistics.fmean(extra) if extra else 0.0, typical)


@dataclass(frozen=True)
class NoiseResult:
    compute: Stalls
    """Per compute op: its time over the requested duration."""
    wake: Stalls
    """Per compute op kept waiting for comm ops: its start after their end."""
    compute_us: float
    """Requested duration of each compute op of the probe."""

    @property
    def stalls_per_s(self) -> float:
        seconds = self.compute.samples * self.compute_us / 1e6
        return self.compute.stalled / seconds if seconds else 0.0

    @property
    def wake_stall_probability(self) -> float:
        return self.wake.stalled / self.wake.samples if self.wake.samples else 0.0

    @property
    def duration_stretch(self) -> float:
        """The median compute op's time over its requested duration (see the module doc)."""
        return 1.0 + self.compute.typical_us / self.compute_us if self.compute_us > 0 else 1.0

    def machine_json(self) -> dict:
        """The machine file's `compute_noise:`."""
        return {"stalls_per_s": round(self.stalls_per_s, 3), "stall_us": round(self.compute.mean_us, 1),
                "wake_stall_probability": round(self.wake_stall_probability, 4), "wake_stall_us": round(self.wake.mean_us, 1),
                "duration_stretch": round(self.duration_stretch, 4)}  # fmt: skip


PROBE_ITERS = 50
"""Iterations of one piece of the probe (calibration runs `NOISE_PIECES` and keeps the
median piece, `combine_pieces`): stalls are rare, so their rate is a Poisson count,
and its standard error is one over the square root of the stalls counted (docs/validation.md, Calibration's design figures)."""


def combine_pieces(pieces: list[NoiseResult]) -> NoiseResult:
    """The piece with the median stall rate (the lower of two middle ones), with the median
    of the pieces' typical excess. Stalls come in episodes: a probe run in one burst can
    meet one and count several times the usual rate; an episode moves the typical excess
    too, and may do so in a piece with a middle stall rate (docs/validation.md, Calibration's design figures)."""
    kept = sorted(pieces, key=lambda p: p.stalls_per_s)[(len(pieces) - 1) // 2]
    typical = statistics.median_low(p.compute.typical_us for p in pieces)
    return replace(kept, compute=replace(kept.compute, typical_us=typical))


def run_probe(probe: Probe, text: str, name: str, params: dict[str, str], iters: int, warmup: int = 2) -> tuple[list[Op], list[IterRecord]]:
    """Run the schedule `text` through the executor on every rank: this rank's ops and
    their records of each measured iteration (`warmup` more run first)."""
    program = load_schedule_text(text, name, params)
    config = RunConfig(schedule=name, warmup=warmup, iters=iters, duration_mode=DurationMode.BUSY)
    kernels = Kernels(probe.device, DurationMode.BUSY, compute_threads(probe.device))
    # Durations are timed as commdsl.run times them at start-up: agreed per host. A probe
    # lasts seconds, and commdsl.run's re-checks between iterations (which follow the
    # machine's speed over minutes) adopt nothing in a steady machine: the probe leaves
    # them out (on 3 ranks sharing 2 cores they doubled the calibration's probes).
    hosts = all_gather_objects(hostname(), probe.cpu_group, probe.world_size)
    ComputeTiming(kernels, probe.cpu_group, probe.rank, probe.world_size, hosts).start()
    setup = RankSetup(program, probe.rank, probe.backend, probe.device, {"world": dist.group.WORLD}, probe.cpu_group, config,
                      kernels, None, probe.store)  # fmt: skip
    executor = make_executor(setup)
    records = []
    try:
        for it in range(warmup + iters):
            rec = executor.run_iteration()
            if it >= warmup:
                records.append(rec)
    finally:
        executor.close()
    if probe.device.type == "cuda":
        torch.cuda.synchronize(probe.device)
    return program.ops[probe.rank], records


def compute_noise(probe: Probe, msg_bytes: int, iters: int = PROBE_ITERS, warmup: int = 2) -> NoiseResult:
    """Run `STALL_PROBE` through the executor on every rank; every rank returns the result."""
    ops, records = run_probe(probe, STALL_PROBE.format(ranks=probe.world_size), "<calibrate noise probe>",
                             {"msg": f"{msg_bytes}B"}, iters, warmup)  # fmt: skip
    compute = [op for op in ops if op.kind is OpKind.COMPUTE]
    # Each compute op after the first waits for the comm ops of the round before it.
    waited = {op.index: [p.index for p in ops[prev.index + 1 : op.index]] for prev, op in zip(compute, compute[1:])}
    excess: list[float] = []
    gaps: list[float] = []
    for rec in records:
        excess += [(rec.exec_end[op.index] - rec.exec_start[op.index]) / 1e3 - op.duration_us for op in compute]
        gaps += [(rec.exec_start[i] - max(rec.exec_end[j] for j in comm)) / 1e3 for i, comm in waited.items() if comm]
    both = all_gather_objects((excess, gaps), probe.cpu_group, probe.world_size)
    return NoiseResult(stalls([e for mine, _ in both for e in mine]), stalls([g for _, mine in both for g in mine]),
                       compute[0].duration_us)  # fmt: skip


BARRIER_PROBE = """\
name: calibrate_barrier
doc: barriers after compute and back to back, as schedules issue them
params:
  rounds: 5
  t_compute: 5ms
world: {ranks}
streams: [compute]
program: |
  for i in range(rounds):
      compute C[i] t_compute
      barrier
      barrier
"""
"""The barrier probe. Inside the executor a barrier goes from a stream to a comm queue
thread and wakes the stream and the host when done, which costs several times a barrier
loop's (barrier after barrier on the calling thread) (docs/validation.md, Calibration's design figures)."""


def _group_span(spans: Iterable[tuple[float, float]]) -> float:
    """A group op's time from its members' (start, end): the last member's start to the
    last member's end, as the simulator's rendezvous has it (arrival skew is not the op's)."""
    starts, ends = zip(*spans)
    return max(ends) - max(starts)


def barrier_from(records: list[list[list[tuple[float, float]]]]) -> float:
    """Mean barrier time (`_group_span`) from per rank, per iteration, the (start, end) of
    each barrier, on one clock."""
    iters, barriers = len(records[0]), len(records[0][0])
    return statistics.fmean(_group_span(r[it][k] for r in records) for it in range(iters) for k in range(barriers))


def barrier_us(probe: Probe, iters: int = 40, warmup: int = 2) -> float:
    """Run `BARRIER_PROBE` through the executor: the expected time of a barrier (see
    `barrier_from`); every rank returns the result."""
    ops, records = run_probe(probe, BARRIER_PROBE.format(ranks=probe.world_size), "<calibrate barrier probe>", {}, iters, warmup)
    barriers = [op.index for op in ops if op.kind is OpKind.BARRIER]
    off_ns = probe.clock_offset_ns
    mine = [[((rec.exec_start[i] + off_ns) / 1e3, (rec.exec_end[i] + off_ns) / 1e3) for i in barriers] for rec in records]
    return barrier_from(all_gather_objects(mine, probe.cpu_group, probe.world_size))


PEER_COPY_PROBE = """\
name: calibrate_peer_copy
doc: one-sided copies from rank 0 into rank 1's memory, one per size, after a barrier
world: {ranks}
streams: [copy]
program: |
  barrier
  if rank == 0:
{copies}
"""
"""The peer-copy probe; {copies} is one `copy` statement per size, each to rank 1. The
executor runs a peer copy as a copy into the destination's memory opened at start-up
(`commdsl.run.peer`): on CPU a memcpy into shared pages, on CUDA a cudaMemcpyAsync
between the GPUs. That is what the `memcpy` transport stands for: a copy, neither a
gloo nor an NCCL message."""

PEER_COPY_ITERS = 20
"""Iterations of the peer-copy probe: each copy's time is the median over them."""


def peer_copy_us(probe: Probe, sizes: list[int], iters: int = PEER_COPY_ITERS, warmup: int = 2) -> list[tuple[int, float]]:
    """Run `PEER_COPY_PROBE` through the executor on every rank: per size, the median time
    of a copy of that many bytes from rank 0 into rank 1's memory, (size, us). Every rank
    returns the result, or raises `PeerCopyFailed` with every rank's error where any rank's
    probe raised (the ranks agree, so they go on in step). Needs `probe.store`."""
    # Largest first: the first copy after the barrier runs a few microseconds slow, which
    # only the smallest sizes would feel.
    copies = "\n".join(f"      copy c{k} {size}B to 1 on copy" for k, size in sorted(enumerate(sizes), key=lambda ks: -ks[1]))
    text = PEER_COPY_PROBE.format(ranks=probe.world_size, copies=copies)
    try:
        ops, records = run_probe(probe, text, "<calibrate peer copy probe>", {}, iters, warmup)
        copy_at = {op.name: op.index for op in ops if op.is_peer_copy}  # c0, c1, ... on rank 0; none on the others
        mine: list[float] | str = []
        for name in (f"c{k}" for k in range(len(sizes))):
            if name in copy_at:
                i = copy_at[name]
                mine.append(statistics.median((rec.exec_end[i] - rec.exec_start[i]) / 1e3 for rec in records))
    except (RuntimeError, CommdslError) as e:  # e.g. CUDA IPC refused between two GPUs: memcpy keeps the P2P link
        mine = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    everyone = all_gather_objects(mine, probe.cpu_group, probe.world_size)
    errors = [f"rank {r}: {x}" for r, x in enumerate(everyone) if isinstance(x, str)]
    if errors:
        raise PeerCopyFailed("; ".join(errors))
    return list(zip(sizes, everyone[0]))  # rank 0 copies; the others have none


class PeerCopyFailed(RuntimeError):
    """The peer-copy probe raised on some rank (the message names each rank's error)."""


OVERLAP_PROBE = """\
name: calibrate_overlap
doc: a comm op alone, compute alone, then both at once on two streams
params:
  rounds: 3
  t_compute: 20ms
  msg: 16MiB
world: {{ranks}}
streams: [compute, comm]
program: |
  peer = rank + 1 - 2 * (rank % 2)   # the neighbour: 0<->1, 2<->3, ...
  for i in range(rounds):
      {sync}
      record alone_go[i]
      wait alone_go[i] on comm
      {alone}
      wait alone[i]
      compute C[i] t_compute
      record both_go[i]
      wait both_go[i] on comm
      {both}
      compute D[i] t_compute
      wait both[i]
"""
"""The overlap probe; {alone} and {both} are the comm op or copy (`_probe_op`), bound to
the handles (or events) alone[i] and both[i]. {sync}: a barrier where the op does not
line the ranks up itself (a copy), else nothing."""


def _probe_op(kind: OpKind, dtype: Dtype | None, handle: str, tensor: str) -> str:
    """The probe's comm op statement (at the loop body's indent): a collective of all
    ranks, for P2P kinds a send from even ranks to their odd neighbour, for COPY a copy
    from host memory and an event recorded after it."""
    if kind is OpKind.COPY:
        return f"copy {tensor}[i] msg from host on comm\n      record {handle}[i] on comm"
    if kind.is_p2p:
        return (f"if rank % 2 == 0:\n          {handle}[i] = isend {tensor}[i] msg to peer on comm\n"
                f"      else:\n          {handle}[i] = irecv {tensor}[i] msg from peer on comm")  # fmt: skip
    return f"{handle}[i] = {kind.value} {tensor}[i] msg" + (f" dtype={dtype.value}" if dtype else "") + " on comm"


@dataclass(frozen=True)
class Overlap:
    """One comm op's interference with compute, inside the executor (medians, us)."""

    comm_alone_us: float
    comm_beside_us: float
    """The comm op beside a compute op started with it."""
    compute_alone_us: tuple[float, ...]
    """Per rank: the compute op alone."""
    compute_beside_us: tuple[float, ...]
    """Per rank: the compute op started with the comm op."""
    overlap_us: tuple[float, ...]
    """Per rank: how long the two ran together there."""

    @property
    def compute_comm_slowdown(self) -> float:
        """The comm op's slowdown while compute runs (at least 1)."""
        return max(self.comm_beside_us / self.comm_alone_us, 1.0) if self.comm_alone_us > 0 else 1.0

    @property
    def comm_compute_slowdown(self) -> float:
        """Compute's slowdown while the comm op runs, on the rank it slows most (at least 1;
        at most MAX_SLOWDOWN). The most, not a middle value: ranks meet at every comm op,
        so the slowest one paces the schedule, and on a shared CPU they differ widely."""
        return max(map(_compute_slowdown, self.compute_alone_us, self.compute_beside_us, self.overlap_us))


MAX_SLOWDOWN = 10.0
"""Largest compute slowdown `Overlap` reports: beyond it compute practically stops."""


def _compute_slowdown(alone_us: float, beside_us: float, overlap_us: float) -> float:
    """o / (o - (D - C)): D did C's work, o of its time at 1/slowdown and the rest at full speed."""
    lost = beside_us - alone_us
    if lost <= 0 or overlap_us <= 0:
        return 1.0
    if lost >= overlap_us * (1 - 1 / MAX_SLOWDOWN):
        return MAX_SLOWDOWN  # compute (almost) stopped while the op ran
    return overlap_us / (overlap_us - lost)


def overlap_from(records: list[list[dict[str, tuple[float, float]]]], rounds: int) -> Overlap:
    """`Overlap` from the probe's records: per rank, per iteration, the (start, end) of
    the ops A[i], B[i] (comm alone, beside compute), C[i], D[i] (compute alone, beside
    the comm op) of each round i, in microseconds on one clock (every rank's, so comm
    ops are timed from the last member's start to the last member's end)."""
    alone, beside = [], []
    per_rank = [([], [], []) for _ in records]
    for it in range(len(records[0])):
        ranks = [r[it] for r in records]
        for i in range(rounds):
            a, b, c, d = (f"{t}[{i}]" for t in "ABCD")
            alone.append(_group_span(r[a] for r in ranks))
            beside.append(_group_span(r[b] for r in ranks))
            for r, (c_alone, c_beside, overlap) in zip(ranks, per_rank):
                c_alone.append(r[c][1] - r[c][0])
                c_beside.append(r[d][1] - r[d][0])
                overlap.append(max(0.0, min(r[b][1], r[d][1]) - max(r[b][0], r[d][0])))
    med = statistics.median
    return Overlap(med(alone), med(beside), *(tuple(med(x[k]) for x in per_rank) for k in range(3)))


@dataclass(frozen=True)
class OverlapPieces:
    """One comm op's overlap probe run in pieces minutes apart; each factor is the median
    of the pieces' (a single burst can time a factor far from every other calibration's
    (docs/validation.md, Calibration's design figures)). Medians of factors, not factors of median times: the compute slowdown is
    the slowest rank's, which may be another rank in each piece.

    With `loop_alone_us`, the op's slowdown beside compute is its median time beside
    compute over that: the simulator scales the loop-calibrated time, so the ratio that
    makes it reproduce the probe's time beside compute is to that time, not to the
    probe's own time alone. The probe runs its op alone right after compute, and there
    it is slow and noisy, and the higher it comes out the shorter schedules are
    predicted (docs/validation.md, Calibration's design figures)."""

    pieces: tuple[Overlap, ...]
    loop_alone_us: float | None = None
    """The op's calibrated time alone (benchmark loops), at the probe's size; None: the
    pieces' own ratios (copies, whose loop and probe agree)."""

    def _median(self, field: str) -> float:
        return statistics.median(getattr(p, field) for p in self.pieces)

    @property
    def compute_comm_slowdown(self) -> float:
        """The op's slowdown while compute runs (at least 1)."""
        if self.loop_alone_us:
            return max(self.comm_beside_us / self.loop_alone_us, 1.0)
        return self._median("compute_comm_slowdown")

    comm_compute_slowdown = property(lambda self: self._median("comm_compute_slowdown"))
    comm_alone_us = property(lambda self: self._median("comm_alone_us"))
    comm_beside_us = property(lambda self: self._median("comm_beside_us"))


OVERLAP_ITERS = 10
"""Iterations of one piece of the overlap probe (3 rounds each); calibration runs
`OVERLAP_PIECES` pieces of each op, round robin over the ops (`OverlapPieces`)."""


def interference(probe: Probe, kind: OpKind, dtype: Dtype | None, msg_bytes: int, compute_us: float, iters: int = OVERLAP_ITERS,
                 warmup: int = 2) -> Overlap:  # fmt: skip
    """Run `OVERLAP_PROBE` with one comm op (`kind` of msg_bytes; dtype None: the
    schedule's default) or copy (COPY) beside compute ops of compute_us, which should
    outlast the op slowed; every rank returns the result. P2P kinds need an even world
    size."""
    text = OVERLAP_PROBE.format(alone=_probe_op(kind, dtype, "alone", "A"), both=_probe_op(kind, dtype, "both", "B"),
                                sync="barrier" if kind is OpKind.COPY else "")  # fmt: skip
    params = {"msg": f"{msg_bytes}B", "t_compute": f"{compute_us:.0f}us"}
    ops, records = run_probe(probe, text.format(ranks=probe.world_size), f"<calibrate {kind.value} overlap probe>", params, iters, warmup)
    off_ns = probe.clock_offset_ns
    named = [op for op in ops if op.name[:2] in ("A[", "B[", "C[", "D[")]
    mine = [{op.name: ((rec.exec_start[op.index] + off_ns) / 1e3, (rec.exec_end[op.index] + off_ns) / 1e3) for op in named}
            for rec in records]  # fmt: skip
    rounds = sum(1 for op in named if op.name.startswith("C["))
    return overlap_from(all_gather_objects(mine, probe.cpu_group, probe.world_size), rounds)
