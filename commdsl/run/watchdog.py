"""The watchdog: a hang ends with a report from every rank, a partial timeline, and a
non-zero exit, within the timeout plus a few seconds.

Each rank runs a watchdog thread. Every `POLL_S` it looks at its executor and judges
progress, not age: with ops unfinished, no op of the rank finishing for `--timeout`
seconds fires it (a long schedule whose ops keep finishing runs as long as it needs,
however long ago its last op was issued), and so does the host stuck that long in one
of the executor's own phases (an iteration barrier, gathering results).
It also fires when another rank has fired (or failed): ranks tell each other through
the rendezvous store, which works while process groups are stuck, never through a
process group.

Firing: the rank prints what it is stuck on (op id, name, state, source line with
its text), stores its report and its partial records, and raises the abort flag.
Rank 0 waits a few seconds for every rank's records, writes the partial timeline
(spans of finished ops, plus running ones cut at the moment of the hang), and tells
the others it is done; then every rank leaves with `os._exit`, because threads blocked
inside gloo or NCCL cannot be interrupted. torchrun then sees the non-zero exit codes
and reaps its workers: no orphan processes remain.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from commdsl.run.executor import Executor
from commdsl.run.timing import now_ns

POLL_S = 0.25
GATHER_GRACE_S = 5.0
"""How long rank 0 waits for the other ranks' reports after a hang."""
EXIT_HANG = 3
"""Exit status after a hang (as the simulator's deadlock)."""


class Watchdog:
    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float, prefix: str,
                 write_partial: Callable[[list[dict]], str | None]):  # fmt: skip
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_ns = int(timeout_s * 1e9)
        self.prefix = prefix
        self.write_partial = write_partial
        """Rank 0: builds and writes the partial timeline from every rank's payload; returns its path."""
        self.executor: Executor | None = None
        self.phase: tuple[str, int] | None = None
        """A phase outside any executor (gathering results), and since when (ns)."""
        self.partial_payload: Callable[[], dict] = dict
        self._seen: tuple[object, int] | None = None
        """The executor's progress at the last poll: (its iteration record, ops finished in it)."""
        self._progress_ns = 0
        """When `_seen` last changed: the rank's last sign of progress."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._fired = False
        self._thread = threading.Thread(target=self._loop, name="commdsl-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    # ---- detection ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                lines = self._stuck(now_ns())
                if lines:
                    self.fire(lines, EXIT_HANG, origin=True)
                elif self.store.check([self._key("abort")]):
                    info = json.loads(self.store.get(self._key("abort")).decode())
                    self.fire([f"rank {self.rank}: stopping: rank {info['rank']} {info['why']}"], info["code"], origin=False)
            except Exception as e:  # the store went away: the launcher is tearing down
                print(f"rank {self.rank}: watchdog: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                os._exit(EXIT_HANG)

    def _stuck(self, now: int) -> list[str]:
        ex = self.executor
        for phase in (self.phase, ex.phase if ex else None):
            if phase is not None and now - phase[1] > self.timeout_ns:
                return [f"rank {self.rank}: stuck for {(now - phase[1]) / 1e9:.1f}s in {phase[0]}"]
        if ex is None:
            return []
        rec = ex.rec
        unfinished = ex.unfinished()
        finished = sum(1 for t in rec.issue_start if t) - len(unfinished)
        if self._seen is None or self._seen[0] is not rec or self._seen[1] != finished:
            self._seen, self._progress_ns = (rec, finished), now  # an op finished, or a new iteration began
            return []
        if not unfinished or now - self._progress_ns <= self.timeout_ns:
            return []
        return [f"rank {self.rank}: no op finished for {(now - self._progress_ns) / 1e9:.1f}s"] + self.describe(now)

    def describe(self, now: int) -> list[str]:
        """One line per unfinished op (running ones first), with its source line."""
        ex = self.executor
        if ex is None:
            return [f"rank {self.rank}: not running ops yet"]
        unfinished = sorted(ex.unfinished(), key=lambda u: (u[1] != "running", u[0].index))
        if not unfinished:
            where = ex.phase[0] if ex.phase else (self.phase[0] if self.phase else "between iterations")
            return [f"rank {self.rank}: finished its ops; in {where}"]
        lines = []
        for op, state, since in unfinished[:8]:
            what = _what(op)
            lines.append(f"rank {self.rank}: stuck on op {op.id} {op.label}{what} [{state}, "
                         f"issued {(now - since) / 1e9:.1f}s ago] at {op.loc}")  # fmt: skip
            if op.loc.text:
                lines.append(f"    {op.loc.line} | {op.loc.text.strip()}")
        if len(unfinished) > 8:
            lines.append(f"rank {self.rank}: ... and {len(unfinished) - 8} more unfinished ops")
        if ex.host_op is not None:
            op = ex.ops[ex.host_op]
            lines.append(f"rank {self.rank}: the host is blocked issuing op {op.id} {op.label}")
        return lines

    # ---- firing --------------------------------------------------------------------------

    def abort(self, lines: list[str], code: int) -> None:
        """From the host thread after an error: stop every rank, then exit."""
        self.fire(lines, code, origin=True)

    def fire(self, lines: list[str], code: int, *, origin: bool) -> None:
        with self._lock:
            if self._fired:
                return
            self._fired = True
        now = now_ns()
        if origin:
            why = "hit the watchdog timeout" if code == EXIT_HANG else "failed"
            self.store.set(self._key("abort"), json.dumps({"rank": self.rank, "code": code, "why": why}))
        else:
            lines = lines + self.describe(now)
        # One write of whole lines: print() writes its end apart, and another rank's report
        # on the same stderr could land between a line and its newline.
        sys.stderr.write("".join(line + "\n" for line in lines))
        sys.stderr.flush()
        try:
            payload = self.partial_payload()
        except Exception:
            payload = {}
        payload["now_ns"] = now
        self.store.set(self._key(f"report/{self.rank}"), json.dumps(payload))
        if self.rank == 0:
            payloads = self._collect()
            try:
                path = self.write_partial(payloads)
            except Exception as e:
                path = None
                print(f"rank 0: could not write the partial timeline: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if path:
                print(f"rank 0: partial timeline written to {path}", file=sys.stderr, flush=True)
            self.store.set(self._key("done"), "1")
        else:
            deadline = time.monotonic() + GATHER_GRACE_S + 5.0
            while time.monotonic() < deadline and not self.store.check([self._key("done")]):
                time.sleep(0.05)
        sys.stdout.flush()
        os._exit(code)

    def _collect(self) -> list[dict]:
        keys = {r: self._key(f"report/{r}") for r in range(self.world_size)}
        deadline = time.monotonic() + GATHER_GRACE_S
        while time.monotonic() < deadline and not self.store.check(list(keys.values())):
            time.sleep(0.05)
        out = []
        for r, key in keys.items():
            if self.store.check([key]):
                out.append(json.loads(self.store.get(key).decode()))
            else:
                print(f"rank 0: no report from rank {r}", file=sys.stderr, flush=True)
        return out

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"


def _what(op) -> str:
    if op.peer is not None:
        return f" {'to' if op.kind.value == 'send' else 'from'} rank {op.peer} (group {op.group})"
    if op.group is not None:
        root = f", root {op.root}" if op.root is not None else ""
        return f" (group {op.group}{root})"
    if op.waits_for:
        return f" (waits for op(s) {', '.join(f'{op.rank}:{i}' for i in op.waits_for)})"
    return f" on stream {op.stream}"
