"""The simulator's modules import one way: no module of `commdsl/sim/` reaches itself
through imports, counting the imports inside functions and those only for type
checking (a cycle hidden in a function is still a cycle a reader must untangle)."""

from __future__ import annotations

import ast
from pathlib import Path

import commdsl.sim

SIM = Path(commdsl.sim.__file__).parent


def _imports(path: Path) -> set[str]:
    """The `commdsl.sim` modules `path` imports anywhere (module names without the package)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("commdsl.sim."):
            out.add(node.module.removeprefix("commdsl.sim.").split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module == "commdsl.sim":
            out.update(a.name for a in node.names if (SIM / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("commdsl.sim.") for a in node.names if a.name.startswith("commdsl.sim."))
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as the modules along it, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_simulators_modules_import_one_way():
    graph = {p.stem: _imports(p) for p in SIM.glob("*.py") if p.stem != "__init__"}
    assert "result" in graph["summary"] and "result" in graph["trace"]
    assert "simulate" not in graph["summary"] | graph["trace"] | graph["gantt"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
