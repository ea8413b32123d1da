"""What a fleet's two drivers share: routing a trace ahead, and the fleet's summary.

The simulated fleet (``ragsim.sim.fleet``) and the real one (``ragsim.realrun.fleet``) route
with the same router objects (``ragsim.cache.routers``) and report alike: the one-engine
summary over every replica's records, with the engines' counters summed (GPU busy fraction:
the replicas' mean), ``gpu_kv_bytes`` the fleet's total; ``replicas``, each replica's own
summary; ``load_imbalance``, the most requests a replica was sent over the mean (1.0: even);
``gpu_busy_imbalance``, the busiest replica's GPU busy time over the mean.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ragsim.cache.routers import STATELESS_ROUTERS, Router, RouteRequest
from ragsim.profiles.profile import Profile
from ragsim.serving.config import SimConfig
from ragsim.serving.summary import summarize
from ragsim.traces.schema import Trace

# the engines' counters the summary reads, summed over the replicas
_ENGINE = ("scheduler_decisions", "scheduler_s", "iterations_prefill", "iterations_decode",
           "iterations_mixed", "swap_in_s", "gpu_failures", "lost_bytes", "prefills_over_budget",
           "padded_apart")
_TREE = ("swap_in_bytes", "swap_out_bytes", "replica_bytes", "evictions_gpu",
         "evictions_host", "gpu_capacity_bytes")
_POOL = ("reordered", "overdue_served")
_PIPELINE = ("spec_wasted_tokens", "unseen_failures", "retries")
# a replica's summary leaves out what only the fleet's says
_FLEET_ONLY = ("config", "trace_info", "cost_extrapolations", "warnings")


def fleet_problem(config: SimConfig, backend: str = "sim") -> str | None:
    """Why this configuration cannot run as a fleet on ``backend`` (None: it can)."""
    if config.replicas == 1:
        return None
    if config.arrival == "sequential":
        return "sequential arrivals (one request at a time) have no fleet: one request is served"
    if config.answer_cache and backend != "sim":
        return ("a real fleet's answer cache in front of its replicas is not built: the "
                "simulated fleet has one")
    if config.fail_gpu_at_s:
        return "--fail-gpu-at names one GPU; a fleet takes --gpu-failure-rate (per replica)"
    if backend == "vllm":
        return ("a real fleet runs the torch engine (a thread each); vLLM's engine takes "
                "the machine")
    if backend != "sim" and config.router not in STATELESS_ROUTERS:
        return (f"a real fleet's replicas run on clocks of their own (a thread each), so its "
                f"router decides ahead: {', '.join(STATELESS_ROUTERS)}; {config.router} "
                "reads the replicas' live state: simulate it")
    if backend != "sim" and config.router_staleness_s:
        return "--router-staleness is the simulated router's; a real fleet's router decides ahead"
    return None


def route(trace: Trace, router: Router) -> np.ndarray:
    """Each request's replica, in trace order (the router sees each request's cached path,
    session and query, never a replica's cache)."""
    offsets = trace.doc_offsets.tolist()
    docs, tokens = trace.doc_ids.tolist(), trace.doc_tokens_flat.tolist()
    queries = trace.query_tokens.tolist()
    sessions = (trace.session_id.to_pylist() if trace.session_id is not None
                else [None] * trace.n_requests)
    chosen = np.empty(trace.n_requests, dtype=np.int64)
    for i in range(trace.n_requests):
        lo, hi = offsets[i], offsets[i + 1]
        chosen[i] = router.choose(RouteRequest(i, docs[lo:hi], tokens[lo:hi], sessions[i],
                                               queries[i]))
    return chosen


def _summed(objects, names) -> SimpleNamespace:
    return SimpleNamespace(**{n: sum(getattr(o, n) for o in objects) for n in names})


def replica_summary(replica, index: int, columns: dict, trace: Trace, profile: Profile,
                    now_s: float, elapsed_s: float, interrupted: bool, stalled: bool) -> dict:
    """A replica's own summary over its rows of the fleet's ``columns``, as a one-engine run
    of its requests reports it (its simulated time ends when its last request does)."""
    positions = np.flatnonzero(columns["replica"] == index)
    own = {name: values[positions] for name, values in columns.items()}
    if len(positions) and np.isfinite(own["finish_s"]).all():
        now_s = float(own["finish_s"].max())
    view = SimpleNamespace(
        n=len(positions), env=SimpleNamespace(now=now_s), engine=replica.engine,
        tree=replica.tree, pool=replica.pool, profile=profile,
        extrapolated_before=profile.extrapolated_queries, search=replica.search,
        kv=replica.kv, config=replica.config, trace=trace.select(positions),
        retrieval_turned_off=replica.retrieval_turned_off,
        **{name: getattr(replica, name) for name in _PIPELINE})
    summary = summarize(view, own, elapsed_s, interrupted, stalled)
    return {"replica": index, **{k: v for k, v in summary.items() if k not in _FLEET_ONLY}}


def fleet_summary(replicas: list, columns: dict, config: SimConfig, trace: Trace,
                  profile: Profile, extrapolated_before: int, now_s: float, elapsed_s: float,
                  interrupted: bool, stalled: bool, no_progress: str | None,
                  replica_summaries: list[dict] | None = None) -> dict:
    """The fleet's summary (see the module's docstring) from its replicas (pipelines, in
    order), the fleet's ``columns`` (with ``replica``) and the clock's end; each replica's
    summary is computed from its rows unless given."""
    engines = [p.engine for p in replicas]
    engine = _summed(engines, _ENGINE)
    engine.busy_s = float(np.mean([e.busy_s for e in engines]))  # the mean replica's
    view = SimpleNamespace(
        n=trace.n_requests, env=SimpleNamespace(now=now_s), engine=engine,
        tree=_summed([p.tree for p in replicas], _TREE),
        pool=_summed([p.pool for p in replicas], _POOL), profile=profile,
        extrapolated_before=extrapolated_before, search=replicas[0].search,
        kv=replicas[0].kv, config=config, trace=trace,
        retrieval_turned_off=replicas[0].retrieval_turned_off,
        **{name: sum(getattr(p, name) for p in replicas) for name in _PIPELINE})
    summary = summarize(view, columns, elapsed_s, interrupted, stalled, no_progress)
    if replica_summaries is None:
        replica_summaries = [replica_summary(p, r, columns, trace, profile, now_s, elapsed_s,
                                             interrupted, stalled)
                             for r, p in enumerate(replicas)]
    summary["replicas"] = replica_summaries
    routed = columns["replica"]
    counts = np.bincount(routed[routed >= 0], minlength=len(replicas))
    summary["load_imbalance"] = float(counts.max() / counts.mean()) if counts.any() else None
    busy = np.array([e.busy_s for e in engines])
    summary["gpu_busy_imbalance"] = float(busy.max() / busy.mean()) if busy.any() else None
    return summary
