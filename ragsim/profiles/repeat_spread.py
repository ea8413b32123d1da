"""How much one step's time varies when the same step runs again: the spread of a measured
profile's repeated timings, as the standard deviation of the log of a step's time.

Why: a simulation prices every step at its median, so it is one noise-free run. A real engine's
runs of the same requests and arrivals differ from one another (vLLM's mean TTFT at 50% load
varied 27-95 ms over ten runs; ``ragsim.engine_spread``), and at 50-90% load a request's TTFT
in one real run predicts its average over the others with a p90 |error| of 30-70%
(docs/validation.md): small step-time differences reorder the queue. A simulation that
estimates each request's expected TTFT (``validation.run_sim_ensemble``) draws each step's time
around its price with this spread; the spread is the profile's own measurement, never a fit to
a validation.

The profiler keeps, for every prefill and decode cell, the median, the fastest and the slowest
of its ``repetitions`` timings (``obtained.raw``; the repetitions are interleaved sweeps, so the
machine's drift over the profile is in them, as it is in a run). For a normal sample of ``n``
the expected range is ``d2(n)`` standard deviations (n = 7: 2.704), so a cell's log range
``ln(max / min) / d2(n)`` estimates the log-time standard deviation; the profile's value is the
median over its cells (a few cells timed while something else ran do not move it).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ragsim.profiles.profile import Profile

# the cells whose repeats estimate the spread: the two grids every measured profile has
SPREAD_GRIDS = ("prefill", "decode")


@lru_cache(maxsize=64)
def expected_range(n: int) -> float:
    """``d2(n)``: the expected range (max - min) of ``n`` independent standard normal draws,
    E[R] = integral of 1 - Phi(x)^n - (1 - Phi(x))^n over the real line."""
    if n < 2:
        raise ValueError(f"a range needs at least 2 draws, got {n}")
    from scipy import integrate
    from scipy.stats import norm

    value, _ = integrate.quad(lambda x: 1.0 - norm.cdf(x) ** n - norm.sf(x) ** n,
                              -math.inf, math.inf)
    return float(value)


def log_ranges(profile: Profile) -> list[float]:
    """``ln(max / min)`` of every prefill and decode cell the profile kept its repeats of."""
    raw = profile.obtained.get("raw") or {}
    ranges = []
    for grid in SPREAD_GRIDS:
        for cell in (raw.get(grid) or {}).values():
            if len(cell) >= 3 and cell[1] > 0 and cell[2] >= cell[1]:
                ranges.append(math.log(cell[2] / cell[1]))
    return ranges


def step_time_sigma(profile: Profile) -> float | None:
    """The standard deviation of ``ln(step time)`` of a step run again, from the profile's
    repeated timings (see the module); None for a profile without them (a derived one, or
    one timed once)."""
    repetitions = profile.obtained.get("repetitions")
    ranges = log_ranges(profile)
    if not ranges or not isinstance(repetitions, int) or repetitions < 2:
        return None
    return float(np.median(ranges)) / expected_range(repetitions)
