"""The simulated side of a validation as an estimate of each request's expected TTFT.

A simulation prices every step at its median: it is one run, the one without step-time noise.
The real side of a validation with ``--repeats`` is the per-request average of several runs,
an estimate of each request's expected TTFT, and at load one run is a poor estimate of it: on
the project's CPU one real run predicted the other two's average with a p90 |error| of 30-70%
at 50-90% load (docs/validation.md, "Run R"), while the 25% target is about the average. A
noise-free simulation is no closer to the expectation than one real run is; it only has no
spread of its own to show it.

``validate --sim-replicas K`` therefore runs the simulation K times, each step's time drawn
around its price with the spread (and the correlation from one step to the next) measured on
the validation's probe runs' steps (``ragsim.step_spread``), or the profile's for a step run
again where no probe ran (``profiles.repeat_spread``; ``serving.step_noise``), replicas
differing only in ``step_noise_seed`` (the trace, arrivals and search stages are the same),
and compares the per-request average with the real side. The noise-free run stays in the report
(``sim_ensemble.single_run``): what one simulation says, against the same real runs, and the
point's cost elasticity is still measured on it. The replicas' own spread
(``ttft_p90_abs_error_one_run``: one replica against the others' average) is printed beside the
real runs' (``repeats.ttft_p90_abs_error_one_run``): where the two agree, the simulated noise is
as large as the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragsim.serving.pipeline import RunResult

# the per-request columns averaged over the replicas: the timestamps and durations (the TTFT
# components are differences of the timestamps, so they average with them)
AVERAGED_SUFFIX = "_s"
# each request's TTFT standard deviation over the replicas (seconds; NaN in fewer than two), a
# column of the ensemble's result: its own share of the p90's floor (``engine_spread``)
REPLICA_SD_COLUMN = "ttft_replica_sd_s"


def averaged_result(runs: Sequence[RunResult], config=None) -> RunResult:
    """One result of ``runs`` (simulations of one point's requests): each request's time
    columns averaged over the runs it completed in (run 0's values where it completed in none),
    its other columns (status, hits, ids) run 0's, and the summary's numbers averaged over the
    runs. ``config``: the configuration the result is said to be of (default run 0's). A run
    given twice weighs twice: the noise-free simulation of a point whose real runs began in
    different engine states is one simulation per real run (``validation.run_sim_like_runs``)."""
    if not runs:
        raise ValueError("an average needs at least one run")
    first = runs[0]
    ids = np.asarray(first.columns["request_id"])
    for run in runs[1:]:
        if not np.array_equal(np.asarray(run.columns["request_id"]), ids):
            raise ValueError("the runs' requests differ: not one point")
    done = _completed(runs)
    anywhere = done.any(axis=0)
    columns = dict(first.columns)
    for name, values in first.columns.items():
        values = np.asarray(values)
        if not name.endswith(AVERAGED_SUFFIX) or values.dtype.kind != "f":
            continue
        stacked = np.array([np.asarray(run.columns[name], float) for run in runs])
        total = np.where(done, stacked, 0.0).sum(axis=0)
        count = done.sum(axis=0)
        columns[name] = np.where(anywhere, total / np.maximum(count, 1), values)
    summary = dict(first.summary)
    for key, value in first.summary.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        known = [run.summary.get(key) for run in runs]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in known):
            summary[key] = float(np.mean(known))
    return RunResult(config=first.config if config is None else config, columns=columns,
                     summary=summary)


def _completed(runs: Sequence[RunResult]) -> np.ndarray:
    """runs x requests: whether each run completed each request."""
    return np.array([np.asarray(run.columns["status"]) == "completed" for run in runs])


def ensemble_result(runs: Sequence[RunResult], sigma: float, config=None,
                    correlation: float = 0.0) -> RunResult:
    """One result of ``runs`` (replicas of one configuration that differ in their step-time
    draws), averaged per request (``averaged_result``), with each request's TTFT standard
    deviation over the replicas (``REPLICA_SD_COLUMN``) and ``sim_replicas``,
    ``step_time_sigma`` and ``step_time_correlation`` in its summary. ``config``: the
    configuration the replicas were drawn from (the noise-free one, which a point's
    ``config.toml`` keeps; default replica 0's)."""
    result = averaged_result(runs, config)
    # each request's spread over the replicas it completed in: the average's own error
    done = _completed(runs)
    ttft = np.where(done, np.array([np.asarray(run.columns["ttft_s"], float) for run in runs]),
                    np.nan)
    spread = np.full(done.shape[1], np.nan)
    several = done.sum(axis=0) >= 2
    spread[several] = np.nanstd(ttft[:, several], axis=0, ddof=1)
    result.columns[REPLICA_SD_COLUMN] = spread
    result.summary.update(sim_replicas=len(runs), step_time_sigma=float(sigma),
                          step_time_correlation=float(correlation))
    return result


def p90_abs_error_one_run(ttft_s: np.ndarray) -> float:
    """How well one run predicts the others: each run's p90 |error| per request against the
    per-request average of the other runs, averaged over the runs (``ttft_s``: runs x requests,
    the same requests in each row; NaN for fewer than two runs)."""
    runs = np.asarray(ttft_s, float)
    if runs.ndim != 2 or runs.shape[0] < 2 or runs.shape[1] == 0:
        return float("nan")
    each = []
    for k in range(runs.shape[0]):
        others = np.delete(runs, k, axis=0).mean(axis=0)
        each.append(float(np.percentile(np.abs(runs[k] / others - 1.0), 90)))
    return float(np.mean(each))


__all__ = ["REPLICA_SD_COLUMN", "averaged_result", "ensemble_result", "p90_abs_error_one_run"]
