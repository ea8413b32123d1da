"""The numbers a user reads after a run, computed once from the per-request columns."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from ragsim.cache.hit_rates import hit_rate_fields
from ragsim.serving.notices import repeated_documents, run_warnings

if TYPE_CHECKING:
    from ragsim.serving.pipeline import Pipeline


def _stats(values: np.ndarray, prefix: str) -> dict:
    values = values[np.isfinite(values)]
    if not len(values):
        return {f"{prefix}_{k}": None for k in ("mean_s", "p50_s", "p90_s", "p99_s")}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {f"{prefix}_mean_s": float(values.mean()), f"{prefix}_p50_s": float(p50),
            f"{prefix}_p90_s": float(p90), f"{prefix}_p99_s": float(p99)}


def _mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def _percentile_ms(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(1e3 * np.percentile(values, q)) if len(values) else None


def _last_request_event_s(cols: dict[str, np.ndarray]) -> float:
    times = np.concatenate([cols[c] for c in ("arrival_s", "search_start_s", "search_end_s",
                                              "prefill_start_s", "first_token_s", "finish_s")])
    times = times[np.isfinite(times)]
    return float(times.max()) if len(times) else 0.0


def _swap_in_after_search(cols: dict[str, np.ndarray]) -> np.ndarray:
    """The host->GPU copy each request's TTFT contains: its prefill iteration copies first
    (``[prefill_start, prefill_start + swap_in_s)``), and only the part after the search ended
    counts (a speculative prefill may have started during the search, whose time is already
    the search component). With the queue and the prefill it splits the time after the search,
    so the TTFT components still add up to the TTFT."""
    start = cols["prefill_start_s"]
    copy_end = np.minimum(start + cols["swap_in_s"], cols["first_token_s"])
    return np.clip(copy_end - np.maximum(cols["search_end_s"], start), 0, None)


TTFT_COMPONENTS = ("search_wait", "search", "queue", "swap_in", "prefill")

# What a run measures of the process that ran it (wall time, this CPU), not of the modelled
# system: every other column and field is the same for the same seed, these never are.
WALL_CLOCK_COLUMNS = ("decision_s",)
# summary fields that describe the machine or the writing, not what was simulated (a rerun with
# the same seed differs in these only): wall-clock measures, and the id that marks one written
# result's files as a set (ragsim.outputs)
WALL_CLOCK_FIELDS = ("elapsed_s", "sim_requests_per_wall_s", "sim_s_per_wall_s",
                     "scheduler_overhead_ms_per_decision", "decision_p50_ms", "decision_p99_ms",
                     "set_id")


def ttft_components(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each request's TTFT split into search wait + search + queue + host->GPU copy + prefill
    (non-overlapping; they add up to ``ttft_s``; speculation shrinks the part after the search,
    possibly to zero). NaN where a request has no first token."""
    after_search = cols["first_token_s"] - cols["search_end_s"]
    queue = np.clip(cols["prefill_start_s"] - cols["search_end_s"], 0, None)
    queue = np.minimum(queue, after_search)
    swap_in = _swap_in_after_search(cols)
    return {"search_wait": cols["search_start_s"] - cols["arrival_s"],
            "search": cols["search_end_s"] - cols["search_start_s"],
            "queue": queue, "swap_in": swap_in,
            "prefill": after_search - queue - swap_in}


def position_free_fields(cols: dict[str, np.ndarray], served: np.ndarray) -> dict:
    """With position-free reuse (``--reuse blend/epic``): the hit tokens found outside the
    exact prefix (GPU and host; they are in ``hit_tokens_*`` too) and the tokens of them the
    engine recomputed. None without it: a prefix run's summary is as before."""
    if "position_free_hit_tokens" not in cols:
        return {}
    return {"position_free_hit_tokens": int(cols["position_free_hit_tokens"][served].sum()),
            "blend_recomputed_tokens": int(cols["blend_recomputed_tokens"][served].sum())}


def summarize(sim: Pipeline, cols: dict[str, np.ndarray], elapsed_s: float,
              interrupted: bool = False, stalled: bool = False,
              no_progress: str | None = None) -> dict:
    """``interrupted``: cut short by Ctrl-C; ``stalled``: the simulation ran out of events with
    requests still pending (a bug: those requests could never end). Both keep what ended."""
    completed = cols["status"] == "completed"
    n_done = int(completed.sum())
    n_failed = int((cols["status"] == "failed").sum())
    # a stalled run ends when the last request moved; its clock may have ticked on to the
    # background process's next wake-up, which is not simulated work
    simulated_s = _last_request_event_s(cols) if stalled else float(sim.env.now)
    first_arrival = float(cols["arrival_s"].min()) if len(cols["arrival_s"]) else 0.0
    last_finish = float(np.nanmax(cols["finish_s"])) if n_done or n_failed else first_arrival
    span_s = max(last_finish - first_arrival, 1e-12)
    served = np.isfinite(cols["first_token_s"])
    doc_tokens = int(cols["doc_tokens"][served].sum())
    hit_gpu = int(cols["hit_tokens_gpu"][served].sum())
    hit_host = int(cols["hit_tokens_host"][served].sum())
    hit_any = (cols["hit_tokens_gpu"] + cols["hit_tokens_host"])[served] > 0
    self_hits = int(cols["speculative_self_hit_tokens"][served].sum())
    ttft = np.where(completed, cols["ttft_s"], np.nan)
    components = ttft_components(cols)
    engine = sim.engine
    tree = sim.tree
    pool = sim.pool
    output_tokens = int(cols["output_tokens"][completed].sum())
    reasons = Counter(str(r) for r in cols["fail_reason"][cols["status"] == "failed"])
    spec_requests = cols["speculations"] > 0
    summary = {
        "requests": int(sim.n),
        "requests_completed": n_done,
        "requests_failed": n_failed,
        "requests_pending": int(sim.n) - n_done - n_failed,  # > 0 only if cut short
        "interrupted": interrupted,
        "stalled": stalled,
        "pending_request_ids": cols["request_id"][cols["status"] == "pending"][:20].tolist()
        if stalled else [],
        # the clock may have run on to a periodic tick that found nothing left: when a request
        # last moved is when the run stalled
        "stalled_at_s": simulated_s if stalled else None,
        # set when the watchdog stopped a run that made no progress: why, in the flags' terms
        "no_progress": no_progress,
        "failed_by_reason": dict(sorted(reasons.items())),
        **_stats(ttft, "ttft"),
        "tpot_mean_s": _mean(cols["tpot_s"]),
        **_stats(cols["e2e_s"], "e2e"),
        "throughput_rps": n_done / span_s,
        "throughput_tokens_s": output_tokens / span_s,
        # cross-request reuse only: hits on documents a request's own earlier (wasted)
        # speculation computed are counted apart
        **hit_rate_fields(doc_tokens, hit_gpu, hit_host, hit_any),
        "speculative_self_hit_tokens": self_hits,
        "speculative_self_hit_rate": self_hits / doc_tokens if doc_tokens else 0.0,
        "recomputed_tokens": int(cols["recomputed_tokens"][served].sum()),
        **position_free_fields(cols, served),
        "swap_in_bytes": int(tree.swap_in_bytes),
        "swap_out_bytes": int(tree.swap_out_bytes),
        "replica_bytes": int(tree.replica_bytes),
        "evictions_gpu": int(tree.evictions_gpu),
        "evictions_host": int(tree.evictions_host),
        **{f"ttft_{name}_mean_s": _mean(np.where(completed, values, np.nan))
           for name, values in components.items()},
        "speculations_started": int(cols["speculations"].sum()),
        "speculation_requests": int(spec_requests.sum()),
        "speculation_kept": int(cols["speculation_kept"].sum()),
        "speculation_wasted_s": float(cols["speculation_wasted_s"].sum()),
        "speculation_wasted_tokens": int(sim.spec_wasted_tokens),
        "scheduler_decisions": int(engine.scheduler_decisions),
        "scheduler_overhead_ms_per_decision": (
            1e3 * engine.scheduler_s / engine.scheduler_decisions
            if engine.scheduler_decisions else 0.0),
        # per request, the wall time the policy core spent admitting it (the paper: < 1 ms)
        "decision_p50_ms": _percentile_ms(cols["decision_s"], 50),
        "decision_p99_ms": _percentile_ms(cols["decision_s"], 99),
        "reordered_decisions": int(pool.reordered),
        "window_forced_decisions": int(pool.overdue_served),
        "iterations_prefill": int(engine.iterations_prefill),
        "iterations_decode": int(engine.iterations_decode),
        "iterations_mixed": int(engine.iterations_mixed),
        # times a padded engine's batch left the next prompt for a later step (config
        # padded_join; a prompt passed over again under reordering counts each time)
        "prompts_padded_apart": int(engine.padded_apart),
        "gpu_busy_fraction": engine.busy_s / simulated_s if simulated_s > 0 else 0.0,
        "swap_in_s": float(engine.swap_in_s),
        # with those of an already failed, empty system that were counted, not simulated
        "gpu_failures": int(engine.gpu_failures) + int(sim.unseen_failures),
        "gpu_failure_lost_bytes": int(engine.lost_bytes),
        "retries": int(sim.retries),
        "cost_extrapolations": int(sim.profile.extrapolated_queries - sim.extrapolated_before),
        "simulated_s": simulated_s,
        "elapsed_s": elapsed_s,
        # over the requests that ended: an interrupted run did not simulate the rest
        "sim_requests_per_wall_s": (n_done + n_failed) / elapsed_s if elapsed_s > 0
        else float("inf"),
        "sim_s_per_wall_s": simulated_s / elapsed_s if elapsed_s > 0 else float("inf"),
        "stage_source": sim.search.source,
        "kv_bytes_per_token": int(sim.kv),
        "gpu_kv_bytes": int(tree.gpu_capacity_bytes),
        "profile": sim.profile.name,
        "config": sim.config.to_dict(),
        "trace_info": sim.trace.info,
    }
    summary["warnings"] = run_warnings(
        arrival_s=cols["arrival_s"], finish_s=cols["finish_s"], completed=n_done,
        simulated_s=simulated_s, extrapolations=summary["cost_extrapolations"],
        profile=sim.profile.name, retrieval_turned_off=sim.retrieval_turned_off,
        trace_info=sim.trace.info or {},
        system_prompt_tokens=sim.config.system_prompt_tokens,
        prefills_over_budget=engine.prefills_over_budget,
        max_batched_tokens=sim.config.max_batched_tokens,
        repeated_documents=repeated_documents(sim.trace.doc_offsets, sim.trace.doc_ids,
                                              sim.config.top_k))
    return summary
