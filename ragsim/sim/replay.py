"""``ragsim replay``: the trace, in order, through the policy core with no timing model.

This is the fast path for hit-rate studies: no queues, no batching, one request after another.
Per-request results are kept in columns (numpy), so a million requests stay cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ragsim.cache.hit_rates import hit_rate_fields
from ragsim.cache.policies import make_policy
from ragsim.cache.policies.belady import next_use_by_position
from ragsim.cache.reuse import engine_reuse_columns, parse_reuse
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, KnowledgeTree, check_frequency_scope
from ragsim.profiles.profile import Profile
from ragsim.serving.gc_pause import cyclic_gc_paused
from ragsim.serving.notices import repeated_documents, replay_warnings
from ragsim.traces.schema import Trace

Progress = Callable[[int], None]  # called with the number of requests done so far

PROGRESS_EVERY = 10_000


@dataclass(frozen=True)
class ReplayConfig:
    """Everything that determines a replay's result (it is echoed in the summary)."""

    trace: str
    policy: str = "pgdsf"
    model: str = "mistral-7b"
    kv_bytes_per_token: int = 131072
    gpu_capacity_bytes: int = 4 * 2**30
    host_capacity_bytes: int = 32 * 2**30
    flat: bool = False
    profile: str = "a10g-mistral-7b"
    system_prompt_tokens: int = 0
    max_cached_depth: int | None = None
    n_requests: int | None = None
    seed: int = 0
    # how every policy counts retrievals (admission | lifetime | window); see cache/tree.py
    frequency_scope: str = DEFAULT_FREQUENCY_SCOPE
    frequency_window_s: float | None = None  # the window scope's width, in trace seconds
    # a fleet: this many replicas behind one router, each with the memory above of its own
    replicas: int = 1
    router: str = "round-robin"
    # document KV reuse: prefix | blend:R | epic:K (ragsim/cache/reuse.py); the tree only
    reuse: str = "prefix"


@dataclass
class ReplayResult:
    config: ReplayConfig
    columns: dict[str, np.ndarray]  # per-request records, one array per field
    summary: dict

    @property
    def records(self) -> pd.DataFrame:
        return pd.DataFrame(self.columns)


def _record_columns(trace: Trace, cached: np.ndarray, hit_gpu: np.ndarray,
                    hit_host: np.ndarray, recomputed: np.ndarray, swap_in: np.ndarray,
                    free_gpu: np.ndarray | None = None, free_host: np.ndarray | None = None,
                    free_recompute: np.ndarray | None = None) -> dict[str, np.ndarray]:
    # what an engine reuses of what the cache found, as ``run`` counts it (a context cached
    # to the end recomputes its last token); a chunk at a time, so that the rule's temporary
    # columns stay small and in cache instead of faulting in fresh memory per operation
    n = len(cached)
    fields = ("doc_tokens", "cached_tokens", "hit_tokens_gpu", "hit_tokens_host",
              "recomputed_tokens", "position_free_hit_tokens", "blend_recomputed_tokens")
    free = free_gpu is not None
    columns = {name: np.empty(n, dtype=np.int64) for name in fields}
    query = trace.query_tokens
    for start in range(0, n, PROGRESS_EVERY):
        part = slice(start, min(n, start + PROGRESS_EVERY))
        u = engine_reuse_columns(cached[part], recomputed[part] + query[part], hit_gpu[part],
                                 hit_host[part], recomputed[part], 1,
                                 *((free_gpu[part], free_host[part], free_recompute[part])
                                   if free else ()))
        columns["doc_tokens"][part] = u.hit_tokens_gpu + u.hit_tokens_host + u.recomputed_tokens
        columns["cached_tokens"][part] = u.cached_tokens
        columns["hit_tokens_gpu"][part] = u.hit_tokens_gpu
        columns["hit_tokens_host"][part] = u.hit_tokens_host
        columns["recomputed_tokens"][part] = u.recomputed_tokens
        columns["position_free_hit_tokens"][part] = u.position_free_hit_tokens
        columns["blend_recomputed_tokens"][part] = u.blend_recomputed_tokens
    extra = ({name: columns[name] for name in ("position_free_hit_tokens",
                                                "blend_recomputed_tokens")} if free else {})
    return {
        "request_id": trace.request_id,
        "arrival_s": trace.arrival_s,
        "top_k": trace.top_k,
        "doc_tokens": columns["doc_tokens"],
        "query_tokens": trace.query_tokens,
        "cached_tokens": columns["cached_tokens"],
        "hit_tokens_gpu": columns["hit_tokens_gpu"],
        "hit_tokens_host": columns["hit_tokens_host"],
        "recomputed_tokens": columns["recomputed_tokens"],
        "swap_in_bytes": swap_in,
        **extra,
    }


def _in_chunks(n: int, step: Callable[[int, int], None], progress: Progress | None) -> int:
    """Call ``step(start, stop)`` over the requests in chunks; returns how many were done.
    Ctrl-C keeps the chunks that finished (see run_replay)."""
    done = 0
    try:
        for start in range(0, n, PROGRESS_EVERY):
            stop = min(n, start + PROGRESS_EVERY)
            step(start, stop)
            done = stop
            if progress is not None:
                progress(stop)
    except KeyboardInterrupt:
        pass
    return done


def replay_tree(trace: Trace, config: ReplayConfig, profile: Profile | None,
                progress: Progress | None = None) -> tuple[dict[str, np.ndarray], dict]:
    policy = make_policy(config.policy)
    if policy.needs_future:
        policy.prepare(trace.doc_offsets, trace.doc_ids, config.max_cached_depth)
    tree = KnowledgeTree(
        policy,
        gpu_capacity_bytes=config.gpu_capacity_bytes,
        host_capacity_bytes=config.host_capacity_bytes,
        kv_bytes_per_token=config.kv_bytes_per_token,
        prefill_cost_s=profile.prefill.at if policy.needs_cost else None,
        system_prompt_tokens=config.system_prompt_tokens,
        max_cached_depth=config.max_cached_depth,
        frequency_scope=config.frequency_scope,
        frequency_window_s=config.frequency_window_s,
        reuse=config.reuse,
    )
    n = trace.n_requests
    out = np.zeros((8 if tree.reuse.position_free else 5, n), dtype=np.int64)
    offsets = np.ascontiguousarray(trace.doc_offsets, dtype=np.int64)
    query = np.ascontiguousarray(trace.query_tokens, dtype=np.int64)
    # trace time, for the window frequency scope (traces are sorted by arrival)
    arrival = (np.ascontiguousarray(trace.arrival_s, dtype=np.float64)
               if config.frequency_scope == "window" else None)

    def step(start: int, stop: int) -> None:
        # the documents as Python ints (the tree's dictionary keys), one chunk at a time
        lo, hi = int(offsets[start]), int(offsets[stop])
        tree.access_many(trace.doc_ids[lo:hi].tolist(), trace.doc_tokens_flat[lo:hi].tolist(),
                         offsets, query, start, stop, out, arrival)

    with cyclic_gc_paused():
        done = _in_chunks(n, step, progress)
    records = _record_columns(trace.head(done), *out[:, :done])
    counters = {
        "requests_replayed": done,
        "swap_out_bytes": tree.swap_out_bytes,
        "evictions_gpu": tree.evictions_gpu,
        "evictions_host": tree.evictions_host,
        "admission_failures": tree.admission_failures,
        "tree_nodes": tree.node_count,
        "gpu_used_bytes": tree.gpu_used_bytes,
        "host_used_bytes": tree.host_used_bytes,
    }
    return records, counters


def replay_flat(trace: Trace, config: ReplayConfig, profile: Profile | None,
                progress: Progress | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Every document an independent object in one tier of ``gpu_capacity_bytes``."""
    policy = make_policy(config.policy)
    cost_per_token = None
    if policy.needs_cost:
        def cost_per_token(cached_tokens: int, tokens: int) -> float:
            return profile.prefill.at(cached_tokens, tokens) / tokens
    cache = policy.flat_cache(config.gpu_capacity_bytes, cost_per_token,
                              frequency_scope=config.frequency_scope,
                              frequency_window_s=config.frequency_window_s)
    tokens_flat = trace.doc_tokens_flat
    offsets = trace.doc_offsets
    n = trace.n_requests
    hits = bytearray()
    with cyclic_gc_paused():
        keys = trace.doc_ids.tolist()
        sizes = tokens_flat * config.kv_bytes_per_token
        tokens = tokens_flat.tolist() if cost_per_token is not None else None
        nexts = next_use_by_position(trace.doc_ids).tolist() if policy.needs_future else None
        # each document access at its request's arrival, for the window frequency scope
        times = (np.repeat(trace.arrival_s.astype(float), np.diff(offsets)).tolist()
                 if config.frequency_scope == "window" else None)

        def step(start: int, stop: int) -> None:
            nonlocal hits
            lo, hi = int(offsets[start]), int(offsets[stop])
            columns = (keys[lo:hi], sizes[lo:hi], None if tokens is None else tokens[lo:hi],
                       None if nexts is None else nexts[lo:hi])
            if times is None:
                hits += cache.process(*columns)
            else:
                hits += cache.process(*columns, times[lo:hi])

        done = _in_chunks(n, step, progress)
    # cut the requests never replayed (Ctrl-C), or they would count as misses
    trace = trace.head(done)
    tokens_flat, offsets, n = trace.doc_tokens_flat, trace.doc_offsets, done
    # a Ctrl-C between a chunk's hits and its count leaves that chunk's hits over: drop them
    hit_mask = np.frombuffer(hits, dtype=np.uint8).view(bool)[:int(offsets[done])]
    hit_gpu = _sum_per_request(np.where(hit_mask, tokens_flat, 0), offsets)
    recomputed = _sum_per_request(tokens_flat, offsets) - hit_gpu
    records = _record_columns(trace, hit_gpu + config.system_prompt_tokens, hit_gpu,
                              np.zeros(n, dtype=np.int64), recomputed,
                              np.zeros(n, dtype=np.int64))
    counters = {
        "requests_replayed": done,
        "swap_out_bytes": 0,
        "evictions_gpu": cache.evictions,
        "evictions_host": 0,
        "object_requests": len(hit_mask),
        "object_hits": int(hit_mask.sum()),
        "object_miss_ratio": float(1 - hit_mask.mean()) if len(hit_mask) else 0.0,
        "gpu_used_bytes": cache.used_bytes,
        "host_used_bytes": 0,
    }
    return records, counters


def _sum_per_request(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-request sums of a CSR-aligned int64 column (requests may have no documents)."""
    sums = np.zeros(len(offsets) - 1, dtype=np.int64)
    if len(values):
        cumulative = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
        sums = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    return sums


def replay_fleet(driver, trace: Trace, config: ReplayConfig, profile: Profile | None,
                 progress: Progress | None = None):
    """``config.replicas`` caches, each with the configured memory, behind ``config.router``:
    each replica replays the requests routed to it, in trace order. The records come back in
    trace order with a ``replica`` column; a Ctrl-C keeps the replicas that finished."""
    from ragsim.cache.routers import TIMING_FREE_ROUTERS, make_router
    from ragsim.serving.fleet import route

    if config.router not in TIMING_FREE_ROUTERS:
        raise ValueError(f"router {config.router!r} needs the simulator's clock; replay runs "
                         f"{', '.join(TIMING_FREE_ROUTERS)}")
    chosen = route(trace, make_router(config.router, config.replicas, seed=config.seed))
    parts, per_replica, totals = [], [], {}
    done_before = 0
    for replica in range(config.replicas):
        positions = np.flatnonzero(chosen == replica)
        own = trace.select(positions)

        def advanced(done: int, before: int = done_before) -> None:
            if progress is not None:
                progress(before + done)

        records, counters = driver(own, config, profile, advanced)
        done = counters["requests_replayed"]
        records = {**records, "replica": np.full(done, replica, dtype=np.int64),
                   "_position": positions[:done]}
        parts.append(records)
        doc = int(records["doc_tokens"].sum())
        hit_gpu = int(records["hit_tokens_gpu"].sum())
        hit_host = int(records["hit_tokens_host"].sum())
        any_hit = (records["hit_tokens_gpu"] + records["hit_tokens_host"]) > 0
        per_replica.append({"replica": replica, "requests": done, "doc_tokens": doc,
                            "hit_tokens_gpu": hit_gpu, "hit_tokens_host": hit_host,
                            **hit_rate_fields(doc, hit_gpu, hit_host, any_hit),
                            **{k: v for k, v in counters.items() if k != "requests_replayed"}})
        for name, value in counters.items():
            totals[name] = totals.get(name, 0) + value
        done_before += done
        if done < own.n_requests:  # Ctrl-C: the replicas after this one did not run
            break
    order = np.argsort(np.concatenate([p["_position"] for p in parts]), kind="stable")
    merged = {name: np.concatenate([p[name] for p in parts])[order]
              for name in parts[0] if name != "_position"}
    return merged, totals, per_replica


def _recorded(config: ReplayConfig) -> dict:
    """The configuration as the summary records it (``reuse`` only when not prefix, so a
    prefix replay's summary is as before)."""
    data = asdict(config)
    if config.reuse == "prefix":
        data.pop("reuse")
    return data


def run_replay(trace: Trace, config: ReplayConfig, profile: Profile | None = None,
               progress: Progress | None = None) -> ReplayResult:
    if make_policy(config.policy).needs_cost and profile is None:
        raise ValueError(f"{config.policy} needs a profile (prefill costs)")
    check_frequency_scope(config.frequency_scope, config.frequency_window_s)
    if config.flat and parse_reuse(config.reuse).position_free:
        raise ValueError("a flat cache has no positions: position-free reuse applies to the tree")
    started = time.perf_counter()
    # the profile counts extrapolated lookups over its lifetime: report this replay's own
    extrapolated_before = profile.extrapolated_queries if profile is not None else 0
    driver = replay_flat if config.flat else replay_tree
    fleet = None
    if config.replicas == 1:
        records, counters = driver(trace, config, profile, progress)
    else:
        records, counters, fleet = replay_fleet(driver, trace, config, profile, progress)
    elapsed = time.perf_counter() - started
    # Ctrl-C keeps what finished: whole chunks of requests, in trace order. The tree's counters
    # (evictions, swap-outs, bytes in use) may include part of the chunk that was cut short.
    replayed = counters.pop("requests_replayed")
    interrupted = replayed < trace.n_requests
    doc_tokens = int(records["doc_tokens"].sum())
    hit_gpu = int(records["hit_tokens_gpu"].sum())
    hit_host = int(records["hit_tokens_host"].sum())
    hit_any = (records["hit_tokens_gpu"] + records["hit_tokens_host"]) > 0
    summary = {
        "requests": replayed,
        "interrupted": interrupted,
        "doc_tokens": doc_tokens,
        "hit_tokens_gpu": hit_gpu,
        "hit_tokens_host": hit_host,
        "recomputed_tokens": int(records["recomputed_tokens"].sum()),
        **{name: int(records[name].sum()) for name in ("position_free_hit_tokens",
                                                       "blend_recomputed_tokens")
           if name in records},
        "swap_in_bytes": int(records["swap_in_bytes"].sum()),
        **{k: counters.pop(k) for k in ("swap_out_bytes", "evictions_gpu", "evictions_host")},
        **hit_rate_fields(doc_tokens, hit_gpu, hit_host, hit_any),
        "elapsed_s": elapsed,
        "requests_per_s": replayed / elapsed if elapsed > 0 else float("inf"),
        **counters,
        "cost_extrapolations": (profile.extrapolated_queries - extrapolated_before
                                if profile is not None else 0),
        "config": _recorded(config),
        "trace_info": trace.info,
    }
    if fleet is not None:
        summary["replicas"] = fleet
        summary["load_imbalance"] = (max(r["requests"] for r in fleet)
                                     / (replayed / len(fleet)) if replayed else None)
    summary["warnings"] = replay_warnings(
        extrapolations=summary["cost_extrapolations"],
        profile=profile.name if profile is not None else None, trace_info=trace.info or {},
        system_prompt_tokens=config.system_prompt_tokens,
        repeated_documents=repeated_documents(trace.doc_offsets, trace.doc_ids))
    return ReplayResult(config=config, columns=records, summary=summary)
