"""The executor: run a schedule for real under torchrun and record the measured timeline.

    torchrun --nproc_per_node=4 -m commdsl.run schedules/1f1b.yaml --out measured.json

Every rank loads the same schedule, expands it to the same `Program` the simulator
sees, creates one process group per group the schedule uses, and executes its own op
list with the execution semantics of docs/simulator.md. On CUDA the streams are
CUDA streams; on CPU (gloo) they are emulated with worker threads (`streams.py`).
Rank 0 writes the measured timeline in the simulator's Chrome-trace format, so
`commdsl compare predicted.json measured.json` pairs ops by id ("rank:index").

Modules, top to bottom: `cli` (arguments, exit codes), `config` (RunConfig),
`backend` (torchrun environment, store, process groups), `tensors` (buffers, dtypes,
fills), `compute` (calibrated compute kernels), `streams` (CPU stream emulation),
`comm` (torch.distributed calls), `executor` (the op loop), `timing` (clocks, medians,
timeline), `check` (expected values), `watchdog` (hang reports).
"""
