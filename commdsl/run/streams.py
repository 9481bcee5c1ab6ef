"""CPU emulation of streams and comm queues (the gloo backend).

A CUDA stream is a FIFO of device work; ops on different streams overlap; NCCL runs a
communicator's ops in issue order on its own internal stream. On CPU we rebuild that
with threads:

* every declared stream of a rank is a `WorkQueue`: one worker thread running its
  tasks one after another, in the order the host submitted them;
* every group the rank belongs to has its own `WorkQueue` too, its comm queue: the
  group's comm ops run there strictly in program order, so every member issues the
  group's gloo calls in the same order (gloo, like NCCL, matches by order);
* an async comm op is two things: the comm-queue task first waits until the issuing
  stream has finished everything submitted before the op (its "ticket"), then makes
  the torch.distributed call and sets the op's completion event; a synchronous op
  also puts a task on the issuing stream that waits for that event, so later work on
  the stream starts after the comm, exactly as `work.wait()` orders a CUDA stream;
* `record` submits a task that sets a `threading.Event`; `wait` on an event or a
  handle submits a task that blocks the stream until the event is set.

Every blocking wait here polls `RunSignals.stop`, so a failure on any thread (or the
watchdog) tears the run down instead of leaving threads blocked forever. Blocking
inside gloo itself cannot be interrupted: the watchdog ends the process for that.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

_POLL_S = 0.2
"""How often a blocked wait looks at the stop flag (waking on notify is immediate)."""


class Aborted(Exception):
    """The run is being torn down; unwinds a worker without reporting a new error."""


class RunSignals:
    """Shared by the host and the workers of one rank: stop flag and first failure."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = exc
        self.stop.set()

    def wait_event(self, event: threading.Event) -> None:
        while not event.wait(_POLL_S):
            if self.stop.is_set():
                raise Aborted()


class WorkQueue:
    """One worker thread running submitted tasks in FIFO order."""

    def __init__(self, name: str, signals: RunSignals, on_start: Callable[[], None] | None = None):
        """`on_start` runs first on the worker thread (per-thread settings)."""
        self.name = name
        self._signals = signals
        self._on_start = on_start
        self._cond = threading.Condition()
        self._tasks: deque[Callable[[], None]] = deque()
        self._submitted = 0
        self._done = 0
        self._event_waits: dict[int, threading.Event] = {}
        """Task number -> the event that task only waits for (see `wait_for`)."""
        self._thread = threading.Thread(target=self._loop, name=f"commdsl-{name}", daemon=True)
        self._thread.start()

    @property
    def position(self) -> int:
        """Number of tasks submitted so far: a ticket covering all queued work."""
        with self._cond:
            return self._submitted

    def submit(self, task: Callable[[], None], *, only_waits_for: threading.Event | None = None) -> int:
        """Queue a task; returns its ticket. `only_waits_for`: the task does nothing but
        wait for this event (see `wait_for`)."""
        with self._cond:
            self._tasks.append(task)
            self._submitted += 1
            if only_waits_for is not None:
                self._event_waits[self._submitted] = only_waits_for
            self._cond.notify_all()
            return self._submitted

    def wait_for(self, ticket: int) -> None:
        """Block until the first `ticket` tasks have finished, or until those left are
        only waits for events already set: on a GPU, work ordered after such a wait
        starts as the event fires, without the waiting stream having to run first (here,
        without two thread wake-ups per comm op)."""
        with self._cond:
            while self._done < ticket:
                if self._signals.stop.is_set():
                    raise Aborted()
                if all((ev := self._event_waits.get(n)) is not None and ev.is_set() for n in range(self._done + 1, ticket + 1)):
                    return
                self._cond.wait(_POLL_S)

    def drain(self) -> None:
        self.wait_for(self.position)

    def join(self, timeout_s: float = 5.0) -> None:
        """After `RunSignals.stop` is set: wait for the worker to leave."""
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            with self._cond:
                while not self._tasks:
                    if self._signals.stop.is_set():
                        return
                    self._cond.wait(_POLL_S)
                task = self._tasks.popleft()
            try:
                task()
            except Aborted:
                return
            except BaseException as e:  # reported by the host thread, with the op
                self._signals.fail(e)
                return
            with self._cond:
                self._done += 1
                self._event_waits.pop(self._done, None)
                self._cond.notify_all()
