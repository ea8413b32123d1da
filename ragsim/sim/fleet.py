"""``ragsim run --replicas N --router R``: a fleet of engines behind one router, simulated.

The arrival process is drawn once for the whole traffic (``--rate`` is the fleet's rate); the
router (``ragsim.cache.routers``) then sends each request, in arrival order, to a replica; each
replica is the whole pipeline (its own search workers, scheduler, knowledge tree, GPU and host
memory, failures seeded ``seed + replica``) serving the requests it was sent on their arrival
times. For the routers that decide without the replicas' load (round-robin, random, session,
prefix-affinity by its cache rule) the replicas never interact, so each is simulated on its own
and the fleet is their union, exactly; a load-aware router (least-loaded, prefix-affinity's load
fallback) needs one clock for all and is not built yet.

The fleet's summary is the one-engine summary computed over every replica's records, with the
engines' counters summed (GPU busy fraction: the replicas' mean), ``gpu_kv_bytes`` the fleet's
total, and ``replicas``: each replica's own summary.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import numpy as np

from ragsim.cache.routers import TIMING_FREE_ROUTERS, make_router
from ragsim.profiles.profile import Profile
from ragsim.serving.config import SimConfig
from ragsim.serving.pipeline import Progress, RunResult, planned_arrivals, requests_to_run
from ragsim.serving.summary import summarize
from ragsim.sim.replay import route
from ragsim.sim.simulator import Simulation
from ragsim.traces.schema import Trace

# the engines' counters the summary reads, summed over the replicas
_ENGINE = ("scheduler_decisions", "scheduler_s", "iterations_prefill", "iterations_decode",
           "iterations_mixed", "swap_in_s", "gpu_failures", "lost_bytes", "prefills_over_budget")
_TREE = ("swap_in_bytes", "swap_out_bytes", "replica_bytes", "evictions_gpu",
         "evictions_host", "gpu_capacity_bytes")
_POOL = ("reordered", "overdue_served")
_PIPELINE = ("spec_wasted_tokens", "unseen_failures", "retries")


def fleet_problem(config: SimConfig) -> str | None:
    """Why this configuration cannot run as a fleet yet (None: it can)."""
    if config.replicas == 1:
        return None
    if config.router not in TIMING_FREE_ROUTERS:
        return (f"router {config.router!r} decides by the replicas' load, which needs one clock "
                f"for the whole fleet (not built yet); the fleet runs "
                f"{', '.join(TIMING_FREE_ROUTERS)}")
    if config.arrival == "sequential":
        return "sequential arrivals (one request at a time) have no fleet: one request is served"
    if config.answer_cache:
        return "an answer cache shared by the replicas is not built yet"
    if config.fail_gpu_at_s:
        return "--fail-gpu-at names one GPU; a fleet takes --gpu-failure-rate (per replica)"
    return None


def _summed(objects, names) -> SimpleNamespace:
    return SimpleNamespace(**{n: sum(getattr(o, n) for o in objects) for n in names})


def run_fleet(trace: Trace, config: SimConfig, profile: Profile,
              progress: Progress | None = None) -> RunResult:
    problem = fleet_problem(config)
    if problem is not None:
        raise ValueError(problem)
    started = time.perf_counter()
    trace = requests_to_run(trace, config)
    arrivals = planned_arrivals(trace, config)
    timed = dataclasses.replace(trace, arrival_s=arrivals)
    chosen = route(timed, make_router(config.router, config.replicas, seed=config.seed))
    own_config = config.replace(arrival="trace", rate_rps=None, n_requests=None, replicas=1)
    extrapolated_before = profile.extrapolated_queries
    sims, results, parts = [], [], []
    ended_before = 0
    for replica in range(config.replicas):
        positions = np.flatnonzero(chosen == replica)
        if not len(positions):
            continue

        def advanced(done: int, now_s: float, before: int = ended_before) -> None:
            if progress is not None:
                progress(before + done, now_s)

        sim = Simulation(timed.select(positions), own_config.replace(seed=config.seed + replica),
                         profile, advanced)
        result = sim.run()
        sims.append(sim)
        results.append((replica, result))
        parts.append({**result.columns, "replica": np.full(len(positions), replica),
                      "_position": positions})
        ended_before += len(positions)
        if result.summary["interrupted"] or result.summary["stalled"]:
            break  # Ctrl-C or a stall: the replicas after this one did not run
    order = np.argsort(np.concatenate([p["_position"] for p in parts]), kind="stable")
    columns = {name: np.concatenate([p[name] for p in parts])[order]
               for name in parts[0] if name != "_position"}
    engines = [s.engine for s in sims]
    engine = _summed(engines, _ENGINE)
    engine.busy_s = float(np.mean([e.busy_s for e in engines]))  # the mean replica's fraction
    view = SimpleNamespace(
        n=trace.n_requests, env=SimpleNamespace(now=max(s.env.now for s in sims)),
        engine=engine, tree=_summed([s.tree for s in sims], _TREE),
        pool=_summed([s.pool for s in sims], _POOL), profile=profile,
        extrapolated_before=extrapolated_before, search=sims[0].search, kv=sims[0].kv,
        config=config, trace=trace,
        retrieval_turned_off=any(s.retrieval_turned_off for s in sims),
        **{n: sum(getattr(s, n) for s in sims) for n in _PIPELINE})
    interrupted = any(r.summary["interrupted"] for _, r in results)
    stalled = any(r.summary["stalled"] for _, r in results)
    no_progress = next((r.summary["no_progress"] for _, r in results
                        if r.summary.get("no_progress")), None)
    summary = summarize(view, columns, time.perf_counter() - started, interrupted, stalled,
                        no_progress)
    summary["replicas"] = [{"replica": replica, **{k: v for k, v in r.summary.items()
                                                    if k not in ("config", "trace_info")}}
                           for replica, r in results]
    counts = np.bincount(chosen, minlength=config.replicas)
    summary["load_imbalance"] = float(counts.max() / counts.mean())
    return RunResult(config=config, columns=columns, summary=summary)
