"""Waiting until an absolute time computed ahead, to the last bit.

When a driver prices several steps at once (decode runs, search stages that change nothing),
it sums their durations as SimPy would have, one addition per step, and then waits once. A
SimPy timeout lands at ``now + delay``, and no delay may land exactly on a precomputed time
(with round-half-even some sums are unreachable from ``now``), so the simulator's clock offers
``timeout_at`` (``ragsim.sim.simulator.ExactClock``), which ``exact_timeouts`` hands the
drivers; another clock (a real run's) gets the nearest timeout, where a last-bit difference is
far below its own jitter.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy


def exact_timeouts(env: simpy.Environment) -> Callable[..., simpy.Event]:
    """``timeout_at`` bound to ``env`` once, ``(t, urgent=False) -> event``: the drivers wait
    this way several times per request, and the lookup of the clock's own method is then paid
    once per run. On a clock without it (a real run's wall clock) the nearest timeout, at
    normal priority: ``urgent`` orders events of one simulated instant, which a wall clock
    does not have."""
    at = getattr(env, "timeout_at", None)
    if at is not None:
        return at

    def nearest(t: float, urgent: bool = False) -> simpy.Event:
        return env.timeout(max(t - env.now, 0.0))

    return nearest


def redirect_wait(process: simpy.Process, event: simpy.Event) -> None:
    """Have ``process``, waiting on an event, wait on ``event`` instead.

    A driver that waits once for several steps (a decode run) learns during the wait that it
    must stop earlier. An interrupt would do it, at the price of an event, an exception thrown
    into the process and a second wait; this does what SimPy's interrupt does to the process's
    wait before it throws (``Interruption._interrupt``: the process leaves its target's
    callbacks), then waits on ``event``. The earlier event still fires, for nobody."""
    process._target.callbacks.remove(process._resume)
    event.callbacks.append(process._resume)
    process._target = event
