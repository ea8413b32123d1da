"""How far the simulation is from a real run of the same trace, configuration and profile.

``ragsim validate`` runs the real-time harness (``ragsim.realrun``) and the simulator on one
trace, configuration and cost profile, joins the two runs' per-request records by request id and
measures the distance: per-request TTFT errors, the errors of the TTFT distribution's mean and
percentiles, throughput, per-request agreement of the cache hits, the error of each TTFT
component (so a miss points at the model assumption behind it) and two distribution tests. Only
requests completed in both runs count; the others are counted as dropped.

The equivalence test (TOST) is run on paired *log ratios* ln(sim / real) per request: TTFT errors
are multiplicative (a prefill 10% too slow is 10% of a long TTFT and of a short one), and on the
log scale a ratio r and its inverse 1/r are equally far from agreement. The margin +-10% means
the geometric mean of sim/real lies in [0.9, 1.1]; both one-sided t-tests must reject at ``alpha``.

This module is the only one that sees both drivers (``sim`` never imports ``realrun`` nor the
other way round); it imports them inside the functions that run them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ragsim.backends import CPU_PROFILES
from ragsim.errors import ConfigError, RagsimInputError

if TYPE_CHECKING:
    from ragsim.profiles.profile import Profile
    from ragsim.serving.config import SimConfig
    from ragsim.traces.schema import Trace

BACKENDS = ("torch", "vllm", "sim")  # sim: the "real" side is a second simulation (tests)
DEFAULT_TORCH_CPU_PROFILE = CPU_PROFILES["torch"]
BASE_MODEL = "mistral-7b"  # the architecture the torch engine scales down (--layers/--hidden)
TOST_MARGIN = 0.10
TOST_ALPHA = 0.05
# targets shown with pass/fail marks; hit agreement holds only when requests cannot overlap
# (sequential), throughput only means something when the system is saturated (overload)
TARGETS = {"hit_agreement": 1.0, "ttft_mean_abs_error": 0.10, "ttft_p90_abs_error": 0.25,
           "throughput_abs_error": 0.10}
# TTFT = search wait + search + queue + host->GPU copy + prefill (per request, as the summary
# splits it: ragsim.serving.summary.ttft_components); each with the model assumption that sets
# it in the simulation
COMPONENTS = {
    "search_wait": "the search worker pool",
    "search": "the search latency model",
    "queue": "batching and scheduling",
    "swap_in": "the host->GPU copy model",
    "prefill": "the prefill / batched-prefill cost grid",
}
# an over-saturated point: every request offered at (nearly) once, unless --rate says otherwise
BURST_RATE_RPS = 1e6
LOAD_IDLE, LOAD_OVER = "idle", "over"
# the speed probes before and after a real run differing by more than this: the machine's speed
# moved during the run, and no single factor describes it (the report says so)
STEADY_SPEED_CHANGE = 0.10
_KEPT = ("request_id", "ttft_s", "hit_tokens_gpu", "hit_tokens_host")
# the simulator's iterations for a vLLM run unless told otherwise: vLLM >= 0.4 forms every step
# from decodes and prompt chunks under one token budget (the torch engine runs prefill-first)
VLLM_SCHEDULER = "mixed"
# why vLLM's engine runs these as ``harness.engine_terms`` says, for those ``harness.ENGINE_FIXED``
# does not say (its prefix cache shares a block with the batch that scheduled it)
_SHARED_IN_BATCH = "vLLM caches a block when it schedules it: the requests of a batch share it"


# --------------------------------------------------------------------------- the join
def completed(columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """The completed requests of one run: id, TTFT, its components and hit tokens per tier."""
    from ragsim.serving.summary import ttft_components

    frame = pd.DataFrame({name: columns[name] for name in (*_KEPT, "status")})
    for name, values in ttft_components(columns).items():
        frame[f"{name}_s"] = values
    return frame[frame["status"] == "completed"].drop(columns="status")


def join_runs(real: dict[str, np.ndarray], sim: dict[str, np.ndarray]
              ) -> tuple[pd.DataFrame, list]:
    """Requests completed in both runs, one row each (``*_real``, ``*_sim`` columns), and the
    ids of the requests of either run that do not count (failed, pending or missing in one)."""
    joined = completed(real).merge(completed(sim), on="request_id", suffixes=("_real", "_sim"),
                                   validate="one_to_one")
    every_id = np.union1d(np.asarray(real["request_id"]), np.asarray(sim["request_id"]))
    dropped = np.setdiff1d(every_id, joined["request_id"].to_numpy())
    return joined.sort_values("request_id", ignore_index=True), dropped.tolist()


def joined_to_reals(reals: Sequence, sim_columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """Another simulation of a point joined with its real side as ``compare`` joins its own:
    over repeated real runs their per-request average (``engine_spread.pooled_join``), else
    the one run."""
    if len(reals) > 1:
        from ragsim.engine_spread import pooled_join

        return pooled_join(reals, sim_columns)[0]
    return join_runs(reals[0].columns, sim_columns)[0]


def same_replica(real: dict[str, np.ndarray], sim: dict[str, np.ndarray]) -> float:
    """Share of the requests that both fleets sent to the same replica (1.0: routed alike)."""
    frame = pd.DataFrame({"request_id": real["request_id"], "replica": real["replica"]}).merge(
        pd.DataFrame({"request_id": sim["request_id"], "replica": sim["replica"]}),
        on="request_id", suffixes=("_real", "_sim"))
    return float((frame["replica_real"] == frame["replica_sim"]).mean()) if len(frame) else 0.0


# --------------------------------------------------------------------------- the statistics
def relative_errors(sim: np.ndarray, real: np.ndarray) -> np.ndarray:
    """(sim - real) / real, elementwise."""
    return (np.asarray(sim, float) - np.asarray(real, float)) / np.asarray(real, float)


def ttft_errors(joined: pd.DataFrame) -> dict[str, float]:
    """Signed errors of the TTFT distribution's mean and percentiles (sim against real, over the
    same requests) and percentiles of the per-request absolute errors |sim - real| / real."""
    sim, real = joined["ttft_s_sim"].to_numpy(float), joined["ttft_s_real"].to_numpy(float)
    per_request = np.abs(relative_errors(sim, real))
    stats = {"ttft_mean_error": float(relative_errors(sim.mean(), real.mean()))}
    for q in (50, 90, 99):
        stats[f"ttft_p{q}_error"] = float(relative_errors(np.percentile(sim, q),
                                                          np.percentile(real, q)))
    stats["ttft_mean_abs_error_per_request"] = float(per_request.mean())
    for q in (50, 90, 99):
        stats[f"ttft_p{q}_abs_error"] = float(np.percentile(per_request, q))
    return stats


def hits_agree(joined: pd.DataFrame) -> pd.Series:
    """Per request: the same cached tokens in both runs, tier by tier (the same total split
    differently between GPU and host is a disagreement: the costs differ)."""
    return ((joined["hit_tokens_gpu_real"] == joined["hit_tokens_gpu_sim"])
            & (joined["hit_tokens_host_real"] == joined["hit_tokens_host_sim"]))


def hit_agreement(joined: pd.DataFrame) -> float:
    """Share of requests whose cached tokens agree in both runs, tier by tier."""
    return float(hits_agree(joined).mean())


def ks_test(sim: np.ndarray, real: np.ndarray) -> dict[str, float]:
    """Two-sample Kolmogorov-Smirnov test: do the two TTFT samples share a distribution?"""
    from scipy.stats import ks_2samp

    result = ks_2samp(sim, real)
    return {"ks_statistic": float(result.statistic), "ks_pvalue": float(result.pvalue)}


def tost_log_ratio(sim: np.ndarray, real: np.ndarray, margin: float = TOST_MARGIN,
                   alpha: float = TOST_ALPHA) -> dict[str, Any]:
    """Paired TOST equivalence test on d = ln(sim / real): H0 is that the mean of d lies outside
    [ln(1 - margin), ln(1 + margin)]; equivalence is shown when both one-sided t-tests reject
    at ``alpha`` (p = the larger of their p-values)."""
    from scipy.stats import t

    d = np.log(np.asarray(sim, float) / np.asarray(real, float))
    low, high = math.log(1 - margin), math.log(1 + margin)
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        p_low = p_high = math.nan
    else:
        se = float(d.std(ddof=1)) / math.sqrt(n)
        if se == 0:  # every pair has the same ratio: inside the margin or not, with certainty
            p_low, p_high = float(mean <= low), float(mean >= high)
        else:
            p_low = float(t.sf((mean - low) / se, n - 1))  # H0: mean <= low
            p_high = float(t.cdf((mean - high) / se, n - 1))  # H0: mean >= high
    p = max(p_low, p_high)
    return {"tost_on": "paired log ratios ln(sim/real) of per-request TTFT",
            "tost_margin": margin, "tost_alpha": alpha, "tost_mean_log_ratio": mean,
            "tost_geometric_mean_ratio": math.exp(mean) if n else math.nan,
            "tost_p_lower": p_low, "tost_p_upper": p_high, "tost_pvalue": p,
            "tost_equivalent": bool(p < alpha)}


def throughput_error(real_summary: dict, sim_summary: dict) -> float:
    return float(relative_errors(sim_summary["throughput_rps"], real_summary["throughput_rps"]))


def component_errors(joined: pd.DataFrame) -> dict[str, dict]:
    """Each TTFT component's mean over the requests both runs completed, its error in seconds
    and as a share of the real mean TTFT (the shares add up to the TTFT mean error: the
    components add up to the TTFT, request by request), and the model assumption it tests."""
    real_ttft = float(joined["ttft_s_real"].mean())
    errors = {}
    for name, assumption in COMPONENTS.items():
        real_s = float(joined[f"{name}_s_real"].mean())
        sim_s = float(joined[f"{name}_s_sim"].mean())
        error_s = sim_s - real_s
        errors[name] = {"real_s": real_s, "sim_s": sim_s, "error_s": error_s,
                        "share_of_ttft": error_s / real_ttft if real_ttft else None,
                        "assumption": assumption}
    return errors


def iteration_time_ratio(real_summary: dict) -> float | None:
    """Predicted over measured time of the real run's own iterations (prefills and decode
    steps, as the profile prices each): the cost model's error before queueing amplifies it.
    Near 1 with a large TTFT error points at the pipeline model; away from 1, at the profile
    (or at a machine whose speed moved since it was measured). None for a simulated 'real'."""
    costs = real_summary.get("cost_model_errors")
    if not costs:
        return None
    measured = sum(kind["measured_s"] for kind in costs.values())
    return sum(kind["predicted_s"] for kind in costs.values()) / measured if measured else None


def beyond_profile_time_share(real_summary: dict) -> float | None:
    """Share of the real engine's iteration time spent in iterations past what the profile
    measured (larger batches, longer contexts: priced by extrapolation). A large share says the
    profile, not the model, is what to extend. None for a simulated 'real'."""
    costs = real_summary.get("cost_model_errors")
    if not costs:
        return None
    measured = sum(kind["measured_s"] for kind in costs.values())
    past = sum(kind.get("beyond_profile_measured_s", 0.0) for kind in costs.values())
    return past / measured if measured else None


def search_error(joined: pd.DataFrame, real_summary: dict) -> dict:
    """The search as a component of its own: its mean time in both runs, its relative error
    and how the real side searched (``faiss``: the trace's staged index run for real on the
    search workers; ``modelled``: the stage times were waited, so both sides wait the same
    times and its error is zero by construction)."""
    real_s = float(joined["search_s_real"].mean())
    sim_s = float(joined["search_s_sim"].mean())
    search = real_summary.get("search") or {}
    return {"search_mode": search.get("mode", "modelled"),
            "search_mean_error": (sim_s - real_s) / real_s if real_s > 0 else None}


def warmed_like(profile: Profile, real) -> Profile:
    """``profile`` pricing an engine that has run the step sizes ``real``'s engine process had
    run before that run began (``engine_warm_step_tokens``: vLLM's engines, whose shapes stay
    built in the process; ``realrun.vllm.shapes``) and that keeps as many of them built as
    ``real``'s process does (``engine_built_capacity_counts``, where the run records it and the
    profile has first-time prices); ``profile`` itself for other runs."""
    kept = getattr(real, "engine_built_capacity_counts", None)
    shapes = profile.new_shapes
    if shapes is not None and kept is not None and kept != shapes.built_capacity_counts:
        profile = replace(profile, new_shapes=replace(shapes, built_capacity_counts=kept))
    warm = getattr(real, "engine_warm_step_tokens", None)
    return profile.warmed(warm) if warm else profile


def _pricer(real, profile: Profile):
    """What the simulator charges for each of ``real``'s steps, called in their order: one
    engine's first-time prices (``NewShapeCharge``) and where its last step with prompts was
    (``AfterPrompt``) follow the steps it has run."""
    from ragsim.decisions import priced_s
    from ragsim.profiles.decode_after_prompt import AfterPrompt
    from ragsim.profiles.new_shapes import NewShapeCharge
    from ragsim.serving.connector_costs import ConnectorCosts

    overlap = bool(real.config.overlap_swap)
    new_shape = NewShapeCharge(profile.new_shapes)  # the replay's engine, as the simulated one
    after_prompt = AfterPrompt(profile.decode_after_prompt)  # likewise
    connector = ConnectorCosts.of(real.config)  # its KV connector's work, as priced there
    return lambda decision: priced_s(decision, profile, overlap, new_shape, after_prompt,
                                     connector)


def _cold_start(profile: Profile):
    """What the simulator charges a step for the engine's idle time before it (``idle_start``;
    None for a profile without the term)."""
    return profile.idle_start_s if profile.idle_start is not None else None


def priced_step_table(real, profile: Profile) -> list[dict] | None:
    """``real``'s steps, one row each, against the simulator's price for it (the profile as
    the run's engine had warmed it, ``warmed_like``, and the cold start of the idle time
    before it, as the replay charges them: ``decisions.priced_steps``); None where the run
    kept no steps."""
    from ragsim.decisions import priced_steps

    iterations = (getattr(real, "decisions", None) or {}).get("iterations")
    if not iterations:
        return None
    warmed = warmed_like(profile, real)
    return priced_steps(iterations, _pricer(real, warmed), cold_start=_cold_start(warmed))


def step_prices(reals: Sequence, profile: Profile,
                tables: Sequence[list[dict] | None] | None = None) -> dict | None:
    """The real runs' steps, each measured against the simulator's price for it
    (``priced_step_table``; ``tables``: those already priced, one per run), over every run and
    by the steps' size (``decisions.by_step_size``); None where no run kept its steps. The
    replay's cost-model share says how far the prices move the mean TTFT; this says which
    steps they miss, and whether those lie past the profile's grid.

    ``by_run_measured_over_priced``: each run's steps against their prices, in the runs'
    order. Why: a machine whose speed moves between runs shows it there first. In run V's
    fifteen runs of one 50% point, these ranged from 0.97 to 1.22. Each run's mean TTFT
    followed them: the correlation with its error against the one simulation was -0.77.
    The runs' average then sits where no single speed does (docs/validation.md, "Run V,
    request by request")."""
    from ragsim.decisions import STEP_TOKEN_EDGES, by_step_size, with_ratios

    if tables is None:
        tables = [priced_step_table(real, profile) for real in reals]
    kept = [table for table in tables if table]
    if not kept:
        return None
    groups: dict[int, dict] = {}
    for table in kept:
        for g in by_step_size(table):
            into = groups.setdefault(g["tokens_from"], {**g, "steps": 0, "measured_s": 0.0,
                                                        "priced_s": 0.0})
            for name in ("steps", "measured_s", "priced_s"):
                into[name] += g[name]
    rows = with_ratios([groups[k] for k in sorted(groups)])
    measured = sum(g["measured_s"] for g in rows)
    priced = sum(g["priced_s"] for g in rows)
    by_run = [_ratio(sum(row["measured_s"] for row in table),
                     sum(row["priced_s"] for row in table)) for table in kept]
    return {"runs": len(kept), "steps": sum(g["steps"] for g in rows),
            "measured_over_priced": _ratio(measured, priced),
            "by_run_measured_over_priced": by_run,
            "grid_new_tokens": int(max(profile.prefill.y_axis)),
            "edges_tokens": list(STEP_TOKEN_EDGES), "by_tokens": rows}


def _ratio(measured_s: float, priced_s: float) -> float | None:
    """Measured over priced seconds; None where nothing was priced."""
    return measured_s / priced_s if priced_s else None


def replay_decisions(real, profile: Profile, *, measured: bool = False) -> np.ndarray | None:
    """Per request of the real run, its TTFT under the run's own decisions at the simulator's
    prices (``ragsim.decisions.replay``); None when the run kept no decisions (a simulated
    'real' side, or an engine whose steps ragsim does not see). ``measured``: each iteration
    at its measured duration instead (``ragsim.decisions.measured_s``): what is left of the
    real TTFT is the engine thread's time outside its steps."""
    kept = getattr(real, "decisions", None)
    if not kept or not kept["iterations"]:
        return None
    from ragsim.decisions import measured_s, replay
    from ragsim.serving.engine_loop import EngineLoop

    closed_loop = real.config.arrival == "sequential"
    loop = EngineLoop.of(real.config)  # charged as the simulation charges it
    if measured:  # the search tier's interpreter time was spent inside the measured steps
        return replay(kept["iterations"], kept["submitted_s"], real.columns, measured_s,
                      closed_loop=closed_loop,
                      loop=loop.without_search() if loop is not None else None)
    return replay(kept["iterations"], kept["submitted_s"], real.columns,
                  _pricer(real, profile), closed_loop=closed_loop,
                  cold_start=_cold_start(profile), loop=loop)


def search_note(trace: Trace, config: SimConfig, backend: str) -> tuple[str, bool] | None:
    """What ``--search-latency`` means for this validation, in one line (warning: the search
    is modelled on both sides after all), or None with the fixed latency."""
    if config.search_latency != "trace":
        return None
    if backend == "sim":
        return ("search: both sides simulate the trace's measured stage times", False)
    from ragsim.realrun.search import _why_not

    why = _why_not(trace)
    if why is not None:
        return (f"search: the real run waits the trace's measured stage times, as the "
                f"simulation does ({why}): its error is zero by construction", True)
    return (f"search: the real run searches the trace's staged faiss index on "
            f"{config.search_workers} worker(s); the simulation waits the trace's measured "
            "stage times", False)


def dominant_component(components: dict[str, dict]) -> str | None:
    """The component whose error is largest in absolute terms (None when none is known)."""
    known = {name: abs(c["error_s"]) for name, c in components.items()
             if c["error_s"] is not None}
    return max(known, key=known.get) if known else None


def checks(report: dict, *, sequential: bool, overload: bool) -> list[dict]:
    """The targets with pass/fail marks; ``passed`` is None where a target does not apply (hit
    agreement outside sequential mode, throughput below overload)."""
    rows = [("hit_agreement", report["hit_agreement"], ">=", sequential),
            ("ttft_mean_abs_error", abs(report["ttft_mean_error"]), "<=", True),
            ("ttft_p90_abs_error", report["ttft_p90_abs_error"], "<=", True),
            ("throughput_abs_error", abs(report["throughput_error"]), "<=", overload)]
    out = []
    for name, value, sense, applies in rows:
        target = TARGETS[name]
        ok = value >= target if sense == ">=" else value <= target
        out.append({"metric": name, "value": value, "sense": sense, "target": target,
                    "applies": applies, "passed": bool(ok) if applies else None})
    return out


def machine_speed(real_summary: dict) -> dict | None:
    """How fast the machine ran the model during the real run, against when the profile was
    measured (``realrun.speed``: the profile's grid points timed right before and right after
    the run): the ratios, the factor a speed-adjusted comparison scales the profile by (their
    geometric mean) and how much the speed changed during the run. None without probes."""
    before, after = real_summary.get("speed_ratio_before"), real_summary.get("speed_ratio_after")
    if not before or not after:
        return None
    change = after / before - 1
    return {"ratio_before": before, "ratio_after": after,
            "factor": math.sqrt(before * after), "change_during_run": change,
            "steady": abs(change) <= STEADY_SPEED_CHANGE,
            "by_kind": speed_by_kind(real_summary.get("speed_probes"))}


def speed_by_kind(probes: dict | None) -> dict[str, float]:
    """Each kind of probe point's own factor (prefill, decode): the geometric mean over the
    probes before and after the run of that kind's median ratio. The run's factor is one
    median over all points, and two prefill points outvote the decode one: run L's torch
    profile had timed its small decode cells 11-14% slow, its decode probe read x0.86-0.89 and
    the median x0.99-1.04 (docs/validation.md, run L)."""
    if not probes:
        return {}
    ratios: dict[str, list[float]] = {}
    for when in ("before", "after"):
        kinds: dict[str, list[float]] = {}
        for point in probes.get(when) or ():
            kinds.setdefault(point["kind"], []).append(float(point["ratio"]))
        for kind, values in kinds.items():
            ratios.setdefault(kind, []).append(float(np.median(values)))
    return {kind: math.exp(float(np.mean(np.log(values)))) for kind, values in ratios.items()
            if len(values) == 2}


def hidden_speed_kinds(factor: float | None, by_kind: dict[str, float]) -> dict[str, float]:
    """The kinds of probe point whose own factor lies more than ``STEADY_SPEED_CHANGE`` from
    the run's ``factor`` (the median the loads tables show): what that median hides, which
    the CLI and ``benchmarks/validate_at_rest.sh`` print beside it."""
    if factor is None:
        return {}
    return {kind: k for kind, k in sorted(by_kind.items())
            if abs(k / factor - 1) > STEADY_SPEED_CHANGE}


def speed_adjusted_sim(trace: Trace, config: SimConfig, profile: Profile, *reals):
    """The simulation priced by the profile scaled to the machine's speed during the real runs
    (``machine_speed``; over repeated runs, the geometric mean of their factors), or None when
    a real run carries no speed probes."""
    from ragsim.backends import runner

    speeds = [machine_speed(real.summary) for real in reals]
    if not speeds or any(speed is None for speed in speeds):
        return None
    factor = math.exp(float(np.mean([math.log(speed["factor"]) for speed in speeds])))
    return runner("sim")(trace, config, profile.scaled_compute(factor), None)


# the change of every step's price at which a point's cost elasticity is read: small enough to
# stay near the point (a queue answers a price change non-linearly), large enough to move runs
# of whole steps
ELASTICITY_PRICE_STEP = 0.05


def all_positive(values) -> bool:
    """Every one of a run's readings a finite positive number (a run with no request ended
    reads None or NaN, and a ratio of it says nothing)."""
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values)


def cost_elasticity(trace: Trace, config: SimConfig, profile: Profile, sim) -> dict | None:
    """How strongly the point's mean TTFT answers the cost model: the simulation (``sim``, run
    with ``profile``) rerun with every step's price x(1 -+ ``ELASTICITY_PRICE_STEP``)
    (``Profile.scaled_compute``; copies and search unchanged). ``elasticity``: the change of
    ln(mean TTFT) over the change of ln(price) -- about 1 where a TTFT is its own steps
    (idle); up to 1 / (1 - load) where it is a queue's wait behind steps that do not batch, less
    for an engine that batches more as its load grows (vLLM on two cores: 1.3-1.9 at 50% of its
    overload throughput, 1.9-3.2 at 90%). ``price_accuracy_needed``: the error of the steps'
    prices that alone spends the mean-TTFT target, target / elasticity. A reading of the
    simulation, never of the engine: None where a run has no finite positive mean TTFT. The
    three means are kept beside it: with batches that form differently at another price, the
    response need not be monotone (a cheaper step can leave a queue longer); ``unstable``: the
    three span more than ``run --sensitivity``'s limit (``api.uncertainty.UNSTABLE_SPAN``: a
    queue that grows or does not, speculative prefills that win or lose their race) or are out
    of the prices' order, where one error of the point says little about the cost model."""
    from ragsim.api.uncertainty import UNSTABLE_SPAN, spans
    from ragsim.backends import runner

    step = ELASTICITY_PRICE_STEP
    base = sim.summary.get("ttft_mean_s")
    means = [runner("sim")(trace, config, profile.scaled_compute(factor), None
                           ).summary.get("ttft_mean_s") for factor in (1 - step, 1 + step)]
    values = [base, *means]
    if not all_positive(values):
        return None
    elasticity = (math.log(means[1]) - math.log(means[0])) / (math.log(1 + step)
                                                              - math.log(1 - step))
    target = TARGETS["ttft_mean_abs_error"]
    ordered = means[0] <= base <= means[1]
    span = spans(min(values), max(values))
    return {"price_step": step, "ttft_mean_s": {"cheaper": means[0], "as_priced": base,
                                                "dearer": means[1]},
            "elasticity": elasticity,
            "price_accuracy_needed": target / elasticity if elasticity > 0 else None,
            "span": span, "unstable": span > UNSTABLE_SPAN or not ordered}


def search_term_range(trace: Trace, config: SimConfig, profile: Profile, sim,
                      search_cost: dict | None) -> dict | None:
    """What the search term's own uncertainty does to the point: the simulation (``sim``, run
    with ``profile`` and ``config``'s ``engine_loop_search_s``) rerun with that term at each
    end of its probe's 95% interval (``realrun.search_cost.cost_interval``:
    ``search_s_low``, ``search_s_high``). Why: the term is measured once a validation, on
    block pairs whose spread puts +-22% on it (run AC, 96 pairs), and a loaded point's mean
    answers it through the queue; a point's error means less by as much as this moves it.
    ``ttft_mean_s`` and ``throughput_rps`` at the low end, as charged and at the high end;
    ``ttft_mean_ratio`` and ``throughput_ratio``: each end's over as charged (multiply a
    point's ``1 + error`` by them for the error at that end); ``ordered``: the three means in
    the term's order, as a search costing the engine more should leave them (run AD's torch 90%
    point was not: -8.3% as charged, +0.1% and +12.5% at the ends, its batches reshuffled by
    any change, where one error of the point says little). None where the configuration
    does not charge the probe's figure (set in a file, or no interval measured) or a run has
    no finite positive mean TTFT."""
    from ragsim.backends import runner

    if not search_cost or "search_s_low" not in search_cost:
        return None
    charged = float(config.engine_loop_search_s)
    if not math.isclose(charged, float(search_cost["search_s"]), rel_tol=1e-9, abs_tol=1e-12):
        return None
    ends = {"low": float(search_cost["search_s_low"]), "high": float(search_cost["search_s_high"])}
    runs = {end: runner("sim")(trace, config.replace(engine_loop_search_s=seconds), profile,
                               None).summary for end, seconds in ends.items()}
    summaries = {"low": runs["low"], "as_charged": sim.summary, "high": runs["high"]}
    means = {end: summary.get("ttft_mean_s") for end, summary in summaries.items()}
    if not all_positive(means.values()):
        return None
    rates = {end: summary.get("throughput_rps") for end, summary in summaries.items()}
    known = all_positive(rates.values())
    return {"search_s": charged, "search_s_low": ends["low"], "search_s_high": ends["high"],
            "ttft_mean_s": means, "throughput_rps": rates,
            "ttft_mean_ratio": {end: means[end] / means["as_charged"] for end in ends},
            "ordered": means["low"] <= means["as_charged"] <= means["high"],
            "throughput_ratio": ({end: rates[end] / rates["as_charged"] for end in ends}
                                 if known else None)}


def _errors(real_throughput_rps: float, sim, joined: pd.DataFrame, *, sequential: bool,
            overload: bool) -> dict:
    ttft_sim, ttft_real = joined["ttft_s_sim"].to_numpy(), joined["ttft_s_real"].to_numpy()
    errors = {"hit_agreement": hit_agreement(joined), **ttft_errors(joined),
              "throughput_error": float(relative_errors(sim.summary["throughput_rps"],
                                                        real_throughput_rps)),
              **ks_test(ttft_sim, ttft_real), **tost_log_ratio(ttft_sim, ttft_real)}
    errors["checks"] = checks(errors, sequential=sequential, overload=overload)
    return errors


def compare(real, sim, *, backend: str, load: str | None = None,
            sim_speed_adjusted=None, terms: dict[str, tuple] | None = None,
            replayed_ttft: np.ndarray | None = None,
            capacity_error: float | None = None, repeats: Sequence = (),
            repeats_replayed: Sequence[np.ndarray | None] = (),
            measured_replayed: Sequence[np.ndarray | None] = (),
            elasticity: dict | None = None, steps: dict | None = None,
            single=None, profile_misses: dict | None = None) -> dict:
    """The report (``validation.json``) of one pair of runs with ``.columns``, ``.summary`` and
    ``.config``; ``load`` is the load point (``over``, ``idle``, a percentage) or None. With
    ``sim_speed_adjusted`` (``speed_adjusted_sim``) the report also gives the errors against
    the simulation priced at the machine's speed during the run (``speed_adjusted``).
    ``terms``: what ``backend_terms`` changed, recorded as ``backend_terms`` (field -> the
    value both sides ran with; the full configuration is the runs' own). ``replayed_ttft``
    (``replay_decisions``) splits the TTFT mean error into ``cost_model_error`` and
    ``decision_error``. ``capacity_error``: at a percentage of the engine's capacity, the
    overload point's throughput error (the simulation's own capacity against the engine's:
    the load it runs this rate at differs by that much; the diagnosis reads it).
    ``repeats``: more real runs of the same point (``--repeats``; ``repeats_replayed`` their
    replays): the raw errors are then against the runs' per-request average, with each run's
    own errors and the interval their spread gives beside them (``ragsim.engine_spread``);
    ``real`` is the first run, whose summary the report keeps. ``measured_replayed``: per real
    run, its decisions replayed at their measured durations (``replay_decisions(measured=
    True)``), which split the cost model's share into the steps' prices and the engine thread's
    time outside its steps (``decisions.split_error``). ``elasticity``: how strongly the
    point's mean TTFT answers the steps' prices (``cost_elasticity``), kept as
    ``cost_elasticity`` for the diagnosis to size the next fix. ``steps``: the real runs' steps
    measured against their prices, by size (``step_prices``), kept as ``step_prices``: which
    steps the prices miss. ``single``: with ``sim`` an ensemble (``run_sim_ensemble``), the
    noise-free simulation of the point, whose errors against the same real side are kept as
    ``sim_ensemble.single_run``. ``profile_misses``: the profile's held-out kinds whose prices
    its own checks found biased (``profiles.steps.heldout_misses``), kept as
    ``profile_heldout_misses``."""
    reals = [real, *repeats]
    if repeats:
        from ragsim import engine_spread

        joined, dropped, each = engine_spread.pooled_join(reals, sim.columns)
        real_throughput, throughput_err = engine_spread.pooled_throughput_error(
            reals, sim.summary)
    else:
        joined, dropped = join_runs(real.columns, sim.columns)
        real_throughput = float(real.summary["throughput_rps"])
        throughput_err = throughput_error(real.summary, sim.summary)
    if joined.empty:
        raise RagsimInputError("no request completed in both runs: nothing to compare",
                               field="--requests")
    ttft_sim, ttft_real = joined["ttft_s_sim"].to_numpy(), joined["ttft_s_real"].to_numpy()
    components = component_errors(joined)
    config = sim.config
    report = {
        "requests": len(joined),
        "requests_dropped": len(dropped),
        "dropped_request_ids": dropped[:20],
        "backend": backend,
        "real_is_simulated": backend == "sim",
        "system": config.system,
        "trace": config.trace,
        "profile": config.profile,  # as given: a shipped name or a file (--profile-now's)
        "load": load,
        "arrival": config.arrival,
        "rate_rps": config.rate_rps,
        "backend_terms": {name: getattr(config, name) for name in terms or {}},
        "hit_agreement": hit_agreement(joined),
        **ttft_errors(joined),
        "throughput_error": throughput_err,
        "real_throughput_rps": real_throughput,
        **ks_test(ttft_sim, ttft_real),
        **tost_log_ratio(ttft_sim, ttft_real),
        "components": components,
        "dominant_component": dominant_component(components),
        **search_error(joined, real.summary),
        "cost_model_error": None, "decision_error": None, "capacity_error": capacity_error,
        "iteration_time_ratio": iteration_time_ratio(real.summary),
        "beyond_profile_time_share": beyond_profile_time_share(real.summary),
        "cost_elasticity": elasticity,
        "step_prices": steps,
        # the profile's held-out kinds whose prices its own checks found biased before any run
        # (``profiles.steps.heldout_misses``): the diagnosis names the profile where they exist
        "profile_heldout_misses": profile_misses or {},
    }
    request_ids = real.columns["request_id"]
    measured_ttft = measured_replayed[0] if len(measured_replayed) == len(reals) else None
    if repeats and replayed_ttft is not None:
        from ragsim.engine_spread import pooled_replay

        request_ids = joined["request_id"].to_numpy()
        replayed_ttft = pooled_replay(reals, [replayed_ttft, *repeats_replayed], request_ids)
        if measured_ttft is not None:
            measured_ttft = pooled_replay(reals, list(measured_replayed), request_ids)
    if replayed_ttft is not None:
        from ragsim.decisions import split_error

        report["decisions"] = split_error(joined, replayed_ttft, request_ids, measured_ttft)
        report["cost_model_error"] = report["decisions"]["cost_model_error"]
        report["decision_error"] = report["decisions"]["decision_error"]
    if getattr(config, "replicas", 1) > 1:  # a fleet on both sides: routed by one router
        report.update(replicas=config.replicas, router=config.router,
                      same_replica=same_replica(real.columns, sim.columns))
    if config.arrival == "sequential":  # compared without the decisions that race with time
        report["sequential_without"] = sorted(TIME_DRIVEN)
    report["checks"] = checks(report, sequential=config.arrival == "sequential",
                              overload=load == LOAD_OVER)
    report["machine_speed"] = machine_speed(real.summary)
    if repeats:
        from ragsim.engine_spread import spread

        report["repeats"] = spread(reals, sim, each)
    if sim_speed_adjusted is not None:
        adjusted = joined_to_reals(reals, sim_speed_adjusted.columns)
        report["speed_adjusted"] = _errors(real_throughput, sim_speed_adjusted, adjusted,
                                           sequential=config.arrival == "sequential",
                                           overload=load == LOAD_OVER)
    if "position_free_hit_tokens" in sim.summary:  # --reuse blend:R | epic:K
        report["reuse"] = config.reuse
        report["position_free"] = position_free_counts(real.summary, sim.summary)
    if single is not None:
        report["sim_ensemble"] = ensemble_section(reals, sim, single, real_throughput)
    report["real"], report["sim"] = real.summary, sim.summary
    from ragsim.diagnosis import diagnose

    report["diagnosis"] = diagnose(report)  # each missed target: its cause and next fix
    return report


def ensemble_section(reals: Sequence, ensemble, single, real_throughput: float) -> dict:
    """The ``sim_ensemble`` section of a report: the replicas and their step-time spread, the
    replicas' own p90 |error| one against the others, and the noise-free run's raw errors
    against the same real side (its per-request average over ``reals``)."""
    errors = ttft_errors(joined_to_reals(reals, single.columns))
    return {
        "replicas": ensemble.summary.get("sim_replicas"),
        "step_time_sigma": ensemble.summary.get("step_time_sigma"),
        "step_time_correlation": ensemble.summary.get("step_time_correlation", 0.0),
        "ttft_p90_abs_error_one_run": ensemble.summary.get("ttft_p90_abs_error_one_run"),
        "single_run": {
            "ttft_mean_error": errors["ttft_mean_error"],
            "ttft_p90_abs_error": errors["ttft_p90_abs_error"],
            "throughput_error": float(relative_errors(single.summary["throughput_rps"],
                                                      real_throughput)),
            "ttft_mean_s": single.summary.get("ttft_mean_s"),
        },
        "estimator": "each request's simulated TTFT averaged over the replicas (each step's "
                     "time x exp(e), e an AR(1) over the steps with spread step_time_sigma and "
                     "lag-1 correlation step_time_correlation, measured on the probe runs' "
                     "steps, else the profile's repeated timings with no correlation); "
                     "single_run: the noise-free simulation against the same real side",
    }


POSITION_FREE_FIELDS = ("position_free_hit_tokens", "blend_recomputed_tokens")


def position_free_counts(real_summary: dict, sim_summary: dict) -> dict:
    """Position-free reuse on both sides: what the policy core counted in each run, what the
    real engine's blended prefills reused and recomputed (``engine_*``, the torch engine's
    own count), and whether all agree."""
    counts = {"sim": {f: sim_summary.get(f) for f in POSITION_FREE_FIELDS},
              "real": {f: real_summary.get(f) for f in POSITION_FREE_FIELDS}}
    if "engine_position_free_hit_tokens" in real_summary:
        counts["engine"] = {f: real_summary[f"engine_{f}"] for f in POSITION_FREE_FIELDS}
    counts["agree"] = all(side == counts["sim"] for side in counts.values()
                          if isinstance(side, dict))
    return counts


def per_request(joined: pd.DataFrame) -> pd.DataFrame:
    """The joined per-request table written beside the report, with each request's TTFT error
    and whether its hits agree."""
    table = joined.copy()
    table["ttft_error"] = relative_errors(table["ttft_s_sim"], table["ttft_s_real"])
    table["hits_agree"] = hits_agree(table)
    return table


# --------------------------------------------------------------------------- figures
def plot_ttft(joined: pd.DataFrame, out_dir: Path, label: str) -> list[Path]:
    """``ttft_scatter.png`` (simulated against real TTFT per request, with the diagonal and the
    +-10% band) and ``ttft_cdf.png`` (both runs' TTFT distributions)."""
    from ragsim.figures import new_figure, save_figure

    real, sim = joined["ttft_s_real"].to_numpy(), joined["ttft_s_sim"].to_numpy()
    fig = new_figure(5, 5)
    ax = fig.add_subplot()
    ax.scatter(real, sim, s=8, alpha=0.6)
    top = max(real.max(), sim.max()) * 1.05
    ax.plot([0, top], [0, top], color="black", lw=1, label="sim = real")
    ax.fill_between([0, top], [0, top * (1 - TOST_MARGIN)], [0, top * (1 + TOST_MARGIN)],
                    color="grey", alpha=0.2, label=f"±{TOST_MARGIN:.0%}")
    ax.set(xlabel=f"{label} TTFT (s)", ylabel="simulated TTFT (s)", xlim=(0, top), ylim=(0, top),
           title="TTFT per request")
    ax.legend()
    paths = [save_figure(fig, out_dir / "ttft_scatter.png")]
    fig = new_figure(6, 4)
    ax = fig.add_subplot()
    for values, name in ((real, label), (sim, "simulated")):
        ordered = np.sort(values)
        ax.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post", label=name)
    ax.set(xlabel="TTFT (s)", ylabel="share of requests", title="TTFT distribution")
    ax.legend()
    paths.append(save_figure(fig, out_dir / "ttft_cdf.png"))
    return paths


# --------------------------------------------------------------------------- equal terms
def _toml(value) -> str:
    return json.dumps(value)  # true, false, 32, "mixed": as a --config file writes them


def backend_terms(config: SimConfig, backend: str, *, device: str = "cpu",
                  given: Collection[str] = (), source: str | None = None
                  ) -> tuple[SimConfig, dict[str, tuple]]:
    """``config`` on the terms ``backend`` runs it with, for both sides of the comparison, and
    what that changed (field -> (was, now)). vLLM runs a configuration its own way
    (``realrun.vllm.harness.engine_terms``: no speculation, first come first served, with its
    prefix cache hits in whole blocks of its smallest block on ``device``, shared within a
    batch) and, unless told otherwise, is simulated with the mixed scheduler; each field the
    user did not set (``given``: by an option or in the --config file ``source``) takes that
    value. One set to a value vLLM cannot run, or to a block it cannot page, is refused naming
    the field; so is whatever else vLLM's engine does not do (``harness.check_config``). Other
    backends run the configuration as it is."""
    if backend != "vllm":
        return config, {}
    from ragsim.realrun.vllm.engine import smallest_block_tokens
    from ragsim.realrun.vllm.harness import (
        ENGINE_FIXED,
        PROMPTS_PER_STEP,
        check_config,
        engine_terms,
    )

    on_cpu = device == "cpu"
    terms = {**engine_terms(config, on_cpu=on_cpu), "scheduler": VLLM_SCHEDULER}
    why = {**{name: reason for name, (_, _, reason) in ENGINE_FIXED.items()},
           "batch_kv_sharing": _SHARED_IN_BATCH, "max_prefill_bs": PROMPTS_PER_STEP}
    for name, value in terms.items():
        if name in given and name in why and getattr(config, name) != value:
            raise ConfigError(f"{name} = {_toml(getattr(config, name))} is not how --backend "
                              f"vllm runs ({name} = {_toml(value)}): {why[name]}",
                              file=source, field=name)
    if "order" in given and config.order != "fcfs":  # the order is the reordering's choice
        raise ConfigError(f"order = {_toml(config.order)} is not how --backend vllm runs "
                          f"(order = \"fcfs\"): {why['reorder']}", file=source, field="order")
    smallest = smallest_block_tokens(on_cpu)
    if config.cache and "prefix_block_tokens" in given and config.prefix_block_tokens % smallest:
        raise ConfigError(f"vLLM {'on a CPU ' if on_cpu else ''}pages KV in blocks of a "
                          f"multiple of {smallest} tokens, got {config.prefix_block_tokens}",
                          file=source, field="prefix_block_tokens")
    changed = {name: (getattr(config, name), value) for name, value in terms.items()
               if name not in given and getattr(config, name) != value}
    config = config.replace(**{name: now for name, (_, now) in changed.items()})
    check_config(config)
    return config, changed


def terms_note(changed: dict[str, tuple], backend: str, *,
               who: str = "both sides run as it does",
               settable: str = "--scheduler or a --config file may set the scheduler, the file "
                               "the block") -> str:
    """One line saying what ``backend_terms`` changed: ``who`` runs on them (validate: both
    sides; ``ragsim run``: the run) and ``settable`` says how to set them otherwise."""
    return (f"--backend {backend}: {who}: "
            + ", ".join(f"{name} {_toml(was)} -> {_toml(now)}"
                        for name, (was, now) in changed.items())
            + f" ({settable})")


# --------------------------------------------------------------------------- the runs
def run_pair(trace: Trace, config: SimConfig, profile: Profile, *, backend: str,
             device: str = "cpu", threads: int | None = None,
             reference_profile: Profile | None = None, progress=None):
    """``(real, sim)``: the real harness and the simulator on the same trace, configuration and
    profile (the engine runs the profile's model). With ``backend="sim"`` the real side is a
    second simulation (with ``reference_profile`` if given): a dry run of the comparison, not a
    validation."""
    real = run_real(trace, config, profile, backend=backend, device=device, threads=threads,
                    reference_profile=reference_profile, progress=progress)
    return real, run_sim(trace, config, profile)


def run_sim(trace: Trace, config: SimConfig, profile: Profile):
    """The simulated side of ``run_pair`` (deterministic for the configuration's seed: one run
    a point, however many real runs it is compared with)."""
    from ragsim.backends import runner

    return runner("sim")(trace, config, profile, None)


def run_sim_ensemble(trace: Trace, config: SimConfig, profile: Profile | Sequence[Profile],
                     replicas: int, sigma: float, correlation: float = 0.0):
    """``replicas`` simulations of the point, each step's time drawn around its price with
    ``sigma`` and ``correlation`` (``serving.step_noise``; ``step_noise_seed``
    0..replicas-1), averaged per request (``ragsim.sim_ensemble``): an estimate of each
    request's expected TTFT. ``profile``: one, or one per real run (``like_runs``): replica k
    is priced by the ``k % len``-th, so the replicas begin in the engine states the real runs
    began in, as evenly as their number allows."""
    from ragsim.sim_ensemble import ensemble_result

    profiles = list(profile) if isinstance(profile, list | tuple) else [profile]
    runs = [run_sim(trace, config.replace(step_time_sigma=sigma,
                                          step_time_correlation=correlation,
                                          step_noise_seed=k), profiles[k % len(profiles)])
            for k in range(replicas)]
    # the point's config.toml: noise-free
    ensemble = ensemble_result(runs, sigma, config, correlation)
    ensemble.summary["ttft_p90_abs_error_one_run"] = _one_run_p90(runs)
    return ensemble


def like_runs(profile: Profile, reals: Sequence) -> list[Profile]:
    """``profile`` as each of ``reals``' engines had warmed it when its run began
    (``warmed_like``), one per run in their order. Why: repeated runs of a point share one
    engine process (vLLM's), so each begins with the step sizes the runs before it built; the
    real side is their average, and the simulation of the first run's state alone charged the
    later runs first-time prices their engines no longer paid (run AI: +3.9% against -6.4% at
    vllm-apc's 50% point, docs/validation.md)."""
    return [warmed_like(profile, real) for real in reals]


def run_sim_like_runs(trace: Trace, config: SimConfig, profiles: Sequence[Profile]):
    """The noise-free simulation of a point whose real runs began in the engine states
    ``profiles`` price (``like_runs``): one simulation per state, averaged per request with
    each real run's weight (``sim_ensemble.averaged_result``), where the real side averages
    the runs; a state shared by several runs is simulated once, and one state is its
    simulation itself. Returns (the average, the first run's simulation): readings of one
    simulation (its cost elasticity, its search term) are taken on the first."""
    from ragsim.sim_ensemble import averaged_result

    by_state: dict[object, object] = {}
    runs = []
    for profile in profiles:
        key = _warm_state(profile)
        if key not in by_state:
            by_state[key] = run_sim(trace, config, profile)
        runs.append(by_state[key])
    if len(by_state) == 1:
        return runs[0], runs[0]
    average = averaged_result(runs, config)
    average.summary["sim_engine_states"] = len(by_state)
    return average, runs[0]


def _warm_state(profile: Profile) -> object:
    """What of an engine's starting state a profile prices: the step sizes built and how many
    stay built (``Profile.new_shapes``), or nothing."""
    shapes = profile.new_shapes
    return None if shapes is None else (tuple(shapes.warm_step_tokens),
                                        shapes.built_capacity_counts)


def _one_run_p90(runs) -> float:
    """The replicas' own spread: one against the others' average (requests completed in all)."""
    from ragsim.sim_ensemble import p90_abs_error_one_run

    frames = [completed(run.columns).set_index("request_id")["ttft_s"] for run in runs]
    common = frames[0].index
    for frame in frames[1:]:
        common = common.intersection(frame.index)
    return p90_abs_error_one_run(np.array([frame.loc[common].to_numpy(float)
                                           for frame in frames]))


def run_real(trace: Trace, config: SimConfig, profile: Profile, *, backend: str,
             device: str = "cpu", threads: int | None = None,
             reference_profile: Profile | None = None, progress=None):
    """The real side of ``run_pair`` alone (a fresh engine): one more run of a point whose
    engine is measured more than once (``--repeats``)."""
    from ragsim.backends import runner

    if backend not in BACKENDS:
        raise RagsimInputError(f"unknown backend {backend!r}; known: torch, vllm",
                               field="--backend")
    if backend == "sim":
        return runner("sim")(trace, config, reference_profile or profile, progress)
    return runner(backend, device=device, threads=threads)(trace, config, profile, progress)


def engine_scale(profile: Profile, layers: int | None, hidden: int | None
                 ) -> tuple[int, int]:
    """The engine's layers and hidden size, which are the profile's model's (the engine builds
    the model the profile describes); others are refused, since the simulation would price a
    model the engine does not run."""
    model = profile.model
    for given, measured, flag in ((layers, model.num_layers, "--layers"),
                                  (hidden, model.hidden_size, "--hidden")):
        if given is not None and given != measured:
            raise RagsimInputError(
                f"{given} does not match the profile {profile.name!r} ({model.name}: "
                f"{measured}); give a matching --profile or --profile-now", field=flag)
    return model.num_layers, model.hidden_size


# a CPU profile's decode grid stops here, however many requests an overloaded run holds (each
# extra batch size costs a row of decode measurements; past it the report's
# beyond_profile_time_share says how much of the run was priced by extrapolation)
CPU_PROFILE_MAX_BATCH = 64


def run_needs(trace: Trace, config: SimConfig, kv_bytes_per_token: int) -> dict[str, int]:
    """What the runs of a validation will ask of a profile (``ProfilePlan.covering``): the
    longest prompt (cached prefix and prefill), the longest context a decode step sees, and the
    most requests that can decode at once (the batch limit, the requests, and the GPU memory's
    room for requests of the mean context, whichever is least), and the most prompts one
    prefill takes (``max_prefill_bs``: the torch engine's levels by row count reach it)."""
    prompts = config.system_prompt_tokens + trace.doc_tokens_per_request + trace.query_tokens
    contexts = prompts + trace.output_tokens
    batch = min(config.max_batch_size, trace.n_requests)
    if config.gpu_kv_bytes:
        room = config.gpu_kv_bytes // (kv_bytes_per_token * max(float(contexts.mean()), 1.0))
        batch = min(batch, max(int(room), 1))
    return {"cached_tokens": int(prompts.max()), "new_tokens": int(prompts.max()),
            "batch_size": int(batch), "context_tokens": int(contexts.max()),
            "prefill_rows": int(config.max_prefill_bs)}


def profile_here(out: Path, *, layers: int | None, hidden: int | None, device: str,
                 threads: int | None, seed: int, progress=None,
                 needs: dict[str, int] | None = None, engine: str = "torch",
                 block_tokens: int = 32) -> Profile:
    """Profile ``engine`` on this machine (``ragsim profile [--engine vllm]``'s measurement,
    the quick plan reaching ``needs``: ``run_needs``) for the scaled-down model it serves; the
    profile is written to ``out``. vLLM's steps are timed at the runs' ``block_tokens``: a
    validation against vLLM priced with a profile measured elsewhere (the shipped CPU vLLM
    profile) measures the other machine."""
    from ragsim.profiles.models import resolve_model, scaled_down
    from ragsim.profiles.profiler import ProfilePlan, run_profile

    spec = scaled_down(resolve_model(BASE_MODEL), layers=layers, hidden=hidden)
    dtype = "fp32" if device == "cpu" else spec.dtype
    spec = spec.with_dtype(dtype)
    plan = ProfilePlan.quick()
    if needs:
        if device == "cpu":
            needs = {**needs, "batch_size": min(needs["batch_size"], CPU_PROFILE_MAX_BATCH)}
        plan = plan.covering(**needs)
    label = (f"scaled down from {BASE_MODEL}: {spec.num_layers} layers, hidden "
             f"{spec.hidden_size}" if layers or hidden else BASE_MODEL)
    if engine == "vllm":
        from ragsim.realrun.vllm.profile import profile_vllm

        # one engine thread unless told otherwise, as the torch engine's profile: the run's
        # search workers and harness then have the other cores, as a GPU server's CPU serves
        # them beside its accelerator (the simulation models no contention between them; on
        # every core, vLLM's first steps of a burst ran 10-15x their price while the searches
        # of the burst ran beside them)
        return profile_vllm(spec, name=f"{device}-vllm-{spec.name}", plan=plan, out=out,
                            block_tokens=block_tokens, kv_cache_bytes=2**30, seed=seed,
                            label=f"vLLM; {label}", progress=progress,
                            threads=(threads or 1) if device == "cpu" else None)
    return run_profile(spec, name=f"{device}-{spec.name}", device=device, dtype=dtype,
                       plan=plan, out=out, threads=threads or 1, seed=seed, label=label,
                       progress=progress)


# --------------------------------------------------------------------------- load points
def load_key(text: str) -> str:
    """A load as the points name it: ``idle``, ``over`` or a percentage in ``:g`` form
    (``" 90.0% "`` is ``90``); text that is none of them is returned as written, lower case,
    for the caller to refuse."""
    point = text.strip().lower().rstrip("%")
    if point in (LOAD_IDLE, LOAD_OVER):
        return point
    try:
        return f"{float(point):g}"
    except ValueError:
        return point


def parse_loads(text: str) -> list[str]:
    """``idle,50,90,over`` -> the points in the order they run: the overload point first (its
    real throughput is the capacity the percentages refer to; added when only percentages are
    asked), then the percentages from the highest, then idle (sequential)."""
    points = [load_key(p) for p in text.split(",") if p.strip()]
    percents = []
    for point in points:
        if point in (LOAD_IDLE, LOAD_OVER):
            continue
        try:
            value = float(point)
        except ValueError:
            value = math.nan
        if not 0 < value < 100:
            raise RagsimInputError(f"{point!r} is not idle, over or a percentage of capacity "
                                   "between 0 and 100", field="--loads")
        percents.append(point)
    if not points:
        raise RagsimInputError("no load points given", field="--loads")
    order = sorted(set(percents), key=float, reverse=True)
    return ([LOAD_OVER] if LOAD_OVER in points or order else []) + order + (
        [LOAD_IDLE] if LOAD_IDLE in points else [])


def _repeat_count(text: str, item: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise RagsimInputError(f"{item!r}: real runs per point must be a whole number of at "
                               "least 1", field="--repeats")
    return count


def parse_repeats(text: str | int, points: Sequence[str] | None) -> dict[str | None, int]:
    """``--repeats``: real runs per point, ``{None: every point not named, load: its own}``.

    ``5`` runs every point five times; ``3,90=15,50=15`` runs the 90% and 50% points fifteen
    times and the others three. Why per load: a point's spread, and so how many runs it takes to
    pin each request's expected TTFT, differs by load by an order of magnitude (one real run
    against the others' average, at p90: 13-17% idle, 40-65% at 90% on this project's CPU,
    docs/validation.md), and the real runs are the validation's time. A named load must be one
    of ``points`` (``--loads``), in the form ``parse_loads`` gives it (``90%`` is ``90``)."""
    if isinstance(text, bool):
        raise RagsimInputError(f"real runs per point must be a whole number, got {text!r}",
                               field="--repeats")
    if isinstance(text, int):
        text = str(text)
    counts: dict[str | None, int] = {}
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        load, sep, count = item.partition("=")
        if not sep:
            if None in counts:
                raise RagsimInputError(f"{text!r} gives the count of every other point twice",
                                       field="--repeats")
            counts[None] = _repeat_count(item, item)
            continue
        if points is None:
            raise RagsimInputError(f"{item!r} names a load: give --loads, or one count",
                                   field="--repeats")
        key = load_key(load)
        if key not in points:
            raise RagsimInputError(f"{item!r} names a load that does not run (--loads: "
                                   f"{', '.join(points)})", field="--repeats")
        if key in counts:
            raise RagsimInputError(f"{text!r} names load {key} twice", field="--repeats")
        counts[key] = _repeat_count(count.strip(), item)
    if not counts:
        raise RagsimInputError("no count of real runs given", field="--repeats")
    counts.setdefault(None, 1)
    return counts


# Decisions that race with time even one request at a time: a speculative job started during a
# request's search is admitted to the cache or not depending on whether the engine is still
# busy with the previous one's iteration when the search moves on, and host replicas are copied
# every ``replicate_every_s`` seconds, so a slower real run copies at other requests than the
# simulation. Sequential comparisons turn them off (and say so), so that hit agreement tests the
# cache policy exactly; the open-loop points keep every setting.
TIME_DRIVEN = {"speculate": False, "host_replicas": 0}


def sequential_config(config: SimConfig) -> tuple[SimConfig, dict]:
    """One request at a time, without the time-driven decisions; returns the configuration and
    the settings it changed (field -> (was, now))."""
    changed = {field: (getattr(config, field), value) for field, value in TIME_DRIVEN.items()
               if getattr(config, field) != value}
    return config.replace(arrival="sequential", **TIME_DRIVEN), changed


def config_at_load(config: SimConfig, load: str, capacity_rps: float | None) -> SimConfig:
    """The configuration of one load point: ``over`` (Poisson at ``config.rate_rps`` if given,
    else every request at once), a percentage of ``capacity_rps``, or ``idle`` (one request at a
    time)."""
    if load == LOAD_IDLE:
        return sequential_config(config)[0]
    if load == LOAD_OVER:
        return config.replace(arrival="poisson", rate_rps=config.rate_rps or BURST_RATE_RPS)
    return config.replace(arrival="poisson", rate_rps=capacity_rps * float(load) / 100)


def load_row(report: dict) -> dict:
    """One row of the loads table (``loads.json``, ``loads.parquet``)."""
    marks = {c["metric"]: c["passed"] for c in report["checks"]}
    return {"load": report["load"], "arrival": report["arrival"], "rate_rps": report["rate_rps"],
            "requests": report["requests"], "requests_dropped": report["requests_dropped"],
            "ttft_mean_error": report["ttft_mean_error"],
            "ttft_p90_abs_error": report["ttft_p90_abs_error"],
            "throughput_error": report["throughput_error"],
            "hit_agreement": report["hit_agreement"],
            "real_throughput_rps": report.get("real_throughput_rps",
                                              report["real"]["throughput_rps"]),
            "sim_throughput_rps": report["sim"]["throughput_rps"],
            # how busy the engine was: a load named as a share of the burst's capacity may sit
            # nearer saturation than its name says (the mean over the real runs, with repeats)
            "real_gpu_busy_fraction": (report.get("repeats") or {}).get(
                "real_gpu_busy_fraction", report["real"].get("gpu_busy_fraction")),
            "sim_gpu_busy_fraction": report["sim"].get("gpu_busy_fraction"),
            "dominant_component": report["dominant_component"],
            "cost_model_error": report.get("cost_model_error"),
            "decision_error": report.get("decision_error"),
            # the cost model's share: the steps' prices, the engine thread's time outside them
            "step_price_error": (report.get("decisions") or {}).get("step_price_error"),
            "outside_steps_error": (report.get("decisions") or {}).get("outside_steps_error"),
            "search_mean_error": report.get("search_mean_error"),
            "search_mode": report.get("search_mode"),
            # a 1% error of every step's price moves the simulated mean TTFT by this many %
            "ttft_cost_elasticity": (report.get("cost_elasticity") or {}).get("elasticity"),
            "ttft_cost_unstable": (report.get("cost_elasticity") or {}).get("unstable"),
            "machine_speed_factor": (report["machine_speed"] or {}).get("factor"),
            "machine_speed_change": (report["machine_speed"] or {}).get("change_during_run"),
            # each kind of probe point's own factor: one median can hide a kind the profile
            # timed at another speed (run L: decode x0.86-0.89 under a median of x1.0)
            "machine_speed_prefill": ((report["machine_speed"] or {}).get("by_kind")
                                      or {}).get("prefill"),
            "machine_speed_decode": ((report["machine_speed"] or {}).get("by_kind")
                                     or {}).get("decode"),
            "adjusted_ttft_mean_error": (report.get("speed_adjusted") or {}).get(
                "ttft_mean_error"),
            "adjusted_ttft_p90_abs_error": (report.get("speed_adjusted") or {}).get(
                "ttft_p90_abs_error"),
            "adjusted_throughput_error": (report.get("speed_adjusted") or {}).get(
                "throughput_error"),
            "interrupted": bool(report.get("interrupted", False)),
            # the mean error at each end of the search term's 95% interval (search_term_range)
            **search_term_columns(report.get("search_term")),
            **repeat_columns(report.get("repeats")),
            **ensemble_columns(report.get("sim_ensemble")),
            **{f"{name}_passed": passed for name, passed in marks.items()},
            **miss_columns(report.get("diagnosis") or [])}


def search_term_columns(term: dict | None) -> dict:
    """A load row's search term's interval and the TTFT mean error at each end of it (NaN
    where the term was not measured with an interval: ``search_term_range``)."""
    if not term:
        return {"search_s_low": math.nan, "search_s_high": math.nan,
                "ttft_mean_error_search_low": math.nan, "ttft_mean_error_search_high": math.nan,
                "ttft_mean_search_ordered": None}
    return {"search_s_low": term["search_s_low"], "search_s_high": term["search_s_high"],
            "ttft_mean_error_search_low": term["ttft_mean_error"]["low"],
            "ttft_mean_error_search_high": term["ttft_mean_error"]["high"],
            "ttft_mean_search_ordered": term["ordered"]}


def repeat_columns(repeats: dict | None) -> dict:
    """A load row's real runs (``--repeats``), the 95% intervals of its errors their spread
    gives and the p90 |error| floor it sets (NaN for one run: no spread measured)."""
    if not repeats:
        return {"real_runs": 1, "ttft_mean_error_low": math.nan,
                "ttft_mean_error_high": math.nan, "throughput_error_low": math.nan,
                "throughput_error_high": math.nan, "real_ttft_mean_cv": math.nan,
                "ttft_p90_abs_error_floor": math.nan,
                "ttft_p90_abs_error_floor_both_sides": math.nan,
                "real_ttft_p90_abs_error_one_run": math.nan}
    ttft, throughput = repeats["ttft_mean_error_interval"], repeats["throughput_error_interval"]
    return {"real_runs": repeats["runs"], "ttft_mean_error_low": ttft[0],
            "ttft_mean_error_high": ttft[1], "throughput_error_low": throughput[0],
            "throughput_error_high": throughput[1],
            "real_ttft_mean_cv": repeats["real_ttft_mean_cv"],
            # the p90 |error| the runs' own per-request spread gives a perfect model
            "ttft_p90_abs_error_floor": repeats.get("ttft_p90_abs_error_floor", math.nan),
            # with --sim-replicas: the replicas' average's own error added
            "ttft_p90_abs_error_floor_both_sides": repeats.get(
                "ttft_p90_abs_error_floor_both_sides", math.nan),
            # one real run against the others' average: what a model that is one more run
            # of the engine would show
            "real_ttft_p90_abs_error_one_run": repeats.get("ttft_p90_abs_error_one_run",
                                                           math.nan)}


def ensemble_columns(ensemble: dict | None) -> dict:
    """A load row's simulated side as an ensemble (``validate --sim-replicas``): its replicas,
    their step-time spread, one replica against the others, and the noise-free run's raw
    errors (1 replica, NaN: the simulation is the noise-free run itself)."""
    if not ensemble:
        return {"sim_replicas": 1, "step_time_sigma": math.nan,
                "step_time_correlation": math.nan, "sim_ttft_p90_abs_error_one_run": math.nan,
                "single_ttft_mean_error": math.nan, "single_ttft_p90_abs_error": math.nan,
                "single_throughput_error": math.nan}
    single = ensemble["single_run"]
    return {"sim_replicas": ensemble["replicas"], "step_time_sigma": ensemble["step_time_sigma"],
            "step_time_correlation": ensemble.get("step_time_correlation", 0.0),
            "sim_ttft_p90_abs_error_one_run": ensemble["ttft_p90_abs_error_one_run"],
            "single_ttft_mean_error": single["ttft_mean_error"],
            "single_ttft_p90_abs_error": single["ttft_p90_abs_error"],
            "single_throughput_error": single["throughput_error"]}


def miss_columns(diagnosis: list[dict]) -> dict:
    """A load row's causes and next fixes (``ragsim.diagnosis``), flat for the loads table:
    ``metric: cause`` for each missed target, and each distinct next fix once (None: none
    missed); the full evidence is in the load's ``validation.json``."""
    if not diagnosis:
        return {"miss_causes": None, "next_fixes": None}
    fixes = list(dict.fromkeys(miss["next_fix"] for miss in diagnosis))
    return {"miss_causes": "; ".join(f"{m['metric']}: {m['cause']}" for m in diagnosis),
            "next_fixes": " | ".join(fixes)}
