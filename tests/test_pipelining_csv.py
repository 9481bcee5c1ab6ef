"""Round trips with torch.distributed.pipelining's schedule CSV: `commdsl export
pipelining` writes what PyTorch's runtime loads and runs, `commdsl import pipelining`
reads what PyTorch writes, and bad CSVs fail with their row and column."""

from __future__ import annotations

import json
import re
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
    # Values out of range: refused where they are read, at their cell, before any loop counts to them.
    ("stage_of_5000_digits", "0F0,0B0,1" + "9" * 4999 + "F0\n", "stage 1999999999...(5,000 digits) in row 1, column 9 has more than 9 digits", 1, 9),
    ("microbatch_of_5000_digits", "0F0,0B0\n1F" + "9" * 5000 + "\n", "microbatch 9999999999...(5,000 digits) in row 2, column 1", 2, 1),
    ("stage_10_to_the_11", "0F0,0B0,100000000000F0\n", "stage 100000000000 in row 1, column 9 has more than 9 digits", 1, 9),
    ("stage_past_the_actions", "0F0,0B0\n999999999F0,999999999B0\n", "999999999F0: stage 999999999 is past the 4 compute actions", 2, 1),
    ("microbatch_past_the_forwards", "0F0,0B0,0F999999999\n", "0F999999999: microbatch 999999999 is past the 2 forward actions", 1, 9),
    ("transfer_microbatch_past", "0F0,0SEND_F99999,0B0\n1RECV_F0,1F0,1B0\n", "0SEND_F99999: microbatch 99999 is past the 2 forward", 1, 5),
    ("too_many_rows", "0F0,0B0\n" * 65_537, "the CSV has 65,537 rows, one per rank: more than the limit of 65,536 ranks", 65_537, 1),
    ("too_many_cells", "0F0,0B0," + "," * 250_000 + "\n", "the CSV holds more than 250,000 cells by row 1", 1, 1),
    ("vertical_tab_is_no_line_break", "0F0,0B0\x0b1F0,1B0\n", "unknown action '0B0\\x0b1F0'", 1, 5),
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


def test_an_output_that_is_the_input_or_of_another_format_is_refused(tmp_path):
    """`export -o` onto its own schedule, or `import -o` onto its own CSV, replaced the
    input with the other format; a CSV written to `.yaml` (a schedule to `.csv`) misled."""
    schedule = tmp_path / "z.yaml"
    schedule.write_text(Path(__file__).parent.parent.joinpath("schedules", "zbv.yaml").read_text())
    text = schedule.read_text()
    same = _cli("export", "pipelining", str(schedule), "-o", str(schedule), cwd=tmp_path)
    assert same.returncode == 2 and f"-o {schedule} is the input file" in same.stderr and schedule.read_text() == text
    wrong = _cli("export", "pipelining", str(schedule), "-o", "e.yaml", cwd=tmp_path)
    assert wrong.returncode == 2 and "this writes a pipelining CSV, not a .yaml file" in wrong.stderr and "-o e.csv" in wrong.stderr
    assert _cli("export", "pipelining", str(schedule), "-o", "e.csv", cwd=tmp_path).returncode == 0
    csv_text = (tmp_path / "e.csv").read_text()
    back = _cli("import", "pipelining", "e.csv", "-o", "e.csv", cwd=tmp_path)
    assert back.returncode == 2 and "-o e.csv is the input file" in back.stderr and (tmp_path / "e.csv").read_text() == csv_text


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


def test_a_head_to_head_csv_writes_nothing(tmp_path):
    """Rank 0 runs its backward before sending the forward's output that rank 1's
    backward (whose gradient rank 0 waits for) needs: the ranks wait on each other. The
    import checks as `commdsl check` does, exits 3 and writes nothing."""
    bad = tmp_path / "h2h.csv"
    bad.write_text("0F0,0RECV_B0,0B0,0SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0\n")
    out = tmp_path / "h2h.yaml"
    proc = _cli("import", "pipelining", str(bad), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("deadlock:") and "nothing was written" in proc.stderr, proc.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["h2h.csv"]


def _rows(ranks: int, microbatches: int) -> str:
    """A 1F1B-like compute-only CSV of `ranks` rows, one stage each."""
    return "".join(",".join([f"{r}F{m}" for m in range(microbatches)] + [f"{r}B{m}" for m in range(microbatches)]) + "\n"
                   for r in range(ranks))  # fmt: skip


def test_import_is_linear_in_rows():
    """Each rank's program walks a balanced tree of rank tests: the schedule's size, and
    the conditions any rank evaluates, grow as ranks x log2(ranks), not ranks^2."""
    for ranks in (3, 64, 1000):
        text = schedule_text(parse_csv(_rows(ranks, 2), "r.csv"), "r")
        tests = text.count("if pp.rank <")
        assert tests == ranks - 1
        depth = max(len(line) - len(line.lstrip()) for line in text.splitlines() if "if pp.rank <" in line)
        assert depth <= 2 + 4 * (ranks - 1).bit_length()
    program = load_schedule_text(schedule_text(parse_csv(_rows(64, 2), "r.csv"), "r"), "r.yaml")
    assert [actions(program, r) for r in range(64)] == [f"{r}F0 {r}F1 {r}B0 {r}B1" for r in range(64)]


# ---- a seeded fuzz: mutated CSVs fail only with commdsl's errors ------------------------------------

CSV_FUZZ_SEED = 43
CSV_FUZZ_CASES = 10_000
_CSV_PIECES = ["", ",", ";", "(", ")", "OVERLAP_F_B", "F", "B", "I", "W", "SEND_F", "RECV_B", "UNSHARD", "REDUCE_GRAD", '"', "\n",
               "\r", "\x00", "\x0b", "\u2028", "-1", "0", "9" * 12, "9" * 5000, "999999999", "1e3", " ", "é", "\ufeff"]  # fmt: skip


def _mutate_csv(rng, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.choice((0, 0, 1, 2, 5)))
        op = rng.random()
        if op < 0.5:
            text = text[:i] + rng.choice(_CSV_PIECES) + text[j:]
        elif op < 0.7:
            text = text[:i] + text[j:]
        elif op < 0.85:  # a digit becomes another
            text = re.sub(r"\d", lambda m: str(rng.randrange(10)) if rng.random() < 0.2 else m.group(0), text)
        else:  # a row repeated or dropped
            rows = text.split("\n")
            k = rng.randrange(len(rows))
            rows[k:k + 1] = [rows[k]] * rng.choice((0, 2))
            text = "\n".join(rows)
    return text


def test_seeded_csv_fuzz_raises_only_commdsl_errors():
    """10,000 mutations of exported CSVs (both formats) read with `parse_csv`; every
    50th that reads is also imported and loaded. Nothing but a commdsl error, with a
    location inside the file, may come out."""
    import random

    from commdsl.errors import CommdslError

    seeds = []
    for name, params in sorted(SMALL.items()):
        program = load_schedule(name, params)
        kinds = (False, True) if name in ("looped_bfs", "interleaved_zb", "zbv", "dualpipev") else (False,)
        seeds += [format_csv(csv_rows(program, with_transfers=t)) for t in kinds]
    read = loaded = 0
    for case in range(CSV_FUZZ_CASES):
        rng = random.Random(f"{CSV_FUZZ_SEED}:{case}")
        text = _mutate_csv(rng, rng.choice(seeds))
        try:
            schedule = parse_csv(text, "fuzz.csv")
            read += 1
            if read % 50 == 0:
                load_schedule_text(schedule_text(schedule, "fuzz"), "fuzz.yaml")
                loaded += 1
        except CommdslError as err:
            assert err.loc is None or 1 <= err.loc.line <= max(text.count("\n") + 1, 1), (case, err.format())
            err.format()
        except Exception as e:  # pragma: no cover - the failure names the case that replays it
            raise AssertionError(f"case {case} (seed {CSV_FUZZ_SEED}): {type(e).__name__}: {e}\n{text[:500]!r}") from e
    assert read > 100 and loaded > 2, (read, loaded)
