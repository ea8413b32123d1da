"""Waiting until an absolute time computed ahead, to the last bit.

When a driver prices several steps at once (decode runs, search stages that change nothing),
it sums their durations as SimPy would have, one addition per step, and then waits once. A
SimPy timeout lands at ``now + delay``, and no delay may land exactly on a precomputed time
(with round-half-even some sums are unreachable from ``now``), so the simulator's clock offers
``timeout_at`` (``ragsim.sim.simulator.ExactClock``); another clock (a real run's) gets the
nearest timeout, where a last-bit difference is far below its own jitter.
"""

from __future__ import annotations

import simpy


def timeout_at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at time ``t`` (exactly, on a clock that offers ``timeout_at``)."""
    at = getattr(env, "timeout_at", None)
    if at is not None:
        return at(t)
    return env.timeout(max(t - env.now, 0.0))
