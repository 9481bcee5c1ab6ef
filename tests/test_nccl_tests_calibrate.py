"""Reading nccl-tests logs and calibrating a GPU cluster from them (`--from-nccl-tests`).

The fixture logs (tests/data/nccl_tests) are in nccl-tests 2.17's format: one process
driving 8 GPUs with NCCL INFO lines, one process per GPU under mpirun --tag-output, and
two nodes of 8. Their times come from dgx-h100 with other protocol latencies, Simple
efficiency, launch cost, P2P channel rate and NIC rate; calibrating dgx-h100 on them must
reproduce them.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.calibrate.nccl_logs import parse_log, read_logs
from commdsl.calibrate.nccl_tests import Run, from_nccl_tests, simulate_run
from commdsl.errors import LogError
from commdsl.ir import Algo, OpKind, Protocol
from commdsl.machine import load_machine, resolve_machine

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
    assert Run.of(ar) == Run(OpKind.ALL_REDUCE, 8, 8, False, algo=Algo.RING)


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

BAD_LOGS = [
    ("another tool", "---\nRDMA_Write BW Test\n #bytes  #iterations  BW peak[Gb/sec]\n 65536  5000  97.5\n", 1, "not nccl-tests output"),
    ("cut mid-line", HEADER + ROW + "        2048           512     float     sum      -1    10.5", 12, "cut-off result line"),
    ("no summary", HEADER + ROW, 11, "truncated"),
    ("no results", HEADER, 10, "no results"),
    ("two runs", HEADER + ROW + END + HEADER.split("\n", 2)[2], 16, "second run's header"),
    ("rank listed twice", HEADER.replace("#  Rank  1 Group", "#  Rank  0 Group") + ROW + END, 7, "rank 0 is listed twice"),
    ("mixed GPU counts", HEADER.replace("#  Rank  1 Group  0 Pid   4000", "#  Rank  1 Group  0 Pid   4001").replace("nGpus 2", "nGpus 1")
     .replace("#\n#       size", "#  Rank  2 Group  0 Pid   4001 on      node0 device  2 [0000:1a:00] NVIDIA H100 80GB HBM3\n#\n#       size")
     + ROW + END, 3, "processes drive different numbers of GPUs"),  # fmt: skip
    ("ranks not a multiple", HEADER.replace("nGpus 2", "nGpus 4") + ROW + END, 3, "not a multiple of nGpus 4"),
    ("unknown type", HEADER + ROW.replace("float", "quad") + END, 11, "type 'quad'"),
    ("time not a number", HEADER + ROW.replace("10.00    0.10", "oops    0.10", 1) + END, 11, "time 'oops'"),
    ("result before header", ROW + HEADER + ROW + END, 1, "comes before nccl-tests' `# nThread"),
    ("unknown tool", HEADER.replace("all_reduce_perf", "hypercube_perf", 1) + ROW + END, 2, "hypercube_perf"),
    ("mixed GPUs", HEADER.replace("device  1 [0000:19:00] NVIDIA H100 80GB HBM3", "device  1 [0000:19:00] NVIDIA A100-SXM4-80GB") + ROW + END,
     3, "mixes GPUs"),  # fmt: skip
]


@pytest.mark.parametrize("name,text,line,message", BAD_LOGS, ids=[b[0] for b in BAD_LOGS])
def test_bad_logs_are_errors_naming_the_line(name, text, line, message):
    with pytest.raises(LogError) as info:
        parse_log(text, "bad.log")
    assert message in info.value.message
    assert info.value.loc is not None and info.value.loc.file == "bad.log" and info.value.loc.line == line


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
    assert machine.calibration.by == "commdsl calibrate --from-nccl-tests" and AR.name in machine.calibration.source
    errors = []
    for log in read_logs([str(AR), str(AG), str(A2A)]):
        run = Run.of(log)
        for p in log.points[:: max(1, len(log.points) // 5)]:
            errors.append(abs(simulate_run(machine, run, p.size_bytes) / p.time_us - 1.0))
    assert statistics.median(errors) < 0.03 and max(errors) < 0.12, errors
    # The -g 8 log's small sizes are the host's launches: the fit finds the logs' launch cost.
    assert machine.nccl.launch_us == pytest.approx(4.0, rel=0.15)
    assert machine.nccl.protocol(Protocol.SIMPLE).efficiency == pytest.approx(0.93, rel=0.03)


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
    bad.write_text(HEADER + ROW)
    r = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--from-nccl-tests", str(bad), "--out", str(tmp_path / "m.yaml")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "log error: truncated" in r.stderr and f"{bad}:11" in r.stderr
    missing = subprocess.run([sys.executable, "-m", "commdsl.calibrate", "--from-nccl-tests", str(tmp_path / "nope.log"),
                              "--out", str(tmp_path / "m.yaml")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert missing.returncode == 2 and "cannot read nccl-tests log" in missing.stderr
