"""`commdsl sweep` and `commdsl.sweep`: every combination, failures as rows, outputs, bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path

import pytest

import commdsl
from commdsl.cli import main
from commdsl.sweeps import Objective, Row, best_rows, pareto_front, parse_values

# Two ranks exchange `size` bytes: in order 0 rank 0 sends first and rank 1 receives
# first (fine); in order 1 both send first (a head-to-head deadlock); a memory param
# beyond the device fails the point; `assert` refuses n > 3.
EXCHANGE = """\
name: exchange
params: {order: 0, size: 8MiB, mem: 1GiB, n: 1}
world: 2
program: |
  assert n <= 3, "n must be at most 3"
  alloc buf mem
  for i in range(n):
      compute F[i] 1ms
      if rank == 0 or order == 1:
          send x[i] size to 1 - rank
          recv y[i] size from 1 - rank
      else:
          recv x[i] size from 1 - rank
          send y[i] size to 1 - rank
  free buf
"""


@pytest.fixture
def exchange(tmp_path: Path) -> str:
    path = tmp_path / "exchange.yaml"
    path.write_text(EXCHANGE)
    return str(path)


@pytest.mark.parametrize("text,values", [
    ("2,4,8", ("2", "4", "8")),
    ("8:64:x2", ("8", "16", "32", "64")),
    ("2:8:2", ("2", "4", "6", "8")),
    ("2:9:3", ("2", "5", "8")),
    ("0.5:1.5:0.5", ("0.5", "1", "1.5")),
    ("16MiB, 32MiB", ("16MiB", "32MiB")),
    ("7", ("7",)),
    ("1MiB:8MiB:x2", ("1MiB", "2MiB", "4MiB", "8MiB")),
    ("1ms:2ms:0.5ms", ("1ms", "1.5ms", "2ms")),
    ("-1.5:-0.5:0.5", ("-1.5", "-1", "-0.5")),
    ("9007199254740993:9007199254740995:1", ("9007199254740993", "9007199254740994", "9007199254740995")),  # past 2**53: exact
    ("1:" + "0" * 5000 + "2:1", ("1", "2")),
])  # fmt: skip
def test_values(text, values):
    assert parse_values("p", text) == values


@pytest.mark.parametrize("text,words", [
    ("8:2:1", "the range is empty"),
    ("2:8:0", "the step must be more than 0"),
    ("2:8:x1", "the factor must be more than 1"),
    ("0:8:x2", "starts above 0"),
    ("2:8", "a range is START:STOP:STEP"),
    ("2,,4", "separated by commas"),
    ("1MiB:8GiB:x2", "take one unit"),
    ("1:2:3:4", "a range is START:STOP:STEP"),
    ("1:1" + "0" * 400 + ":x2", r"-p p=1:1000.*: 10000000000000000000\.\.\. \(401 characters\) is too large \(the limit is 2\*\*63\)"),
    ("1:9223372036854775808:1", "9223372036854775808 is too large"),
    ("1:1e400:x2", "1e400 is too large for a number"),
    ("1:2:1e309", "1e309 is too large for a number"),
    ("1:1000000:1", "more than 100,000 values"),
])  # fmt: skip
def test_bad_values(text, words):
    with pytest.raises(commdsl.UsageError, match=words):
        parse_values("p", text)


def test_failures_are_rows_and_metrics_are_the_simulators(exchange):
    rows = commdsl.sweep([exchange], {"order": "0,1", "n": "1:4:1", "mem": ["1GiB", "200GiB"]}, machines="dgx-h100",
                         network="analytic", jobs=2)  # fmt: skip
    assert len(rows) == 2 * 4 * 2
    assert [(r.params["order"], r.params["n"], r.params["mem"]) for r in rows[:3]] == [("0", "1", "1GiB"), ("0", "1", "200GiB"), ("0", "2", "1GiB")]
    kinds = {}
    for r in rows:
        kinds.setdefault(r.error_kind, set()).add((r.params["order"], r.params["n"], r.params["mem"]))
    assert kinds["ScheduleError"] == {(o, "4", m) for o in "01" for m in ("1GiB", "200GiB")}
    assert kinds["DeadlockError"] == {("1", n, "1GiB") for n in "123"} | {("1", n, "200GiB") for n in "123"} or \
        kinds["DeadlockError"] == {("1", n, "1GiB") for n in "123"}
    assert {("0", n, "200GiB") for n in "123"} <= kinds["MemoryExceededError"]
    assert kinds[None] == {("0", n, "1GiB") for n in "123"}
    for r in rows:
        if r.ok:
            program = commdsl.load(exchange, order=r.params["order"], n=r.params["n"], mem=r.params["mem"])
            m = commdsl.metrics(commdsl.simulate(program, "dgx-h100", network="analytic"))
            assert r.makespan_us == m.makespan_us and r.peak_memory_bytes == 1 << 30
            assert r.exposed_comm_us_per_rank == m.exposed_comm_us
        else:
            assert r.error and r.makespan_us is None and math.isinf(r.value(Objective.MAKESPAN))
    assert "n must be at most 3" in next(r.error for r in rows if r.error_kind == "ScheduleError")


def test_cli_sweep_writes_every_point(exchange, tmp_path, capsys):
    out_csv, out_json, report = tmp_path / "r.csv", tmp_path / "r.json", tmp_path / "r.html"
    argv = ["sweep", exchange, "-p", "order=0,1", "-p", "size=1MiB:4MiB:x2", "--machine", "dgx-h100,dgx-a100", "--nodes", "1,2",
            "-j", "2", "--network", "analytic", "--html", str(report), "--max-memory", "2GiB"]  # fmt: skip
    assert main([*argv, "--out", str(out_csv)]) == 0
    printed = capsys.readouterr().out
    assert "24 points: 12 simulated, 12 failed" in printed and "12 failed (DeadlockError)" in printed
    with open(out_csv, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 24
    assert {"param.order", "param.size", "machine", "nodes", "makespan_us", "bubble_fraction", "exposed_comm_us",
            "peak_memory_bytes", "exposed_comm_us_per_rank", "peak_memory_bytes_per_rank", "error"} <= set(table[0])  # fmt: skip
    assert {row["machine"] for row in table} == {"dgx-h100", "dgx-a100"} and {row["nodes"] for row in table} == {"1", "2"}
    assert all(json.loads(row["peak_memory_bytes_per_rank"]) == [1 << 30] * 2 for row in table if not row["error"])
    page = report.read_text()
    assert page.count("<circle") == 12 and "<polyline" in page or page.count("<circle") == 12
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert main([*argv, "--out", str(out_json)]) == 0
    rows = json.loads(out_json.read_text())
    assert len(rows) == 24 and sum(r["error_kind"] == "DeadlockError" for r in rows) == 12


def test_parquet(exchange, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "r.parquet"
    assert main(["sweep", exchange, "-p", "order=0,1", "-j", "1", "--network", "analytic", "--out", str(out)]) == 0
    table = pq.read_table(out).to_pylist()
    assert [r["param.order"] for r in table] == ["0", "1"] and table[1]["error_kind"] == "DeadlockError"
    assert table[0]["peak_memory_bytes_per_rank"] == [1 << 30, 1 << 30]


@pytest.mark.parametrize("args,words", [
    (["-p", "sise=1MiB"], "has no param 'sise'"),
    (["-p", "order=2:1:1"], "the range is empty"),
    (["--machine", "dgx-h900"], "no such machine file or preset: dgx-h900"),
    (["--nodes", "0"], "--nodes 0"),
    (["--out", "/no/such/folder/r.csv"], "does not exist"),
    (["--out", "r.xlsx"], "must end in .csv, .json, .parquet"),
    (["--html", "OUTDIR"], "Is a directory"),
    (["--max-memory", "80ms"], "give a size"),
    (["--address", "auto"], "use it with --executor ray"),
    (["-p", "order=0", "-p", "order=1"], "given twice"),
    (["-p", "order"], "KEY=VALUE"),
    (["-p", "order=0:1:x1e400"], "1e400 is too large for a number"),
    (["-p", "order=0:999:1", "-p", "n=0:999:1"], "the sweep has 1,000,000 points, more than the limit of 100,000"),
    (["-j", "99999999999"], "argument -j/--jobs: must be at most 1,024, got 99,999,999,999"),
    (["trace.json"], "unknown top-level key 'displayTimeUnit'"),
    (["empty.yaml"], "the schedule file is empty"),
    (["noprogram.yaml"], "the schedule has no `program:` block"),
])  # fmt: skip
def test_bad_input_is_one_message_before_any_work(exchange, tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "OUTDIR.html").mkdir()
    (tmp_path / "trace.json").write_text('{"displayTimeUnit": "ms", "traceEvents": []}')  # another tool's file
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "noprogram.yaml").write_text("params: {order: 0}\nworld: 2\n")
    args = [a.replace("OUTDIR", "OUTDIR.html") for a in args]
    assert main(["sweep", exchange, *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "r.xlsx").exists()


def test_a_sweep_where_no_point_simulated_exits_1_with_its_rows(exchange, tmp_path, capsys):
    out = tmp_path / "r.csv"
    argv = ["sweep", exchange, "-j", "1", "--network", "analytic", "--out", str(out)]
    assert main([*argv, "-p", "order=1"]) == 1  # a deadlock
    assert "1 points: 0 simulated, 1 failed" in capsys.readouterr().out
    assert [row["error_kind"] for row in csv.DictReader(out.open())] == ["DeadlockError"]
    assert main([*argv, "--max-ops", "1"]) == 1
    assert "more than 1 ops" in capsys.readouterr().out
    assert main([*argv, "-p", "order=0,1"]) == 0  # one point simulated


def test_a_point_past_max_ops_stops_at_its_own_limit(exchange):
    """The point's --max-ops bounds its expansion (here counted as it runs: 1F1B's loop
    bound is below the limit, rank 0's ops above it), not the default 5,000,000."""
    [row] = commdsl.sweep(["1f1b"], {"microbatches": "100000"}, network="analytic", jobs=1, max_ops=500_000)
    assert row.error_kind == "LimitError" and "the schedule expands to more than 500,000 ops" in row.error


def test_jobs_are_bounded(exchange):
    with pytest.raises(commdsl.UsageError, match="jobs must be a whole number from 1 to 1,024, got 1025"):
        commdsl.sweep([exchange], {"order": "0"}, jobs=1025)


@pytest.mark.parametrize("kw,words", [
    ({"schedules": None}, "sweep: schedules must be a schedule or a list of schedules, got None"),
    ({"schedules": 5}, "sweep: schedules must be .*, got 5"),
    ({"schedules": ["EXCHANGE", 5]}, "sweep: a schedule must be .*, got 5"),
    ({"params": [("order", "0")]}, "sweep: params must be a mapping .*, got a list"),
    ({"params": "order=0"}, "sweep: params must be a mapping .*, got 'order=0'"),
    ({"machines": None}, "sweep: machines must be a machine or a list of machines, got None"),
    ({"machines": [5]}, "sweep: a machine must be a preset name or a machine file, got 5"),
    ({"nodes": [2.0]}, "nodes must be a whole number, got 2.0"),
    ({"nodes": "2"}, "nodes must be a whole number, got '2'"),
    ({"nodes": True}, "nodes must be a whole number, got True"),
    ({"nodes": [1, float("nan")]}, "nodes must be a whole number, got nan"),
    ({"network": ["flow"]}, "network must be the name of a network model .*, got a list"),
    ({"max_ops": "x"}, "max_ops must be a whole number, got 'x'"),
    ({"max_ops": 0}, "max_ops must be at least 1, got 0"),
    ({"jobs": True}, "jobs must be a whole number, got True"),
    ({"jobs": 2.0}, "jobs must be a whole number, got 2.0"),
    ({"progress": 5}, "sweep: progress must be a function .*, got 5"),
    ({"executor": ["ray"]}, "unknown executor a list"),
    ({"executor": "ray", "address": 5}, "sweep: address must be .*, got 5"),
])  # fmt: skip
def test_a_bad_argument_is_a_usage_error_naming_it(exchange, kw, words):
    kw = {"schedules": [exchange], "params": {"order": "0"}, "network": "analytic", **kw}
    if isinstance(kw["schedules"], list):
        kw["schedules"] = [exchange if s == "EXCHANGE" else s for s in kw["schedules"]]
    with pytest.raises(commdsl.UsageError, match=words):
        commdsl.sweep(kw.pop("schedules"), kw.pop("params"), **kw)


def test_ray_that_cannot_start_is_a_usage_error(exchange, monkeypatch):
    """Ray raises bare `Exception`s (a cluster it cannot reach, a token it lacks): one
    usage error with Ray's message, not Ray's traceback."""
    import types

    def init(**kw):
        raise Exception("could not connect to the cluster")  # noqa: TRY002 (as Ray does)

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(commdsl.UsageError, match="cannot start or reach Ray: could not connect to the cluster"):
        commdsl.sweep([exchange], {"order": "0"}, network="analytic", executor="ray")


def test_several_schedules_need_the_same_params(exchange, capsys):
    assert main(["sweep", exchange, "1f1b", "-p", "order=0"]) == 2
    assert "schedule 1f1b has no param 'order'" in capsys.readouterr().err


def _row(makespan: float, memory: int, ok: bool = True) -> Row:
    return Row("s", {}, "m", None, makespan_us=makespan if ok else None, peak_memory_bytes=memory if ok else None,
               error=None if ok else "no")  # fmt: skip


def test_pareto_front_and_memory_cap():
    rows = [_row(10, 5), _row(8, 7), _row(9, 6), _row(12, 4), _row(9, 8), _row(11, 5), _row(1, 1, ok=False)]
    front = pareto_front(rows)
    assert [(r.makespan_us, r.peak_memory_bytes) for r in front] == [(12, 4), (10, 5), (9, 6), (8, 7)]
    for r in rows:
        if r.ok and r not in front:  # every point off the front is beaten by one on it
            assert any(f.makespan_us <= r.makespan_us and f.peak_memory_bytes <= r.peak_memory_bytes for f in front)
    assert [r.makespan_us for r in best_rows(rows, "makespan", max_memory_bytes=6)] == [9, 10, 11, 12]
    assert best_rows(rows, Objective.PEAK_MEMORY)[0].peak_memory_bytes == 4
    assert [r.makespan_us for r in best_rows(rows, "makespan", max_memory_bytes=0)] == []  # a cap of 0 is a cap
    with pytest.raises(commdsl.UsageError, match="unknown objective 'zz' \\(known: makespan, bubble, exposed_comm, peak_memory\\)"):
        best_rows(rows, "zz")
    for cap in (float("nan"), -1, "80GiB", True):
        with pytest.raises(commdsl.UsageError, match="max_memory_bytes must be a number of bytes from 0"):
            best_rows(rows, max_memory_bytes=cap)


def test_ray_executor_gives_the_same_rows(exchange):
    pytest.importorskip("ray")
    args = ([exchange], {"order": "0,1", "n": "1:4:1"})
    kw = {"machines": ["dgx-h100"], "network": "analytic", "jobs": 2}
    local = commdsl.sweep(*args, **kw)
    on_ray = commdsl.sweep(*args, executor="ray", **kw)
    strip = lambda rows: [(r.params, r.makespan_us, r.peak_memory_bytes_per_rank, r.error_kind, r.error) for r in rows]  # noqa: E731
    assert strip(on_ray) == strip(local)
    assert {r.error_kind for r in on_ray} == {None, "DeadlockError", "ScheduleError"}


def _die(task):
    os._exit(3)  # as the system's OOM killer ends a worker: no exception, no result


def test_a_worker_that_dies_is_one_message(exchange, monkeypatch):
    """Not a point's failure but the process's: one error naming the task's first point."""
    import multiprocessing

    import commdsl.sweeps as sweeps

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the poisoned evaluate reaches the workers only when they are forked")
    monkeypatch.setattr(sweeps, "evaluate", _die)  # the workers are forked: they run it too
    with pytest.raises(commdsl.CommdslError, match="a worker process ended abruptly while simulating .*order=0"):
        commdsl.sweep([exchange], {"order": "0,1"}, machines=["dgx-h100"], network="analytic", jobs=2)


def test_a_sweep_folds_data_parallel_replicas_where_that_is_exact(tmp_path, monkeypatch):
    """llm_3d over DP: a point folds its replicas where each copy fills whole nodes (TP 8:
    a replica a node; TP 4: two replicas a node, from DP 4), and its row is every rank's,
    as an unfolded simulation gives it. Where a fold would be only close (NCCL's tree on
    the replicas' NICs, with pipeline sends across nodes: a machine whose `nccl.algo` is
    tree), the point runs every rank, and its row is exact too."""
    from commdsl.dsl import load_schedule
    from commdsl.machine.loader import PRESETS_DIR

    small = {"layers": "4", "hidden": "256", "vocab": "512", "seq": "64", "microbatches": "4", "pp": "2", "heads": "8", "kv_heads": "8"}
    trees = tmp_path / "trees.yaml"
    trees.write_text((PRESETS_DIR / "dgx-h100.yaml").read_text().replace("name: dgx-h100", "name: trees")
                     .replace("nccl:\n  generation: hopper", "nccl:\n  algo: [tree]\n  generation: hopper"))  # fmt: skip
    import commdsl.sim

    simulated, simulate = {}, commdsl.sim.simulate

    def recording(program, machine, network="flow", **kw):  # what each point simulated (jobs=1: in this process)
        simulated[(machine.name == "dgx-h100", program.params)] = program.fold is not None
        return simulate(program, machine, network, **kw)

    monkeypatch.setattr(commdsl.sim, "simulate", recording)
    rows = commdsl.sweep(["llm_3d"], {**small, "dp": "2,4", "tp": "4,8"}, machines=["dgx-h100", str(trees)], nodes=8, jobs=1)
    monkeypatch.setattr(commdsl.sim, "simulate", simulate)
    assert len(rows) == 8 and all(r.ok for r in rows), [r.error for r in rows]
    folds = {}
    for r in rows:
        params = {k: str(v) for k, v in r.params.items()}
        machine = commdsl.load_machine(r.machine).with_nodes(8)
        every_rank = load_schedule("llm_3d", params)
        m = commdsl.metrics(commdsl.simulate(every_rank, machine))
        assert (r.num_ops, r.makespan_us, r.exposed_comm_us_per_rank, r.peak_memory_bytes_per_rank) == (
            every_rank.num_ops, m.makespan_us, m.exposed_comm_us, m.peak_memory_bytes)
        folds[(r.machine == "dgx-h100", params["dp"], params["tp"])] = simulated[(r.machine == "dgx-h100", every_rank.params)]
    # folded and exact: TP 8, and TP 4 from DP 4 (two replicas a node); DP 2 x TP 4 fills a
    # node only with both replicas; the tree makes TP 8's folds close only (every rank runs)
    assert folds == {(True, "2", "4"): False, (True, "4", "4"): True, (True, "2", "8"): True, (True, "4", "8"): True,
                     (False, "2", "4"): False, (False, "4", "4"): True, (False, "2", "8"): True, (False, "4", "8"): False}
