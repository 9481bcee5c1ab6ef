"""bench/nccl_partial_nodes.py: the 10-node all_to_all, sendrecv, all_gather,
reduce_scatter and all_reduce curves with 1, 2 and 4 GPUs a node, simulated on the ranks
they ran on (the script runs in a few seconds)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "bench"


def test_the_partial_node_curves_are_simulated_on_their_ranks(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nccl_partial_nodes.py"])
    runpy.run_path(str(BENCH / "nccl_partial_nodes.py"), run_name="__main__")
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("xx10g")]
    assert len(rows) == 150 and {r[1] for r in rows} == {"10", "20", "40"}
    ops = ("alltoall", "sendrecv", "all_gather", "reduce_scatter", "all_reduce")
    summary = {(f[0], f[1]): float(f[3].rstrip("%")) for f in (line.split() for line in out.splitlines()) if len(f) >= 5 and f[0] in ops}
    assert set(summary) == {(op, g) for op in ops for g in ("1", "2", "4")}
    # a collective is simulated over its group's ranks alone: one GPU a node is a ring of
    # network hops that lands near the log (docs/validation.md: 2 and 4 GPUs are not as close)
    assert summary[("all_gather", "1")] < 5.0 and summary[("reduce_scatter", "1")] < 5.0
    # the all_to_alls are close at every GPU count (docs/validation.md: sendrecv at 1-2 GPUs a node is not)
    assert all(summary[("alltoall", g)] < 5.0 for g in ("1", "2", "4"))
