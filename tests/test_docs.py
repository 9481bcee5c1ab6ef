"""The examples in README.md and docs/*.md run, so they cannot rot.

  * a `yaml` block with a `program:` is a whole schedule: it loads, validates and can
    finish (the deadlock check); one with a `device:` is a whole machine file: it loads;
  * a `commdsl` block is a program: it runs as the `program:` of the file's schedule
    named `snippet` (a `yaml` block) and must load, validate and finish the same way;
  * a `python` block runs (each file's blocks in order, in one namespace, in a temporary
    folder);
  * a `console` block's `$ commdsl ...` lines run through the real command line, in order,
    in one temporary folder: each must exit 0 (or the code a trailing `# exit N` names),
    and every output line shown under a command (but `...`) must appear in its output.
    Commands that start processes (`commdsl run`, `commdsl calibrate`, `torchrun`) have
    their own end-to-end tests; here their arguments are only parsed (and a run's `--out`
    file is its schedule simulated, for the examples that read it).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from commdsl.cli import main
from commdsl.dsl import load_schedule_text
from commdsl.sim import check_deadlock

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
_EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
_NOT_RUN = ("run", "calibrate")
"""`commdsl` subcommands whose examples are parsed, not run (they start ranks)."""


@dataclass(frozen=True)
class Block:
    path: Path
    lang: str
    text: str
    line: int

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def _all(lang: str) -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.lang == lang]


def _schedule(block: Block, text: str) -> None:
    program = load_schedule_text(text, f"{block.id}")
    check_deadlock(program)


@pytest.mark.parametrize("block", [b for b in _all("yaml") if re.search(r"^program:", b.text, re.M)], ids=lambda b: b.id)
def test_yaml_schedules_load_and_finish(block: Block):
    _schedule(block, block.text)


@pytest.mark.parametrize("block", [b for b in _all("yaml") if re.search(r"^device:", b.text, re.M)], ids=lambda b: b.id)
def test_yaml_machine_files_load(block: Block):
    from commdsl.machine import load_machine_text

    load_machine_text(block.text, block.id)


@pytest.mark.parametrize("block", _all("commdsl"), ids=lambda b: b.id)
def test_program_snippets_run_in_the_snippet_schedule(block: Block):
    context = [b for b in blocks(block.path) if b.lang == "yaml" and re.search(r"^name: snippet$", b.text, re.M)]
    assert context, f"{block.path.name} has commdsl blocks but no `name: snippet` yaml block to run them in"
    head = context[0].text.split("program: |")[0]
    body = "".join(f"  {line}\n" for line in block.text.splitlines())
    _schedule(block, f"{head}program: |\n{body}")


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.lang == "python" for b in blocks(p))], ids=lambda p: p.name)
def test_python_examples_run(path: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in blocks(path):
        if block.lang == "python":
            exec(compile(block.text, block.id, "exec"), namespace)  # noqa: S102 - our own docs, in a test


def _commands(block: Block) -> list[tuple[str, int, list[str]]]:
    """(command line, expected exit code, output lines shown) per `$ commdsl` line."""
    out: list[tuple[str, int, list[str]]] = []
    shown: list[str] | None = None
    for line in block.text.splitlines():
        if line.startswith("$ "):
            shown = None
            command = line[2:]
            code = 0
            m = _EXIT.search(command)
            if m:
                code, command = int(m.group(1)), command[: m.start()]
            command = command.split(" #")[0].strip()
            if command.startswith("commdsl "):
                shown = []
                out.append((command, code, shown))
        elif shown is not None and line.strip() and line.strip() != "...":
            shown.append(line.strip())
    return out


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.lang == "console" for b in blocks(p))], ids=lambda p: p.name)
def test_console_examples_run(path: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    for block in blocks(path):
        if block.lang != "console":
            continue
        for command, code, shown in _commands(block):
            argv = shlex.split(command)[1:]
            redirect = None
            if ">" in argv:  # `commdsl show 1f1b --json > out.json`
                redirect = argv[argv.index(">") + 1]
                argv = argv[: argv.index(">")]
            if argv and argv[0] in _NOT_RUN:
                _parses(argv, block)
                _stand_in_for_a_run(argv)
                continue
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                got = main(argv)
            output = buf.getvalue()
            if redirect is not None:
                Path(redirect).write_text(output)
            assert got == code, f"{block.id}: `{command}` exited {got}, expected {code}:\n{output}"
            flat = " ".join(output.split())
            for line in shown:
                assert " ".join(line.split()) in flat, f"{block.id}: `{command}` did not print {line!r}:\n{output}"


def _stand_in_for_a_run(argv: list[str]) -> None:
    """A command that starts ranks is not run here, but the file it writes is made so that
    the examples after it have it: `run --out FILE` is its schedule simulated (a timeline
    with the same op ids), `calibrate --out FILE` the cpu-loopback preset."""
    from commdsl.cli import build_parser

    if "--out" not in argv:
        return
    args = build_parser().parse_args(argv)
    if argv[0] == "calibrate":
        from commdsl.machine.loader import PRESETS_DIR

        Path(args.out).write_text((PRESETS_DIR / "cpu-loopback.yaml").read_text())
        return
    params = [x for p in args.param for x in ("-p", p)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["simulate", args.schedule, *params, "--machine", "cpu-loopback", "--trace", args.out, "--gantt", "never"]) == 0


def _parses(argv: list[str], block: Block) -> None:
    """A command that starts ranks: its arguments must parse (the command exists, its flags too)."""
    from commdsl.cli import build_parser

    build_parser().parse_args(argv)


def test_the_error_reference_is_what_its_script_writes():
    """docs/errors.md is generated from the tables of bad inputs (tools/error_reference.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("error_reference", ROOT / "tools" / "error_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "errors.md").read_text() == module.render(), "run `python tools/error_reference.py`"
