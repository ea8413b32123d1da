"""How much a served step's time varies about its price, measured on real runs' steps: the
spread and the lag-1 correlation ``serving.step_noise`` draws a simulated run's steps with.

Why not the profile's repeats alone (``profiles.repeat_spread``): a profile times each cell in
a quiet loop, and its spread (sigma 0.034-0.058 on runs Q-R2's profiles) is a third to a half
of what a serving engine's steps show (0.06-0.11), where a step runs after a different one,
beside the search threads and the arrivals' intake. Replicas drawn with the profile's spread
came out half as far apart as the real runs (run R, docs/validation.md).

What is measured, on each run's steps priced as the simulator prices them
(``validation.priced_step_table``): ``r = ln(measured / price)``, less the median of ``r``
over the run's steps of the same kind and size (``decisions.STEP_TOKEN_EDGES``). What a price
misses for a whole group of steps is the cost model's error, which every replica would share,
not noise; what is left about the group's median is. Groups of fewer than
``MIN_GROUP_STEPS`` steps give no median to measure about and are left out.

* ``sigma``: 1.4826 x the median |r| over every run's kept steps (a normal's standard
  deviation, robust to the few steps a collection or a page fault stretched).
* ``correlation``: the lag-1 correlation of consecutive kept steps' ``r`` in each run, the
  ``r`` clipped at 3 ``sigma`` first (so that one stretched step does not set it), clipped to
  [0, ``MAX_STEP_TIME_CORRELATION``].

The steps a validation measures this on are its probe runs' (``realrun.probe_runs``: the
trace's requests past the ones it judges, at 50% and 90% load): never the judged runs'.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragsim.decisions import STEP_TOKEN_EDGES, size_class
from ragsim.serving.config import MAX_STEP_TIME_CORRELATION

MIN_GROUP_STEPS = 8  # a group's median needs this many steps to measure about
NORMAL_MAD = 1.4826  # a normal's standard deviation over its median absolute deviation
CLIP_SIGMAS = 3.0  # where a step's deviation is clipped before the correlation is taken


def step_group(row: dict) -> tuple[str, int]:
    """A step's group: its kind and its size class (``decisions.size_class``, the classes the
    steps-by-size table groups by)."""
    return row["kind"], size_class(row["step_tokens"])


def deviations(table: Sequence[dict]) -> np.ndarray:
    """Each step's ``ln(measured / price)`` less its group's median over the run (NaN: a step
    without both times, or of a group of fewer than ``MIN_GROUP_STEPS``), in the run's order."""
    logs = np.full(len(table), np.nan)
    groups: dict[tuple[str, int], list[int]] = {}
    for index, row in enumerate(table):
        measured, priced = row.get("measured_s"), row.get("priced_s")
        if measured is None or priced is None or not (measured > 0 and priced > 0):
            continue
        logs[index] = np.log(measured / priced)
        groups.setdefault(step_group(row), []).append(index)
    out = np.full(len(table), np.nan)
    for members in groups.values():
        if len(members) >= MIN_GROUP_STEPS:
            out[members] = logs[members] - np.median(logs[members])
    return out


def lag1_terms(r: np.ndarray) -> tuple[float, float]:
    """``(sum of r_t r_(t+1), sum of r_t^2)`` over the consecutive pairs both kept."""
    both = ~np.isnan(r[:-1]) & ~np.isnan(r[1:])
    kept = r[~np.isnan(r)]
    return float(np.sum(r[:-1][both] * r[1:][both])), float(np.sum(kept * kept))


def served_step_spread(tables: Sequence[Sequence[dict] | None]) -> dict | None:
    """``sigma`` and ``correlation`` of the runs' steps about their prices (see the module),
    with the steps and groups they come from and each run's own figures; None where no run
    kept enough steps to measure."""
    runs, pooled, per_run = [], [], []
    for table in tables:
        if not table:
            continue
        r = deviations(table)
        kept = r[~np.isnan(r)]
        if kept.size < MIN_GROUP_STEPS:
            continue
        runs.append(r)
        pooled.append(kept)
    if not runs:
        return None
    every = np.concatenate(pooled)
    sigma = NORMAL_MAD * float(np.median(np.abs(every)))
    if not sigma > 0:
        return None
    cross = square = 0.0
    for r in runs:
        clipped = np.clip(r, -CLIP_SIGMAS * sigma, CLIP_SIGMAS * sigma)
        c, s = lag1_terms(clipped)
        cross, square = cross + c, square + s
        kept = r[~np.isnan(r)]
        per_run.append({"steps": int(kept.size),
                        "sigma": NORMAL_MAD * float(np.median(np.abs(kept))),
                        "correlation": c / s if s > 0 else None})
    correlation = min(max(cross / square, 0.0), MAX_STEP_TIME_CORRELATION) if square > 0 else 0.0
    return {"sigma": sigma, "correlation": float(correlation), "steps": int(every.size),
            "runs": per_run, "min_group_steps": MIN_GROUP_STEPS,
            "edges_tokens": list(STEP_TOKEN_EDGES)}
