"""Probe runs: real runs of a trace's requests past the ones a validation judges, at two loads,
that measure what the simulation of such a run must charge and a profile cannot hold.

Two probes run on them, on either engine. The engine's loop: the time its thread spends
between two steps of a busy engine (handing outputs back, the pipeline's events, the next
batch, each request's intake), fitted as ``step_s`` a gap plus ``request_s`` a request
(``fit_engine_loop``; vLLM's in ``realrun/vllm/loop.py``, the torch engine's in
``torch_engine_loop``). And the search tier's share of the serving process's interpreter: a
serving process whose search workers run Python beside an in-process engine shares one
interpreter with it, and the engine's Python waits while they hold it (docs/validation.md,
"The search tier in the engine's interpreter"). The probe measures it as what a search costs
the engine's steps (``realrun/search_cost.py``: steps timed alone and beside searches, several
times the searches' own interpreter time), with the CPU time the run's search threads spent
outside faiss (``RealSearch``: ``interpreter_s_total``) per search beside it, on requests the
validation does not serve, so that no judged run sets a parameter of its own simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from ragsim.profiles.profile import Profile
from ragsim.realrun.search_cost import (
    SEARCH_COST_CONTEXT_TOKENS,
    SEARCH_COST_ROWS,
    charged_search_s,
    measure_search_cost,
)
from ragsim.serving.config import SimConfig
from ragsim.traces.schema import Trace

# requests in each probe run, and the loads (shares of the simulated burst capacity) it runs at:
# two, so that the time a step costs and the time a request costs can be told apart
LOOP_PROBE_REQUESTS = 120
LOOP_PROBE_LOADS = (0.5, 0.9)
# a small validation's probe runs as many requests as it serves, down to this many: a probe
# run lasts its requests over its rate, and 120 at half a small engine's capacity took minutes
# beside a validation of ten requests
LOOP_PROBE_MIN_REQUESTS = 16


def probe_size(served: int) -> int:
    """The requests of each probe run beside a validation of ``served`` requests: as many, at
    least ``LOOP_PROBE_MIN_REQUESTS`` and at most ``LOOP_PROBE_REQUESTS``."""
    return min(LOOP_PROBE_REQUESTS, max(LOOP_PROBE_MIN_REQUESTS, served))


def kept_whole(summary: dict) -> dict:
    """A probe run's summary, or the stop that cut it short passed on (a run stopped by Ctrl-C
    or SIGTERM keeps what ended and returns; a probe of part of its requests measures
    nothing the validation could charge, and the user asked it to stop)."""
    if summary.get("interrupted"):
        raise KeyboardInterrupt("a probe run was stopped")
    return summary


def probe_rows(n_trace: int, served: int, wanted: int | None = None) -> tuple[range, bool]:
    """The rows a probe runs: the ``wanted`` (default ``probe_size(served)``) past the
    ``served`` ones where the trace has them (True), else its last ``wanted`` (False: some are
    the validation's own)."""
    if wanted is None:
        wanted = probe_size(served)
    if n_trace >= served + wanted:
        return range(served, served + wanted), True
    return range(max(0, n_trace - wanted), n_trace), False


def probe_configs(config: SimConfig, capacity_rps: float) -> list[tuple[float, SimConfig]]:
    """Each probe run's load and configuration: Poisson arrivals at ``LOOP_PROBE_LOADS`` x
    ``capacity_rps``, every request of the probe's trace."""
    return [(share, config.replace(arrival="poisson", rate_rps=share * capacity_rps,
                                   n_requests=None)) for share in LOOP_PROBE_LOADS]


def fit_engine_loop(points: list[tuple[int, float, int]]) -> tuple[float, float]:
    """``(step_s, request_s)`` from ``(gaps, seconds between steps, requests handed over while
    busy)`` of each probe run: non-negative least squares (``scipy.optimize.nnls``), so that
    noise cannot make either term a refund."""
    from scipy.optimize import nnls

    if not points:
        return 0.0, 0.0
    design = np.array([[float(g), float(r)] for g, _, r in points])
    seconds = np.array([float(s) for _, s, _ in points])
    solution, _ = nnls(design, seconds)
    return float(solution[0]), float(solution[1])


def probe_loop_runs(probe: Trace, config: SimConfig, capacity_rps: float,
                    run_one: Callable[[float, SimConfig], object]
                    ) -> tuple[list[tuple[int, float, int]], list[dict], list[dict], dict | None]:
    """The probe runs either engine's loop is fitted on: ``run_one(share, config)`` serves
    ``probe`` at each of ``probe_configs`` and returns its ``RunResult`` (a run cut short
    passes its stop on: ``kept_whole``). Returns each run's ``(gaps, seconds between steps,
    requests handed over while busy)`` for ``fit_engine_loop``, its row of the probe's report,
    its summary, and what a search took past its stage times in them
    (``search_lag_in_runs``; None without a real search). Both engines' summaries count
    their loops under the same names (``engine_between_steps``, ``engine_between_steps_s``,
    ``engine_requests_while_busy``), each by its engine's own rule: vLLM's the requests handed
    over while it had work, the torch engine's the requests whose prefill began as the step
    before it ended."""
    points, runs, summaries, columns = [], [], [], []
    for share, cfg in probe_configs(config, capacity_rps):
        result = run_one(share, cfg)
        summary = kept_whole(result.summary)
        summaries.append(summary)
        columns.append(result.columns)
        gaps = int(summary.get("engine_between_steps", 0))
        between_s = float(summary.get("engine_between_steps_s", 0.0))
        requests = int(summary.get("engine_requests_while_busy", 0))
        points.append((gaps, between_s, requests))
        search = summary.get("search") or {}
        runs.append({"load": share, "rate_rps": cfg.rate_rps, "gaps": gaps,
                     "between_steps_s": between_s, "requests_while_busy": requests,
                     "gpu_busy_fraction": summary.get("gpu_busy_fraction"),
                     "search_interpreter_mean_s": search.get("interpreter_mean_s")})
    searched = all((s.get("search") or {}).get("mode") != "modelled" for s in summaries)
    search_lag = (search_lag_in_runs(columns, modelled_stage_s(probe, config),
                                     config.search_workers)
                  if config.search_latency == "trace" and searched else None)
    return points, runs, summaries, search_lag


def interpreter_per_search(summaries: Iterable[dict]) -> tuple[float, int]:
    """``(seconds a search, searches)``: the search threads' interpreter time per search over
    the runs' summaries (0 where none searched a real index)."""
    seconds, searches = 0.0, 0
    for summary in summaries:
        search = summary.get("search") or {}
        seconds += float(search.get("interpreter_s_total", 0.0))
        searches += int(search.get("searches_run", 0))
    return (seconds / searches if searches else 0.0), searches


# fewer searches than this measure no lag worth charging
SEARCH_LAG_MIN_SEARCHES = 8


def modelled_stage_s(trace: Trace, config: SimConfig) -> np.ndarray:
    """Each request's search as the simulation times it before its hand-off: the
    simulation's own ``StagedSearch`` of the trace's measured stage times (times
    ``search_time_scale``), so that the lag is read against exactly what it waits."""
    from ragsim.serving.retrieval import StagedSearch

    search = StagedSearch(trace, lambda i: [], stages=1, search_s=0.0, source="trace", seed=0,
                          latency="trace", time_scale=float(config.search_time_scale))
    return np.array([search.total_s(i) for i in range(trace.n_requests)])


def search_lag_in_runs(runs: Iterable[dict[str, np.ndarray]], stage_s: np.ndarray,
                       workers: int) -> dict | None:
    """What a search takes past its stage times in the probe runs, beside their engine (``runs``:
    each run's per-request columns, in the order of ``stage_s``, each request's modelled stage
    time): its end less its arrival less its stage time, over the searches that found a worker
    free at their arrival (a wait behind other searches the simulation's pool models apart). The
    mean is what the simulation should add to each search (``search_dispatch_s`` +
    ``search_handoff_s``); the searches that arrived while the engine had work (another request
    between its search's end and its finish) and while it had none are reported apart. Why: the
    hand-off probe times the pool and the clock in a process without the engine, at rest, and on
    the project's CPU it read 0.52-0.62 ms where the runs' searches took 1.0-1.2 ms past their
    stage times, at every load, beside a busy engine or an idle one alike (docs/validation.md,
    "Run AZ"). The lag is then split where the run's record splits it: its start less its
    arrival (``dispatch_s``: the front end handing it over, before a worker took it; the
    record's ``search_wait``) and its end less its start less its stage time (``handoff_s``: the
    worker's hand-off, inside the search), so that each of the simulation's two parts
    (``search_dispatch_s``, ``search_handoff_s``) is counted where the run counts it. None with
    fewer than ``SEARCH_LAG_MIN_SEARCHES`` such searches."""
    busy_lags: list[float] = []
    idle_lags: list[float] = []
    dispatches: list[float] = []
    for cols in runs:
        arrival = np.asarray(cols["arrival_s"], float)
        start = np.asarray(cols["search_start_s"], float)
        end = np.asarray(cols["search_end_s"], float)
        finish = np.asarray(cols["finish_s"], float)
        finish = np.where(np.isnan(finish), np.inf, finish)  # in the engine to the end
        lag = end - arrival - stage_s
        for i in np.flatnonzero(np.isfinite(lag) & np.isfinite(start)):
            t = arrival[i]
            others = np.arange(len(arrival)) != i
            if int(np.sum(others & (start <= t) & (t < end))) >= workers:
                continue  # every worker busy: the pool's queue, not the hand-off
            busy = bool(np.any(others & (end <= t) & (t < finish)))
            (busy_lags if busy else idle_lags).append(float(lag[i]))
            dispatches.append(float(start[i] - t))
    lags = busy_lags + idle_lags
    if len(lags) < SEARCH_LAG_MIN_SEARCHES:
        return None
    lag_s = max(0.0, float(np.mean(lags)))
    dispatch_s = min(max(0.0, float(np.mean(dispatches))), lag_s)
    return {"lag_s": lag_s, "dispatch_s": dispatch_s, "handoff_s": lag_s - dispatch_s,
            "searches": len(lags),
            "median_lag_s": float(np.median(lags)),
            "busy_mean_lag_s": float(np.mean(busy_lags)) if busy_lags else None,
            "busy_searches": len(busy_lags),
            "idle_mean_lag_s": float(np.mean(idle_lags)) if idle_lags else None,
            "idle_searches": len(idle_lags)}


def torch_engine_loop(trace: Trace, config: SimConfig, profile: Profile, *, served: int,
                      capacity_rps: float,
                      run: Callable[[Trace, SimConfig, Profile], object],
                      engine_step: Callable[[], Callable[[], object]] | None = None,
                      threads: int | None = None) -> dict:
    """The torch engine's loop in real runs of ``config`` (``run``: one real run on a fresh
    engine, returning its ``RunResult``), on the trace's requests past the ``served`` ones, at
    each of ``LOOP_PROBE_LOADS`` x ``capacity_rps``, as vLLM's probe measures its engine's
    (``realrun/vllm/loop.py``): each run's time between the steps of its busy engine
    (``TorchIterations.between_steps_s``) fitted as ``step_s`` a gap plus ``request_s`` a
    request whose prefill began as the step before it ended (``fit_engine_loop``; the torch
    profile times its passes from their inputs, so no intake is in its prices to take off).
    And what a search beside the busy engine costs it: the search threads' interpreter time per
    search there (``interpreter_s``) and, given ``engine_step`` (called after the runs: one
    step of the last run's engine, on ``threads``, as vLLM's probe steps its run's engine after
    the run), the engine's steps timed beside the trace's searches (``search_cost``:
    ``realrun/search_cost.py``), which is ``search_s`` where measured (what
    ``EngineLoop.search_s`` charges), else the interpreter time. Also the searches and each
    run's own figures."""
    rows, held_aside = probe_rows(trace.n_requests, served)
    probe = trace.select(np.asarray(rows))
    points, runs, summaries, search_lag = probe_loop_runs(
        probe, config, capacity_rps, lambda _share, cfg: run(probe, cfg, profile))
    step_s, request_s = fit_engine_loop(points)
    interpreter_s, searches = interpreter_per_search(summaries)
    search_cost = None
    if engine_step is not None and config.search_latency == "trace":
        search_cost = measure_search_cost(probe, config.search_workers, engine_step(), threads)
    search_s = charged_search_s(interpreter_s, search_cost)
    return {"step_s": step_s, "request_s": request_s, "fitted_request_s": request_s,
            "quiet_intake_s": 0.0, "search_s": search_s, "searches": searches,
            "interpreter_s": interpreter_s, "search_cost": search_cost, "runs": runs,
            "requests": len(rows), "held_aside": held_aside,
            "search_lag": search_lag}


def outside_passes_s(decision: dict) -> float:
    """A torch iteration's time outside its timed passes and its copies (its stamped
    duration less ``passes_s``, the exposed swap-in copy and the decode batch's write, which
    the profile prices apart): the engine's own work around the passes."""
    return (decision["end_s"] - decision["start_s"] - decision.get("passes_s", 0.0)
            - decision.get("swap_copy_s", 0.0) - (decision.get("batch_copy_s") or 0.0))


def step_costs_in_runs(decisions: Iterable[list[dict]], profile: Profile
                       ) -> tuple[dict, object, object] | None:
    """What the torch engine's steps cost around their timed passes in real runs (the probe
    runs' ``decisions``), as the simulation prices it: a ``StepOverhead`` of four terms (a
    step, a row, and a step with prompts, a prompt more) fitted to each step's time outside
    its passes (``outside_passes_s``), and a ``BatchCopy`` fitted to the decode batch's
    writes as the engine timed them. Why: the profiler times the passes and the greedy
    sampling alone, and the batch's write on one shared prompt's KV, while the engine's steps
    also look its prompts' tokens up, keep their new KV, hand each row's token back and write
    rows whose KV lies in pieces: on the project's 2-core CPU (2026-12-07, run AU) a prompt
    step spent 0.29 ms outside its pass, a decode row 0.085 ms (the profile: 0.05), and a
    changed batch's write cost 2.4-3.4x its price. Fitted on group means by kind and rows
    (every step's time counts, a stray one no more than its share). None where the runs kept
    no steps. Returns the report (``profile_*``: the profile's own terms beside), the
    ``StepOverhead`` and the ``BatchCopy`` (None where no write was timed)."""
    from ragsim.profiles.batch_copy import BatchCopy
    from ragsim.profiles.fitting import relative_nnls
    from ragsim.profiles.steps import StepOverhead

    groups: dict[tuple[str, int], list[float]] = {}
    copies: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for run in decisions:
        for d in run or ():
            if "end_s" not in d or "passes_s" not in d:
                continue
            rows = len(d.get("jobs") or ()) if d["kind"] == "prefill" else int(d.get("size")
                                                                                or 0)
            groups.setdefault((d["kind"], rows), []).append(outside_passes_s(d))
            if d.get("batch_copy_s") is not None and (d.get("batch_rows") or 0) > 0:
                written, tokens = int(d["batch_rows"]), float(d["batch_row_tokens"])
                copies.setdefault((written, round(tokens / written / 64.0)), []).append(
                    (float(d["batch_copy_s"]), tokens))
    if not groups:
        return None
    keys = sorted(groups)
    counts = np.array([len(groups[k]) for k in keys], float)
    means = np.array([float(np.mean(groups[k])) for k in keys])
    design = np.array([[1.0, r, float(kind == "prefill"), float(r if kind == "prefill" else 0)]
                       for kind, r in keys])
    # group means, each weighted by its steps (relative errors: small and large steps count
    # alike, common shapes more)
    (step, row, prompt_step, prompt_row), errors = relative_nnls(design, np.maximum(means, 0.0),
                                                                 counts)
    fitted = design @ [step, row, prompt_step, prompt_row]
    by_kind = [{"kind": kind, "rows": r, "steps": int(n), "outside_mean_s": float(m),
                "fitted_s": float(f), "profile_s": profile.step_overhead_s(
                    r, r if kind == "prefill" else 0)}
               for (kind, r), n, m, f in zip(keys, counts, means, fitted, strict=True)]
    overhead = StepOverhead(float(step), float(row), {
        "points": len(keys), "steps": int(counts.sum()),
        "median_rel_error": float(np.median(errors)), "max_rel_error": float(errors.max()),
        "against": "the probe runs' steps, their time outside the timed passes and copies, "
                   "by kind and rows"}, float(prompt_step), float(prompt_row))
    copy = None
    if copies:
        keys_c = sorted(copies)
        counts_c = np.array([len(copies[k]) for k in keys_c], float)
        means_c = np.array([float(np.mean([c[0] for c in copies[k]])) for k in keys_c])
        design_c = np.array([[1.0, k[0], float(np.mean([c[1] for c in copies[k]]))]
                             for k in keys_c])
        (latency, per_row, per_row_token), errors_c = relative_nnls(design_c, means_c,
                                                                    counts_c)
        copy = BatchCopy(float(latency), float(per_row), float(per_row_token), {
            "statistic": "least squares of the probe runs' writes' means, by rows and tokens "
                         "a row (to 64), every term >= 0, weighted by sqrt(writes) / seconds",
            "groups": len(keys_c), "writes": int(counts_c.sum()),
            "median_abs_rel_error": float(np.median(errors_c)),
            "max_abs_rel_error": float(np.max(errors_c))})
    measured_s = float(sum(c[0] for v in copies.values() for c in v))
    priced_s = float(sum(profile.batch_copy_s(r, c[1]) for (r, _), v in copies.items()
                         for c in v))
    return {"step_overhead": overhead.to_dict(), "batch_copy": copy and copy.to_dict(),
            "profile_step_overhead": profile.step_overhead and profile.step_overhead.to_dict(),
            "profile_batch_copy": profile.batch_copy and profile.batch_copy.to_dict(),
            "steps": int(counts.sum()), "by_kind": by_kind,
            "writes": int(sum(len(v) for v in copies.values())),
            "writes_measured_s": measured_s,
            "writes_profile_priced_s": priced_s}, overhead, copy


def torch_decode_step(model, seed: int) -> Callable[[], None]:
    """One decode step of the reference engine's ``model`` (a ``TorchModel``, a run's:
    ``SEARCH_COST_ROWS`` rows of ``SEARCH_COST_CONTEXT_TOKENS``, the workload vLLM's probe
    steps too), undone after so that it can be run again: the torch engine's search-cost
    workload, on the engine that served the probe runs (its own rows, apart from any run's)."""
    from ragsim.profiles.torch_model import Row

    rng = np.random.default_rng(seed)
    vocab = model.spec.vocab_size
    state = model.prepare([Row(None, rng.integers(0, vocab, SEARCH_COST_CONTEXT_TOKENS), 0)
                           for _ in range(SEARCH_COST_ROWS)])
    model.forward(state)
    ids = rng.integers(0, vocab, SEARCH_COST_ROWS)

    def step() -> None:
        model.decode(state, ids)
        model.undo_decode(state)
        model.sync()

    return step
