"""Write docs/errors.md: every error the test suite's tables of bad inputs check, as printed.

    python tools/error_reference.py            # rewrite docs/errors.md
    python tools/error_reference.py --check    # exit 1 if docs/errors.md is not what this writes

The rows come from tests/test_bad_inputs.py, the tables the tests loop over: schedules
(`CASES`), machine files (`MACHINE_CASES`), command lines (`USAGE_CASES`) and simulated
times past the horizon (`HORIZON_CASES`); and from tests/test_nccl_logs_bad.py, the
nccl-tests logs calibrate refuses (`STRUCTURE`, `NUMBERS`). Each row runs again here, through the same
functions the command line calls, and its message goes into the page exactly as a user
sees it. Sections follow the tables' own `# ...` comments. `tests/test_docs.py` fails when
the page and this script disagree, so the reference cannot fall behind the code.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "errors.md"
TESTS = ROOT / "tests" / "test_bad_inputs.py"


def _sections(table: str) -> dict[str, str]:
    """Row id -> the `# ...` comment above it in the test file's table `table`."""
    text = TESTS.read_text()
    start = text.index(f"\n{table} = [")
    end = text.index("\n]", start)
    out: dict[str, str] = {}
    section = ""
    for line in text[start:end].splitlines():
        stripped = line.strip()
        comment = re.match(r"#\s*-*\s*(.*?)\s*-*$", stripped)
        if comment and comment.group(1):
            section = comment.group(1)
            continue
        row = re.match(r'(?:Case\()?\(?"([^"]+)"', stripped)
        if row:
            out.setdefault(row.group(1), section)
    return out


def _group(rows: list[tuple[str, str, str]]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """(section, [(row id, body), ...]) in table order."""
    order: dict[str, list[tuple[str, str]]] = {}
    for section, row_id, body in rows:
        order.setdefault(section, []).append((row_id, body))
    yield from order.items()


def _message(call: Callable[[], object]) -> str:
    from commdsl.errors import CommdslError

    try:
        call()
    except CommdslError as err:
        return err.format()
    raise AssertionError("the row raised no error")


def schedule_rows(bad) -> list[tuple[str, str, str]]:
    from commdsl.dsl import load_schedule_text

    sections = _sections("CASES")
    rows = []
    for case in bad.CASES:
        kwargs = {"max_ops": case.max_ops} if case.max_ops else {}
        text = _message(lambda: load_schedule_text(case.text, "bad.yaml", case.overrides, **kwargs))
        given = f"with `-p {' -p '.join(f'{k}={v}' for k, v in case.overrides.items())}`\n\n" if case.overrides else ""
        rows.append((sections.get(case.id, ""), case.id, f"{given}```text\n{text}\n```"))
    return rows


def machine_rows(bad) -> list[tuple[str, str, str]]:
    from commdsl.machine import load_machine_text

    sections = _sections("MACHINE_CASES")
    rows = []
    for row_id, old, new, *_ in bad.MACHINE_CASES:
        text = _message(lambda: load_machine_text(bad.MACHINE.replace(old, new), "bad_machine.yaml"))
        rows.append((sections.get(row_id, "") or "machine files", row_id, f"```text\n{text}\n```"))
    return rows


def horizon_rows(bad) -> list[tuple[str, str, str]]:
    from commdsl.dsl import load_schedule_text
    from commdsl.machine import load_machine_text
    from commdsl.sim import simulate

    machine = load_machine_text(bad.SLOW_MACHINE, "slow.yaml")
    rows = []
    for row_id, lines, *_ in bad.HORIZON_CASES:
        program = load_schedule_text("world: 2\nprogram: |\n" + "".join(f"  {x}\n" for x in lines), "slow.yaml")
        rows.append(("simulated time past the horizon", row_id, f"```text\n{_message(lambda: simulate(program, machine))}\n```"))
    return rows


def log_rows(logbad) -> list[tuple[str, str, str]]:
    """nccl-tests logs `calibrate --from-nccl-tests` refuses (tests/test_nccl_logs_bad.py)."""
    from commdsl.calibrate.nccl_logs import parse_logs

    rows = []
    for section, table in (("what a log says", logbad.STRUCTURE), ("numbers in a log", logbad.NUMBERS)):
        for row_id, text, *_ in table:
            rows.append((section, row_id, f"```text\n{_message(lambda: parse_logs(text, 'bad.log'))}\n```"))
    return rows


def usage_rows(bad) -> list[tuple[str, str, str]]:
    from commdsl.cli import main

    rows = []
    with tempfile.TemporaryDirectory() as tmp, _inside(tmp):
        Path("ok.yaml").write_text(bad.prog("compute F t_fwd"))
        Path("deep.json").write_text('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}")
        Path("folder").mkdir()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["simulate", "ok.yaml", "--trace", "predicted.json"]) == 0
        files = {"ok": "ok.yaml", "dir": "folder", "deep": "deep.json", "trace": "predicted.json"}
        for args, _ in bad.USAGE_CASES:
            argv = [a.format(**files) for a in args]
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            assert code == 2, (argv, err.getvalue())
            shown = " ".join(a if a and " " not in a else repr(a) for a in argv)
            rows.append(("the command line", shown, f"```text\n{err.getvalue().rstrip()}\n```"))
    return rows


@contextlib.contextmanager
def _inside(folder: str) -> Iterator[None]:
    """Run in `folder`, so messages name files relatively (the page does not depend on where it was written)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _error_classes(base: type) -> list[type]:
    """`base` and every error class under it that `commdsl.errors` defines, depth first."""
    out = [base] if base.__module__ == "commdsl.errors" else []
    for sub in base.__subclasses__():
        out += _error_classes(sub)
    return out


def _first_line(doc: str | None) -> str:
    return " ".join((doc or "").split("\n\n")[0].split()).rstrip(".")


def render() -> str:
    sys.path.insert(0, str(TESTS.parent))
    os.environ.setdefault("COLUMNS", "120")
    import test_bad_inputs as bad
    import test_nccl_logs_bad as logbad

    from commdsl import errors
    from commdsl.commands.compare import EXIT_OVER_MAX_ERROR

    kinds = [("schedule files", schedule_rows(bad)), ("machine files", machine_rows(bad)),
             ("simulation", horizon_rows(bad)), ("logs of nccl-tests", log_rows(logbad)),
             ("command lines", usage_rows(bad))]  # fmt: skip
    out = [
        "# Error reference",
        "",
        "<!-- Written by `python tools/error_reference.py` from the tables of bad inputs in",
        "tests/test_bad_inputs.py and tests/test_nccl_logs_bad.py; do not edit by hand. -->",
        "",
        "Every mistake ends in one message, with the file, line and column where there is one, the",
        "line itself with a caret, and a hint where one helps, and a non-zero exit code; never a",
        "traceback. This page lists every error the test suite checks, each one run again to",
        "write it here exactly as it is printed.",
        "",
        "| exit code | errors |",
        "| --- | --- |",
    ]
    codes: dict[int, list[str]] = {}
    for cls in _error_classes(errors.CommdslError)[1:]:  # the base class is never raised
        codes.setdefault(cls.exit_code, []).append(f"{cls.kind} (`{cls.__name__}`: {_first_line(cls.__doc__)})")
    codes.setdefault(3, []).append("`commdsl run`: its watchdog ended a hang, every rank's stuck op reported")
    codes.setdefault(EXIT_OVER_MAX_ERROR, []).append("`commdsl compare --max-error PCT`: the makespan error is larger")
    out += [f"| {code} | {'<br>'.join(names)} |" for code, names in sorted(codes.items())]
    out += ["", "Contents:", ""]
    for title, rows in kinds:
        out.append(f"- {title.capitalize()} ({len(rows)})")
    for title, rows in kinds:
        out += ["", f"## {title.capitalize()}"]
        for section, entries in _group(rows):
            if section:
                out += ["", f"### {section[0].upper()}{section[1:]}"]
            for row_id, body in entries:
                out += ["", f"`{row_id}`", "", body]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/errors.md differs from what this writes")
    args = parser.parse_args()
    text = render()
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python tools/error_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
