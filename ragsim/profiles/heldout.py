"""How well a profile predicts points it was not built from, and what to say when it does not.

Every profile is checked on held-out points: single requests off the prefill grid (measured
profiles) and whole batched-prefill iterations (every profile). The targets below are what a
profile must hold to be trusted for TTFT comparisons; a profile that misses them carries a
warning that ``ragsim profiles show`` prints next to the numbers, so a noisy measurement cannot
pass silently into a result.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Median and worst relative error of held-out predictions a profile should hold. The median
# says whether the model is right; the max catches a region (a grid cell, a batch shape) it
# gets wrong that a median would hide.
HELDOUT_MEDIAN_TARGET = 0.10
HELDOUT_MAX_TARGET = 0.25


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """|predicted - measured| / measured for each held-out point."""
    return [abs(p - m) / max(m, 1e-12) for p, m in zip(predicted, measured, strict=True)]


def median_and_max(errors: Sequence[float]) -> tuple[float | None, float | None]:
    if not errors:
        return None, None
    return float(np.median(errors)), float(max(errors))


def misses_targets(median: float | None, maximum: float | None) -> bool:
    return (median is not None and median > HELDOUT_MEDIAN_TARGET) or (
        maximum is not None and maximum > HELDOUT_MAX_TARGET)


def heldout_warning(what: str, median: float | None, maximum: float | None, *,
                    measured: bool, threads: int | None = 1) -> str | None:
    """One sentence for a profile whose held-out ``what`` misses the targets, else None.

    Measured and derived profiles fail for different reasons, so the advice differs: a
    measurement is usually noisy (a busy machine) or its grid too coarse; a derived profile's
    batch model disagreeing with its own formula is a modelling error to report.
    """
    if not misses_targets(median, maximum):
        return None
    found = (f"held-out {what}: median error {median:.1%} (target {HELDOUT_MEDIAN_TARGET:.0%}), "
             f"max {maximum:.1%} (target {HELDOUT_MAX_TARGET:.0%})")
    if not measured:
        return f"{found}: the batch model does not follow the formula it was fitted to"
    advice = "remeasure on an idle machine"
    if threads != 1:
        advice += " with --threads 1"
    advice += ", or with a finer grid (without --quick)"
    return (f"{found}. Likely cause: timings from a busy machine are noisy (other processes, "
            f"frequency scaling), or the grid is too coarse between its points. Predictions "
            f"from this profile are that uncertain; {advice}")
