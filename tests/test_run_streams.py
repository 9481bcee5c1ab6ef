"""The CPU executor's work queues (streams and comm queues as threads)."""

from __future__ import annotations

import threading
import time

import pytest

from commdsl.run.streams import Aborted, RunSignals, WorkQueue


def _waiting(q: WorkQueue, ticket: int) -> threading.Thread:
    """A thread blocked in q.wait_for(ticket), given a moment to get there."""
    waiter = threading.Thread(target=q.wait_for, args=(ticket,))
    waiter.start()
    time.sleep(0.05)
    return waiter


@pytest.fixture
def signals():
    s = RunSignals()
    yield s
    s.stop.set()


def test_tasks_run_in_order_and_wait_for_blocks_until_done(signals):
    q = WorkQueue("s", signals)
    order: list[int] = []
    gate = threading.Event()
    q.submit(lambda: (gate.wait(5), order.append(1)))
    ticket = q.submit(lambda: order.append(2))
    waiter = _waiting(q, ticket)
    assert waiter.is_alive()  # the first task holds the queue
    gate.set()
    waiter.join(5)
    assert not waiter.is_alive() and order == [1, 2]


def test_a_wait_whose_event_fired_does_not_hold_back_work_ordered_after_it(signals):
    """As a GPU stream resolves a fired event at once: no waiting for the worker to get
    there (here the wait task is made slow to run, to tell the two apart)."""
    q = WorkQueue("s", signals)
    fired, release = threading.Event(), threading.Event()
    fired.set()
    ticket = q.submit(lambda: release.wait(30), only_waits_for=fired)
    waiter = threading.Thread(target=q.wait_for, args=(ticket,))
    waiter.start()
    waiter.join(10)  # returns at once; the bound only keeps a broken queue from hanging the test
    try:
        assert not waiter.is_alive(), "wait_for waited for the worker to run the wait task"
    finally:
        release.set()


def test_real_work_before_a_fired_wait_still_holds_back(signals):
    q = WorkQueue("s", signals)
    busy, fired = threading.Event(), threading.Event()
    fired.set()
    q.submit(lambda: busy.wait(5))
    ticket = q.submit(lambda: None, only_waits_for=fired)
    waiter = _waiting(q, ticket)
    assert waiter.is_alive()
    busy.set()
    waiter.join(5)
    assert not waiter.is_alive()


def test_a_wait_on_an_unfired_event_holds_back_what_follows(signals):
    q = WorkQueue("s", signals)
    ev = threading.Event()
    ticket = q.submit(lambda: signals.wait_event(ev), only_waits_for=ev)
    waiter = _waiting(q, ticket)
    assert waiter.is_alive()
    ev.set()
    waiter.join(5)
    assert not waiter.is_alive()


def test_stop_unblocks_a_waiter(signals):
    q = WorkQueue("s", signals)
    q.submit(lambda: signals.wait_event(threading.Event()))
    signals.stop.set()
    with pytest.raises(Aborted):
        q.wait_for(1)


def test_on_start_runs_on_the_worker_thread_before_any_task(signals):
    seen: list[str] = []
    q = WorkQueue("s", signals, on_start=lambda: seen.append("start:" + threading.current_thread().name))
    q.wait_for(q.submit(lambda: seen.append("task")))
    assert seen == ["start:commdsl-s", "task"]
