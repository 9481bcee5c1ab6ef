"""Copy engines: how many memcpy transfers each GPU runs at once.

A GPU has `topology.copy_engines` of them (`Topology.copy_engines`). A memcpy transfer
between GPUs (a peer copy, or a send/recv with transport=memcpy) holds an engine on
every GPU whose engine drives part of it, from when it starts moving to its last byte:

  * a direct copy (the GPUs have peer access): one engine of the source GPU;
  * a copy staged through host memory: one of the source (the device->host leg) and one
    of the destination (the host->device leg), both legs in flight at once.

A transfer that finds an engine it needs busy waits. Waiting transfers start in the
order they asked, per GPU: a later one never takes an engine an earlier one waits for,
but one that needs only free GPUs starts at once.
"""

from __future__ import annotations

from collections.abc import Callable


class CopyEngines:
    """The copy engines of every GPU of a simulation (None per GPU count: unlimited)."""

    def __init__(self, per_gpu: int, world_size: int):
        self.free = [per_gpu] * world_size
        """Per GPU, engines not held."""
        self.waiting: list[tuple[tuple[int, ...], Callable[[], None]]] = []
        """Transfers waiting for engines: (GPUs, start), in the order they asked."""

    def acquire(self, gpus: tuple[int, ...], start: Callable[[], None]) -> None:
        """Start the transfer (call `start`) once it holds an engine on each of `gpus`."""
        if not self.waiting and all(self.free[d] > 0 for d in gpus):
            self._take(gpus)
            start()
            return
        self.waiting.append((gpus, start))
        self._start_waiting()

    def release(self, gpus: tuple[int, ...]) -> None:
        """A transfer holding engines on `gpus` ended: start whichever waiting ones can."""
        for d in gpus:
            self.free[d] += 1
        if self.waiting:
            self._start_waiting()

    def _take(self, gpus: tuple[int, ...]) -> None:
        for d in gpus:
            self.free[d] -= 1

    def _start_waiting(self) -> None:
        blocked: set[int] = set()  # GPUs an earlier waiting transfer still needs
        keep = []
        starts = []
        for gpus, start in self.waiting:
            if not blocked.intersection(gpus) and all(self.free[d] > 0 for d in gpus):
                self._take(gpus)
                starts.append(start)
            else:
                blocked.update(gpus)
                keep.append((gpus, start))
        self.waiting = keep
        for start in starts:
            start()
