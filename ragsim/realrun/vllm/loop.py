"""The real vLLM run's engine loop, measured through the run's own loop: what the simulation of
such a run charges on the engine's timeline besides the steps (``serving.engine_loop``).

ragsim's real vLLM run steps vLLM's in-process engine on the same thread as its pipeline: between
two steps of a busy engine that thread hands the last step's outputs back, runs the pipeline's
events (arrivals, search stages) and hands new requests over (vLLM's ``add_request``). Taken
apart on the project's CPU (docs/validation.md, "The vLLM run's engine thread between steps"):
1.01 ms a gap at 90% load, 0.46 ms at 50%; half of it vLLM's intake, which costs 1.9-3.9x in a
run what it costs on a quiet engine, the rest the harness's.

A profile times the engine alone, so it cannot hold this; read off the runs it would be judged
on, it would be the answer. So ``measure_engine_loop`` runs the real run itself, on requests the
validation does not serve (the trace's rows past them), at two loads, and fits the time between
steps of a busy engine as

    time between steps = step_s x gaps + request_s x requests handed over while busy

(least squares, both terms >= 0: ``fit_engine_loop``). The profile's prefill prices already
hold each request's intake as a quiet engine pays it (``VllmTimer._pass`` times a prefill from
its hand-over), so the same intake is timed on the probe's idle engine and taken off
``request_s``: the simulation charges only what the prices do not hold.

What a search beside the busy engine costs it (``search_s``) lands inside the engine's steps,
not between them, so the fit above cannot see it: on the last probe run's engine, its decode
steps are timed alone and beside the trace's searches (``search_cost_beside``,
``realrun/search_cost.py``), and the simulation charges the difference per request searched
while the engine was busy (``EngineLoop.search_s``). The runs' search threads' own interpreter
time per search (``RealSearch``: ``interpreter_s_total``) is reported beside it: a search costs
the engine several times what its threads hold.

Where the configuration runs RAGCache's connector (the ``ragcache`` system), the same runs time
the connector's work inside vLLM's steps (``connector_costs``): its scheduler side per request
the tree served, its saves and loads per token copied. The simulation prices them as part of
the steps (``serving.connector_costs``): a profile of vLLM times the engine without them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np

from ragsim.profiles.profile import Profile
from ragsim.realrun.probe_runs import (
    LOOP_PROBE_LOADS,
    LOOP_PROBE_REQUESTS,
    fit_engine_loop,
    interpreter_per_search,
    probe_loop_runs,
    probe_rows,
)
from ragsim.realrun.search_cost import charged_search_s
from ragsim.serving.config import SimConfig
from ragsim.traces.schema import Trace

__all__ = ["LOOP_PROBE_LOADS", "LOOP_PROBE_REQUESTS", "connector_costs", "fit_engine_loop",
           "measure_engine_loop", "probe_rows", "quiet_intake_s"]

QUIET_INTAKES = 40  # requests whose intake is timed on the probe's idle engine


def connector_costs(summaries: list[dict]) -> dict | None:
    """The connector's work per unit over the runs' summaries (their ``host_tier``, the
    connector's own timers: ``connector.RagsimTreeConnector``): ``request_s`` (its scheduler
    side's time over the requests the tree served), ``save_s_per_token`` and
    ``load_s_per_token`` (its worker's copies over the tokens they moved; 0 where the runs
    loaded nothing, so that the profile's transfers price the loads), with what they come
    from. None where no run had the connector."""
    tiers = [s["host_tier"] for s in summaries if s.get("host_tier")]
    if not tiers:
        return None
    total = {k: sum(float(t.get(k, 0)) for t in tiers)
             for k in ("scheduler_s", "tree_access_s", "requests_served", "save_s", "load_s")}
    saved = sum(int(t.get("blocks_copied_out", 0)) * int(t["block_tokens"]) for t in tiers)
    loaded = sum(int(t.get("blocks_copied_in", 0)) * int(t["block_tokens"]) for t in tiers)
    served = total["requests_served"]
    return {"request_s": total["scheduler_s"] / served if served else 0.0,
            "tree_access_s": total["tree_access_s"] / served if served else 0.0,
            "save_s_per_token": total["save_s"] / saved if saved else 0.0,
            "load_s_per_token": total["load_s"] / loaded if loaded else 0.0,
            "requests_served": int(served), "tokens_saved": saved, "tokens_loaded": loaded,
            "scheduler_s": total["scheduler_s"], "save_s": total["save_s"],
            "load_s": total["load_s"]}


def quiet_intake_s(run, prompts: list[list[int]]) -> float:
    """The median time vLLM's ``add_request`` takes on ``run``'s idle engine for ``prompts``,
    each aborted before the next: a request's intake as a quiet engine pays it, which is what
    the profile's prefill prices hold."""
    from ragsim.realrun.vllm.engine import greedy

    took = []
    for k, prompt in enumerate(prompts):
        key = f"loop-probe-intake-{k}"
        started = time.perf_counter()
        run.llm.add_request(key, {"prompt_token_ids": prompt}, greedy(1))
        took.append(time.perf_counter() - started)
        run.llm.abort_request([key])
    return float(np.median(took)) if took else 0.0


def search_cost_beside(run, trace: Trace, workers: int) -> dict | None:
    """What a search beside ``run``'s busy engine costs it (``realrun/search_cost.py``), on
    that engine after its run (``search_cost_on_engine``)."""
    return search_cost_on_engine(run.llm, run.profile.model.vocab_size,
                                 run.settings.max_model_len, trace, workers, run.settings.threads)


def search_cost_on_engine(llm, vocab_size: int, max_model_len: int, trace: Trace, workers: int,
                          threads: int | None) -> dict | None:
    """What a search beside vLLM engine ``llm`` costs it (``realrun/search_cost.py``):
    ``SEARCH_COST_ROWS`` requests of ``SEARCH_COST_CONTEXT_TOKENS`` decoding, their steps the
    workload, begun afresh before each pair of blocks (the same prompts, their KV cached after
    the first time) so that every pair times rows of about that context; the searches
    ``trace``'s (None: it has no real search). The requests are aborted after."""
    from ragsim.realrun.search_cost import (
        SEARCH_COST_CONTEXT_TOKENS,
        SEARCH_COST_ROWS,
        SEARCH_COST_STEPS,
        measure_search_cost,
    )
    from ragsim.realrun.vllm.engine import greedy

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, vocab_size, size=SEARCH_COST_CONTEXT_TOKENS).tolist()
               for _ in range(SEARCH_COST_ROWS)]
    # the first step, a block, then a pair's two blocks, with room to spare
    tokens = max(1, min(3 * SEARCH_COST_STEPS + 8,
                        max_model_len - SEARCH_COST_CONTEXT_TOKENS - 1))
    keys: list[str] = []
    renewals = itertools.count()

    def stop() -> None:
        if keys:
            llm.abort_request(keys)
        while llm.has_unfinished_requests():
            llm.step()

    def renew() -> None:
        stop()
        n = next(renewals)
        keys[:] = [f"search-cost-{n}-{k}" for k in range(SEARCH_COST_ROWS)]
        for key, prompt in zip(keys, prompts, strict=True):
            llm.add_request(key, {"prompt_token_ids": prompt}, greedy(tokens))
        llm.step()  # their prompts: the probe times their decode steps

    renew()
    try:
        return measure_search_cost(trace, workers, llm.step, threads, renew=renew)
    finally:
        stop()


def measure_engine_loop(trace: Trace, config: SimConfig, profile: Profile, *, served: int,
                        capacity_rps: float, threads: int | None = None, seed: int = 0,
                        on_result: Callable[[object], None] | None = None) -> dict:
    """The engine loop of this machine's real vLLM runs of ``config`` (see the module's
    docstring): a run of the trace's requests past the ``served`` ones at each of
    ``LOOP_PROBE_LOADS`` x ``capacity_rps`` (Poisson), each on a fresh engine, as a validation's
    real runs are. Returns ``step_s``, ``request_s`` (past the quiet intake) and ``search_s``
    (what a search beside the busy engine costs its steps, ``search_cost``; where the trace
    has no real search, the search threads' interpreter time per search, 0 without any) for
    the configuration, with what they come from, and ``connector`` (``connector_costs``;
    None without RAGCache's connector). ``on_result``: given each run's
    ``RunResult`` (its steps measure the step-time spread: ``ragsim.step_spread``)."""
    from ragsim.realrun.vllm.engine import release_engines
    from ragsim.realrun.vllm.harness import VllmRun

    rows, held_aside = probe_rows(trace.n_requests, served)
    probe = trace.select(np.asarray(rows))
    quiet, search_cost = 0.0, None

    def run_one(share: float, cfg: SimConfig):
        nonlocal quiet, search_cost
        run = VllmRun(probe, cfg, profile, seed=seed, speed_probes=False, threads=threads)
        result = run.run()
        if on_result is not None and not result.summary.get("interrupted"):
            on_result(result)
        if share == LOOP_PROBE_LOADS[-1] and not result.summary.get("interrupted"):
            quiet = quiet_intake_s(run, list(run.prompts.values())[:QUIET_INTAKES])
            if cfg.search_latency == "trace":
                search_cost = search_cost_beside(run, probe, cfg.search_workers)
        del run
        release_engines()  # the probe run's engine, dropped: its memory back
        return result

    points, runs, summaries, search_lag = probe_loop_runs(probe, config, capacity_rps,
                                                          run_one)
    step_s, request_s = fit_engine_loop(points)
    interpreter_s, searches = interpreter_per_search(summaries)
    search_s = charged_search_s(interpreter_s, search_cost)
    return {"step_s": step_s, "request_s": max(0.0, request_s - quiet),
            "fitted_request_s": request_s, "quiet_intake_s": quiet,
            "search_s": search_s, "searches": searches,
            "interpreter_s": interpreter_s, "search_cost": search_cost,
            "connector": connector_costs(summaries), "runs": runs, "requests": len(rows),
            "held_aside": held_aside, "search_lag": search_lag}
