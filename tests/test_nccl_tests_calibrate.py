"""Calibrating a GPU cluster from its nccl-tests logs (`--from-nccl-tests`).

The fixture logs (tests/data/nccl_tests) are in nccl-tests 2.17's format: one process
driving 8 GPUs with NCCL INFO lines, one process per GPU under mpirun --tag-output, and
two nodes of 8. Their times come from dgx-h100 with other protocol latencies, Simple
efficiency, launch cost, P2P channel rate and NIC rate; calibrating dgx-h100 on them must
reproduce them. (How logs are read: tests/test_nccl_logs_*.py.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from commdsl.calibrate.nccl_logs import parse_log, read_logs
from commdsl.calibrate.nccl_tests import Run, bench_machine, choice, from_nccl_tests, simulate_run
from commdsl.errors import LogError
from commdsl.ir import Algo, OpKind
from commdsl.machine import load_machine, load_machine_text, resolve_machine

DATA = Path(__file__).parent / "data" / "nccl_tests"
AR = DATA / "h100_all_reduce_g8_ring.log"
AG = DATA / "h100_all_gather_mpi_ring.log"
A2A = DATA / "h100_alltoall_2nodes.log"


def test_the_fixture_logs_read_as_the_runs_they_record():
    ar, ag, a2a = read_logs([str(AR), str(AG), str(A2A)])
    assert (ar.tool, ar.op, ar.ranks, ar.gpus_per_process, ar.nodes, ar.graph) == ("all_reduce_perf", OpKind.ALL_REDUCE, 8, 8, 1, False)
    assert ar.algos == frozenset({Algo.RING}) and ar.protos is None  # from the NCCL INFO line
    assert ar.points[0].size_bytes == 8 and ar.points[-1].size_bytes == 8 * 4**15 and len(ar.points) == 16
    assert ar.device == "NVIDIA H100 80GB HBM3"
    assert (ag.op, ag.gpus_per_process, ag.algos) == (OpKind.ALL_GATHER, 1, frozenset({Algo.RING}))  # MPI prefixes stripped
    assert (a2a.op, a2a.ranks, a2a.nodes, a2a.algos) == (OpKind.ALL_TO_ALL, 16, 2, None)
    assert Run.of(ar) == Run(OpKind.ALL_REDUCE, 8, 8, False, algos=frozenset({Algo.RING}), nccl_version=(2, 26, 2))  # "NCCL version 2.26.2"


def test_a_log_s_nccl_release_chooses_its_algorithms():
    # 4 DGX H100 nodes, all_reduce 256 MiB: NCCL 2.24's table runs rings there, 2.29's
    # NVLS_TREE (tuning.cc: the NVLS bandwidth model changed in 2.28); the run takes the
    # release its log printed, whatever the base machine says.
    from commdsl.calibrate.nccl_tests import bench_machine, choice

    h100 = resolve_machine("dgx-h100")
    old, new = (Run(OpKind.ALL_REDUCE, 32, nccl_version=v) for v in ((2, 24, 3), (2, 29, 2)))
    assert bench_machine(h100, old).nccl.version == (2, 24, 3)
    assert choice(bench_machine(h100, old), old, 256 << 20).algo is Algo.RING
    assert choice(bench_machine(h100, new), new, 256 << 20).algo is Algo.NVLS_TREE


HEADER = """# nccl-tests version 2.17.9 nccl-headers=22602 nccl-library=22602
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4000 on      node0 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   4000 on      node0 device  1 [0000:19:00] NVIDIA H100 80GB HBM3
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
"""
ROW = "        1024           256     float     sum      -1    10.00    0.10    0.10       0    10.00    0.10    0.10       0\n"
END = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.1\n#\n# Collective test concluded: all_reduce_perf\n"

def test_a_log_without_its_tool_line_needs_the_tool_named(tmp_path):
    text = HEADER.replace("# Collective test starting: all_reduce_perf\n", "") + ROW + END
    with pytest.raises(LogError) as info:
        parse_log(text, "old.log")
    assert "TOOL=FILE" in info.value.hint
    path = tmp_path / "old.log"
    path.write_text(text)
    (log,) = read_logs([f"all_reduce_perf={path}"])
    assert log.op is OpKind.ALL_REDUCE and log.points[0].time_us == 10.0


def test_logs_of_different_gpus_are_not_calibrated_together(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(HEADER + ROW + END)
    b.write_text(HEADER.replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB") + ROW + END)
    with pytest.raises(LogError, match="different GPUs"):
        read_logs([str(a), str(b)])


def test_calibrating_from_the_logs_reproduces_them(tmp_path):
    out = tmp_path / "cluster.yaml"
    # The logs came from dgx-h100 when its P2P crossed a NIC at 0.78 of the NIC's rate; the
    # 2-node all_to_all alone cannot tell that from the NIC rate, so the base keeps it.
    base = tmp_path / "base.yaml"
    base.write_text(open(resolve_machine("dgx-h100").source).read().replace("p2p_net_efficiency: 1.0", "p2p_net_efficiency: 0.78"))
    machine = from_nccl_tests([str(AR), str(AG), str(A2A)], str(out), str(base), echo=lambda _: None)
    assert load_machine(out).nccl == machine.nccl
    assert machine.nccl.version == (2, 26, 2)  # the logs' nccl-library=22602: the machine chooses as that NCCL
    assert machine.calibration.by == "commdsl calibrate --from-nccl-tests" and AR.name in machine.calibration.source
    errors = []
    for log in read_logs([str(AR), str(AG), str(A2A)]):
        run = Run.of(log)
        for p in log.points[:: max(1, len(log.points) // 5)]:
            errors.append(abs(simulate_run(machine, run, p.size_bytes) / p.time_us - 1.0))
    assert statistics.median(errors) < 0.03 and max(errors) < 0.12, errors
    # The -g 8 log's small sizes are the host's launches: the fit finds the logs' launch cost.
    # (The other values the logs were made with depend on the model's version: the simulator's
    # errors above are what must hold.)
    assert machine.nccl.launch_us == pytest.approx(4.0, rel=0.15)


def test_the_command_line_writes_the_machine_without_torch(tmp_path):
    out = tmp_path / "fitted.yaml"
    code = (
        "import sys\nfrom commdsl.calibrate.main import main\n"
        f"rc = main(['--from-nccl-tests', {str(AR)!r}, {str(AG)!r}, '--out', {str(out)!r}, '--machine', 'dgx-h100'])\n"
        "print('torch' in sys.modules)\nsys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(out), "False"]
    assert "calibrate: 29 points in 2 log(s), base machine dgx-h100" in r.stderr
    assert "all_gather_perf on 8 GPUs" in r.stderr
    assert load_machine(out).nccl is not None


def test_the_command_line_reports_a_bad_log_with_its_line(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_text(HEADER.replace("maxBytes 1024", "maxBytes 4096") + ROW)  # stops short of its sweep: cut off
    r = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--from-nccl-tests", str(bad), "--out", str(tmp_path / "m.yaml")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "log error: truncated" in r.stderr and f"{bad}:11" in r.stderr
    missing = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--from-nccl-tests", str(tmp_path / "nope.log"),
                              "--out", str(tmp_path / "m.yaml")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 2 and "cannot read nccl-tests log" in missing.stderr


def _fitted(paths):
    from commdsl.calibrate.nccl_tests import fit
    from commdsl.machine import resolve_machine

    base = resolve_machine("dgx-h100")
    logs = read_logs([str(p) for p in paths])
    runs = [Run.of(log) for log in logs]
    return base, logs, runs, fit(base, Path(base.source).read_text(), logs, runs, [str(p) for p in paths])


def test_the_fit_is_the_simulator_on_the_training_points():
    from commdsl.calibrate.nccl_tests import _parameters, _points, _predict

    base, logs, runs, fitted = _fitted([AR, AG, A2A])
    points = _points(fitted.machine, base, logs, runs)
    closed = _predict(points, {**_parameters(base), **fitted.values})
    for p, c in zip(points, closed):
        # The machine file rounds each value to 4 digits: the closed form and the simulator agree to that.
        assert simulate_run(fitted.machine, runs[p.log], int(p.size)) == pytest.approx(c, rel=1e-3), (p.log, p.size)
    assert {"launch_us", "protocols.simple.efficiency", "scale.nic", "p2p_net_efficiency"} <= set(fitted.values)
    assert "scale.nic" in fitted.uses[2] and "scale.nic" not in fitted.uses[0]  # only the 2-node log crosses the network


def test_the_report_is_the_simulators_error_at_every_point(tmp_path):
    from commdsl.calibrate.nccl_tests import simulated_errors

    lines: list[str] = []
    machine = from_nccl_tests([str(AR), str(A2A)], str(tmp_path / "m.yaml"), "dgx-h100", echo=lines.append)
    logs = read_logs([str(AR), str(A2A)])
    errors = simulated_errors(machine, logs, [Run.of(log) for log in logs])
    for log, errs in zip(logs, errors):
        errs = [abs(e) for e in errs]
        want = (f"  {log.path}: {log.tool} on {log.ranks} GPUs ({log.nodes} node(s)): simulator's error median "
                f"{100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}% over {len(log.points)} sizes")
        assert want in lines, lines
    fitted_lines = [line for line in lines if line.startswith("    fitted: ")]
    assert len(fitted_lines) == 2 and "scale.nic" in fitted_lines[1] and "scale.nic" not in fitted_lines[0]
    assert any(line.startswith("  not fitted (no point depends on them), from dgx-h100: ") and "nvls_latency_us" in line for line in lines)


def test_calibrate_then_predict_within_five_percent():
    from commdsl.calibrate.nccl_tests import holdout_errors
    from commdsl.machine import resolve_machine

    logs = read_logs([str(AR), str(AG), str(A2A)])
    out = holdout_errors(resolve_machine("dgx-h100"), logs, [Run.of(log) for log in logs])
    assert set(out) == {"small->large", "large->small"}
    for direction, errors in out.items():
        assert statistics.median(abs(e) for e in errors) <= 0.05, (direction, errors)


def _log_text(tool: str, run: Run, points: list[tuple[int, float]]) -> str:
    """An nccl-tests log of `run` (one process per GPU, 8 per node) with the given times."""
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {5000 + r:6d} on {'n%d' % (r // 8):>10} device {r % 8:2d} [0000:18:00] NVIDIA H100 80GB HBM3\n"
                    for r in range(run.ranks))  # fmt: skip
    rows = "".join(f"{s:12d}  {s // 8:12d}    double    none      -1  {t:7.2f}  {s / t / 1e3:6.2f}    0.00       0  {t:7.2f}  {s / t / 1e3:6.2f}"
                   "    0.00     N/A\n" for s, t in points)  # fmt: skip
    return (f"# Collective test starting: {tool}\n# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 "
            f"agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n{ranks}#\n"
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
            f"{rows}# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1\n#\n")


def test_the_pcie_rate_is_fitted_where_the_logs_depend_on_it(tmp_path):
    # Two DGX H100 nodes whose GPU-to-NIC PCIe runs at 30 GB/s (the preset says 55): an
    # all_to_all between the nodes is bound by it, and calibrate must fit it. (On this
    # topology the PCIe and the NIC rates lie on one path: the logs fix the slower of the two.)
    from commdsl.calibrate.nccl_tests import RATES, fitted_machine_text
    from commdsl.machine import load_machine_text, resolve_machine

    base = resolve_machine("dgx-h100")
    text = Path(base.source).read_text()
    truth = load_machine_text(fitted_machine_text(text, {"scale.pcie": 30 / 55}, ["truth"]), "truth.yaml")
    run = Run(OpKind.ALL_TO_ALL, 16, dtype=Run(OpKind.ALL_TO_ALL, 16).dtype)
    sizes = [2**k for k in range(20, 33, 2)]
    log = tmp_path / "a2a_pcie.log"
    log.write_text(_log_text("alltoall_perf", run, [(s, simulate_run(truth, run, s)) for s in sizes]))
    lines: list[str] = []
    machine = from_nccl_tests([str(log)], str(tmp_path / "m.yaml"), "dgx-h100", echo=lines.append)
    for s in sizes:
        assert simulate_run(machine, run, s) == pytest.approx(simulate_run(truth, run, s), rel=0.03), s
    assert simulate_run(base, run, sizes[-1]) < 0.85 * simulate_run(truth, run, sizes[-1])  # the preset alone is far off
    assert "scale.pcie" in next(line for line in lines if line.startswith("    fitted: "))
    assert {r.name for r in RATES} >= {"nvlink", "pcie", "nic", "shm", "memory"}


def test_a_failed_calibration_leaves_no_machine_file(tmp_path, monkeypatch):
    from commdsl.calibrate import nccl_tests
    from commdsl.errors import CommdslError

    out = tmp_path / "m.yaml"

    def fail(*args, **kwargs):
        raise LogError("the simulation failed")

    monkeypatch.setattr(nccl_tests, "simulated_errors", fail)
    with pytest.raises(CommdslError):
        from_nccl_tests([str(AR)], str(out), "dgx-h100", echo=lambda _: None)
    assert list(tmp_path.iterdir()) == []
    out.write_text("an older machine file\n")
    with pytest.raises(CommdslError):
        from_nccl_tests([str(AR)], str(out), "dgx-h100", echo=lambda _: None)
    assert out.read_text() == "an older machine file\n" and list(tmp_path.iterdir()) == [out]


def test_outputs_and_layouts_it_cannot_take_are_refused_before_any_work(tmp_path):
    from commdsl.errors import UsageError

    with pytest.raises(UsageError, match="a folder|Is a directory"):
        from_nccl_tests([str(AR)], str(tmp_path), "dgx-h100", echo=lambda _: None)
    (loop := tmp_path / "loop.yaml").symlink_to(loop)
    with pytest.raises(UsageError, match="Symlink loop|Too many levels of symbolic links"):
        from_nccl_tests([str(AR)], str(loop), "dgx-h100", echo=lambda _: None)
    loop.unlink()
    os.mkfifo(fifo := tmp_path / "fifo.yaml")
    with pytest.raises(UsageError, match="a pipe that nothing reads"):
        from_nccl_tests([str(AR)], str(fifo), "dgx-h100", echo=lambda _: None)
    fifo.unlink()
    wide = tmp_path / "wide.log"  # 16 GPUs on each of 2 hosts: more than a DGX node has
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {100 + r:5d} on node{r // 16} device {r % 16:2d} [0000:{r % 16:02x}:00] NVIDIA H100 80GB HBM3\n"
                    for r in range(32))  # fmt: skip
    head, tail = HEADER.split("#  Rank  0", 1)[0], "#\n#       size" + HEADER.split("#\n#       size", 1)[1]
    wide.write_text(head.replace("nGpus 2", "nGpus 1") + ranks + tail + ROW + END)
    with pytest.raises(LogError, match="the run has 16 GPUs on each of 2 nodes, and machine dgx-h100 has 8 a node") as info:
        from_nccl_tests([str(wide)], str(tmp_path / "m.yaml"), "dgx-h100", echo=lambda _: None)
    assert (info.value.loc.file, info.value.loc.line) == (str(wide), 3)
    # 8 GPUs on one node, a base machine of 4 a node: not spread over two of its nodes.
    with pytest.raises(LogError, match="the run has 8 GPUs on one node, and machine gh200-quad has 4 a node") as info:
        from_nccl_tests([str(AR)], str(tmp_path / "m.yaml"), "gh200-quad", echo=lambda _: None)
    assert (info.value.loc.file, info.value.loc.line) == (str(AR), read_logs([str(AR)])[0].line)
    assert not (tmp_path / "m.yaml").exists()


def test_an_algorithm_the_base_machine_lacks_is_an_error_at_the_logs_line(tmp_path):
    # NCCL_ALGO=CollNetDirect from the log's INFO line, on a DGX H100 without CollNet: NCCL's choice fails
    # inside the fit, named at the log's point, not at the schedule calibrate simulates.
    log = tmp_path / "collnet.log"
    log.write_text(AR.read_text().replace("NCCL_ALGO set by environment to Ring", "NCCL_ALGO set by environment to CollNetDirect"))
    with pytest.raises(LogError) as info:
        from_nccl_tests([str(log)], str(tmp_path / "m.yaml"), "dgx-h100", echo=lambda _: None)
    assert (info.value.loc.file, info.value.loc.line) == (str(log), read_logs([str(log)])[0].points[0].line)
    assert "cannot run this point as the log ran it: NCCL has no collnet_direct among the machine's nccl.algo" in info.value.message
    assert "NCCL_ALGO collnet_direct" in info.value.hint
    assert not (tmp_path / "m.yaml").exists()


def test_a_headerless_table_calibrates_with_what_the_command_line_gives(tmp_path):
    from commdsl.errors import UsageError

    table = Path(__file__).parent / "data" / "nccl_logs" / "headerless_table.txt"
    with pytest.raises(UsageError, match="no base machine for GPU 'not named in the logs'"):
        from_nccl_tests([f"all_reduce_perf:8={table}"], str(tmp_path / "m.yaml"), echo=lambda _: None)
    lines: list[str] = []
    from_nccl_tests([f"all_reduce_perf:8={table}"], str(tmp_path / "m.yaml"), "dgx-h100", echo=lines.append)
    assert any(line.startswith(f"  {table}: all_reduce_perf on 8 GPUs: simulator's error median") for line in lines), lines
    assert load_machine(tmp_path / "m.yaml").nccl is not None


def test_a_point_the_simulator_refuses_is_named_at_its_log_line(monkeypatch):
    from commdsl.calibrate import nccl_tests
    from commdsl.errors import ScheduleError, SourceLoc
    from commdsl.machine import resolve_machine

    def refuse(*args, **kwargs):
        raise ScheduleError("ops end past the horizon", SourceLoc("<nccl-tests>", 4, 8))

    monkeypatch.setattr(nccl_tests, "simulate_run", refuse)
    logs = read_logs([str(AR)])
    with pytest.raises(LogError) as info:
        nccl_tests.simulated_errors(resolve_machine("dgx-h100"), logs, [Run.of(log) for log in logs])
    assert info.value.loc.file == str(AR) and info.value.loc.line == logs[0].points[0].line
    assert "cannot simulate this point: ops end past the horizon" in info.value.message


def test_the_closed_form_sizes_p2p_by_the_communicator_as_the_simulator_does(tmp_path):
    # nccl-tests' sendrecv ring over 10 DGX H100 nodes: NCCL sizes each peer's P2P channels
    # from its channels across nodes (one each among 80 ranks), and a P2P channel that
    # crosses the network runs at most at NCCL's per-channel network rate (14 GB/s), so
    # the sends across nodes, not the NICs, pace it. The fit's closed form must see the
    # same channels and rates as the simulator.
    from commdsl.calibrate.nccl_tests import _parameters, _points, _predict, busbw_gb_per_s

    base = resolve_machine("dgx-h100")
    run = Run(OpKind.SEND, 80, dtype=Run(OpKind.SEND, 80).dtype)
    sizes = [1 << 28, 1 << 30]
    times = {s: simulate_run(base, run, s) for s in sizes}
    log = tmp_path / "sendrecv_10_nodes.log"
    log.write_text(_log_text("sendrecv_perf", run, list(times.items())))
    logs = read_logs([str(log)])
    (parsed,) = logs
    assert (parsed.op, parsed.ranks, parsed.nodes) == (OpKind.SEND, 80, 10)
    points = _points(base, base, logs, [Run.of(parsed)])
    for p, closed in zip(points, _predict(points, _parameters(base))):
        assert closed == pytest.approx(times[int(p.size)], rel=1e-3)
    assert busbw_gb_per_s(OpKind.SEND, 80, sizes[-1], times[sizes[-1]]) < 41  # 2 channels x 20 GB/s, below a NIC's 47


def test_the_p2p_channels_network_rate_is_fitted_from_a_multi_node_sendrecv_log(tmp_path):
    # A cluster whose P2P channels across the network reach 9 GB/s (NCCL's figure is 14):
    # its 10-node sendrecv log depends on that rate only, and calibrate must fit it, with
    # the closed form and the simulator agreeing on the fitted machine.
    from commdsl.calibrate.nccl_tests import _parameters, _points, _predict, fit, fitted_machine_text
    from commdsl.machine import load_machine_text

    base = resolve_machine("dgx-h100")
    text = Path(base.source).read_text()
    truth = load_machine_text(fitted_machine_text(text, {"p2p_net_channel_bandwidth_gb_per_s": 9.0}, ["truth"]), "truth.yaml")
    run = Run(OpKind.SEND, 80, dtype=Run(OpKind.SEND, 80).dtype)
    sizes = [1 << k for k in range(24, 31, 2)]
    log = tmp_path / "sendrecv_10_nodes.log"
    log.write_text(_log_text("sendrecv_perf", run, [(s, simulate_run(truth, run, s)) for s in sizes]))
    logs = read_logs([str(log)])
    runs = [Run.of(log) for log in logs]
    fitted = fit(base, text, logs, runs, [str(log)])
    assert "p2p_net_channel_bandwidth_gb_per_s" in fitted.uses[0] and "p2p_channel_bandwidth_gb_per_s" not in fitted.uses[0]
    assert fitted.values["p2p_net_channel_bandwidth_gb_per_s"] == pytest.approx(9.0, rel=0.02)
    points = _points(fitted.machine, base, logs, runs)
    for p, closed in zip(points, _predict(points, {**_parameters(base), **fitted.values})):
        assert simulate_run(fitted.machine, runs[0], int(p.size)) == pytest.approx(closed, rel=1e-3), p.size
        assert simulate_run(fitted.machine, runs[0], int(p.size)) == pytest.approx(simulate_run(truth, run, int(p.size)), rel=0.02)


def test_the_closed_form_keeps_the_proxies_posting_of_an_all_to_all(tmp_path):
    # nccl-tests' all_to_all over 10 DGX H100 nodes: besides its fitted latencies it waits
    # 71 x 3 us while NCCL's proxies post its remote peers (the host's network overhead,
    # not a fitted parameter). The closed form must count it once, as the simulator does,
    # with the latencies at their values or at any other.
    from commdsl.calibrate.nccl_tests import LATENCIES, _parameters, _points, _predict

    base = resolve_machine("dgx-h100")
    run = Run(OpKind.ALL_TO_ALL, 80, dtype=Run(OpKind.ALL_TO_ALL, 80).dtype)
    sizes = [80 << 16, 80 << 20, 80 << 24]
    times = {s: simulate_run(base, run, s) for s in sizes}
    log = tmp_path / "alltoall_10_nodes.log"
    log.write_text(_log_text("alltoall_perf", run, list(times.items())))
    logs = read_logs([str(log)])
    points = _points(base, base, logs, [Run.of(logs[0])])
    assert all(p.fixed_us == pytest.approx(71 * 3 * base.nccl.net_overhead_us) for p in points)
    for p, closed in zip(points, _predict(points, _parameters(base))):
        assert closed == pytest.approx(times[int(p.size)], rel=1e-3), p.size
    # with every fitted latency doubled, the closed form moves by the fitted part alone
    values = _parameters(base)
    doubled = {k: 2 * v if k.endswith("latency_us") or ".hop." in k else v for k, v in values.items()}
    for p, once, twice in zip(points, _predict(points, values), _predict(points, doubled)):
        fitted_part = sum(k * values[e.name(p.proto, p.intra)] for k, e in zip(p.latency, LATENCIES) if k)
        assert fitted_part > 0 and twice - once == pytest.approx(fitted_part, rel=1e-9)


def test_a_sharp_log_calibrates_a_machine_with_collnet(tmp_path):
    log = Path(__file__).parent / "data" / "nccl_logs" / "sharp_collnet_snipped.md"  # mpirun -x NCCL_COLLNET_ENABLE=1
    lines: list[str] = []
    machine = from_nccl_tests([str(log)], str(tmp_path / "m.yaml"), "dgx-a100", echo=lines.append)
    assert machine.nccl.collnet and not resolve_machine("dgx-a100").nccl.collnet
    assert any("all_reduce_perf on 16 GPUs (2 node(s), CollNet)" in line for line in lines), lines


def test_a_run_on_part_of_each_node_calibrates_and_its_closed_form_is_the_simulator(tmp_path):
    from commdsl.calibrate.nccl_tests import _parameters, _points, _predict, placement

    part = Path(__file__).parent / "data" / "nccl_logs" / "sweep_with_failed_run.log"  # 4 GPUs on each of 2 nodes
    base, logs, runs, fitted = _fitted([part])
    assert [(run.ranks, run.ranks_per_node) for run in runs] == [(8, 4), (8, 4)]
    world, members = placement(bench_machine(base, runs[0]), runs[0])
    assert (world, members) == (16, (0, 1, 2, 3, 8, 9, 10, 11))  # the first 4 GPUs of each DGX node, its rails 0-3
    points = _points(fitted.machine, base, logs, runs)
    closed = _predict(points, {**_parameters(base), **fitted.values})
    for p, c in zip(points, closed):
        assert simulate_run(fitted.machine, runs[p.log], int(p.size)) == pytest.approx(c, rel=1e-3), (p.log, p.size)
    # The same 8 ranks on one node would cross no NIC: the run's time is its layout's.
    one_node = replace(runs[0], ranks_per_node=None)
    assert simulate_run(base, runs[0], 1 << 30) > 2 * simulate_run(base, one_node, 1 << 30)


def test_a_round_that_moves_nccls_choice_to_a_worse_fit_does_not_replace_a_better_one(monkeypatch):
    # The fit runs again while the fitted machine makes other choices than the one it was
    # fitted on; each round is scored on its own machine's choices (what the simulator
    # will time), and the best round is kept. Round 1 here gives the network 20 us per
    # message, which NCCL's table counts, so its choice moves at a size of the all_reduce
    # (another round follows); the rounds after it are far worse (every latency x 1000).
    from commdsl.calibrate import nccl_tests as nt

    part = Path(__file__).parent / "data" / "nccl_logs" / "sweep_with_failed_run.log"  # 4 GPUs on each of 2 nodes
    logs = read_logs([str(part)], [])
    base = resolve_machine("dgx-h100")
    rounds = []

    def fake_minimise(points, base_vals, free, start, progress, caps=None):
        assert "net_latency_us" in free
        good = {k: base_vals[k] for k in free} | {"net_latency_us": 20.0}
        bad = {k: (v * 1000 if "latency" in k or ".hop." in k else v) for k, v in good.items()}
        rounds.append(bad if rounds else good)
        return rounds[-1]

    monkeypatch.setattr(nt, "_minimise", fake_minimise)
    fitted = nt.fit(base, Path(base.source).read_text(), logs, [Run.of(log) for log in logs], [str(part)])
    assert len(rounds) >= 2  # the first round's machine chose otherwise, so the fit ran again
    assert fitted.values == rounds[0]
    assert fitted.machine.nccl.net_latency_us == pytest.approx(20.0)


def test_a_fitted_rate_moves_times_not_nccls_choices():
    # NCCL's table rates its graphs by the speeds its search reads off the hardware: a fit
    # that finds the links deliver less (or more) keeps NCCL's choices where they were, and
    # the fitted machine file says so (nccl.graph_scale, the inverse of the fitted rate).
    from commdsl.calibrate import nccl_tests as nt

    part = Path(__file__).parent / "data" / "nccl_logs" / "sweep_with_failed_run.log"
    logs = read_logs([str(AR), str(part)], [])
    runs = [Run.of(log) for log in logs]
    base = resolve_machine("dgx-h100")
    values = {"scale.nvlink": 0.2, "scale.nic": 0.8}
    text = nt.fitted_machine_text(Path(base.source).read_text(), values, [str(part)])
    slow = load_machine_text(text, "<fitted>")
    assert dict(slow.nccl.graph_scale) == {"nvlink": 5.0, "nic": 1.25}
    sizes = [p.size_bytes for log in logs for p in log.points]
    for run in runs:
        for size in sizes:
            assert choice(bench_machine(slow, run), run, size) == choice(bench_machine(base, run), run, size)
    run = runs[0]
    assert abs(simulate_run(slow, run, 1 << 28) / simulate_run(base, run, 1 << 28) - 1) > 0.1  # the times move
    # Without graph_scale the same links would have moved NCCL's choice somewhere.
    leaky = replace(slow, nccl=replace(slow.nccl, graph_scale=()))
    assert any(choice(bench_machine(leaky, run), run, size) != choice(bench_machine(base, run), run, size) for run in runs for size in sizes)


def test_check_times_the_logs_on_the_machine_as_it_is_and_writes_nothing(tmp_path):
    # `commdsl calibrate --from-nccl-tests LOG --check`: every size's measured and predicted
    # time and error on the base machine, fitting nothing; the errors are the simulator's.
    cmd = [sys.executable, "-m", "commdsl.cli", "calibrate", "--from-nccl-tests", str(AG), "--machine", "dgx-h100", "--check"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []
    (log,) = read_logs([str(AG)])
    run = Run.of(log)
    base = resolve_machine("dgx-h100")
    lines = [line.split() for line in r.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(w[0]) for w in lines] == [p.size_bytes for p in log.points]
    for words, p in zip(lines, log.points):
        predicted = simulate_run(base, run, p.size_bytes)
        assert float(words[2]) == pytest.approx(predicted, abs=0.006)
        assert float(words[3].rstrip("%")) == pytest.approx(100 * (predicted / p.time_us - 1), abs=0.06)
    assert "median" in r.stdout.splitlines()[-1]
    for bad, message in ((["--out", "m.yaml"], "--check writes no machine file"),):
        r = subprocess.run(cmd + bad, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "commdsl.cli", "calibrate", "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--check goes with --from-nccl-tests" in r.stderr


def test_a_fit_never_moves_a_link_faster_than_its_line_rate(tmp_path):
    # A log faster than the NICs can signal (an all_to_all across two nodes, timed at half):
    # the fit takes the NICs to their line rate (400 Gb/s: 50 GB/s of dgx-h100's 47) and no
    # further; the rest of the log's speed goes to what else it moved.
    from commdsl.calibrate import nccl_tests as nt

    fast = tmp_path / "fast.log"
    lines = []
    for line in A2A.read_text().split("\n"):
        words = line.split()
        if len(words) >= 13 and words[0].isdigit() and int(words[0]) >= 1 << 26:
            size = int(words[0])
            t = float(words[5]) / 2
            line = line.replace(words[5], f"{t:.2f}", 1).replace(words[6], f"{size / (t * 1e3):.2f}", 1)
        lines.append(line)
    fast.write_text("\n".join(lines))
    logs = read_logs([str(fast)], [])
    base = resolve_machine("dgx-h100")
    assert nt._rate_caps(base) == {"scale.nic": pytest.approx(50 / 47)}
    fitted = nt.fit(base, Path(base.source).read_text(), logs, [Run.of(log) for log in logs], [str(fast)])
    assert "scale.nic" in fitted.values and fitted.values["scale.nic"] <= 50 / 47 + 1e-9
    nic = next(l for l in fitted.machine.topology.links if l.kind.value == "network")
    assert nic.bandwidth_gb_per_s <= nic.line_rate_gb_per_s == 50
