"""The real runs' wall clock: SimPy's real-time environment that other threads can wake.

A real run's processes (the pipeline, the engine's loop) live on SimPy's real-time clock, while
the work they wait for may finish on other threads (a search stage on the search workers). A
SimPy environment cannot be woken from another thread, so the runs used to look at such work
every 0.5 ms: a search that took 0.05 ms was seen up to half a millisecond late, and at idle
that poll was most of the search the real run measured (vLLM at rest: 0.67 ms against the
trace's 0.05 ms). Here the clock sleeps on a ``threading.Event`` instead of ``time.sleep``: a
thread that finishes work sets it, and the clock turns the finished work into an event at the
wall instant it was seen. What the clock cannot do is interrupt a forward pass: work that ends
during one is seen right after it, as an engine's loop sees it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

import simpy
import simpy.rt
from simpy.core import EmptySchedule, Infinity


class WakeableClock(simpy.rt.RealtimeEnvironment):
    """``simpy.rt.RealtimeEnvironment`` (not strict) whose waits end early when another thread
    finishes work handed to ``when_done``."""

    def __init__(self, initial_time: float = 0.0, factor: float = 1.0) -> None:
        super().__init__(initial_time=initial_time, factor=factor, strict=False)
        self._finished: deque[tuple[simpy.Event, Future]] = deque()
        self._outstanding = 0  # futures handed to when_done and not yet turned into events
        self._wake = threading.Event()

    def env_time(self, monotonic_s: float) -> float:
        """A ``time.monotonic()`` instant on this clock."""
        return self.env_start + (monotonic_s - self.real_start) / self.factor

    def wall_time(self, env_s: float) -> float:
        """The ``time.monotonic()`` instant of ``env_s`` on this clock."""
        return self.real_start + (env_s - self.env_start) * self.factor

    def when_done(self, future: Future) -> simpy.Event:
        """An event that fires when ``future`` finishes, at the instant the clock sees it
        (fails with the future's error: a worker's error surfaces in the process waiting).
        Work already finished fires now, before whatever else is due now: a search's later
        stages, done while the pipeline handled the first, are seen at once, as a loop that
        looks at them finds them (not after the engine's next forward pass)."""
        done = self.event()
        if future.done():
            _settle(done, future)
            return done
        self._outstanding += 1

        def finished(f: Future) -> None:  # on the thread that finished it
            self._finished.append((done, f))
            self._wake.set()

        future.add_done_callback(finished)
        return done

    def _take_finished(self) -> None:
        """Each finished future as its event, scheduled at the wall instant it is seen."""
        while self._finished:
            done, future = self._finished.popleft()
            self._outstanding -= 1
            delay = max(0.0, self.env_time(time.monotonic()) - self.now)
            timer = self.timeout(delay)
            timer.callbacks.append(lambda _, d=done, f=future: _settle(d, f))

    def step(self) -> None:
        """The next event, once the wall clock reaches it, or earlier work another thread
        finished (``when_done``)."""
        while True:
            self._wake.clear()
            self._take_finished()
            at = self.peek()
            if at is Infinity and not self._outstanding:
                raise EmptySchedule
            left = float("inf") if at is Infinity else self.wall_time(at) - time.monotonic()
            if left <= 0:
                break
            # a thread that finishes work sets the flag; sleep in bounded slices so that a
            # run interrupted from outside still gets control back
            self._wake.wait(min(left, 1.0))
        simpy.Environment.step(self)


def _settle(done: simpy.Event, future: Future) -> None:
    error = future.exception()
    if error is not None:
        done.fail(error)
    else:
        done.succeed(future.result())
