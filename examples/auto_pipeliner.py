"""A toy auto-pipeliner: split a model's layers into S pipeline stages, for S in 2..8,
estimate each split's training step with 1F1B on a machine preset, and print the best.

    python examples/auto_pipeliner.py                       # the layer costs below, dgx-h100
    python examples/auto_pipeliner.py --machine dgx-a100 --microbatches 32

Each candidate is built in Python with `commdsl.Builder` (no schedule file) and simulated
with the analytic network, the fast closed form: a planner's inner loop. The split of a
given S balances the stages' work (the contiguous partition whose largest stage is
smallest); the pipeline then trades fewer, longer stages against more stages, each
with its share of the weights in memory and more sends.
"""

from __future__ import annotations

import argparse
from functools import lru_cache

import commdsl

LAYER_GFLOP = [900, 1200, 1200, 1200, 1200, 1500, 1500, 1500, 1500, 1500, 1500, 1200, 1200, 1200, 1200, 2000]
"""Forward work of each layer of one microbatch (GFLOP): an embedding, transformer
blocks of two widths, and the output head. A backward is twice its forward."""
LAYER_PARAM_BYTES = [256 << 20] + [384 << 20] * 14 + [256 << 20]
"""Parameter bytes of each layer; a stage keeps its weights, their gradients and the
optimizer's state (twice the weights, as Adam's two moments)."""
ACT_BYTES = 16 << 20
"""Activation (and activation-gradient) bytes a stage sends per microbatch."""
SAVED_BYTES_PER_LAYER = 24 << 20
"""Activation bytes a layer's forward keeps for its backward, per microbatch."""


def balanced_split(costs: list[float], stages: int) -> list[list[int]]:
    """The contiguous split of `costs` into `stages` non-empty parts whose largest part is
    smallest (the linear partition problem, by dynamic programming): the layer indices
    of each stage."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    @lru_cache(maxsize=None)
    def best(first: int, parts: int) -> tuple[float, tuple[int, ...]]:
        """(largest part, cut points) of layers first.. into `parts` parts."""
        if parts == 1:
            return prefix[n] - prefix[first], ()
        options = []
        for cut in range(first + 1, n - parts + 2):
            rest, cuts = best(cut, parts - 1)
            options.append((max(prefix[cut] - prefix[first], rest), (cut, *cuts)))
        return min(options)

    cuts = (0, *best(0, stages)[1], n)
    return [list(range(cuts[i], cuts[i + 1])) for i in range(stages)]


def one_f_one_b(stage_forward: list[float], stage_param_bytes: list[int], stage_saved_bytes: list[int], microbatches: int,
                act_bytes: int, *, unit: str = "flops", dtype: str = "bf16") -> commdsl.Program:
    """1F1B over len(stage_forward) stages, in torch.distributed.pipelining's order: warm-up
    forwards, one forward and one backward with batched sends in the steady state, then
    the remaining backwards. A stage's forward is `stage_forward[s]` in `unit`: work
    (`flops`, timed by the machine's rates) or time (`duration_us`); a backward is twice
    its forward. Each stage holds its weights, their gradients, the optimizer's state
    (twice the weights) and `stage_saved_bytes[s]` per microbatch in flight."""
    stages = len(stage_forward)
    b = commdsl.Builder(f"1f1b-{stages}", mesh={"pp": stages}, dtype=dtype,
                        params={"stages": stages, "microbatches": microbatches})
    for s in range(stages):
        r = b.rank(s)
        first, last = s == 0, s == stages - 1
        prev, next_ = s - 1, s + 1
        fwd, bwd = {unit: stage_forward[s]}, {unit: 2 * stage_forward[s]}
        r.alloc("weights", stage_param_bytes[s])
        r.alloc("grads", stage_param_bytes[s])
        r.alloc("optimizer", 2 * stage_param_bytes[s])

        def forward(mb: int) -> None:
            r.alloc(f"saved[{mb}]", stage_saved_bytes[s])
            r.compute(f"F[{mb}]", **fwd, action="forward", stage=s, microbatch=mb)

        def backward(mb: int) -> None:
            r.compute(f"B[{mb}]", **bwd, action="backward", stage=s, microbatch=mb)
            r.free(f"saved[{mb}]")

        warmup = min(stages - s - 1, microbatches)
        for mb in range(warmup):
            if not first:
                r.recv(f"act[{mb}]", act_bytes, prev, group="pp")
            forward(mb)
            if not last:
                r.send(f"act[{mb}]", act_bytes, next_, group="pp")
        if not first and warmup < microbatches:
            r.recv(f"act[{warmup}]", act_bytes, prev, group="pp")
        for i in range(microbatches - warmup):
            f = warmup + i
            forward(f)
            if not last:
                with r.batch():
                    r.isend(f"act[{f}]", act_bytes, next_, group="pp")
                    r.irecv(f"grad[{i}]", act_bytes, next_, group="pp")
            backward(i)
            if not first:
                if f + 1 < microbatches:
                    with r.batch():
                        r.isend(f"grad[{i}]", act_bytes, prev, group="pp")
                        r.irecv(f"act[{f + 1}]", act_bytes, prev, group="pp")
                else:
                    r.send(f"grad[{i}]", act_bytes, prev, group="pp")
        for mb in range(microbatches - warmup, microbatches):
            if not last:
                r.recv(f"grad[{mb}]", act_bytes, next_, group="pp")
            backward(mb)
            if not first:
                r.send(f"grad[{mb}]", act_bytes, prev, group="pp")
    return b.build()


def candidate(stages: int, microbatches: int) -> tuple[list[list[int]], commdsl.Program]:
    """The balanced split into `stages` stages and its 1F1B program."""
    split = balanced_split(LAYER_GFLOP, stages)
    program = one_f_one_b(
        [sum(LAYER_GFLOP[i] for i in layers) * 1e9 for layers in split],
        [sum(LAYER_PARAM_BYTES[i] for i in layers) for layers in split],
        [SAVED_BYTES_PER_LAYER * len(layers) for layers in split],
        microbatches, ACT_BYTES,
    )  # fmt: skip
    return split, program


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--machine", default="dgx-h100", help="machine preset or file (default dgx-h100)")
    parser.add_argument("--microbatches", type=int, default=16, help="microbatches per step (default 16)")
    args = parser.parse_args(argv)
    machine = commdsl.load_machine(args.machine)
    print(f"{len(LAYER_GFLOP)} layers, {args.microbatches} microbatches, 1F1B on {machine.name}")
    print(f"{'stages':>6}  {'step ms':>8}  {'bubble':>6}  {'peak GiB':>8}  split (layers per stage)")
    best = None
    for stages in range(2, 9):
        split, program = candidate(stages, args.microbatches)
        m = commdsl.metrics(commdsl.simulate(program, machine, network="analytic"))
        print(f"{stages:>6}  {m.makespan_us / 1e3:>8.2f}  {m.bubble_fraction:>6.3f}  "
              f"{m.max_peak_memory_bytes / 2**30:>8.2f}  {[len(layers) for layers in split]}")  # fmt: skip
        if best is None or m.makespan_us < best[1].makespan_us:
            best = (stages, m, split)
    stages, m, split = best
    print(f"best: {stages} stages, {m.makespan_us / 1e3:.2f} ms per step, split {[len(layers) for layers in split]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
