"""Copies from and to pageable host memory (`copy x SIZE from host memory=pageable`):
the language, the machine's rate for them, the simulator's blocked host and the
executor's, which waits for such a copy as CUDA does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import commdsl
from commdsl.dsl import load_schedule_text
from commdsl.errors import ScheduleError
from commdsl.ir import CopyDir, HostMemory, OpKind
from commdsl.machine import load_machine_text
from commdsl.sim import simulate
from commdsl.timeline import SpanRole, Timeline

try:
    from test_run_support import REPO
except ImportError:  # tests/ imported as a package
    from tests.test_run_support import REPO

MACHINE = """
name: m
devices: 1
device: {{name: test, peak_tflops: {{fp32: 10}}, memory_bandwidth_gb_per_s: 1000, sm_count: 4}}
kernel_launch_us: 0
comm_launch_us: 0
host_link: {{latency_us: 0, bandwidth_gb_per_s: 10}}
transports:
  nccl: {{latency_us: 0, bandwidth_gb_per_s: 100}}
{extra}"""


def machine(extra: str = ""):
    return load_machine_text(MACHINE.format(extra=extra), "m.yaml")


def program(body: str):
    lines = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return load_schedule_text(f"name: t\nworld: 1\nstreams: [a, b]\nprogram: |\n{lines}\n", "t.yaml")


def exec_times(result) -> dict[str, tuple[float, float]]:
    return {op.name: (result.raw.start[g], result.raw.end[g]) for g, op in enumerate(result.raw.ops)}


def test_memory_option_sets_how_the_host_buffer_is_allocated():
    ops = program("copy a 1MiB from host memory=pageable on a\ncopy b 1MiB to host on a\ncopy c 1MiB on a").ops[0]
    assert [(op.copy_dir, op.host_memory) for op in ops] == [
        (CopyDir.H2D, HostMemory.PAGEABLE), (CopyDir.D2H, HostMemory.PINNED), (CopyDir.D2D, None)]  # fmt: skip
    assert ops[0].to_json()["host_memory"] == "pageable" and "host_memory" not in ops[2].to_json()


@pytest.mark.parametrize(
    "statement, message, column",
    [
        ("copy a 1MiB memory=pageable on a", "moves device memory only", 15),
        ("copy a 1MiB to 0 memory=pinned on a", "moves device memory only", 20),
        ("copy a 1MiB from host memory=locked on a", "unknown memory 'locked'; expected one of pinned, pageable", 25),
        ("copy a 1MiB from host memory=1 on a", "memory= takes a name", 25),
    ],
)
def test_memory_option_errors_point_at_the_option(statement, message, column):
    with pytest.raises(ScheduleError) as e:
        program(statement)
    assert message in str(e.value)
    assert (e.value.loc.line, e.value.loc.column) == (5, column)


def test_a_pageable_copy_blocks_the_host_and_a_pinned_one_does_not():
    # 100 MB over 10 GB/s = 10 ms; compute 5 ms on another stream, issued after the copy.
    m = machine()
    pinned = exec_times(simulate(program("copy x 100MB from host on b\ncompute C 5ms on a"), m))
    pageable = exec_times(simulate(program("copy x 100MB from host memory=pageable on b\ncompute C 5ms on a"), m))
    assert pinned["x"] == pageable["x"] == pytest.approx((0, 10_000))
    assert pinned["C"] == pytest.approx((0, 5_000))  # the host went on at once: they overlap
    assert pageable["C"] == pytest.approx((10_000, 15_000))  # the host waited for the copy
    # A pageable copy waits for its stream's earlier work, and the host with it.
    queued = exec_times(simulate(program("compute A 3ms on b\ncopy y 10MB to host memory=pageable on b\nhost H 1ms"), m))
    assert queued["y"] == pytest.approx((3_000, 4_000)) and queued["H"] == pytest.approx((4_000, 5_000))


def test_the_hosts_issue_span_covers_the_pageable_copy():
    r = simulate(program("copy x 100MB from host memory=pageable on b"), machine())
    issue = [s for s in r.timeline.spans if s.role is SpanRole.ISSUE]
    assert [(s.start_us, s.end_us) for s in issue] == [pytest.approx((0, 10_000))]


def test_host_memcpy_rate_bounds_a_pageable_copy_and_a_profile_wins():
    body = "copy x 100MB from host memory=pageable on b\ncopy y 100MB to host on b"
    slow = exec_times(simulate(program(body), machine("host_memcpy_gb_per_s: 4")))
    assert slow["x"][1] - slow["x"][0] == pytest.approx(25_000)  # 100 MB at 4 GB/s: the memcpy is the slower stage
    assert slow["y"][1] - slow["y"][0] == pytest.approx(10_000)  # pinned: the DMA alone
    fast = exec_times(simulate(program(body), machine("host_memcpy_gb_per_s: 40")))
    assert fast["x"][1] - fast["x"][0] == pytest.approx(10_000)  # the DMA is the slower stage
    measured = "copy_measured_us: {pageable: [[1000000, 500], [100000000, 30000]], pageable_to_host: [[1000000, 900], [100000000, 40000]]}"
    m = machine(f"host_memcpy_gb_per_s: 4\n{measured}")
    assert m.host_copy_us(100e6, pageable=True) == pytest.approx(30_000)
    assert m.host_copy_us(100e6, to_host=True, pageable=True) == pytest.approx(40_000)
    assert m.host_copy_us(100e6) == pytest.approx(10_000)
    assert m.to_json()["host_memcpy_gb_per_s"] == 4 and set(m.to_json()["copy_measured_us"]) == {"pageable", "pageable_to_host"}


def test_builder_takes_memory_and_refuses_it_where_it_means_nothing():
    b = commdsl.Builder(world_size=1, streams=("a", "b"))
    b.rank(0).copy("x", 1 << 20, "h2d", memory="pageable", stream="b")
    assert b.build().ops[0][0].host_memory is HostMemory.PAGEABLE
    with pytest.raises(ScheduleError, match="moves device memory only"):
        commdsl.Builder(world_size=1).rank(0).copy("x", 1 << 20, memory="pageable")
    with pytest.raises(ScheduleError, match="moves device memory only"):
        commdsl.Builder(world_size=2).rank(0).copy("x", 1 << 20, peer=1, memory="pinned")
    with pytest.raises(ScheduleError, match="unknown memory 'paged'"):
        commdsl.Builder(world_size=1).rank(0).copy("x", 1 << 20, "d2h", memory="paged")


def test_executor_holds_the_host_for_a_pageable_copy(tmp_path):
    """On gloo the copy runs on its stream's thread; the host waits for it, so the compute
    issued after it on another stream starts after its end (a pinned copy would overlap)."""
    sched = tmp_path / "pageable.yaml"
    sched.write_text("name: pageable\nworld: 1\nstreams: [a, b]\nprogram: |\n"
                     "  copy x 64MiB from host memory=pageable on b\n  compute C 2ms on a\n"
                     "  copy y 64MiB to host on b\n  compute D 2ms on a\n")  # fmt: skip
    out = tmp_path / "m.json"
    run = subprocess.run([sys.executable, "-m", "commdsl.run", str(sched), "--out", str(out), "--warmup", "0", "--iters", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    tl = Timeline.read(out)
    spans = {s.name: s for s in tl.exec_spans().values()}
    issue = {s.op_id: s for s in tl.spans if s.role is SpanRole.ISSUE}
    x, c = spans["x"], spans["C"]
    assert c.start_us >= x.end_us - 1, (x, c)
    assert issue[x.op_id].end_us >= x.end_us - 1  # the host's issue of x lasts until x is done
    assert issue[spans["y"].op_id].end_us < spans["y"].end_us  # a pinned copy returns at once
    assert {op.kind for op in commdsl.load(sched).ops[0]} == {OpKind.COPY, OpKind.COMPUTE}


def test_profiler_traces_name_pageable_copies_as_cupti_does_and_import_reads_them_back(tmp_path):
    """`simulate --trace-dir` names a pageable copy `Memcpy HtoD (Pageable -> Device)`, as
    CUPTI does, and `import kineto` turns it back into `memory=pageable`."""
    from commdsl.cli import main

    sched = tmp_path / "s.yaml"
    sched.write_text("name: s\nworld: 1\nstreams: [a, b]\nprogram: |\n  copy x 64MiB from host memory=pageable on b\n"
                     "  copy y 64MiB to host on b\n  compute C 1ms on a\n")  # fmt: skip
    traces, out = tmp_path / "traces", tmp_path / "replay.yaml"
    assert main(["simulate", str(sched), "--machine", "h100-nvlink", "--trace-dir", str(traces), "--gantt", "never"]) == 0
    names = {e["name"] for e in json.loads((traces / "rank-0.pt.trace.json").read_text())["traceEvents"] if e.get("cat") == "gpu_memcpy"}
    assert names == {"Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)"}
    assert main(["import", "kineto", str(traces), "-o", str(out)]) == 0
    copies = [op for op in commdsl.load(out).ops[0] if op.kind is OpKind.COPY]
    assert [(op.copy_dir, op.host_memory) for op in copies] == [(CopyDir.H2D, HostMemory.PAGEABLE), (CopyDir.D2H, HostMemory.PINNED)]
