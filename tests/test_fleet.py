"""The simulated fleet on one clock (ragsim/sim/fleet.py) and the routers that read the
replicas' live state: least-loaded (by requests, Vidur's LOR, or by tokens), kv-aware
(Dynamo's KV router cost), and a router that sees the fleet late (--router-staleness)."""

from __future__ import annotations

import numpy as np
import pytest

from ragsim.cache.policies import make_policy
from ragsim.cache.routers import (
    ActivePrompts,
    FleetState,
    KvAware,
    LeastLoaded,
    RouteRequest,
)
from ragsim.cache.tree import KnowledgeTree
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.serving.summary import WALL_CLOCK_FIELDS
from ragsim.sim.fleet import FleetSimulation, LateCache, run_fleet
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

PROFILE = load_profile("a10g-mistral-7b")
A, B, C = 1, 2, 3


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def test_one_replica_on_the_fleets_clock_is_the_one_engine_run_to_the_last_bit():
    """The fleet's machinery (its arrival loop, the shared request table, the replica's
    reports) with one replica, on the default system with speculation, random GPU failures
    and host replicas: every column and every summary field equal one engine's."""
    trace = resolve_trace("mmlu", n_requests=600)
    config = build_config({"trace": "mmlu", "rate_rps": 2.0, "gpu_failure_rate_per_h": 20.0,
                           "host_replicas": 4, "seed": 3})
    alone = run_simulation(trace, config, PROFILE)
    fleet = FleetSimulation(trace, config, PROFILE).run()
    assert alone.summary["gpu_failures"] > 0 and alone.summary["speculations_started"] > 0
    for name, values in alone.columns.items():
        if name != "decision_s":
            assert _same(values, fleet.columns[name]), name
    for name, value in alone.summary.items():
        if name not in WALL_CLOCK_FIELDS:
            assert fleet.summary[name] == value, name
    assert (fleet.columns["replica"] == 0).all()



def _starting_at(start_s: float, n: int):
    """mmlu's first n requests with their clock moved on by ``start_s`` (logged traffic keeps
    its wall-clock timestamps: an epoch time, say), the first request no longer at t = 0."""
    import dataclasses

    trace = resolve_trace("mmlu", n_requests=n)
    return dataclasses.replace(trace, arrival_s=trace.arrival_s + start_s)


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "kv-aware"])
@pytest.mark.parametrize("start_s", [100.0, 1.7e9])
def test_a_fleet_on_a_trace_whose_clock_starts_late_serves_nothing_before_it_arrives(
        start_s, router):
    """The fleet's arrival loop starts as one engine's: its first request waits for its own
    planned time (it was delivered at t = 0, a TTFT of -start_s), whether the router decides
    ahead (round-robin: each replica timed from its own start) or at each arrival; and one
    replica is the one-engine run of the same trace, column by column."""
    trace = _starting_at(start_s, 120)
    config = build_config({"trace": "mmlu", "replicas": 2, "router": router, "seed": 3})
    columns = run_fleet(trace, config, PROFILE).columns
    assert (columns["first_token_s"] >= columns["arrival_s"]).all()
    assert (columns["ttft_s"] >= 0).all()
    assert _same(columns["arrival_s"], trace.arrival_s)
    one = config.replace(replicas=1)
    alone = run_simulation(trace, one, PROFILE)
    fleet = FleetSimulation(trace, one, PROFILE).run()
    for name, values in alone.columns.items():
        if name != "decision_s":
            assert _same(values, fleet.columns[name]), name


def test_least_loaded_counts_requests_or_tokens():
    request = RouteRequest(0, [A], [10])
    state = FleetState(requests=[1, 3, 2], tokens=[900, 100, 400])
    assert LeastLoaded(3).choose(request, loads=state.requests, state=state) == 0
    assert LeastLoaded(3, by="tokens").choose(request, loads=state.requests, state=state) == 1
    with pytest.raises(ValueError, match="clock"):
        LeastLoaded(3, by="tokens").choose(request, loads=[0, 0, 0])


def test_active_prompts_count_a_shared_document_once_as_dynamos_active_sequences():
    active = ActivePrompts()
    active.add(1, [A, C], [64, 48], own_tokens=10, prefill_tokens=0)
    assert active.active_tokens == 64 + 48 + 10
    assert active.new_tokens([A, B], [64, 32], own_tokens=20) == 32 + 20  # A is served
    active.add(2, [A, B], [64, 32], own_tokens=20, prefill_tokens=52)
    assert (active.active_tokens, active.prefill_tokens) == (174, 52)
    active.prefilled(2)
    assert active.prefill_tokens == 0
    active.remove(1)  # C and its query go; A stays, request 2 still serves it
    assert active.active_tokens == 174 - 48 - 10
    active.remove(2)
    assert (active.active_tokens, active.prefill_tokens) == (0, 0)


def _kv_state(cached: dict[int, int], prefill_tokens: int = 0) -> FleetState:
    busy = ActivePrompts()
    busy.add(1, [A, C], [64, 48], own_tokens=10, prefill_tokens=prefill_tokens)
    return FleetState(requests=[1, 0], tokens=[0, 0],
                      cached_tokens=lambda r, docs, tokens: cached[r],
                      active=[busy, ActivePrompts()])


def test_kv_aware_takes_the_lowest_dynamo_cost():
    """Dynamo's logit = overlap_score_weight x prefill blocks + decode blocks, by hand, with
    16-token blocks. The request: documents A (64) and B (32) and a 20-token query: isl 116.
    Replica 0 holds A in its cache and serves [A C] + 10 (122 active tokens, prefilled);
    replica 1 holds nothing and serves nothing.
    - replica 0: overlap 64 // 16 = 4 blocks; prefill (0 + 116 - 64) / 16 = 3.25; decode
      (122 + B 32 + query 20) / 16 = 10.875: 14.125.
    - replica 1: prefill 116 / 16 = 7.25; decode 116 / 16 = 7.25: 14.5.
    Weight 1 (Dynamo's default): replica 0. Weight 0 (Dynamo: pure load balancing):
    10.875 against 7.25, replica 1. 70 cached tokens are still 4 whole blocks. With 200
    tokens of replica 0's prompts still to prefill: (200 + 52) / 16 + 10.875 = 26.625 > 14.5:
    replica 1."""
    request = RouteRequest(0, [A, B], [64, 32], query_tokens=20)
    router = KvAware(2, block_tokens=16)
    assert router.overlap_score_weight == 1.0
    assert router.logits(request, _kv_state({0: 64, 1: 0})) == [14.125, 14.5]
    assert router.choose(request, state=_kv_state({0: 64, 1: 0})) == 0
    assert router.logits(request, _kv_state({0: 70, 1: 0})) == [14.125, 14.5]
    assert KvAware(2, overlap_score_weight=0.0, block_tokens=16).choose(
        request, state=_kv_state({0: 64, 1: 0})) == 1
    assert router.logits(request, _kv_state({0: 64, 1: 0}, prefill_tokens=200)) == [
        26.625, 14.5]
    with pytest.raises(ValueError, match="clock"):
        router.choose(request, loads=[0, 0])


def test_kv_aware_draws_among_equal_costs_seeded():
    request = RouteRequest(0, [A], [32])
    empty = FleetState(requests=[0, 0, 0], tokens=[0, 0, 0],
                       cached_tokens=lambda r, docs, tokens: 0,
                       active=[ActivePrompts() for _ in range(3)])
    picks = [KvAware(3, seed=1).choose(request, state=empty) for _ in range(1)]
    router = KvAware(3, seed=1)
    drawn = [router.choose(request, state=empty) for _ in range(60)]
    assert set(drawn) == {0, 1, 2} and drawn[0] == picks[0]
    again = KvAware(3, seed=1)
    assert drawn == [again.choose(request, state=empty) for _ in range(60)]


def test_a_late_router_sees_a_replicas_cache_as_it_was_staleness_ago():
    tree = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=1000, kv_bytes_per_token=1,
                         system_prompt_tokens=5, record_moves=True)
    late = LateCache(tree, staleness_s=2.0)
    tree.access([A, B], [100, 50])
    late.collect(1.0)  # the moves seen by the decision at t = 1
    assert tree.cached_prefix_tokens([A, B], [100, 50]) == 155  # the live cache
    assert late.cached_tokens(2.5, [A, B], [100, 50]) == 5  # 1.5 s later: not yet seen
    assert late.cached_tokens(3.0, [A, B], [100, 50]) == 155
    tree.access([C], [900])  # evicts A and B (LRU) to fit C
    late.collect(4.0)
    assert late.cached_tokens(5.0, [A, B], [100, 50]) == 155  # still believes they are there
    assert late.cached_tokens(6.0, [A, B], [100, 50]) == 5
    assert late.cached_tokens(6.0, [C], [900]) == 905


def _outstanding_at(records, t: float, i: int, replicas: int) -> list[int]:
    """Requests each replica holds when request i arrives at t: arrived before it (or at t,
    earlier in the trace) and not yet ended."""
    before = records.index < i
    held = before & (records["finish_s"] > t)
    return [int((held & (records["replica"] == r)).sum()) for r in range(replicas)]


def test_least_loaded_on_the_fleets_clock_sends_each_request_to_the_fewest_outstanding():
    """Recomputed from the records alone: at each arrival, the replica chosen held the fewest
    requests that had arrived and not ended (ties: the lowest index)."""
    trace = resolve_trace("mmlu", n_requests=400)
    config = build_config({"trace": "mmlu", "rate_rps": 8.0, "replicas": 3,
                           "router": "least-loaded", "seed": 1})
    records = run_fleet(trace, config, PROFILE).records
    arrival = records["arrival_s"].to_numpy()
    assert len(np.unique(arrival)) == len(arrival)  # no ties to argue about
    checked = 0
    for i in range(len(records)):
        loads = _outstanding_at(records, arrival[i], i, 3)
        assert records["replica"][i] == min(range(3), key=lambda r: (loads[r], r)), i
        checked += max(loads) > 0
    assert checked > 100  # the fleet was busy, not just idle between requests


def test_a_router_that_sees_the_fleet_too_late_sends_everything_to_one_replica():
    """With the loads seen 10^6 s late the fleet looks empty at every decision: least-loaded
    breaks the tie to replica 0 every time."""
    trace = resolve_trace("mmlu", n_requests=200)
    config = build_config({"trace": "mmlu", "rate_rps": 4.0, "replicas": 3,
                           "router": "least-loaded", "router_staleness_s": 1e6})
    summary = run_fleet(trace, config, PROFILE).summary
    assert [r["requests"] for r in summary["replicas"]] == [200, 0, 0]
    assert summary["load_imbalance"] == pytest.approx(3.0)
    fresh = run_fleet(trace, config.replace(router_staleness_s=0.0), PROFILE).summary
    assert fresh["load_imbalance"] < 1.2


@pytest.mark.parametrize("router", ["kv-aware", "prefix-affinity"])
def test_a_cache_aware_fleet_keeps_more_than_round_robin_and_balances_less(router):
    trace = resolve_trace("mmlu", n_requests=1500)
    common = {"trace": "mmlu", "rate_rps": 6.0, "replicas": 4, "gpu_kv_bytes": 2**30,
              "host_cache_bytes": 2 * 2**30}
    rr = run_fleet(trace, build_config({**common, "router": "round-robin"}), PROFILE).summary
    aware = run_fleet(trace, build_config({**common, "router": router}), PROFILE).summary
    assert aware["token_hit_rate"] > rr["token_hit_rate"] + 0.03
    assert rr["load_imbalance"] == pytest.approx(1.0)  # 375 each
    assert aware["load_imbalance"] > rr["load_imbalance"]
    assert len(aware["replicas"]) == 4
    assert sum(r["requests_completed"] for r in aware["replicas"]) == aware["requests_completed"]


def _asked_twice(n: int):
    """mmlu's first n requests, each question asked twice (the second a repeat, later)."""
    import dataclasses

    import pyarrow as pa

    base = resolve_trace("mmlu", seed=0, n_requests=n)
    texts = [f"question {i % (n // 2)}" for i in range(n)]
    return dataclasses.replace(base, query_text=pa.array(texts, pa.string()),
                               answer_key=pa.array(texts, pa.string()))


@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_the_fleets_answer_cache_answers_requests_that_never_reach_a_replica(router):
    """One answer cache in front of the fleet: the second asking of each question (its first
    long finished: they come n/2 requests apart at 2 req/s) is answered by it, is no replica's
    (``replica`` -1) and nothing of it is searched or prefilled; the replicas share the rest
    as the router decides (round-robin: by the request's place in the trace)."""
    n = 200
    trace = _asked_twice(n)
    config = build_config({"trace": "mmlu", "rate_rps": 2.0, "replicas": 2, "router": router,
                           "answer_cache": True, "answer_semantic": False})
    result = run_fleet(trace, config, PROFILE)
    columns, s = result.columns, result.summary
    answered = np.isin(columns["answer_tier"], ["l1", "l2", "semantic"])
    assert answered.tolist() == [i >= n // 2 for i in range(n)]
    assert (columns["replica"][answered] == -1).all()
    assert np.isnan(columns["search_start_s"][answered]).all()
    assert (columns["status"] == "completed").all()
    served = columns["replica"][~answered]
    if router == "round-robin":
        assert served.tolist() == [i % 2 for i in range(n // 2)]
    assert sorted(set(served.tolist())) == [0, 1]
    assert sum(s["answer_cache_hits"].values()) == n // 2
    assert sum(r["requests"] for r in s["replicas"]) == n // 2
    assert s["requests_completed"] == n


def test_kv_aware_blind_to_the_caches_keeps_less():
    """Seen 10^6 s late, every replica's cache looks empty: kv-aware is left with its own
    record of the prompts it sent (Dynamo's active blocks), and keeps less than when it sees
    the caches as they are."""
    trace = resolve_trace("mmlu", n_requests=1500)
    common = {"trace": "mmlu", "rate_rps": 6.0, "replicas": 4, "router": "kv-aware",
              "gpu_kv_bytes": 2**30, "host_cache_bytes": 2 * 2**30}
    live = run_fleet(trace, build_config(common), PROFILE).summary
    blind = run_fleet(trace, build_config({**common, "router_staleness_s": 1e6}),
                      PROFILE).summary
    assert live["token_hit_rate"] > blind["token_hit_rate"] + 0.02
    assert blind["config"]["router_staleness_s"] == 1e6
