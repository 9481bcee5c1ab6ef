"""Mutations of bundled schedules and machine presets for the fuzz tests (no tests here).

`run_cases(seed, kind, cases)` mutates and loads each case in this process: case `i` of a
seed is always the same mutation (its own random generator), so any share of the cases can
run in any worker and a failure names the case that replays it. Each mutation is one of the
classes of bad input the front end must turn into its own error: broken lines and tokens,
stray characters, extreme values, YAML tags and nesting, keys no program can name, loops
far past the limits, very long lines. A schedule that loads is also checked for deadlock
and simulated (analytic network): those too may only fail with commdsl's errors.
"""

from __future__ import annotations

import random
import re

from commdsl.dsl import load_schedule_text
from commdsl.errors import CommdslError
from commdsl.files import source_lines
from commdsl.resources import bundled_schedules, schedules_dir

SCHEDULES = {name: (schedules_dir() / f"{name}.yaml").read_text() for name in bundled_schedules()}
NAMES = sorted(SCHEDULES)

# Small params keep every load fast, so many examples fit in the time budget.
_SMALL = {"stages": "2", "microbatches": "4", "chunks": "2", "world": "2", "ranks": "2", "dp": "2", "tp": "2", "pp": "2"}

_TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?[A-Za-z]*|\*\*|//|[=<>!]=|\S")
_INTERESTING = [
    "\t", " ", "  ", "\n", ":", "(", ")", "[", "]", "=", "==", "**", ",", "#", '"', "'", "\\", "-", "{", "}",
    "\x00", "\x7f", "\u2028", "\ufeff", "é", "1e999", "10**99", "0", "-1", "if", "for", "def", "batch", "on",
    "rank", "wait", "record", "host", "MiB", "ms", "bf16[", "group=", "op=", "%", "!!int", "&a", "*a", "---",
]  # fmt: skip


def _small_overrides(text: str) -> dict[str, str]:
    """Override only params the schedule declares, with small values."""
    return {k: v for k, v in _SMALL.items() if re.search(rf"^\s+{k}\s*:", text, re.M)}


_EXTREME_VALUES = [
    "1e308B", "1e300s", "1e296TiB", "1e30PFLOP", "1" + "0" * 30, "-1", "0", "1e-300", ".nan", ".inf", "-.inf",
    "\uff11", "\u0663", "2**62", "10**15", "1e308 * 10", "1e308B * 2", "0B - 4B", "1" + "0" * 5000, "0.5", "true",
    "[1, 2]", "{a: 1}", '""', "~", "2020-13-45", "100000", "65537", "1e12us", "1e30", "0x10", "1_000",
]  # fmt: skip
_TAGS = ["!!int ", "!!bool ", "!!float ", "!!timestamp ", "!!set ", "!!omap ", "!!binary ", "!foo ", "!!str ", "!!null "]
_NUMBER_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[A-Za-z]*")
_VALUE_RE = re.compile(r"(?<=: )\S[^\n#]*")


def _mutate(rng: random.Random, text: str) -> tuple[str, str]:
    """One mutation of `text`: (the mutated text, what was done)."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    kind = rng.choice(["line", "token", "byte", "value", "number", "tag", "nest", "key", "loop", "long"])
    if kind == "line":
        op = rng.choice(["delete", "duplicate", "indent", "dedent", "swap", "tab"])
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "indent":
            lines[i] = " " * rng.randint(1, 6) + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][rng.randint(1, 4) :]
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = "\t" + lines[i].lstrip(" ")
        return "\n".join(lines), f"line {i + 1}: {op}"
    if kind == "token":
        spans = [m.span() for m in _TOKEN_RE.finditer(text)]
        a, b = sorted(rng.sample(range(len(spans)), 2))
        (s1, e1), (s2, e2) = spans[a], spans[b]
        op = rng.choice(["swap", "delete", "replace"])
        if op == "swap":
            return text[:s1] + text[s2:e2] + text[e1:s2] + text[s1:e1] + text[e2:], f"swap tokens at {s1} and {s2}"
        if op == "delete":
            return text[:s1] + text[e1:], f"delete token at {s1}"
        token = rng.choice(_INTERESTING)
        return text[:s1] + token + text[e1:], f"replace token at {s1} with {token!r}"
    if kind == "byte":
        pos = rng.randrange(len(text) + 1)
        op = rng.choice(["insert", "truncate", "interesting"])
        if op == "truncate":
            return text[:pos], f"truncate at {pos}"
        noise = rng.choice(_INTERESTING) if op == "interesting" else "".join(chr(rng.randrange(0x2FFF)) for _ in range(rng.randint(1, 4)))
        return text[:pos] + noise + text[pos:], f"insert {noise!r} at {pos}"
    if kind in ("value", "number"):
        pattern = _VALUE_RE if kind == "value" else _NUMBER_RE
        matches = list(pattern.finditer(text))
        m = rng.choice(matches)
        value = rng.choice(_EXTREME_VALUES)
        return text[: m.start()] + value + text[m.end() :], f"{kind} at {m.start()} -> {value!r}"
    if kind == "tag":
        m = rng.choice(list(_VALUE_RE.finditer(text)))
        tag = rng.choice(_TAGS)
        return text[: m.start()] + tag + text[m.start() :], f"tag {tag!r} at {m.start()}"
    if kind == "nest":
        m = rng.choice(list(_VALUE_RE.finditer(text)))
        depth = rng.choice([3, 70, 2000])
        opener = rng.choice(["[", "{a: "])
        closer = "]" if opener == "[" else "}"
        return text[: m.start()] + opener * depth + "1" + closer * depth + text[m.end() :], f"nest {depth} x {opener!r} at {m.start()}"
    if kind == "key":
        keys = list(re.finditer(r"^(\s+)(\w+):", text, re.M))
        m = rng.choice(keys)
        key = rng.choice(["1", "\u00e9", '"a b"', "__x", "rank", "world", "host", "\uff11"])
        return text[: m.start(2)] + key + text[m.end(2) :], f"key {m.group(2)!r} -> {key!r}"
    if kind == "loop":
        program = text.find("program:")
        body = [n for n, line in enumerate(lines) if line.startswith("  ") and sum(map(len, lines[:n])) + n > program >= 0]
        n = rng.choice(body) if body else i
        indent = len(lines[n]) - len(lines[n].lstrip(" "))
        # Past the limits (the loop must fail before its first iteration), or harmless.
        bound = rng.choice(["10**7", "10**12", "world_size * 10**7", "2"])
        lines[n] = " " * indent + f"for fuzz_i in range({bound}):\n" + " " * (indent + 4) + lines[n].lstrip(" ")
        return "\n".join(lines), f"line {n + 1}: in a loop of range({bound})"
    pos = rng.randrange(len(text) + 1)
    run = rng.choice(["x", " ", "(1 + ", "#", "1"])
    return text[:pos] + run * (300 if run == "(1 + " else 20_000) + text[pos:], f"long run of {run!r} at {pos}"


def _error_problem(err: CommdslError, text: str) -> str | None:
    """What is wrong with the message of `err` (None: nothing): it must fit a screen and
    point inside the file."""
    formatted = err.format()
    if "Traceback" in formatted:
        return "a traceback in the message"
    if len(formatted.splitlines()) > 30 or len(formatted) > 4000:
        return f"a message of {len(formatted.splitlines())} lines, {len(formatted)} characters"
    loc = err.loc
    if loc is not None and loc.file == "fuzz.yaml":
        lines = source_lines(text) or ("",)
        if not (1 <= loc.line <= len(lines) and 1 <= loc.column <= len(lines[loc.line - 1]) + 1):
            return f"{err.message[:80]!r} points at {loc.line}:{loc.column}, outside the file ({len(lines)} lines)"
    return None


def _without_comment_lines(text: str) -> str:
    """A schedule without its comment-only lines: they document it, and a mutation there
    would cost a whole load to change nothing."""
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))


def run_cases(seed: int, kind: str, cases: range) -> dict:
    """Mutate and load `cases` of `seed` ("schedules" or "machines"): counts of what loaded,
    simulated or failed with a commdsl error, and one line per failure (an exception that
    is not a commdsl error, or a message that does not fit a screen or the file)."""
    from commdsl.machine import load_machine_text, preset_names, resolve_machine
    from commdsl.machine.loader import PRESETS_DIR
    from commdsl.sim import check_deadlock, simulate

    if kind == "schedules":
        bases = {name: _without_comment_lines(text) for name, text in SCHEDULES.items()}
    else:
        bases = {name: (PRESETS_DIR / f"{name}.yaml").read_text() for name in preset_names()}
    names = sorted(bases)
    machine = resolve_machine("h100-nvlink")
    out: dict = {"failures": [], "cases": 0, "loaded": 0, "simulated": 0, "errors": 0}
    for case in cases:
        out["cases"] += 1
        rng = random.Random(seed * 1_000_003 + case)
        name = rng.choice(names)
        text, what = _mutate(rng, bases[name])
        what = f"case {case} ({name}: {what})"
        try:
            if kind == "machines":
                load_machine_text(text, "fuzz.yaml")
                out["loaded"] += 1
                continue
            program = load_schedule_text(text, "fuzz.yaml", _small_overrides(text), max_ops=20_000)
            out["loaded"] += 1
            check_deadlock(program)
            simulate(program, machine, "analytic")
            out["simulated"] += 1
        except CommdslError as err:
            out["errors"] += 1
            problem = _error_problem(err, text)
            if problem:
                out["failures"].append(f"{what}: {problem}")
        except Exception as e:  # the bug the fuzz exists to find
            out["failures"].append(f"{what}: {type(e).__name__}: {str(e)[:200]}")
    return out
