"""The real runs' clock: work finished on another thread wakes it (``realrun.clock``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from ragsim.realrun.clock import WakeableClock


def _finish_later(future: Future, after_s: float, seen: dict, error: Exception | None = None):
    def work():
        time.sleep(after_s)
        seen["finished_monotonic"] = time.monotonic()
        if error is None:
            future.set_result("found")
        else:
            future.set_exception(error)

    threading.Thread(target=work, daemon=True).start()


def test_work_finished_on_a_thread_wakes_the_clock_before_its_next_event():
    """A process waiting on a worker's future resumes when the worker finishes, at that wall
    instant on the clock (never before it), not at the clock's next scheduled event, 30 s
    away; the future's result is the event's value."""
    env = WakeableClock(initial_time=100.0)
    env.sync()
    future, seen, got = Future(), {}, {}
    env.timeout(30.0)  # the next event of the schedule

    def waiting():
        got["value"] = yield env.when_done(future)
        got["now"] = env.now

    process = env.process(waiting())
    _finish_later(future, 0.05, seen)
    env.run(until=process)
    assert got["value"] == "found"
    assert 100.0 < got["now"] < 130.0
    assert got["now"] >= env.env_time(seen["finished_monotonic"])


def test_an_empty_schedule_waits_for_outstanding_work_instead_of_ending():
    """Nothing scheduled but a search on a worker: the run goes on until it finishes (a plain
    SimPy environment would stop at once, its schedule empty)."""
    env = WakeableClock()
    env.sync()
    future, seen, got = Future(), {}, []

    def waiting():
        got.append((yield env.when_done(future)))

    env.process(waiting())
    _finish_later(future, 0.05, seen)
    env.run()
    assert got == ["found"] and "finished_monotonic" in seen


def test_a_workers_error_surfaces_in_the_waiting_process():
    env = WakeableClock()
    env.sync()
    future, seen = Future(), {}

    def waiting():
        yield env.when_done(future)

    process = env.process(waiting())
    _finish_later(future, 0.01, seen, error=ValueError("the index is gone"))
    with pytest.raises(ValueError, match="the index is gone"):
        env.run(until=process)


def test_work_finished_before_it_is_waited_on_fires_at_once():
    env = WakeableClock(initial_time=5.0)
    env.sync()
    future = Future()
    future.set_result(7)
    got = []

    def waiting():
        got.append((yield env.when_done(future)))
        got.append(env.now)

    env.process(waiting())
    env.timeout(60.0)
    env.run(until=5.2)  # (until: past the work; the 60 s event is never reached)
    assert got[0] == 7 and 5.0 <= got[1] < 5.2
