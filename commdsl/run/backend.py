"""The torchrun environment, the rendezvous store, and one process group per group.

torchrun (or Slurm, or a hand-written launcher) describes each process with the
environment variables RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. We connect to the same key-value store torch's `env://` rendezvous uses
(torchrun's agent store when TORCHELASTIC_USE_AGENT_STORE=True, else one hosted by
rank 0) and keep our own connection to it: the watchdog talks through the store, which
keeps working while a process group is stuck.

Process groups: torch's `new_group` must be called by every rank, in the same order.
Every rank holds the whole Program, so every rank walks `Program.groups` in order and
creates exactly the groups some op uses. The schedule's "world" group is the default
process group; every other group gets its own process group, i.e. its own
communicator and comm queue, as the execution semantics require (docs/simulator.md). A separate gloo group
("control") carries the executor's own traffic (iteration barriers, clock alignment,
gathering timelines), so it never queues behind the schedule's communication.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import os
import pickle
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commdsl.errors import CommdslError, UsageError
from commdsl.ir import Program
from commdsl.run.config import BackendChoice

_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits, as the launcher describes it."""

    rank: int
    world_size: int
    local_rank: int
    """Rank within the node; picks the GPU."""
    local_world_size: int
    master_addr: str
    master_port: int
    use_agent_store: bool
    """torchrun's agent already hosts the store; every rank connects as a client."""
    launched: bool
    """False when run as plain `python -m commdsl.run` for a one-rank schedule."""

    @classmethod
    def from_environ(cls, program_world_size: int) -> DistEnv:
        env = os.environ
        missing = [v for v in _ENV_VARS if v not in env]
        if missing:
            if program_world_size == 1:
                return cls(0, 1, 0, 1, "127.0.0.1", 0, False, launched=False)
            raise UsageError(
                f"the schedule needs {program_world_size} ranks, but {', '.join(missing)} is not set: "
                "run it under torchrun",
                hint=f"torchrun --nproc_per_node={program_world_size} -m commdsl.run SCHEDULE",
            )
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_rank = int(env.get("LOCAL_RANK", rank))
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
            port = int(env["MASTER_PORT"])
        except ValueError as e:
            raise UsageError(f"malformed torchrun environment: {e}") from None
        if world != program_world_size:
            raise UsageError(
                f"the schedule has {program_world_size} ranks but torchrun started {world} processes",
                hint=f"use --nproc_per_node={program_world_size} (times --nnodes), or change the schedule's "
                "world with -p",
            )
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return cls(rank, world, local_rank, local_world, env["MASTER_ADDR"], port, agent, launched=True)


def resolve_backend(choice: BackendChoice, env: DistEnv) -> str:
    """NCCL with one GPU per local rank where CUDA has enough GPUs, else gloo."""
    cuda_ok = torch.cuda.is_available() and torch.cuda.device_count() >= env.local_world_size
    if choice is BackendChoice.AUTO:
        return "nccl" if cuda_ok and dist.is_nccl_available() else "gloo"
    if choice is BackendChoice.NCCL:
        if not dist.is_nccl_available() or not torch.cuda.is_available():
            raise UsageError("--backend nccl needs a CUDA build of torch and a GPU; this machine has none",
                             hint="use --backend gloo (CPU)")  # fmt: skip
        if torch.cuda.device_count() < env.local_world_size:
            raise UsageError(
                f"--backend nccl needs one GPU per local rank: {env.local_world_size} ranks on this node, "
                f"{torch.cuda.device_count()} GPU(s)"
            )
    return choice.value


def connect_store(env: DistEnv, timeout_s: float, *, host: bool) -> dist.Store:
    """A connection to the rendezvous store. With `host`, rank 0 hosts the store when
    torchrun's agent does not; later calls (`host=False`) open further client
    connections to the same store, e.g. for the watchdog. Without a launcher (one rank)
    it is an in-process store; share that one object instead of calling again."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if not env.launched:
        return dist.HashStore()
    is_master = host and env.rank == 0 and not env.use_agent_store
    if not is_master:
        _wait_for_store(env, timeout_s)
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master, timeout,
                         wait_for_workers=False)  # fmt: skip


class RendezvousError(CommdslError):
    """Nothing hosts the rendezvous store this rank was told to join (exit code 1)."""

    kind = "run error"


def _wait_for_store(env: DistEnv, timeout_s: float) -> None:
    """Wait until something listens at MASTER_ADDR:MASTER_PORT (rank 0's store or torchrun's
    agent), at most `timeout_s`: torch's own client retries past its timeout and prints C++
    stacks, where a rank started without its rank 0 wants one clear message."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((env.master_addr, env.master_port), timeout=min(5.0, timeout_s)):
                return
        except OSError:
            if time.monotonic() >= deadline:
                where = f"{env.master_addr}:{env.master_port} (MASTER_ADDR:MASTER_PORT)"
                raise RendezvousError(f"rank {env.rank}: nothing listens at {where} after {timeout_s:.0f} s: rank 0, or the "
                                      "launcher's agent, hosts the rendezvous there",
                                      hint="start every rank (torchrun, srun, or `commdsl run -n N`), or check MASTER_ADDR "
                                           "and MASTER_PORT") from None  # fmt: skip
            time.sleep(0.5)


@dataclass
class Groups:
    """Process groups of one rank."""

    control: dist.ProcessGroup
    """gloo group of all ranks for the executor's own traffic."""
    by_id: dict[str, dist.ProcessGroup]
    """Schedule group id -> process group, for the groups this rank belongs to."""


def init_distributed(env: DistEnv, backend: str, store: dist.Store, program: Program, pg_timeout_s: float) -> Groups:
    """Initialise torch.distributed and create the schedule's groups in Program order."""
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(backend, store=dist.PrefixStore("commdsl/pg", store), rank=env.rank,
                            world_size=env.world_size, timeout=timeout)  # fmt: skip
    control = dist.new_group(backend="gloo", timeout=timeout)
    used = {op.group for op in program.all_ops() if op.group is not None}
    by_id: dict[str, dist.ProcessGroup] = {}
    for group in program.groups:
        if group.id not in used:
            continue
        if group.id == "world":
            pg = dist.group.WORLD
        else:
            pg = dist.new_group(list(group.ranks), timeout=timeout)
        if env.rank in group.ranks:
            by_id[group.id] = pg
    return Groups(control, by_id)


def hostname() -> str:
    return socket.gethostname()


# ---- Python objects between ranks, without numpy ----------------------------------------
# torch.distributed's *_object collectives read received bytes through numpy, which torch
# does not install: in a fresh environment they fail on the receiving side. These move
# pickled objects as uint8 tensors instead. What arrives is read by `RanksUnpickler`: the
# bytes come from the job's own ranks, but through a store and sockets anyone on the
# network may reach, so only the classes ranks exchange can be named in them.

_SAFE_BUILTINS = frozenset({"bool", "int", "float", "complex", "str", "bytes", "bytearray", "tuple", "list", "dict", "set",
                            "frozenset", "slice", "range"})  # fmt: skip
_TORCH_CLASSES = {"torch": frozenset({"Size", "Tensor", "UntypedStorage", "device"}), "torch._tensor": frozenset({"Tensor"}),
                  "torch.storage": frozenset({"UntypedStorage", "TypedStorage"})}  # fmt: skip
"""What torch's CUDA IPC export (`torch.multiprocessing.reductions.reduce_tensor`) names."""
_RECONSTRUCTORS = frozenset({("commdsl.ir", "make_op")})
"""commdsl's functions that rebuild a pickled object from its fields (`Op.__reduce__`)."""


class RanksUnpickler(pickle.Unpickler):
    """Reads what another rank of the job sent: builtin values, commdsl's dataclasses and
    enums (the timelines, results and probes ranks exchange) and the torch classes of a CUDA IPC
    handle; any other global (a function, a module of the standard library) is refused,
    so bytes injected into the store cannot run code."""

    def find_class(self, module: str, name: str) -> object:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if (module, name) in _RECONSTRUCTORS:
            return super().find_class(module, name)
        if (module == "commdsl" or module.startswith("commdsl.")) and not name.startswith("_"):
            found = super().find_class(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found  # a record or a kind: built from its fields, never a function or a class that acts
        if name in _TORCH_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # a dtype pickles as its name in the torch module
        raise pickle.UnpicklingError(f"data from another rank names {module}.{name}: not a class ranks exchange")


def loads_from_rank(data: bytes) -> object:
    """An object another rank pickled (see `RanksUnpickler`)."""
    return RanksUnpickler(io.BytesIO(data)).load()


def _encode(obj: object) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _decode(t: torch.Tensor, size: int) -> object:
    return loads_from_rank(bytes(t.contiguous().untyped_storage())[:size])


def _sizes(data: torch.Tensor, group: dist.ProcessGroup, world_size: int) -> list[int]:
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64), group=group)
    return [int(s.item()) for s in sizes]


def _padded(data: torch.Tensor, length: int) -> torch.Tensor:
    out = torch.zeros(length, dtype=torch.uint8)
    out[: data.numel()] = data
    return out


def all_gather_objects(obj: object, group: dist.ProcessGroup, world_size: int) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    data = _encode(obj)
    sizes = _sizes(data, group, world_size)
    longest = max(sizes)
    bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(bufs, _padded(data, longest), group=group)
    return [_decode(b, n) for b, n in zip(bufs, sizes)]


def gather_objects(obj: object, group: dist.ProcessGroup, world_size: int, rank: int, dst: int = 0) -> list | None:
    """Every rank's `obj`, in rank order, on rank `dst` (None elsewhere)."""
    data = _encode(obj)
    sizes = _sizes(data, group, world_size)
    longest = max(sizes)
    bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world_size)] if rank == dst else None
    dist.gather(_padded(data, longest), bufs, dst=dst, group=group)
    return [_decode(b, n) for b, n in zip(bufs, sizes)] if bufs is not None else None


def broadcast_object(obj: object, group: dist.ProcessGroup, rank: int, src: int = 0) -> object:
    """Rank `src`'s `obj` on every rank (other ranks pass anything)."""
    data = _encode(obj) if rank == src else torch.zeros(0, dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    buf = data if rank == src else torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=group)
    return _decode(buf, int(size.item()))
