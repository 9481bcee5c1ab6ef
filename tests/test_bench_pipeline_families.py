"""docs/schedules.md's table of pipeline families is what bench/pipeline_families.py
prints today: generated, never typed by hand."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_docs_table_is_the_bench_output():
    spec = importlib.util.spec_from_file_location("pipeline_families", REPO / "bench" / "pipeline_families.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = (REPO / "docs" / "schedules.md").read_text()
    block = re.search(re.escape(bench.BEGIN) + r"\n(.*?)\n" + re.escape(bench.END), doc, re.S)
    assert block, "docs/schedules.md has lost its generated table"
    assert block.group(1).splitlines() == bench.table(), "regenerate: python bench/pipeline_families.py --write docs/schedules.md"
    # Every bundled pipeline family is in it, the zero-bubble ones with the smallest bubbles.
    rows = {line.split("|")[1].strip(" `") + "x" + line.split("|")[2].strip(): float(line.split("|")[5]) for line in bench.table()[2:]}
    assert set(rows) == {"gpipex1", "1f1bx1", "interleaved_1f1bx2", "looped_bfsx2", "interleaved_zbx1", "interleaved_zbx2", "zbvx2",
                         "dualpipevx2"}  # fmt: skip
    assert max(rows["zbvx2"], rows["dualpipevx2"], rows["interleaved_zbx2"]) < min(rows["1f1bx1"], rows["interleaved_1f1bx2"])
