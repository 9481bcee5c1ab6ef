"""The bundled schedules: each loads, validates, expands for many params, documents
itself, cannot deadlock under rendezvous P2P semantics, and works by name from the CLI.

`rendezvous_deadlock` (also used by test_pipeline_orders.py) is a deliberately strict
model of the execution contract (docs/simulator.md, "Execution semantics"): each rank's communication
ops run one at a time in program order (a batch_isend_irecv as one unit); a send and
its first-in-first-out matching recv complete once both are at the head of their
ranks' queues; a collective completes once every member has it at the head. A schedule
that finishes under this model cannot hang on the real ordering constraints.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path

import pytest
import yaml

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.errors import CommdslError
from commdsl.ir import OpKind, Program
from commdsl.resources import bundled_schedules, schedules_dir
from commdsl.validate import validate_program

REPO = Path(__file__).resolve().parents[1]

EXPECTED = {
    "1f1b", "collectives", "ddp_overlap", "dualpipev", "fsdp", "gpipe", "interleaved_1f1b", "interleaved_zb",
    "looped_bfs", "memcpy_vs_nccl", "p2p", "stream_overlap", "tp_mlp", "zbv",
}  # fmt: skip

# Several overrides per schedule: world sizes, loop counts, shrunk sizes and times.
OVERRIDES: dict[str, list[dict[str, str]]] = {
    "1f1b": [{"stages": "2", "microbatches": "1"}, {"stages": "8", "microbatches": "32"},
             {"stages": "5", "microbatches": "3", "act": "1KiB", "t_fwd": "10us", "t_bwd": "20us"},
             {"stages": "1", "microbatches": "4"}],
    "llm_3d": [{"gpipe": "true", "microbatches": "1"}, {"fsdp": "true", "sequence_parallel": "true", "pp": "4", "microbatches": "6"},
               {"tp": "1", "pp": "1", "dp": "4", "fsdp": "true"}, {"tp": "4", "dp": "1", "pp": "2", "microbatches": "1"}],
    "gpipe": [{"stages": "2", "microbatches": "1"}, {"stages": "8", "microbatches": "32"},
              {"stages": "3", "microbatches": "5", "act": "1KiB"}],
    "interleaved_1f1b": [{"stages": "2", "chunks": "2", "microbatches": "2"},
                         {"stages": "8", "chunks": "4", "microbatches": "32"},
                         {"stages": "3", "chunks": "1", "microbatches": "6"},
                         {"stages": "4", "chunks": "3", "microbatches": "4", "act": "1KiB"},
                         {"stages": "4", "chunks": "2", "microbatches": "10"}, {"stages": "1", "chunks": "3", "microbatches": "2"}],
    "looped_bfs": [{"stages": "2", "chunks": "1", "microbatches": "1"}, {"stages": "8", "chunks": "4", "microbatches": "16"},
                   {"stages": "1", "chunks": "3", "microbatches": "2"}, {"stages": "5", "chunks": "2", "microbatches": "3", "act": "1KiB"}],
    "interleaved_zb": [{"stages": "2", "chunks": "1", "microbatches": "2"}, {"stages": "8", "chunks": "4", "microbatches": "16"},
                       {"stages": "4", "chunks": "2", "microbatches": "6"}, {"stages": "1", "chunks": "2", "microbatches": "3"}],
    "zbv": [{"stages": "1", "microbatches": "1"}, {"stages": "8", "microbatches": "16"}, {"stages": "3", "microbatches": "2"},
            {"stages": "2", "microbatches": "5", "saved_w": "0B"}],
    "dualpipev": [{"stages": "1", "microbatches": "2"}, {"stages": "8", "microbatches": "16"}, {"stages": "3", "microbatches": "7"},
                  {"stages": "2", "microbatches": "4", "saved_w": "32MiB"}],
    "collectives": [{"ranks": "2"}, {"ranks": "8", "root": "7"}, {"ranks": "3", "tensor": "fp32[5]"},
                    {"ranks": "1"}],
    "p2p": [{"pairs": "2"}, {"pairs": "4", "msg": "4KiB", "t_compute": "10us"}],
    "ddp_overlap": [{"ranks": "2", "layers": "7", "bucket_layers": "3"}, {"ranks": "8", "steps": "3"},
                    {"layers": "1", "bucket_layers": "4"}, {"layer_grad": "4KiB"}],
    "fsdp": [{"ranks": "2", "layers": "1"}, {"ranks": "8", "layers": "16"}, {"layer_params": "64KiB"}],
    "tp_mlp": [{"dp": "1", "tp": "8"}, {"dp": "4", "tp": "2", "blocks": "4"}, {"dp": "1", "tp": "1"},
               {"tokens": "128", "hidden": "256"}],
    "stream_overlap": [{"batches": "1"}, {"batches": "6", "overlap": "false"}, {"ranks": "4"}],
    "memcpy_vs_nccl": [{"gpus": "2"}, {"gpus": "3"}, {"gpus": "8", "copies": "3"}, {"msg": "4KiB", "t_compute": "10us"}],
}  # fmt: skip


# ---- the rendezvous model ---------------------------------------------------------------


def comm_units(program: Program, rank: int) -> list[list]:
    """A rank's communication ops in issue order; ops of one batch form one unit."""
    units: list[list] = []
    for op in program.ops[rank]:
        if not op.kind.is_comm:
            continue
        if op.batch is not None and units and units[-1][0].batch == op.batch:
            units[-1].append(op)
        else:
            units.append([op])
    return units


def p2p_pairs(program: Program) -> list[tuple]:
    """(send, recv) pairs as they match: first-in-first-out per (src, dst, group)."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for op in program.all_ops():
        if op.kind is OpKind.SEND:
            sends[(op.rank, op.peer, op.group)].append(op)
        elif op.kind is OpKind.RECV:
            recvs[(op.peer, op.rank, op.group)].append(op)
    return [pair for channel in sends for pair in zip(sends[channel], recvs[channel])]


def rendezvous_deadlock(program: Program) -> dict[int, list[str]] | None:
    """None if every rank's communication completes; else each stuck rank's head unit."""
    partner = {}
    for s, r in p2p_pairs(program):
        partner[s.id], partner[r.id] = r.id, s.id
    instance, seen = {}, defaultdict(int)  # collective op -> (group, n-th on that group)
    for op in program.all_ops():
        if op.kind.is_collective:
            instance[op.id] = (op.group, seen[(op.group, op.rank)])
            seen[(op.group, op.rank)] += 1
    queues = [deque(comm_units(program, r)) for r in range(program.world_size)]
    done: set[str] = set()
    while any(queues):
        heads = [op for q in queues if q for op in q[0]]
        active = {op.id for op in heads}
        arrived = defaultdict(set)
        for op in heads:
            if op.id in instance:
                arrived[instance[op.id]].add(op.rank)
        progress = False
        for op in heads:
            if op.id in done:
                continue
            if op.kind.is_p2p:
                ready = partner.get(op.id) in active
            else:
                ready = arrived[instance[op.id]] == set(program.group(op.group).ranks)
            if ready:
                done.add(op.id)
                progress = True
        for q in queues:
            if q and all(op.id in done for op in q[0]):
                q.popleft()
                progress = True
        if not progress:
            return {r: [f"{op.kind.value} {op.name}" for op in q[0]] for r, q in enumerate(queues) if q}
    return None


# ---- helpers ------------------------------------------------------------------------------------


def _yaml(name: str) -> dict:
    return yaml.safe_load((schedules_dir() / f"{name}.yaml").read_text())


def _header(name: str) -> str:
    """The comment block at the top of a schedule file, without the '#'s."""
    lines = []
    for line in (schedules_dir() / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


def _cli() -> list[str]:
    """The console script of the environment running the tests (not whichever `commdsl`
    comes first on PATH), else the module."""
    exe = Path(sys.executable).with_name("commdsl")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "commdsl.cli"]


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(_cli() + args, cwd=cwd, capture_output=True, text=True, timeout=60)


def _size_bytes(program: Program) -> int:
    return sum(op.size_bytes for op in program.all_ops() if op.kind is not OpKind.COMPUTE)


def _busy_us(program: Program) -> float:
    return sum(op.duration_us or 0 for op in program.all_ops())


ALL = bundled_schedules()
CASES = [(name, ov) for name in ALL for ov in [{}] + OVERRIDES.get(name, [])]


# ---- tests -----------------------------------------------------------------------------------------


def test_the_expected_schedules_are_bundled():
    assert EXPECTED <= set(ALL), f"missing: {sorted(EXPECTED - set(ALL))}"
    # Every bundled schedule has override cases here, so a new one cannot slip by.
    assert set(ALL) <= set(OVERRIDES), f"add overrides for: {sorted(set(ALL) - set(OVERRIDES))}"


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for n, o in CASES])
def test_loads_validates_and_cannot_deadlock(name, overrides):
    program = load_schedule(name, overrides)
    validate_program(program)  # P2P matching and collective order, again, explicitly
    assert program.num_ops > 0
    assert all(program.ops[r] for r in range(program.world_size)), "a rank with nothing to do"
    assert program.warnings == (), program.warnings  # e.g. a handle never waited
    for key, value in overrides.items():
        assert key in dict(program.params)
    stuck = rendezvous_deadlock(program)
    assert stuck is None, f"{name} {overrides} deadlocks; stuck at {stuck}"
    from commdsl.sim import check_deadlock

    check_deadlock(program)  # the simulator's own progress check (DeadlockError if stuck)


@pytest.mark.parametrize("name", ALL)
def test_matched_sends_and_recvs_carry_the_same_tensor(name):
    """FIFO matching pairs each recv with the send of the same-named tensor: the data a
    rank receives is what its peer meant to send it."""
    for overrides in [{}] + OVERRIDES[name]:
        program = load_schedule(name, overrides)
        for s, r in p2p_pairs(program):
            assert s.name == r.name, f"{name} {overrides}: rank {s.rank} sends {s.name}, rank {r.rank} receives it as {r.name}"


@pytest.mark.parametrize("name", ALL)
def test_header_documents_the_schedule(name):
    header = _header(name)
    assert len(header.splitlines()) >= 10, "the file must start with a comment block describing it"
    assert "What it shows" in header
    assert re.search(r"^Sources?: \w", header, re.M), "name the source it comes from"
    assert not re.search(r"\bseeds?\b", header, re.I), "sources by their subject, not by an internal number"
    assert re.search(rf"^\s*commdsl \w+ {re.escape(name)}\b", header, re.M), "show how to run it by name"
    params_section = header.split("Params:", 1)
    assert len(params_section) == 2, "a Params: section"
    documented = set(re.findall(r"^\s*(\w+(?:, \w+)*)\s{2,}", params_section[1], re.M))
    documented = {p.strip() for group in documented for p in group.split(",")}
    missing = set(_yaml(name).get("params", {})) - documented
    assert not missing, f"params not documented in the header: {sorted(missing)}"
    data = _yaml(name)
    assert data["name"] == name
    assert data.get("doc"), "a one-line doc for `commdsl list`"


@pytest.mark.parametrize("name", ALL)
def test_programs_take_sizes_and_times_from_params(name):
    """No literal sizes or times in the program: tests and users shrink them with -p."""
    program_text = _yaml(name)["program"]
    code = "\n".join(line.split("#", 1)[0] for line in program_text.splitlines())
    literals = re.findall(r"(?<![\w.])(\d+\.?\d*)(KiB|MiB|GiB|TiB|KB|MB|GB|TB|B|ns|us|ms|s|[KMGTP]?FLOP)(?!\w)", code)
    # `1FLOP` as a unit multiplier (2 * m * n * k * 1FLOP) is fine: it carries no magnitude.
    assert [lit for lit in literals if lit[0] != "1"] == [], f"literal quantities in {name}'s program"


@pytest.mark.parametrize("name", ALL)
def test_shrinking_size_and_time_params_shrinks_the_program(name):
    params = _yaml(name).get("params", {})
    defaults = load_schedule(name)
    small: dict[str, str] = {}
    for key, value in params.items():
        text = str(value)
        if re.fullmatch(r"\d+(\.\d+)?(KiB|MiB|GiB)", text):
            small[key] = "8KiB"
        elif re.fullmatch(r"\d+(\.\d+)?(us|ms|s)", text):
            small[key] = "5us"
    if not small:
        pytest.skip(f"{name} has no size or time params (its work is derived from counts)")
    shrunk = load_schedule(name, small)
    assert [len(ops) for ops in shrunk.ops] == [len(ops) for ops in defaults.ops]
    if any(re.fullmatch(r"\d+\w*B", str(params[k])) for k in small):
        assert 0 < _size_bytes(shrunk) < _size_bytes(defaults)
    if any(str(params[k]).endswith("s") for k in small):
        assert _busy_us(shrunk) < _busy_us(defaults)


def _makespan_us(name: str, overrides: dict[str, str] | None = None) -> float:
    from commdsl.machine import DEFAULT_MACHINE, resolve_machine
    from commdsl.sim import simulate

    return simulate(load_schedule(name, overrides or {}), resolve_machine(DEFAULT_MACHINE)).makespan_us


def test_stream_overlap_overlaps():
    """Copies on the copy stream hide behind compute; on the compute stream they do not."""
    overlapped = _makespan_us("stream_overlap")
    serialized = _makespan_us("stream_overlap", {"overlap": "false"})
    assert overlapped < serialized
    # With 4 batches the three later copies are hidden entirely: only the first is exposed.
    steps = load_schedule("stream_overlap")
    step_us = sum(op.duration_us for op in steps.ops[0] if op.name.startswith("step["))
    assert overlapped < step_us + (serialized - step_us) / 2


def test_interleaving_shrinks_the_pipeline_bubble():
    """Same stages, microbatches and work per rank (2 chunks of half the time each)."""
    plain = _makespan_us("1f1b", {"stages": "4", "microbatches": "8", "t_fwd": "2ms", "t_bwd": "4ms"})
    interleaved = _makespan_us("interleaved_1f1b", {"stages": "4", "chunks": "2", "microbatches": "8",
                                                    "t_fwd": "1ms", "t_bwd": "2ms"})  # fmt: skip
    assert interleaved < plain


def test_constraints_fail_with_the_schedules_own_message():
    # PyTorch's rule: rounds of max(1, microbatches // stages); 9 microbatches on 4 stages
    # make 2 rounds, which 9 does not split into.
    with pytest.raises(CommdslError, match=r"multiple of max\(1, microbatches // stages\)"):
        load_schedule("interleaved_1f1b", {"stages": "4", "microbatches": "9"})
    with pytest.raises(CommdslError, match="at least as many microbatches as stages"):
        load_schedule("dualpipev", {"stages": "4", "microbatches": "7"})
    with pytest.raises(CommdslError, match="multiple of tp"):
        load_schedule("tp_mlp", {"tp": "3"})


def test_the_deadlock_model_catches_a_naive_blocking_1f1b():
    """Guard for the model itself: 1F1B with its steady-state batches written as
    blocking send-then-recv pairs must be reported as deadlocked."""
    text = (schedules_dir() / "1f1b.yaml").read_text()
    naive = re.sub(
        r"^(\s*)batch:\n\s*isend (.*)\n\s*irecv (.*)\n",
        lambda m: f"{m.group(1)}send {m.group(2)}\n{m.group(1)}recv {m.group(3)}\n",
        text,
        flags=re.M,
    )
    assert "batch:" not in naive and naive != text
    program = load_schedule_text(naive, "naive_1f1b.yaml")
    assert rendezvous_deadlock(program) is not None
    assert rendezvous_deadlock(load_schedule("1f1b")) is None


@pytest.fixture(scope="module")
def cli_by_name(tmp_path_factory) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """`commdsl check NAME` and `commdsl show NAME --no-listing` for every bundled
    schedule, as real subprocesses started together (from an empty directory, so each
    name resolves to the bundled file)."""
    cwd = tmp_path_factory.mktemp("cli")
    procs = {}
    for name in ALL:
        for argv in (["check", name], ["show", name, "--no-listing"]):
            procs[(argv[0], name)] = (argv, subprocess.Popen(_cli() + argv, cwd=cwd, stdout=subprocess.PIPE,
                                                             stderr=subprocess.PIPE, text=True))  # fmt: skip
    out = {}
    for key, (argv, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        out[key] = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("name", ALL)
def test_cli_check_and_show_by_name(name, cli_by_name):
    check = cli_by_name[("check", name)]
    assert check.returncode == 0, check.stderr
    assert f"{name}: ok" in check.stdout
    show = cli_by_name[("show", name)]
    assert show.returncode == 0, show.stderr
    program = load_schedule(name)
    rows = [line for line in show.stdout.splitlines() if re.match(r"rank \d+\s+\|", line)]
    assert len(rows) == program.world_size


def _cli_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    """The console script's entry point, in this process (same code path, no fork)."""
    from commdsl.cli import main

    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _header_commands(name: str) -> list[list[str]]:
    out = []
    for line in _header(name).splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("commdsl "):
            out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("name", ALL)
def test_header_examples_work(name, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    commands = _header_commands(name)
    assert commands
    for argv in commands:
        if argv[0] in ("check", "show"):
            code, _, err = _cli_in_process(argv + (["--no-listing"] if argv[0] == "show" else []), capsys)
            assert code == 0, f"commdsl {' '.join(argv)}: {err}"
        else:
            # Commands such as `simulate` load the same way: the schedule and its -p pairs.
            schedule = argv[1]
            pairs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-p")
            load_schedule(schedule, pairs)


def test_bundled_schedules_work_by_name(capsys, monkeypatch, tmp_path):
    """Bundled schedules by name from any folder (the README's console examples run in test_docs.py)."""
    monkeypatch.chdir(tmp_path)
    examples = [
        (["list"], []),
        (["show", "1f1b", "-p", "stages=4", "-p", "microbatches=8", "--no-listing"],
         ["rank 0 | F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
          "rank 3 | F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"]),
        (["check", "interleaved_1f1b", "-p", "stages=8", "-p", "chunks=4", "-p", "microbatches=32"], []),
        (["show", "gpipe", "--rank", "1"], []),
    ]  # fmt: skip
    for argv, shown in examples:
        code, stdout, stderr = _cli_in_process(argv, capsys)
        assert code == 0, f"commdsl {' '.join(argv)}: {stderr}"
        lines = [line.rstrip() for line in stdout.splitlines()]
        for expected in shown:
            assert expected in lines, f"`commdsl {' '.join(argv)}` does not print {expected!r}"
        if argv[0] == "list":
            listed = {line.split()[0] for line in lines if line.strip()}
            assert set(ALL) <= listed


def test_check_json_by_name(tmp_path):
    result = _run_cli(["check", "ddp_overlap", "--json", "-p", "ranks=2", "-p", "steps=1"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    program = load_schedule("ddp_overlap", {"ranks": "2", "steps": "1"})
    assert summary["ops"] == program.num_ops
    assert summary["world_size"] == 2
    # 8 layers in buckets of 2: 4 bucket all_reduces per rank.
    assert summary["ops_by_kind"]["all_reduce"] == 2 * 4
