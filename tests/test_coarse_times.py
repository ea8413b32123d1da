"""The warning about arrival times too large for float64 to hold short durations.

Float64 spacing by hand: times near 2**33 s (about 272 years) are 2**33 * 2**-52 = 2**-19 s =
1.9 us apart, past the 1 us the simulation needs; times near 2**32 s are 0.95 us apart.
"""

from __future__ import annotations

import numpy as np

from ragsim.serving.notices import coarse_times


def test_times_spaced_wider_than_a_microsecond_are_named():
    line = coarse_times(np.array([0.0, 2.0**33]))
    assert line is not None and "1.91e-06 s apart" in line


def test_times_that_hold_microseconds_are_not():
    assert coarse_times(np.array([0.0, 2.0**32 - 1])) is None
    assert coarse_times(np.array([])) is None


def test_requests_that_never_arrived_are_not_counted():
    """A sequential run stopped before a request's turn leaves its arrival at inf: not a time
    (the first GPU run's interrupted runs warned of times reaching inf, nan s apart)."""
    assert coarse_times(np.array([0.0, 1.5, np.inf, np.inf])) is None
    assert coarse_times(np.array([np.inf])) is None
    assert coarse_times(np.array([2.0**33, np.inf])) is not None
