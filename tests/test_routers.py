"""Routers (ragsim/cache/routers.py) and the replay of a fleet: each router's choice on
hand-worked sequences, as its source system defines it, and a fleet's replay against its
replicas' sub-traces replayed apart."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from typer.testing import CliRunner

from ragsim.cache.routers import (
    LeastLoaded,
    PrefixAffinity,
    RandomRouter,
    RoundRobin,
    RouteRequest,
    SessionRouter,
)
from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.serving.summary import WALL_CLOCK_FIELDS
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace
from ragsim.traces.io import TraceBuilder

PROFILE = load_profile("a10g-mistral-7b")
runner = CliRunner()


def request(index: int, docs: list[int], tokens: list[int], session=None) -> RouteRequest:
    return RouteRequest(index, docs, tokens, session)


def test_round_robin_sends_request_i_to_replica_i_mod_n():
    router = RoundRobin(3)
    assert [router.choose(request(i, [1], [10])) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_session_routing_is_sticky_by_a_stable_hash_and_round_robin_without_one():
    router = SessionRouter(4)
    for session in ("a", "b", "1757476916095-afhwfadnh5ew"):
        expected = zlib.crc32(session.encode()) % 4  # the definition, computed here
        assert {router.choose(request(i, [1], [5], session)) for i in range(5)} == {expected}
    assert router.choose(request(6, [1], [5])) == 6 % 4


def test_random_routing_is_seeded():
    one, two, other = RandomRouter(5, seed=3), RandomRouter(5, seed=3), RandomRouter(5, seed=4)
    picks = [one.choose(request(i, [1], [1])) for i in range(50)]
    assert picks == [two.choose(request(i, [1], [1])) for i in range(50)]
    assert picks != [other.choose(request(i, [1], [1])) for i in range(50)]
    spread = RandomRouter(5, seed=3)
    counts = np.bincount([spread.choose(request(i, [1], [1])) for i in range(5000)], minlength=5)
    assert counts.min() > 850  # 1,000 each expected; 850 is more than 5 sigma below


def test_least_loaded_takes_the_fewest_outstanding_and_needs_loads():
    router = LeastLoaded(3)
    assert router.choose(request(0, [1], [1]), loads=[4, 2, 2]) == 1  # ties: lowest index
    with pytest.raises(ValueError, match="clock"):
        router.choose(request(0, [1], [1]))


def test_prefix_affinity_follows_sglangs_cache_aware_rules():
    """Worked by hand with SGLang's rules (threshold 0.3; imbalance: > 64 apart and > 1.5x):
    - r0 [A B] (100 + 100): no tree matches (0 <= 0.3): the smallest tree, both empty: 0.
    - r1 [C] (400): matches nothing: the smallest tree, replica 1 (0 tokens against 200).
    - r2 [A B D] (100 + 100 + 50): replica 0 matches 200 of 250 = 0.8 > 0.3: replica 0.
    - r3 [C E] (400 + 1,200): replica 1 matches 400 of 1,600 = 0.25 <= 0.3: the smallest
      tree: replica 1 holds 400 tokens, replica 0 250: replica 0.
    - r4 [A B D] with loads [70, 2]: 68 > 64 and 70 > 1.5 x 2: imbalanced, the least loaded
      (1), although replica 0 matches all of it.
    - r5 [A B D] with loads [10, 2]: balanced (8 <= 64); both trees now hold all of it (r4
      put it in replica 1's): a tie goes to the lower load (as sgl-model-gateway breaks it),
      replica 1.
    - r6 [C E] with loads [10, 2]: replica 0 matches 1,600 of 1,600, replica 1 400: replica 0
      though it is the busier."""
    A, B, C, D, E = 1, 2, 3, 4, 5
    router = PrefixAffinity(2)
    assert router.choose(request(0, [A, B], [100, 100])) == 0
    assert router.choose(request(1, [C], [400])) == 1
    assert router.choose(request(2, [A, B, D], [100, 100, 50])) == 0
    assert router.choose(request(3, [C, E], [400, 1200])) == 0
    assert router.trees[0].size_tokens == 100 + 100 + 50 + 400 + 1200
    assert router.choose(request(4, [A, B, D], [100, 100, 50]), loads=[70, 2]) == 1
    assert router.choose(request(5, [A, B, D], [100, 100, 50]), loads=[10, 2]) == 1
    assert router.choose(request(6, [C, E], [400, 1200]), loads=[10, 2]) == 0


def test_an_approximate_tree_drops_its_least_recently_used_leaves_past_its_size():
    router = PrefixAffinity(1, max_tree_tokens=300)
    tree = router.trees[0]
    tree.insert([1, 2], [100, 100])
    tree.insert([3], [100])
    tree.insert([1, 2], [100, 100])  # touches 1 and 2: 3 is now the least recently used
    tree.insert([4], [100])  # 400 > 300: the LRU leaf (3) goes
    assert tree.size_tokens == 300
    assert tree.match_tokens([3], [100]) == 0 and tree.match_tokens([1, 2], [100, 100]) == 200


DOC_TOKENS = {d: 100 + 37 * d for d in range(1, 13)}


def _trace(rows: list[list[int]]):
    builder = TraceBuilder("test")
    for i, docs in enumerate(rows):
        builder.add(i, float(i), 20, 5, docs, [DOC_TOKENS[d] for d in docs])
    return builder.build({"name": "test"})


def test_a_round_robin_fleet_replays_as_its_interleaved_sub_traces_apart():
    """Each replica's cache sees exactly requests r, r + N, r + 2N, ...: the fleet's records
    equal those of the N sub-traces, built apart from the same rows and replayed alone."""
    rng = np.random.default_rng(7)
    rows = [sorted(rng.choice(12, size=int(rng.integers(1, 4)), replace=False) + 1)
            for _ in range(300)]
    rows = [[int(d) for d in r] for r in rows]
    memory = dict(gpu_capacity_bytes=600 * 131072, host_capacity_bytes=900 * 131072)
    fleet = run_replay(_trace(rows), ReplayConfig(trace="test", replicas=3, **memory), PROFILE)
    records = fleet.records
    assert records["replica"].tolist() == [i % 3 for i in range(300)]
    for replica in range(3):
        alone = run_replay(_trace(rows[replica::3]), ReplayConfig(trace="test", **memory),
                           PROFILE).records
        mine = records[records["replica"] == replica].reset_index(drop=True)
        for column in ("hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens",
                       "swap_in_bytes", "doc_tokens"):
            assert mine[column].tolist() == alone[column].tolist(), column
        assert fleet.summary["replicas"][replica]["requests"] == len(rows[replica::3])
    assert fleet.summary["hit_tokens_gpu"] == int(records["hit_tokens_gpu"].sum())


def test_a_cache_aware_router_keeps_more_than_round_robin_and_balances_less():
    trace = resolve_trace("mmlu", n_requests=8000)
    memory = dict(gpu_capacity_bytes=2**30, host_capacity_bytes=2 * 2**30)
    found = {}
    for router in ("round-robin", "prefix-affinity"):
        config = ReplayConfig(trace="mmlu", replicas=4, router=router, **memory)
        found[router] = run_replay(trace, config, PROFILE).summary
    rr, pa = found["round-robin"], found["prefix-affinity"]
    assert pa["token_hit_rate"] > rr["token_hit_rate"] + 0.05
    assert rr["load_imbalance"] == pytest.approx(1.0)  # 2,000 each
    assert pa["load_imbalance"] > rr["load_imbalance"]


def test_replay_cli_runs_a_fleet_and_refuses_a_router_that_needs_a_clock(tmp_path):
    result = runner.invoke(app, ["replay", "--requests", "3000", "--replicas", "3",
                                 "--router", "session", "--trace", "ragpulse", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [r["replica"] for r in summary["replicas"]] == [0, 1, 2]
    assert sum(r["requests"] for r in summary["replicas"]) == summary["requests"] == 3000
    assert summary["config"]["router"] == "session"
    clocked = runner.invoke(app, ["replay", "--replicas", "2", "--router", "least-loaded"])
    assert clocked.exit_code == 2 and "needs the simulator's clock" in clocked.stderr
    none = runner.invoke(app, ["replay", "--replicas", "0"])
    assert none.exit_code == 2 and "--replicas" in none.stderr


@pytest.mark.parametrize("reuse", ["prefix", "blend:0.15"])
def test_a_simulated_round_robin_fleet_is_its_replicas_simulated_apart(reuse):
    """Each replica is the whole pipeline serving the requests sent to it on their arrival
    times (failures seeded seed + replica): the fleet's per-request times equal N one-engine
    runs of the sub-traces, built apart from the same rows. With position-free reuse too: its
    columns live in the fleet's one request table like every other record."""
    from ragsim.serving.config import build_config
    from ragsim.sim.fleet import run_fleet
    from ragsim.sim.simulator import run_simulation

    rng = np.random.default_rng(3)
    rows = [[int(d) for d in sorted(rng.choice(12, size=2, replace=False) + 1)]
            for _ in range(120)]

    def trace_of(indices):
        builder = TraceBuilder("test")
        for j, i in enumerate(indices):
            builder.add(j, 0.4 * i, 30, 8, rows[i], [DOC_TOKENS[d] for d in rows[i]])
        return builder.build({"name": "test"})

    # no speculation: a fleet draws a request's search stages by its place in the whole trace
    # (every router meets the same searches), a sub-trace run apart by its place in the part
    config = build_config({"replicas": 3, "router": "round-robin", "seed": 5,
                           "gpu_failure_rate_per_h": 30.0, "speculate": False,
                           "reuse": reuse})
    fleet = run_fleet(trace_of(range(120)), config, PROFILE)
    records = fleet.records
    assert records["replica"].tolist() == [i % 3 for i in range(120)]
    for replica in range(3):
        alone = run_simulation(trace_of(range(replica, 120, 3)),
                               config.replace(replicas=1, seed=5 + replica), PROFILE)
        mine = records[records["replica"] == replica].reset_index(drop=True)
        # field by field, to the last bit: every column but the ids (the sub-trace numbers
        # its rows apart) and the policy core's wall time
        for column in alone.records.columns.drop(["request_id", "decision_s"]):
            ours, theirs = mine[column].to_numpy(), alone.records[column].to_numpy()
            assert np.array_equal(ours, theirs, equal_nan=ours.dtype.kind == "f"), column
        own = fleet.summary["replicas"][replica]
        for name, value in alone.summary.items():
            if name in own and name not in WALL_CLOCK_FIELDS:
                assert own[name] == value, name
        assert own["requests"] == 40
    s = fleet.summary
    completed = records[records["status"] == "completed"]
    assert s["requests_completed"] == len(completed) == sum(
        r["requests_completed"] for r in s["replicas"])
    assert s["ttft_mean_s"] == pytest.approx(completed["ttft_s"].mean(), rel=1e-12)
    assert s["gpu_failures"] == sum(r["gpu_failures"] for r in s["replicas"])
    if reuse != "prefix":
        assert records["position_free_hit_tokens"].sum() > 0
        assert s["position_free_hit_tokens"] == sum(r["position_free_hit_tokens"]
                                                    for r in s["replicas"])


def test_run_refuses_a_fleet_it_cannot_simulate_yet():
    real = runner.invoke(app, ["run", "--replicas", "2", "--backend", "vllm",
                               "--requests", "10"])
    assert real.exit_code == 2 and "torch engine" in real.stderr
    unknown = runner.invoke(app, ["run", "--replicas", "2", "--router", "nope"])
    assert unknown.exit_code == 2 and "--router" in unknown.stderr


def test_a_fleet_run_is_deterministic_and_cache_aware_routing_keeps_more():
    import ragsim

    common = dict(trace="mmlu", requests=1500, rate=3.0, seed=2, replicas=4,
                  gpu_mem="1GiB", host_mem="2GiB")
    a = ragsim.simulate(router="prefix-affinity", **common).summary
    b = ragsim.simulate(router="prefix-affinity", **common).summary
    for name in ("ttft_mean_s", "ttft_p99_s", "token_hit_rate", "throughput_rps"):
        assert a[name] == b[name], name
    assert [r["ttft_mean_s"] for r in a["replicas"]] == [r["ttft_mean_s"] for r in b["replicas"]]
    rr = ragsim.simulate(router="round-robin", **common).summary
    assert a["token_hit_rate"] > rr["token_hit_rate"]
    assert a["load_imbalance"] > rr["load_imbalance"] == pytest.approx(1.0)
