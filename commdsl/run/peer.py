"""One-sided copies into another rank's buffer (`copy x SIZE to RANK [into NAME]`).

Every rank holds the whole Program, so before the first iteration every rank knows
which of its buffers other ranks copy into (its *landing buffers*) and
which buffers of other ranks its own copies write (`commdsl.run.tensors.landings`, beside
the rank's other buffers). At start-up (`PeerBuffers.open`):

  1. each rank allocates its landing buffers where another process can write them: on
     CPU a file under /dev/shm (the temp folder where /dev/shm lacks room) mapped shared
     (`torch.from_file(..., shared=True)`); on CUDA a device tensor, exported with
     torch's own CUDA IPC support (the reductions `torch.multiprocessing` pickles CUDA
     tensors with: cudaIpcGetMemHandle and an IPC event);
  2. it puts, per landing buffer, the file's path or the exported handle in the
     rendezvous store, under a key every rank derives from the Program;
  3. each rank opens the buffers its copies write (the store hands each key over once
     it is set): maps the file, or rebuilds the CUDA tensor (cudaIpcOpenMemHandle);
  4. after a barrier of every rank, each rank removes its files: the mappings stay,
     and nothing is left under /dev/shm, even if the run dies later.

A copy is then `remote.copy_(local)` issued on the sender's stream: on CPU the stream's
thread copies into the shared pages; on CUDA it is a cudaMemcpyAsync on the sender's
CUDA stream between the two GPUs (the driver stages it through host memory where the
GPUs have no peer access). Nothing runs on the destination.

Ordering: nothing tells the destination that a copy landed. It may read the buffer
after an op that follows the copy's end on both sides: the source synchronizes (or
waits on an event recorded after the copy), then joins a barrier, a collective or a
send to the destination, and the destination reads after that op.

NOT YET RUN ON A GPU: the CUDA IPC path was written without one (see docs/executor.md).
"""

from __future__ import annotations

import os
import pickle
import tempfile

import torch
import torch.distributed as dist

from commdsl.dsl.values import format_bytes
from commdsl.errors import UsageError
from commdsl.ir import Op, Program
from commdsl.run.backend import loads_from_rank
from commdsl.run.tensors import TORCH_DTYPE, Landing, landing_key, landings

_SHM_DIR = "/dev/shm"
"""Where CPU landing buffers live (a tmpfs on Linux); the temp folder where it is missing."""


class PeerBuffers:
    """The landing buffers of one rank and the remote buffers its copies write."""

    def __init__(self, program: Program, rank: int, device: torch.device, per_op: bool):
        self.rank = rank
        self.device = device
        self.per_op = per_op
        self.all = landings(program, per_op)
        self.local: dict[tuple, torch.Tensor] = {}
        """Key -> this rank's landing buffer."""
        self.remote: dict[tuple[int, tuple], torch.Tensor] = {}
        """(destination rank, key) -> the buffer of that rank this rank's copies write."""
        self.writes = {(op.peer, landing_key(op, per_op)) for op in program.ops[rank] if op.is_peer_copy}
        self._files: list[str] = []

    @property
    def used(self) -> bool:
        """Whether the Program has any peer copy (then every rank takes part in `open`)."""
        return bool(self.all)

    def open(self, store: dist.Store, control: dist.ProcessGroup, prefix: str) -> None:
        """Allocate and export this rank's landing buffers, open the remote ones (see the
        module doc). Every rank calls it, in step (it ends with a barrier of `control`)."""
        mine = self.all.get(self.rank, [])
        for i, landing in enumerate(mine):
            tensor, handle = self._export(landing)
            self.local[landing.key] = tensor
            store.set(f"{prefix}/{self.rank}/{i}", pickle.dumps(handle))
        for dest, buffers in self.all.items():
            for i, landing in enumerate(buffers):
                if (dest, landing.key) in self.writes:
                    handle = loads_from_rank(store.get(f"{prefix}/{dest}/{i}"))  # set by our own rank `dest`
                    self.remote[(dest, landing.key)] = self._import(landing, handle)
        dist.barrier(group=control)  # every copy's destination is open: the files can go
        self._remove_files()

    def target(self, op: Op) -> torch.Tensor:
        """The buffer of `op.peer` that peer copy `op` writes."""
        return self.remote[(op.peer, landing_key(op, self.per_op))]

    def landing(self, op: Op) -> torch.Tensor:
        """On the destination: the landing buffer that peer copy `op` (of another rank) writes."""
        return self.local[landing_key(op, self.per_op)]

    def close(self) -> None:
        """Drop the remote buffers (on CUDA: release the IPC mappings) and remove files left."""
        self.remote.clear()
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()
        self._remove_files()

    # ---- the two devices ------------------------------------------------------------

    def _export(self, landing: Landing) -> tuple[torch.Tensor, object]:
        """A zeroed landing buffer and what another process needs to open it."""
        dtype = TORCH_DTYPE[landing.dtype]
        if landing.numel == 0:
            return torch.zeros(0, dtype=dtype, device=self.device), None
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            tensor = torch.zeros(landing.numel, dtype=dtype, device=self.device)
            _, args = reduce_tensor(tensor)  # torch's CUDA IPC export: handle, offsets, ref counter, event
            return tensor, args
        size_bytes = landing.numel * landing.dtype.itemsize
        folder = _shared_folder(size_bytes)
        fd, path = tempfile.mkstemp(prefix=f"commdsl-peer-{self.rank}-", dir=folder)
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        self._files.append(path)
        return torch.from_file(path, shared=True, size=landing.numel, dtype=dtype), path

    def _import(self, landing: Landing, handle: object) -> torch.Tensor:
        dtype = TORCH_DTYPE[landing.dtype]
        if handle is None:
            return torch.zeros(0, dtype=dtype, device=self.device)
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            return rebuild_cuda_tensor(*handle)  # cudaIpcOpenMemHandle: a tensor on the destination's GPU
        return torch.from_file(handle, shared=True, size=landing.numel, dtype=dtype)

    def _remove_files(self) -> None:
        for path in self._files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._files.clear()


def _shared_folder(size_bytes: int) -> str:
    """Where a CPU landing buffer of `size_bytes` goes: /dev/shm, else the temp folder, the
    first with room for it. The file is sparse until written, and a write past a full
    tmpfs kills the process (SIGBUS), so room is checked up front."""
    folders = [f for f in (_SHM_DIR, tempfile.gettempdir()) if os.path.isdir(f)]
    room = {f: (st := os.statvfs(f)).f_bavail * st.f_frsize for f in folders}
    for f in folders:
        if room[f] >= size_bytes:
            return f
    raise UsageError(f"no room for a {format_bytes(size_bytes)} landing buffer of peer copies: "
                     + ", ".join(f"{f} has {format_bytes(room[f])} free" for f in folders),
                     hint="free space there, or copy fewer bytes to other ranks")  # fmt: skip
