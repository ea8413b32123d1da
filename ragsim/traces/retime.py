"""Re-timing a trace: the same requests, arriving as a renewal process at a chosen rate.

Studies of TTFT against load replay one trace at many rates. Inter-arrival gaps are drawn,
seeded, from an exponential distribution (Poisson arrivals, coefficient of variation 1) or a
gamma distribution with a chosen coefficient of variation (burstier above 1, smoother below):
the G/G/1 request pools of the paper's analysis. The first request arrives at time 0.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.traces.schema import Trace

ARRIVAL_PROCESSES = ("poisson", "gamma")


def arrival_times(n: int, rate_rps: float, *, process: str = "poisson", cv: float = 1.0,
                  seed: int = 0) -> np.ndarray:
    """``n`` arrival times (seconds) with mean inter-arrival 1/rate."""
    if not np.isfinite(rate_rps) or rate_rps <= 0:
        raise RagsimInputError(f"must be a positive number of requests per second, got "
                               f"{rate_rps!r}", field="--rate")
    if process not in ARRIVAL_PROCESSES:
        raise RagsimInputError(f"unknown arrival process {process!r}; choose one of "
                               f"{', '.join(ARRIVAL_PROCESSES)}", field="--arrival")
    if process == "gamma" and (not np.isfinite(cv) or cv <= 0):
        raise RagsimInputError(f"must be > 0, got {cv!r}", field="--cv")
    rng = np.random.default_rng(seed)
    mean = 1.0 / rate_rps
    if process == "poisson":
        gaps = rng.exponential(mean, size=n)
    else:
        shape = 1.0 / (cv * cv)  # gamma: CV^2 = 1/shape
        gaps = rng.gamma(shape, mean / shape, size=n)
    if n:
        gaps[0] = 0.0
    return np.cumsum(gaps)


def retime(trace: Trace, rate_rps: float, *, process: str = "poisson", cv: float = 1.0,
           seed: int = 0) -> Trace:
    """The same requests in the same order, arriving at ``rate_rps``."""
    times = arrival_times(trace.n_requests, rate_rps, process=process, cv=cv, seed=seed)
    info = {**trace.info, "retimed": {"rate_rps": rate_rps, "process": process,
                                      "cv": 1.0 if process == "poisson" else cv,
                                      "seed": seed}}
    return replace(trace, arrival_s=times, info=info)
