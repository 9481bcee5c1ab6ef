"""Pipeline families side by side: simulated bubble fraction and peak activation memory
per rank, every bundled pipeline schedule at one reference point.

The reference point: 4 pipeline ranks, 8 microbatches; the families with virtual
stages run 2 chunks per rank (zbv and dualpipev always do). Every family gets the same
model: a rank's layers take 2 ms forward and 4 ms backward per microbatch (2 ms input
gradient + 2 ms weight gradient where the family splits them), keep 64 MiB of
activations per microbatch (16 MiB of it until the weight gradient), and send 32 MiB
between stages; a chunk is its share of that. Weights, gradients and optimizer state
are left out (set to 0), so a rank's peak is activations only; it is given in MiB and
in microbatches (64 MiB each). Simulated on the default machine (h100-nvlink, flow
network).

    python bench/pipeline_families.py                        # print the table
    python bench/pipeline_families.py --write docs/schedules.md   # replace it there
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from commdsl.dsl import load_schedule
from commdsl.machine import DEFAULT_MACHINE, resolve_machine
from commdsl.sim import simulate

STAGES, MICROBATCHES = 4, 8
T_FWD_MS, T_BWD_IN_MS, T_BWD_W_MS = 2.0, 2.0, 2.0
SAVED_MIB, SAVED_W_MIB, ACT_MIB = 64, 16, 32

FAMILIES = [
    # (schedule, chunks per rank, torch.distributed.pipelining class, what it is)
    ("gpipe", 1, "ScheduleGPipe", "GPipe"),
    ("1f1b", 1, "Schedule1F1B", "1F1B"),
    ("interleaved_1f1b", 2, "ScheduleInterleaved1F1B", "interleaved 1F1B (Megatron)"),
    ("looped_bfs", 2, "ScheduleLoopedBFS", "breadth-first, looped"),
    ("interleaved_zb", 1, "ScheduleInterleavedZeroBubble", "ZB-H1"),
    ("interleaved_zb", 2, "ScheduleInterleavedZeroBubble", "ZB-H1, interleaved"),
    ("zbv", 2, "ScheduleZBVZeroBubble", "ZB-V"),
    ("dualpipev", 2, "ScheduleDualPipeV", "DualPipe-V"),
]
BEGIN, END = "<!-- pipeline-families:begin -->", "<!-- pipeline-families:end -->"


def _params(name: str, chunks: int) -> dict[str, str]:
    program_params = {"stages": str(STAGES), "microbatches": str(MICROBATCHES), "act": f"{ACT_MIB}MiB",
                      "weights": "0B", "optimizer": "0B", "saved": f"{SAVED_MIB / chunks:g}MiB"}  # fmt: skip
    declared = load_schedule(name, {"stages": "2", "microbatches": "4"}, validate=False).params
    names = {k for k, _ in declared}
    if "chunks" in names:
        program_params["chunks"] = str(chunks)
    if "saved_w" in names:
        program_params["saved_w"] = f"{SAVED_W_MIB / chunks:g}MiB"
    if "t_bwd_in" in names:
        program_params.update(t_fwd=f"{T_FWD_MS / chunks:g}ms", t_bwd_in=f"{T_BWD_IN_MS / chunks:g}ms",
                              t_bwd_w=f"{T_BWD_W_MS / chunks:g}ms")  # fmt: skip
    else:
        program_params.update(t_fwd=f"{T_FWD_MS / chunks:g}ms", t_bwd=f"{(T_BWD_IN_MS + T_BWD_W_MS) / chunks:g}ms")
    return program_params


def table() -> list[str]:
    machine = resolve_machine(DEFAULT_MACHINE)
    lines = [
        f"| schedule | chunks | PyTorch class | family | bubble fraction | makespan | peak activations per rank, MiB "
        f"(microbatches of {SAVED_MIB} MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, chunks, cls, what in FAMILIES:
        summary = simulate(load_schedule(name, _params(name, chunks)), machine).summary()
        peaks = [m.peak_bytes / 2**20 for m in summary.memory]
        shown = " / ".join(f"{p:g}" for p in peaks) + " (" + " / ".join(f"{p / SAVED_MIB:g}" for p in peaks) + ")"
        lines.append(f"| `{name}` | {chunks} | `{cls}` | {what} | {summary.bubble_fraction:.3f} | "
                     f"{summary.makespan_us / 1e3:.1f} ms | {shown} |")  # fmt: skip
        print(f"{name} x{chunks}: bubble {summary.bubble_fraction:.3f}", file=sys.stderr)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="FILE.md", help=f"replace the table between {BEGIN} and {END} in FILE.md")
    args = parser.parse_args()
    text = "\n".join(table())
    if not args.write:
        print(text)
        return 0
    path = Path(args.write)
    doc = path.read_text()
    block = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not block.search(doc):
        print(f"{path} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    path.write_text(block.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))
    print(f"wrote the table into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
