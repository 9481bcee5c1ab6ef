"""Launch N local ranks of a commdsl module and watch them.

`commdsl run FILE -n N` and `commdsl calibrate -n N` start their ranks here, on this
machine, as `torchrun --standalone --nproc_per_node=N -m MODULE ...` would: the launcher
hosts the rendezvous store (a `TCPStore` on a port the system picks) and starts each
rank as `python -m MODULE ARGS` with torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True, ...). Several nodes or
Slurm: `torchrun ... -m commdsl.run` (docs/executor.md).

The launcher watches the ranks itself rather than through torch's elastic agent,
because a run under faults needs three things the agent does not give: the rank that
failed first (the agent's failure records carry whole-second timestamps, so a rank it
stopped itself ties with the one that died, and wins on the lower rank), an end within
seconds when a rank does not stop (the agent waits 30 s after SIGTERM before SIGKILL,
and a stopped rank never acts on SIGTERM), and Ctrl-C as one line (under the agent the
terminal's SIGINT reaches every rank, and gloo's threads abort each process). Each rank
prints its own errors (rank 0 those every rank hits alike); the launcher exits with the
code of the rank that failed first: 1 schedule error or failed op, 2 usage error,
3 watchdog (an op hung), 128 + N for a rank killed by signal N (said in one line);
130 after Ctrl-C.

Importing this module does not import torch; `launch` does, and says how to install it
where it is missing.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from commdsl.errors import UsageError
from commdsl.limits import MAX_LOCAL_RANKS

POLL_S = 0.05
"""How often the launcher looks at its ranks."""
STOP_GRACE_S = 5.0
"""After SIGTERM, how long a rank has to exit before it is killed with SIGKILL."""
STORE_TIMEOUT_S = 300.0
"""The launcher's store: how long a request to it may wait."""


class ArgumentRecorder:
    """Adds arguments to a parser like `parser.add_argument` and keeps the actions, in
    order: the options a rank module takes, for `rank_argv`."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.actions: list[argparse.Action] = []

    def __call__(self, *names: str, **options) -> None:
        self.actions.append(self.parser.add_argument(*names, **options))


def add_nproc_argument(parser: argparse.ArgumentParser, default: int | None, what: str) -> None:
    """-n / --nproc-per-node: how many local ranks to start."""
    parser.add_argument("-n", "--nproc-per-node", dest="nproc", type=int, default=default, metavar="N",
                        help=f"ranks to start on this machine ({what}); several nodes: torchrun (docs/executor.md)")  # fmt: skip


def rank_argv(actions: list[argparse.Action], args: argparse.Namespace) -> list[str]:
    """The command line that gives a rank's parser the values `args` holds for `actions`
    (the rank module's own options, as `add_arguments` returned them): positionals in
    order, then every option that differs from its default."""
    positional, options = [], []
    for action in actions:
        value = getattr(args, action.dest)
        if not action.option_strings:
            positional.append(str(value))
        elif action.nargs == 0:  # store_true / store_const
            if value != action.default:
                options.append(action.option_strings[-1])
        elif action.nargs in ("+", "*"):  # one option, several values
            if value:
                options += [action.option_strings[-1], *map(str, value)]
        elif isinstance(value, list):  # append: the option once per value
            options += [f"{action.option_strings[-1]}={item}" for item in value]
        elif value is not None and value != action.default:
            options.append(f"{action.option_strings[-1]}={value}")
    return positional + options


@contextmanager
def torch_required(command: str) -> Iterator[None]:
    """Imports inside turn a missing torch into `command`'s usage error; any other
    import error is a bug and passes."""
    try:
        yield
    except ImportError as e:
        if e.name is None or e.name.partition(".")[0] != "torch":
            raise
        raise UsageError(f"`{command}` runs ranks with torch.distributed, and torch is not installed here",
                         hint='pip install "commdsl[run]" (or install the torch build for your GPUs first)') from None  # fmt: skip


LAUNCHER_PID_ENV = "COMMDSL_LAUNCHER_PID"
"""Set in the ranks `launch` starts: the launcher's pid (`die_with_launcher`)."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher() -> None:
    """In a rank `launch` started: end when the launcher ends, whatever kills it (SIGKILL
    too: the ranks could not hear it, and a rank still setting up waits minutes for a store
    that is gone). Linux's parent-death signal (SIGTERM), set as the rank starts; a
    launcher gone before that ends the rank at once. Elsewhere, and outside `launch`: nothing."""
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if not pid or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != pid:
        os.kill(os.getpid(), signal.SIGTERM)


def launch(module: str, argv: list[str], nproc: int, command: str) -> int:
    """Run `python -m module argv` as `nproc` local ranks; returns the exit code: 0 when
    every rank succeeded, else that of the rank that failed first (128 + N for a rank
    killed by signal N, said in one line), 130 after Ctrl-C, 128 + N after signal N to
    the launcher."""
    if not 1 <= nproc <= MAX_LOCAL_RANKS:
        raise UsageError(f"-n must be from 1 to {MAX_LOCAL_RANKS} ranks on this machine, got {nproc:,}",
                         hint="more ranks: torchrun -m commdsl.run over several nodes (docs/executor.md)")  # fmt: skip
    with torch_required(command):
        from torch.distributed import TCPStore
    env = dict(os.environ)
    if nproc > 1:
        # As torchrun: one intra-op thread per rank unless the user says otherwise, so
        # that N ranks do not start N thread teams as wide as the machine.
        env.setdefault("OMP_NUM_THREADS", "1")
    # The launcher hosts the rendezvous store, as torchrun's agent does, on a port the
    # system picks (no race for a "free" port); every rank connects to it as a client.
    store = TCPStore("127.0.0.1", 0, nproc, True, datetime.timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
               GROUP_RANK="0", TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
               **{LAUNCHER_PID_ENV: str(os.getpid())})  # fmt: skip
    ranks = Ranks()
    with _signals_raise(signal.SIGTERM, signal.SIGHUP):
        try:
            with _signals_held(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as held:
                for rank in range(nproc):
                    # Each rank in a process group of its own: a terminal's Ctrl-C reaches
                    # the launcher only, which stops the ranks (else every rank would print
                    # its own interruption, and gloo's threads abort the process).
                    ranks.procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], start_new_session=True,
                                                        env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))))  # fmt: skip
                    if held:
                        break
            if held:  # acted on now that every rank started is in `ranks`, so stopped
                raise KeyboardInterrupt if held[0] is signal.SIGINT else Stopped(held[0])
            failed = ranks.wait_first_failure()
            killed = ranks.stop() if failed is not None else []
        except KeyboardInterrupt:
            ranks.stop()
            print(f"{command}: interrupted", file=sys.stderr, flush=True)
            return 130
        except Stopped as stopped:
            ranks.stop()
            print(f"{command}: stopped by {stopped.sig.name}", file=sys.stderr, flush=True)
            return 128 + int(stopped.sig)
        except BaseException:
            ranks.stop()
            raise
    if failed is None:
        return 0
    rank, code = failed
    if killed:
        print(f"{command}: rank(s) {', '.join(map(str, killed))} did not stop within {STOP_GRACE_S:g}s of SIGTERM "
              "and were killed (stopped, or stuck in a call that ignores signals)", file=sys.stderr, flush=True)  # fmt: skip
    if code > 0:
        return code  # the rank printed its own error
    print(f"{command}: rank {rank} was killed by {_signal_name(-code)}", file=sys.stderr, flush=True)
    return 128 - code


class Stopped(Exception):
    """The launcher itself got a signal that ends the run (SIGTERM, SIGHUP)."""

    def __init__(self, sig: signal.Signals):
        super().__init__(sig.name)
        self.sig = sig


@contextmanager
def _signal_handlers(handler, signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Inside, `handler` handles `signals` (in the main thread only: elsewhere Python
    cannot set handlers); the handlers before are back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _signals_raise(*signals: signal.Signals):
    """Inside, `signals` raise `Stopped` in the main thread (as SIGINT raises
    KeyboardInterrupt), so that the ranks are stopped before the launcher exits."""

    def handler(signum: int, _frame) -> None:
        raise Stopped(signal.Signals(signum))

    return _signal_handlers(handler, signals)


@contextmanager
def _signals_held(*signals: signal.Signals) -> Iterator[list[signal.Signals]]:
    """Inside, `signals` are noted in the list it yields, not acted on: an exception raised
    between a rank's fork and its `Popen`'s return would lose the rank's process (left
    running, an orphan the launcher never stops)."""
    held: list[signal.Signals] = []
    with _signal_handlers(lambda signum, _frame: held.append(signal.Signals(signum)), signals):
        yield held


class Ranks:
    """The rank processes, in rank order, and how they ended."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def wait_first_failure(self) -> tuple[int, int] | None:
        """Waits until every rank succeeded (None) or one failed: (rank, its return
        code, -N for signal N). Ranks seen to fail in the same look are ordered killed
        by a signal first (a signal comes from outside, an error exit is often a peer's
        echo of it), then by rank."""
        running = set(range(len(self.procs)))
        while running:
            failed = []
            for rank in sorted(running):
                code = self.procs[rank].poll()
                if code is not None:
                    running.discard(rank)
                    if code != 0:
                        failed.append((code > 0, rank, code))
            if failed:
                _, rank, code = min(failed)
                return rank, code
            if running:
                time.sleep(POLL_S)
        return None

    def stop(self) -> list[int]:
        """Stops every rank still running: SIGTERM (and SIGCONT, so that a stopped
        rank acts on it), then SIGKILL for those alive after `STOP_GRACE_S`. Returns
        the ranks that had to be killed."""
        alive = [(rank, p) for rank, p in enumerate(self.procs) if p.poll() is None]
        for _, p in alive:
            _signal(p, signal.SIGTERM)
            _signal(p, signal.SIGCONT)
        deadline = time.monotonic() + STOP_GRACE_S
        killed = []
        for rank, p in alive:
            try:
                p.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                _signal(p, signal.SIGKILL)
                p.wait()
                killed.append(rank)
        return killed


def _signal(p: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        p.send_signal(sig)
    except ProcessLookupError:  # it exited meanwhile
        pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
