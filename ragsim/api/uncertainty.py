"""Uncertainty as output: a run over several seeds, and a run repriced under its costs' error.

Two questions a single run cannot answer:

* **How much is luck?** ``seeds=N`` runs seeds ``seed, seed+1, ..., seed+N-1`` (each seed draws
  its own synthetic trace, arrivals and stage lists) and reports each summary metric's mean and
  95% interval, Student-t over the seeds (``mean``, ``ci95``; the seeds' values in
  ``by_seed``). The run returned is the first seed's, so its records are one run's.
* **How much rests on the cost profile?** ``sensitivity=True`` reruns the first seed with the
  profile repriced: compute (prefill, decode, batch term and per-iteration overhead) scaled by
  ``1 +- e`` for the profile's own held-out error ``e`` (``heldout_max_error``, when it has
  one), by 0.8 and 1.2, and host <-> GPU copies at half the bandwidth. ``sensitivity`` gives
  each metric's [min, max] over the run and those repricings, ``sensitivity_perturbations``
  the repricings used, and ``sensitivity_unstable`` the metrics whose range spans more than 2x:
  a result that moves that much under a 20% change of speed is near saturation, where a queue
  grows or does not, and no single number of it should be quoted.

A comparison of two systems is a ratio; :func:`ratio_range` gives a ratio's range over the
same repricings and flags it so too (``benchmarks/attribution.py`` uses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ragsim.errors import RagsimInputError

# the summary metrics that get an interval and a range
METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
           "e2e_mean_s", "e2e_p99_s", "throughput_rps", "throughput_tokens_s",
           "token_hit_rate", "token_hit_rate_gpu", "token_hit_rate_host", "request_hit_rate")
COMPUTE_FACTORS = (0.8, 1.2)  # +-20% compute
COPY_SLOWDOWN = 2.0  # copies at half the bandwidth
UNSTABLE_SPAN = 2.0  # a range wider than this (max / min) is flagged
MAX_SEEDS = 1000


def student_t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The mean's two-sided ``level`` interval, Student-t with n-1 degrees of freedom."""
    from scipy import stats

    n = len(values)
    if n < 2:
        raise ValueError("an interval needs at least two values")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def perturbations(profile) -> list[dict]:
    """The repricings of a sensitivity: name, compute factor, copy slowdown."""
    out = []
    error = profile.batched_prefill.heldout_max_error
    if error:
        out += [{"name": f"profile error -{error:.1%}", "compute_factor": 1 - error,
                 "copy_slowdown": 1.0},
                {"name": f"profile error +{error:.1%}", "compute_factor": 1 + error,
                 "copy_slowdown": 1.0}]
    out += [{"name": f"compute x{f:g}", "compute_factor": f, "copy_slowdown": 1.0}
            for f in COMPUTE_FACTORS]
    out.append({"name": f"copy bandwidth /{COPY_SLOWDOWN:g}", "compute_factor": 1.0,
                "copy_slowdown": COPY_SLOWDOWN})
    return out


def repriced(profile, perturbation: dict):
    costs = profile
    if perturbation["compute_factor"] != 1.0:
        costs = costs.scaled_compute(perturbation["compute_factor"])
    if perturbation["copy_slowdown"] != 1.0:
        costs = costs.scaled_copies(perturbation["copy_slowdown"])
    return costs


def spans(low: float, high: float) -> float:
    """How many times ``high`` is ``low`` (inf when only one of them is zero)."""
    if low == high:
        return 1.0
    if low <= 0:
        return math.inf
    return high / low


def metric_values(summaries: Sequence[dict]) -> dict[str, list[float]]:
    """Each metric's values over the summaries (a metric some run lacks is left out)."""
    out = {}
    for name in METRICS:
        values = [s.get(name) for s in summaries]
        if values and all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            out[name] = [float(v) for v in values]
    return out


def ratio_range(numerators: Sequence[float], denominators: Sequence[float]) -> dict:
    """A ratio's value per repricing (same order in both), its [min, max] and whether it spans
    more than 2x."""
    ratios = [a / b if b else math.inf for a, b in zip(numerators, denominators, strict=True)]
    low, high = min(ratios), max(ratios)
    return {"values": ratios, "range": [low, high], "unstable": spans(low, high) > UNSTABLE_SPAN}


def run_with_uncertainty(setup, *, seeds: int = 1, sensitivity: bool = False):
    """Run ``setup`` over ``seeds`` seeds and/or its repricings; the first seed's Run, with the
    intervals and ranges in its summary."""
    from ragsim.api.options import label
    from ragsim.profiles.profile import load_profile

    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise RagsimInputError(f"must be an integer in 1..{MAX_SEEDS}, got {seeds!r}",
                               field=label("seeds"))
    if seeds == 1 and not sensitivity:
        return setup.execute()
    if setup.backend != "sim":
        raise RagsimInputError("several seeds and repricings are simulated runs: use "
                               f"{label('backend')} sim", field=label("seeds" if seeds > 1
                                                                       else "sensitivity"))
    base = setup.execute()
    summary = base.summary
    if seeds > 1:
        first = setup.config.seed
        summaries = [summary]
        for seed in range(first + 1, first + seeds):
            other = type(setup)(setup.config.replace(seed=seed), backend=setup.backend)
            summaries.append(other.execute().summary)
        values = metric_values(summaries)
        summary["seeds"] = list(range(first, first + seeds))
        summary["mean"] = {k: sum(v) / len(v) for k, v in values.items()}
        summary["ci95"] = {k: list(student_t_interval(v)) for k, v in values.items()}
        summary["by_seed"] = values
    if sensitivity:
        profile = load_profile(setup.config.profile)
        used = perturbations(profile)
        summaries = [summary] + [setup.execute(costs=repriced(profile, p)).summary
                                 for p in used]
        values = metric_values(summaries)
        ranges = {k: [min(v), max(v)] for k, v in values.items()}
        summary["sensitivity"] = ranges
        summary["sensitivity_perturbations"] = used
        summary["sensitivity_by_perturbation"] = {
            k: dict(zip(["as profiled"] + [p["name"] for p in used], v, strict=True))
            for k, v in values.items()}
        summary["sensitivity_unstable"] = [k for k, (low, high) in ranges.items()
                                           if spans(low, high) > UNSTABLE_SPAN]
    return base
