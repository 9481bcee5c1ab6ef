"""Round trips with torch.distributed.pipelining's schedule CSV: `commdsl export
pipelining` writes what PyTorch's runtime loads and runs, `commdsl import pipelining`
reads what PyTorch writes, and bad CSVs fail with their row and column."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import ScheduleError
from commdsl.ir import OpKind
from commdsl.interop.pipelining import csv_rows, format_csv, parse_csv, schedule_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_pytorch_orders import FAMILIES, actions  # noqa: E402
from test_run_support import torchrun  # noqa: E402
from test_schedules import rendezvous_deadlock  # noqa: E402

DATA = Path(__file__).parent / "data"
TESTS = Path(__file__).parent

SMALL = {
    "1f1b": {"stages": "3", "microbatches": "5"},
    "gpipe": {"stages": "2", "microbatches": "3"},
    "interleaved_1f1b": {"stages": "3", "chunks": "2", "microbatches": "5"},
    "looped_bfs": {"stages": "2", "chunks": "3", "microbatches": "3"},
    "interleaved_zb": {"stages": "3", "chunks": "2", "microbatches": "6"},
    "zbv": {"stages": "3", "microbatches": "4"},
    "dualpipev": {"stages": "3", "microbatches": "7"},
}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commdsl.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _import(text: str, name: str = "imported"):
    schedule = parse_csv(text, f"{name}.csv")
    return load_schedule_text(schedule_text(schedule, name), f"{name}.yaml")


@pytest.mark.parametrize("name", sorted(SMALL))
def test_compute_only_round_trip(name):
    program = load_schedule(name, SMALL[name])
    text = format_csv(csv_rows(program, with_transfers=False))
    imported = _import(text)
    assert [actions(imported, r) for r in range(imported.world_size)] == [actions(program, r) for r in range(program.world_size)]
    assert format_csv(csv_rows(imported, with_transfers=False)) == text
    assert rendezvous_deadlock(imported) is None


@pytest.mark.parametrize("name", ["looped_bfs", "interleaved_zb", "zbv", "dualpipev"])
def test_round_trip_with_transfers_keeps_them_where_they_are(name):
    program = load_schedule(name, SMALL[name])
    text = format_csv(csv_rows(program, with_transfers=True))
    assert "SEND_F" in text and "RECV_B" in text and "REDUCE_GRAD" in text
    imported = _import(text)
    assert format_csv(csv_rows(imported, with_transfers=True)) == text
    # The transfers run in the same order on every rank, tensor by tensor.
    for rank in range(program.world_size):
        def transfers(p):
            return [(op.kind, op.name, op.peer) for op in p.ops[rank] if op.kind.is_p2p]
        assert transfers(imported) == transfers(program), f"rank {rank}"
    assert rendezvous_deadlock(imported) is None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_imports_pytorchs_orders(family):
    """Every order of the table, written as PyTorch's compute-only CSV, imports to a
    schedule that runs it, with transfers that cannot deadlock."""
    for key in list(FAMILIES[family]["accepted"])[::23]:
        rows = FAMILIES[family]["accepted"][key]
        program = _import("\n".join(",".join(row.split()) for row in rows) + "\n")
        assert [actions(program, r) for r in range(program.world_size)] == rows, key
        assert rendezvous_deadlock(program) is None, key


@pytest.mark.parametrize("path", sorted(DATA.glob("pytorch_*.csv")), ids=lambda p: p.stem)
def test_imports_csvs_pytorch_dumped(path):
    """`_dump_csv` output: idle cells, OVERLAP_F_B, FSDP actions, and (compute_comms) the
    transfers PyTorch's lowering placed, which the import keeps in place."""
    text = path.read_text()
    program = _import(text, path.stem)
    schedule = parse_csv(text, path.name)
    for rank, row in enumerate(schedule.ranks):
        expected = [str(a) for a in row if a.type.value in "FBIW" or schedule.with_transfers]
        got = [c for c in csv_rows(program, with_transfers=schedule.with_transfers)[rank] if not c.endswith("REDUCE_GRAD")]
        assert got == expected, f"rank {rank}"
    assert rendezvous_deadlock(program) is None


# ---- bad CSVs -----------------------------------------------------------------------------------

BAD = [
    # (id, text, message, row, column)
    ("unknown_action", "0F0,0X1,0B0\n", "unknown action '0X1' in row 1, column 5", 1, 5),
    ("no_microbatch", "0F0,0B\n", "action '0B' names no microbatch (row 1, column 5)", 1, 5),
    ("skips_a_microbatch", "0F0,0F2,0B0,0B2\n1F0,1F1,1F2,1B0,1B1,1B2\n",
     "rank 0 skips microbatch 1: stage 0 has no forward 0F1 on row 1", 1, 16),
    ("runs_one_twice", "0F0,0F1,0F0,0B0,0B1\n", "rank 0 runs 0F0 twice (row 1, columns 1 and 9)", 1, 9),
    ("empty_row", "0F0,0B0\n\n1F0,1B0\n", "row 2 has no compute action: rank 1 would hold no stage", 2, 1),
    ("fsdp_only_row", "0F0,0B0\n1UNSHARD,1RESHARD\n", "row 2 has no compute action", 2, 1),
    ("stage_on_two_rows", "0F0,0B0\n0F0,0B0\n", "stage 0 is on rows 1 and 2: a stage lives on one rank", 2, 1),
    ("backward_before_forward", "0B0,0F0\n", "0B0 comes before the forward 0F0 on row 1", 1, 1),
    ("weight_before_input", "0F0,0W0,0I0\n", "0W0 comes before its input gradient 0I0 on row 1", 1, 5),
    ("missing_weight", "0F0,0I0\n", "rank 0 skips microbatch 0: stage 0 has no backward 0W0 on row 1", 1, 8),
    ("missing_stage", "0F0,0B0\n2F0,2B0\n", "no row computes stage 1", 1, 1),
    ("recv_missing", "0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n", "1F0 needs 1RECV_F0 before it on row 2", 2, 1),
    ("send_unmatched", "0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n1F1\n", "stage 1 is on rows 2 and 3", 3, 1),
    ("overlap_with_transfer", "(0F0;0SEND_F0)OVERLAP_F_B,0B0\n", "OVERLAP_F_B holds compute actions only", 1, 1),
    ("no_rows", "\n\n", "the CSV has no rows", 1, 1),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_csv(case):
    _, text, message, row, column = case
    with pytest.raises(ScheduleError) as info:
        parse_csv(text, "bad.csv")
    err = info.value
    assert message in err.message, err.format()
    assert (err.loc.file, err.loc.line, err.loc.column) == ("bad.csv", row, column), err.format()
    assert f"--> bad.csv:{row}:{column}" in err.format()


def test_bad_csv_through_the_cli(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0F1,0B0,0B1\n1F0,1Q1,1B0\n")
    proc = _cli("import", "pipelining", str(bad), cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"unknown action '1Q1' in row 2, column 5\n  --> {bad}:2:5" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = _cli("import", "pipelining", str(tmp_path / "nope.csv"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_export_names_an_op_without_its_action(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text("world: 2\nprogram: |\n  compute F 1ms\n")
    proc = _cli("export", "pipelining", str(path), cwd=tmp_path)
    assert proc.returncode == 1
    assert "compute op F names no pipeline action" in proc.stderr and f"--> {path}:3:3" in proc.stderr


def test_cli_round_trip(tmp_path):
    csv_path, yaml_path = tmp_path / "zbv.csv", tmp_path / "zbv_back.yaml"
    out = _cli("export", "pipelining", "zbv", "-p", "stages=2", "-p", "microbatches=3", "-o", str(csv_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    imp = _cli("import", "pipelining", str(csv_path), "-o", str(yaml_path), cwd=tmp_path)
    assert imp.returncode == 0, imp.stderr
    assert "2 ranks, 4 stages, 3 microbatches (without transfers in the file)" in imp.stderr
    again = _cli("export", "pipelining", str(yaml_path), cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == csv_path.read_text()
    sim = _cli("simulate", str(yaml_path), "--json", cwd=tmp_path)
    assert sim.returncode == 0 and json.loads(sim.stdout)["world_size"] == 2


# ---- PyTorch's runtime runs what commdsl exports ----------------------------------------------------

RUNTIME = [
    ("zbv", {"stages": "2", "microbatches": "4"}, "compute_comms"),
    ("dualpipev", {"stages": "2", "microbatches": "4"}, "compute_only"),
]


@pytest.mark.parametrize("name,overrides,fmt", RUNTIME, ids=[f"{n}-{f}" for n, _, f in RUNTIME])
def test_pytorch_runtime_runs_the_export(tmp_path, name, overrides, fmt):
    """Two gloo ranks load the exported CSV into `_PipelineScheduleRuntime` and train a
    tiny model one step: the losses and every stage's weight gradients match the whole
    model's (tests/pipelining_runtime_worker.py)."""
    pytest.importorskip("torch")
    program = load_schedule(name, overrides)
    csv_path = tmp_path / f"{name}.csv"
    csv_path.write_text(format_csv(csv_rows(program, with_transfers=fmt == "compute_comms")))
    result = tmp_path / "result.json"
    run = torchrun(2, [str(csv_path), fmt, str(result)], module="pipelining_runtime_worker", cwd=TESTS, timeout_s=180)
    assert run.returncode == 0, run.stderr[-3000:]
    verdicts = [json.loads(Path(f"{result}.{rank}").read_text()) for rank in range(2)]
    stages = sorted(s for v in verdicts for s in v["stages"])
    assert stages == sorted({op.stage for op in program.all_ops() if op.kind is OpKind.COMPUTE})
    for v in verdicts:
        assert v["grads_ok"], v
        assert v.get("loss_ok", True), v
    assert any("loss_ok" in v for v in verdicts)


def test_a_cyclic_order_is_a_deadlock_naming_the_file(tmp_path):
    """Rank 0's first backward needs rank 1's forward of microbatch 0, which rank 1 runs
    only after microbatch 1's, whose input rank 0 sends after that backward."""
    bad = tmp_path / "cyclic.csv"
    bad.write_text("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n")
    proc = _cli("import", "pipelining", str(bad), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("deadlock: the pipeline's compute order is cyclic")
    assert f"the order comes from {bad} as written" in proc.stderr and "Traceback" not in proc.stderr
