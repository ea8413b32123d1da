"""The generator's popularity drift that reproduces a trace's measured drift.

``stats.popularity_drift`` measures how fast a trace's most popular documents change (top-10
turnover between windows of 1,000 requests, corrected for sampling noise with the same trace
shuffled). The synthetic generator has its own knob, ``drift_per_1k_requests`` (the share of
popularity ranks that trade documents every 1,000 requests). The two are not the same number:
the statistic sees the drift through a finite sample. So the knob is found by generating
traces like the measured one (same number of requests with documents, same skew of leading
documents, same document table size) at a grid of drift values, measuring each with the same
function, and reading off where the curve meets the measured value. Every trace, real or
generated, is measured by one function, so a bias of the statistic is the same on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ragsim.traces.schema import Trace
from ragsim.traces.stats import (
    DRIFT_SHUFFLES,
    DRIFT_TOP_N,
    DRIFT_WINDOW_REQUESTS,
    leading_documents,
    popularity_drift,
    retrieval_skew,
)
from ragsim.traces.synthetic import SyntheticSpec, generate

DRIFT_GRID = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
FIT_SEEDS = tuple(range(8))


@dataclass(frozen=True)
class DriftFit:
    """``drift_per_1k_requests`` whose generated traces show ``measured`` corrected turnover.

    ``curve`` is the mean corrected turnover of the generated traces at each ``grid`` value
    (over ``seeds``); ``at_edge`` says the measured value lies outside the curve, so the fit is
    the grid's end (drift 0 or 1) rather than a crossing."""

    measured: float
    drift_per_1k_requests: float
    grid: tuple[float, ...]
    curve: tuple[float, ...]
    spec: SyntheticSpec
    at_edge: bool


def twin_spec(trace: Trace) -> SyntheticSpec:
    """A generator setting like ``trace`` in what the drift statistic sees: as many requests
    with documents, one document per request (the statistic reads only the leading one), the
    leading documents' skew (top 3%'s share) and the size of the trace's document table."""
    leading = leading_documents(trace)
    return SyntheticSpec(
        "drift-fit", n_requests=len(leading), n_documents=max(int(trace.n_documents), 1),
        top_k=1, target_top3_share=retrieval_skew(leading)["top_3pct_share"])


def drift_curve(spec: SyntheticSpec, grid=DRIFT_GRID, seeds=FIT_SEEDS,
                window: int = DRIFT_WINDOW_REQUESTS, top_n: int = DRIFT_TOP_N,
                shuffles: int = DRIFT_SHUFFLES) -> tuple[float, ...]:
    """Mean corrected top-N turnover of traces generated from ``spec`` at each drift."""
    tag = f"top{top_n}_turnover_corrected"
    curve = []
    for drift in grid:
        values = [popularity_drift(generate(replace(spec, drift_per_1k_requests=drift,
                                                    seed=seed)), window, top_n, shuffles)[tag]
                  for seed in seeds]
        curve.append(float(np.mean(values)))
    return tuple(curve)


def fit_drift(trace: Trace, grid=DRIFT_GRID, seeds=FIT_SEEDS,
              window: int = DRIFT_WINDOW_REQUESTS, top_n: int = DRIFT_TOP_N,
              shuffles: int = DRIFT_SHUFFLES) -> DriftFit:
    """The generator drift at which traces like ``trace`` show its corrected turnover.

    The curve is made non-decreasing (a running maximum: more drift cannot mean less
    turnover; a dip is seed noise) and interpolated linearly between grid points."""
    tag = f"top{top_n}_turnover_corrected"
    measured = popularity_drift(trace, window, top_n, shuffles)[tag]
    if measured is None:
        raise ValueError(f"the trace needs at least two windows of {window} requests with "
                         f"documents (it has {len(leading_documents(trace))} such requests)")
    spec = twin_spec(trace)
    curve = drift_curve(spec, grid, seeds, window, top_n, shuffles)
    rising = np.maximum.accumulate(np.asarray(curve))
    at_edge = not rising[0] <= measured <= rising[-1]
    if measured <= rising[0]:
        fitted = grid[0]
    elif measured >= rising[-1]:
        fitted = grid[-1]
    else:
        # the first grid step that reaches the measured value brackets it
        hi = int(np.argmax(rising >= measured))
        lo = hi - 1
        span = rising[hi] - rising[lo]
        share = (measured - rising[lo]) / span if span > 0 else 0.0
        fitted = grid[lo] + share * (grid[hi] - grid[lo])
    return DriftFit(measured=float(measured), drift_per_1k_requests=float(fitted),
                    grid=tuple(grid), curve=curve, spec=spec, at_edge=at_edge)
