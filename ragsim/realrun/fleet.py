"""``ragsim run --backend torch --replicas N``: a real fleet, N real engines behind one router.

Each replica is a whole real run (``RealRun``: its own model with the same weights, its own
KV store, knowledge tree, search workers and wall clock) on a thread of its own; torch runs
its forward passes without the interpreter lock, so the replicas serve at once. The router is
the simulator's object (``ragsim.cache.routers``), deciding ahead in trace order, which the
routers that read nothing of the replicas (round-robin, random, session) decide the same at
arrival: the arrival process is drawn once for the fleet, each replica serves the requests
sent to it on their arrival times, and every replica's clock starts at the same instant (a
barrier after the speed probes), on the fleet's first arrival. A router that reads the
replicas' live state would need one clock across the threads: the simulator has it.

The summary is the simulated fleet's (``ragsim.serving.fleet``), each replica's own real-run
summary under ``replicas``; the real engine's accounting at the fleet's level: the speed
probes' ratios (the replicas' geometric mean) and the cost model's errors over every
replica's iterations.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable

import numpy as np

from ragsim.cache.routers import make_router
from ragsim.errors import RagsimInputError
from ragsim.profiles.profile import Profile
from ragsim.realrun.harness import RealRun, cost_model_errors
from ragsim.serving.config import SimConfig
from ragsim.serving.fleet import fleet_problem, fleet_summary, route
from ragsim.serving.pipeline import RunResult, planned_arrivals, requests_to_run, resolve_retrieval
from ragsim.traces.schema import Trace

# the real run's own fields a replica's summary keeps (the fleet's say the rest)
_REAL_FIELDS = ("backend", "device", "model", "threads")


def run_real_fleet(trace: Trace, config: SimConfig, profile: Profile, *, device: str = "cpu",
                   threads: int | None = None, seed: int = 0,
                   progress: Callable[[int, float], None] | None = None) -> RunResult:
    problem = fleet_problem(config, "torch")
    if problem is not None:
        raise RagsimInputError(problem, field="--replicas")
    trace = requests_to_run(trace, config)
    config = resolve_retrieval(config, trace)
    arrivals = planned_arrivals(trace, config)
    timed = dataclasses.replace(trace, arrival_s=arrivals)
    chosen = route(timed, make_router(config.router, config.replicas, seed=config.seed))
    own = config.replace(arrival="trace", rate_rps=None, n_requests=None, replicas=1)
    origin_s = float(arrivals.min()) if len(arrivals) else 0.0
    start = threading.Barrier(config.replicas)
    started = time.perf_counter()
    extrapolated_before = profile.extrapolated_queries
    ended = [0] * config.replicas
    lock = threading.Lock()

    def reporter(r: int):
        def advanced(done: int, now_s: float) -> None:
            with lock:
                ended[r] = done
                if progress is not None:
                    progress(sum(ended), now_s)
        return advanced

    parts = []
    for r in range(config.replicas):
        positions = np.flatnonzero(chosen == r)
        parts.append((positions, RealRun(
            timed.select(positions), own.replace(seed=config.seed + r), profile,
            device=device, threads=threads, model_seed=seed, progress=reporter(r),
            clock_start_s=origin_s, start=start)))
    results: list[RunResult | None] = [None] * config.replicas
    errors: list[BaseException] = []

    def serve(r: int) -> None:
        try:
            results[r] = parts[r][1].run()
        except BaseException as exc:
            errors.append(exc)
            start.abort()  # the others must not wait for this one at the barrier

    workers = [threading.Thread(target=serve, args=(r,), name=f"ragsim-replica-{r}")
               for r in range(config.replicas)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    real_errors = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if errors:
        raise (real_errors or errors)[0]
    elapsed_s = time.perf_counter() - started
    return _merged(timed, config, profile, parts, results, extrapolated_before, elapsed_s)


def _merged(trace: Trace, config: SimConfig, profile: Profile, parts: list, results: list,
            extrapolated_before: int, elapsed_s: float) -> RunResult:
    n = trace.n_requests
    positions = np.concatenate([p for p, _ in parts])
    order = np.argsort(positions, kind="stable")
    names = list(results[0].columns)
    columns = {name: np.concatenate([r.columns[name] for r in results])[order]
               for name in names}
    columns["replica"] = np.concatenate([np.full(len(p), r, dtype=np.int64)
                                         for r, (p, _) in enumerate(parts)])[order]
    assert len(columns["replica"]) == n
    runs = [run for _, run in parts]
    replica_summaries = []
    for r, result in enumerate(results):
        own = {k: v for k, v in result.summary.items()
               if k not in ("config", "trace_info", "warnings", "cost_extrapolations")}
        replica_summaries.append({"replica": r, **own})
    summary = fleet_summary(
        runs, columns, config, trace, profile, extrapolated_before,
        max(run.env.now for run in runs), elapsed_s,
        any(r.summary["interrupted"] for r in results),
        any(r.summary["stalled"] for r in results),
        next((r.summary["no_progress"] for r in results if r.summary.get("no_progress")), None),
        replica_summaries)
    first = results[0].summary
    summary.update({name: first[name] for name in _REAL_FIELDS})
    summary["search"] = first["search"]
    log = [entry for run in runs if run.iterations is not None for entry in run.iterations.log]
    summary["cost_model_errors"] = cost_model_errors(log, profile)
    for side in ("before", "after"):
        ratios = [r.summary.get(f"speed_ratio_{side}") for r in results]
        if all(ratios):
            summary[f"speed_ratio_{side}"] = math.exp(np.mean(np.log(ratios)))
    return RunResult(config=config, columns=columns, summary=summary)
