"""How much a served step's time varies about its price, measured on real runs' steps: the
spread and the lag-1 correlation ``serving.step_noise`` draws a simulated run's steps with.

Why not the profile's repeats alone (``profiles.repeat_spread``): a profile times each cell in
a quiet loop, and its spread (sigma 0.034-0.058 on runs Q-R2's profiles) is a third to a half
of what a serving engine's steps show (0.06-0.11), where a step runs after a different one,
beside the search threads and the arrivals' intake. Replicas drawn with the profile's spread
came out half as far apart as the real runs (run R, docs/validation.md).

What is measured, on each run's steps priced as the simulator prices them
(``validation.priced_step_table``): ``r = ln(measured / price)``, less a two-way robust fit of
``r`` (Tukey's median polish): an effect for each group of steps of the same kind and size
(``decisions.STEP_TOKEN_EDGES``), pooled over the runs, and an offset for each run. What a
price misses for a whole group of steps is the cost model's error, which every replica would
share, and what a run's steps all ran off by is that run's machine speed (the validation reads
it apart: ``validation.step_prices``' ``by_run_measured_over_priced``); neither is step noise.
What is left about them is. Groups of fewer than ``MIN_GROUP_STEPS`` steps over all the runs
give no effect to measure about and are left out, and so is a run that keeps fewer than as
many steps (its offset would be its steps' own median).

Why pooled over the runs: the probe runs of a small validation (32 requests of 3 output
tokens, split between two loads) spread their steps over a few groups, and counted within one
run alone every group could fall under ``MIN_GROUP_STEPS`` in both runs (on 16 requests, 7-16
steps kept a run; on 32, the project's CI and one sitting here under load kept none), leaving
the spread unmeasured. The runs' offsets keep their speeds apart.

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


POLISH_ROUNDS = 50  # median polish's rounds at most; it settles in a few
POLISH_TOLERANCE = 1e-12  # a round that moves no effect or offset further than this ends it


def deviations(tables: Sequence[Sequence[dict]]) -> list[np.ndarray]:
    """Each run's steps' ``ln(measured / price)`` less their group's effect and their run's
    offset (module docstring), one array per table in the tables' order, each in its run's
    order. NaN: a step without both times, of a group of fewer than ``MIN_GROUP_STEPS`` steps
    over the runs, or of a run that keeps fewer than as many."""
    # every timed step of every run, flattened: its log ratio, group, run and place in its run
    logs, groups, runs, places = [], [], [], []
    codes: dict[tuple[str, int], int] = {}
    for run, table in enumerate(tables):
        for place, row in enumerate(table):
            measured, priced = row.get("measured_s"), row.get("priced_s")
            if measured is None or priced is None or not (measured > 0 and priced > 0):
                continue
            logs.append(np.log(measured / priced))
            groups.append(codes.setdefault(step_group(row), len(codes)))
            runs.append(run)
            places.append(place)
    r, group, run_of = np.array(logs, float), np.array(groups, int), np.array(runs, int)
    kept = np.ones(r.size, bool)
    while True:  # drop groups too small over the kept runs, then the runs left too small
        kept &= np.bincount(group[kept], minlength=len(codes))[group] >= MIN_GROUP_STEPS
        small = np.bincount(run_of[kept], minlength=len(tables))[run_of] < MIN_GROUP_STEPS
        if not (kept & small).any():
            break
        kept &= ~small
    polished = _median_polish(r[kept], group[kept], run_of[kept])
    out = [np.full(len(table), np.nan) for table in tables]
    for value, run, place in zip(polished, run_of[kept], np.array(places, int)[kept],
                                 strict=True):
        out[run][place] = value
    return out


def _median_polish(r: np.ndarray, group: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Tukey's median polish of ``r``: take each group's median from its steps, then each
    run's from its steps, until a round moves neither further than ``POLISH_TOLERANCE``;
    what is left."""
    r = r.copy()
    for _ in range(POLISH_ROUNDS):
        moved = 0.0
        for labels in (group, run):
            for label in np.unique(labels):
                members = labels == label
                shift = float(np.median(r[members]))
                r[members] -= shift
                moved = max(moved, abs(shift))
        if moved <= POLISH_TOLERANCE:
            break
    return r


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
    for r in deviations([table for table in tables if table]):
        kept = r[~np.isnan(r)]
        if kept.size:
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
