"""Non-negative least squares on relative errors: the one fit behind every additive cost term
a profile or a probe measures (a step's overhead, a batch's write, a copy's latency and
bandwidth, the engine's work around its passes).

Why one rule: each term is a sum of non-negative parts (a fixed cost, a cost a row, a cost a
token), so no part may come out as a refund however noisy the timings; and the timings span
orders of magnitude (a one-row write and a 256-row one), so each is weighted by one over its
own seconds, which fits relative errors and keeps the small ones from being drowned by the
large. Group means may carry more weight for the timings behind them (``counts``: sqrt(count)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def relative_nnls(design: np.ndarray | Sequence[Sequence[float]],
                  seconds: np.ndarray | Sequence[float],
                  counts: np.ndarray | Sequence[float] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The coefficients (each >= 0) of ``seconds ~ design @ coefficients``, each row weighted
    by ``sqrt(counts) / seconds`` (``counts`` default 1), and each row's |fitted / seconds - 1|
    (``scipy.optimize.nnls``)."""
    from scipy.optimize import nnls

    design = np.asarray(design, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    floor = np.maximum(seconds, 1e-12)
    weights = 1.0 / floor
    if counts is not None:
        weights = weights * np.sqrt(np.asarray(counts, dtype=np.float64))
    coefficients, _ = nnls(design * weights[:, None], seconds * weights)
    return coefficients, np.abs(design @ coefficients / floor - 1)
