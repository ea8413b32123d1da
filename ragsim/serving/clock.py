"""Landing SimPy timeouts exactly on absolute times computed ahead.

When a driver prices several steps at once (decode runs, search stages that change nothing),
it sums their durations as SimPy would have, one addition per step, and then waits once. SimPy
schedules a timeout at ``now + delay``; ``delay_to`` picks the delay for which that sum is the
precomputed time to the last bit, so the shortcut gives exactly the times of stepping.
"""

from __future__ import annotations

import math


def delay_to(t: float, now: float) -> float:
    """The delay that lands a SimPy timeout (scheduled at ``now + delay``) exactly on ``t``."""
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    while now + delay > t:
        delay = math.nextafter(delay, -math.inf)
    return delay
