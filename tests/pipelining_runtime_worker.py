"""Worker (one gloo rank, under torchrun): run a schedule CSV through
torch.distributed.pipelining's `_PipelineScheduleRuntime` and check the result.

    torchrun --nproc_per_node=2 -m pipelining_runtime_worker SCHEDULE.csv FORMAT OUT.json

A tiny model (one Linear layer per stage) is built with the same seed on every rank;
this rank's stages are those its CSV row computes. After one `step`, every rank checks
the weight gradients of its stages against the whole model's gradients computed on
this process (the same loss: the mean over microbatches of each microbatch's MSE),
and the last stage's rank checks the losses too. Each rank writes its verdict to
OUT.json.RANK. Used by tests/test_pipelining_csv.py.
"""

from __future__ import annotations

import csv
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

DIM = 8
MICROBATCH_ROWS = 2


def main(path: str, fmt: str, out: str) -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(path, newline="") as f:
        rows = [[_Action.from_str(c) for c in row] for row in csv.reader(f)]

    def compute_stages(row):
        found = set()
        for a in row:
            for x in (a.sub_actions or (a,)) if a is not None else ():
                if x.is_compute_op:
                    found.add(x.stage_index)
        return found

    num_stages = 1 + max(s for row in rows for s in compute_stages(row))
    microbatches = 1 + max(x.microbatch_index for row in rows for a in row if a is not None
                           for x in (a.sub_actions or (a,)) if x.is_compute_op)  # fmt: skip
    mine = sorted(compute_stages(rows[rank]))

    torch.manual_seed(0)
    layers = [torch.nn.Linear(DIM, DIM) for _ in range(num_stages)]
    x = torch.randn(microbatches * MICROBATCH_ROWS, DIM)
    y = torch.randn(microbatches * MICROBATCH_ROWS, DIM)
    reference = [torch.nn.Linear(DIM, DIM) for _ in range(num_stages)]
    for ref, layer in zip(reference, layers):
        ref.load_state_dict(layer.state_dict())

    # Shapes given up front (static mode, gradients included): inferring them would send
    # Python objects, which needs numpy. The examples require grad, as the activations
    # do (without it torch 2.13 drops the weight gradients of split backwards).
    example = torch.empty(MICROBATCH_ROWS, DIM, requires_grad=True)
    stages = [PipelineStage(layers[s], s, num_stages, torch.device("cpu"), input_args=example, output_args=example,
                            output_grads=example, input_grads=example) for s in mine]  # fmt: skip
    schedule = _PipelineScheduleRuntime(stages, n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss)
    schedule._load_csv(path, format=fmt)
    losses: list[torch.Tensor] = []
    schedule.step(x, target=y, losses=losses)

    # The whole model on this process: the mean of the microbatches' losses.
    total = 0.0
    for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
        h = xm
        for ref in reference:
            h = ref(h)
        loss = torch.nn.functional.mse_loss(h, ym)
        (loss / microbatches).backward()
        total += loss.item()
    grads_ok = all(torch.allclose(layers[s].weight.grad, reference[s].weight.grad, rtol=1e-4, atol=1e-6) for s in mine)
    result = {"rank": rank, "stages": mine, "grads_ok": grads_ok,
              "max_grad_error": max(float((layers[s].weight.grad - reference[s].weight.grad).abs().max()) for s in mine)}
    if (num_stages - 1) in mine:
        result["loss_ok"] = abs(sum(float(v) for v in losses) - total) < 1e-4 * max(1.0, abs(total))
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
