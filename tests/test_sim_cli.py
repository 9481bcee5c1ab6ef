"""`commdsl simulate` end to end: summary, --json, --trace, determinism across processes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

from commdsl.cli import main
from commdsl.timeline import SpanRole, Timeline


def test_simulate_1f1b_prints_a_summary(capsys):
    assert main(["simulate", "1f1b"]) == 0
    out = capsys.readouterr().out
    assert "1f1b on h100-nvlink (flow network)" in out
    assert "makespan" in out and "bubble fraction" in out and "critical path" in out
    assert "exposed comm" in out
    assert "F/B...: compute" in out  # the Gantt legend (small schedule)


def test_check_lists_params_on_one_line_and_none_when_there_are_none(capsys, tmp_path):
    assert main(["check", "1f1b"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("  params "))
    assert line.startswith("  params stages=4, ") and line.endswith(", optimizer=1GiB")  # not wrapped at 80 columns
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nworld: 2\nprogram: |\n  compute F 1ms\n")
    assert main(["check", str(bare)]) == 0
    assert "\n  params" not in capsys.readouterr().out


def test_json_summary(capsys):
    assert main(["simulate", "1f1b", "-p", "stages=2", "-p", "microbatches=3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["makespan_us"] > 0 and data["world_size"] == 2
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert {"compute_us", "comm_us", "exposed_comm_us", "idle_us", "bubble_fraction"} <= set(data["ranks"][0])
    path = data["critical_path"]
    assert path[-1]["end_us"] == data["makespan_us"]
    assert all({"op_id", "kind", "name", "source"} <= set(s) for s in path)


def test_trace_has_one_track_per_rank_and_stream(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["simulate", "1f1b", "--trace", str(out), "--gantt", "never"]) == 0
    tl = Timeline.read(out)
    assert tl.source == "predicted" and tl.world_size == 4
    for rank in range(4):
        assert tl.tracks[rank][:2] == ["host", "compute"]
    assert all(s.role in (SpanRole.EXEC, SpanRole.ISSUE) for s in tl.spans)
    assert tl.meta["machine"]["name"] == "h100-nvlink" and tl.meta["network"]["model"] == "flow"
    assert len(tl.flows) > 0


def _run(args, seed: str):
    env = dict(os.environ, PYTHONHASHSEED=seed, COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], capture_output=True, env=env, timeout=120, check=True).stdout


def test_outputs_are_byte_identical_across_processes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    out_a = _run(["simulate", "1f1b", "--trace", str(a), "--gantt", "always"], "1")
    out_b = _run(["simulate", "1f1b", "--trace", str(b), "--gantt", "always"], "2")
    assert a.read_bytes() == b.read_bytes()
    assert out_a.replace(b"a.json", b"b.json") == out_b
    assert _run(["simulate", "1f1b", "--json"], "3") == _run(["simulate", "1f1b", "--json"], "4")


def test_bad_network_flag_is_a_usage_error(capsys):
    assert main(["simulate", "1f1b", "--network", "flow-of-fantasy"]) == 2
    assert "usage error" in capsys.readouterr().err


def test_json_aggregates_transfers_and_lists_flows_only_with_flows(capsys):
    args = ["simulate", "1f1b", "-p", "stages=3", "-p", "microbatches=4", "--json"]
    assert main(args) == 0
    brief = json.loads(capsys.readouterr().out)
    assert brief["flows"] == [] and brief["transfers"] and brief["links"]
    assert main([*args, "--flows"]) == 0
    full = json.loads(capsys.readouterr().out)
    # One flow per send/recv pair: 2 boundaries x 4 microbatches x (activation + gradient).
    assert len(full["flows"]) == sum(t["count"] for t in full["transfers"]) == 16
    assert {"ops", "kind", "transport", "algo", "bytes", "start_us", "end_us", "latency_us", "bottleneck"} <= set(full["flows"][0])
    assert {k: v for k, v in full.items() if k != "flows"} == {k: v for k, v in brief.items() if k != "flows"}
    assert main(["simulate", "1f1b", "--flows"]) == 2
    assert "--flows" in capsys.readouterr().err


def test_simulate_json_imports_neither_rich_nor_other_commands():
    # Start-up time: what --json does not print with (rich) and what other commands need
    # (the executor, calibration) stays unimported.
    code = ("import sys; from commdsl.cli import main; main(['simulate', '1f1b', '-p', 'stages=2', '-p', 'microbatches=2', '--json']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m.startswith(('commdsl.run', 'commdsl.calibrate', "
            "'commdsl.comparison', 'torch'))), file=sys.stderr)")  # fmt: skip
    env = dict(os.environ, COMMDSL_PROGRESS_INTERVAL_S="0")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert json.loads(proc.stdout)["world_size"] == 2
    assert proc.stderr.strip() == "[]"


def test_terminal_tables_show_the_first_and_last_ranks_of_a_large_world(capsys):
    assert main(["simulate", "ddp_overlap", "-p", "ranks=80", "-p", "steps=1", "--gantt", "never"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit() and "ms" in line]
    assert rows[:2] == ["0", "1"] and "79" in rows and "40" not in rows
    assert "16 more ranks" in out


def test_the_command_ends_the_interpreters_way_under_a_profiler(tmp_path):
    # The command line skips the interpreter's teardown, but not under a profiler or a
    # tracer: they write what they measured at exit (here cProfile's stats file).
    stats = tmp_path / "stats.prof"
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "commdsl.cli", "simulate", "p2p", "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["makespan_us"] > 0
    assert stats.stat().st_size > 0


def test_simulate_keeps_the_program_out_of_collections_until_it_ends(capsys, monkeypatch):
    """From the simulation to the output the loaded program is frozen (the cyclic collector
    does not walk its ops), and unfrozen when the command ends: a caller keeps no freeze."""
    from commdsl.commands import simulate as command

    seen = []

    def summarize(result):
        ops = {id(op) for op in result.program.ops[0] if gc.is_tracked(op)}
        seen.append((len(ops), sum(id(x) in ops for x in gc.get_objects())))  # the permanent generation is not listed
        return real(result)

    real = command.summarize
    monkeypatch.setattr(command, "summarize", summarize)
    assert gc.get_freeze_count() == 0
    assert main(["simulate", "1f1b", "--json"]) == 0
    ((tracked, collectable),) = seen
    assert tracked > 0 and collectable == 0
    assert gc.get_freeze_count() == 0
    assert json.loads(capsys.readouterr().out)["makespan_us"] > 0
