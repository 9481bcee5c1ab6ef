"""Regenerate tests/data/pytorch_pipeline_orders.json (and the CSV files PyTorch itself
dumps, tests/data/pytorch_*.csv) from torch.distributed.pipelining.

    python tests/make_pytorch_pipeline_orders.py        # needs torch (2.13.0 wrote the files)

For each multi-stage schedule class of torch.distributed.pipelining and every
(stages, chunks, microbatches) of a grid, the table holds either the compute order of
every rank, exactly as the class's runtime runs it (`pipeline_order`, idle steps left
out, an OVERLAP_F_B action as its sub-actions in order), or the error the class raises
for those arguments. The orders are strings of actions in torch's own notation
(`3F0`: stage 3, forward, microbatch 0; `I` input gradient, `W` weight gradient, `B`
full backward), one string per rank.

Building a schedule class needs no process group: it reads only `group_size`,
`group_rank`, `num_stages` and `stage_index` from its stages, so plain objects stand in
for `PipelineStage`s. tests/test_pytorch_orders.py compares the bundled schedules with
this table, with or without torch installed.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
OUT = DATA / "pytorch_pipeline_orders.json"
DUMPS = {
    # file: (torch class name, stages, chunks, microbatches); both formats are dumped
    "pytorch_zbv_2x4": ("ScheduleZBVZeroBubble", 2, 2, 4),
    "pytorch_dualpipev_2x4": ("ScheduleDualPipeV", 2, 2, 4),
    "pytorch_interleaved_zb_2x2x4": ("ScheduleInterleavedZeroBubble", 2, 2, 4),
}
"""CSV files as `_dump_csv` writes them, compute-only and with transfers, for the import tests."""

FAMILIES = {
    # commdsl schedule name: (torch class name, chunks values of the grid)
    "looped_bfs": ("ScheduleLoopedBFS", (1, 2, 3, 4)),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", (1, 2, 3, 4)),
    "interleaved_zb": ("ScheduleInterleavedZeroBubble", (1, 2, 3, 4)),
    "zbv": ("ScheduleZBVZeroBubble", (1, 2, 3)),
    "dualpipev": ("ScheduleDualPipeV", (1, 2, 3)),
}
STAGES = range(1, 9)
MICROBATCHES = (*range(1, 13), 16)


def stand_ins(stages: int, chunks: int) -> list:
    """What a schedule class reads from its PipelineStages, for rank 0."""
    return [types.SimpleNamespace(group_size=stages, group_rank=0, num_stages=stages * chunks,
                                  stage_index=c * stages, submod=None) for c in range(chunks)]  # fmt: skip


def order(schedule, stages: int) -> list[str]:
    out = []
    for rank in range(stages):
        actions = []
        for action in schedule.pipeline_order[rank]:
            if action is None:
                continue
            for a in action.sub_actions or (action,):
                actions.append(str(a))
        out.append(" ".join(actions))
    return out


def main() -> int:
    import torch
    from torch.distributed.pipelining import schedules

    logging.disable(logging.WARNING)  # the classes log each construction
    table: dict = {"torch": torch.__version__.split("+")[0], "families": {}}
    for family, (cls_name, chunk_values) in FAMILIES.items():
        cls = getattr(schedules, cls_name)
        accepted, rejected = {}, {}
        for p in STAGES:
            for v in chunk_values:
                for m in MICROBATCHES:
                    key = f"{p},{v},{m}"
                    try:
                        schedule = cls(stand_ins(p, v), m)
                    except (ValueError, AssertionError, RuntimeError) as e:
                        rejected[key] = f"{type(e).__name__}: {e}".splitlines()[0]
                        continue
                    accepted[key] = order(schedule, p)
        table["families"][family] = {"class": cls_name, "accepted": accepted, "rejected": rejected}
        print(f"{family}: {len(accepted)} accepted, {len(rejected)} rejected", file=sys.stderr)
    OUT.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)", file=sys.stderr)
    for name, (cls_name, p, v, m) in DUMPS.items():
        schedule = getattr(schedules, cls_name)(stand_ins(p, v), m)
        for fmt in ("compute_only", "compute_comms"):
            path = DATA / f"{name}_{fmt}.csv"
            schedule._dump_csv(str(path), format=fmt)
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
