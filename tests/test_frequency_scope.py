"""One counting rule for every frequency policy: admission, lifetime and window, by hand.

Every expected value here is worked out in the comments (or by a brute-force second
implementation), never read back from the tree.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsim.cache import KnowledgeTree, make_policy
from ragsim.cache.policies import POLICY_NAMES, describe_policies
from ragsim.errors import ConfigError
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import SimConfig, build_config
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

X, Y, Z, V, D = 1, 2, 3, 4, 5
WINDOW_S = 10.0


def lfu_tree(scope: str, gpu_docs: int = 3, policy: str = "lfu") -> KnowledgeTree:
    """100-token documents, 1 byte per token, room for ``gpu_docs`` of them, no host tier."""
    return KnowledgeTree(make_policy(policy), gpu_capacity_bytes=100 * gpu_docs,
                         kv_bytes_per_token=1, frequency_scope=scope,
                         frequency_window_s=WINDOW_S if scope == "window" else None)


def in_gpu(kt: KnowledgeTree) -> set[int]:
    return {n.key for n in kt.iter_nodes() if n.in_gpu and n.parent is not None}


@pytest.mark.parametrize(("scope", "survivors", "counts"), [
    ("admission", {Z, Y, D}, {X: 0, Y: 2, Z: 4, V: 0, D: 1}),
    ("lifetime", {Z, X, D}, {X: 3, Y: 2, Z: 4, V: 1, D: 1}),
    ("window", {X, Y, D}, {X: 3, Y: 2, Z: 0, V: 1, D: 1}),
])
def test_the_three_scopes_evict_three_different_documents(scope, survivors, counts):
    """LFU, room for three documents, window 10 s (a retrieval at t counts while now < t + 10).

    t=0..3  Z four times                        Z: 4
    t=5 X, t=6 Y, t=7 X, t=8 Y                  X: 2, Y: 2 (cache Z, X, Y: full)
    t=9 V   evicts the lowest of Z4, X2, Y2: X and Y tie, X retrieved last at 7 < 8: X goes
            (no retrieval has left the window yet, so every scope agrees). Admission: X -> 0.
    t=10 X  (Z's t=0 leaves the window: Z 3) evicts the lowest of Z, Y2, V1: V. X returns
            with count 1 (admission), 3 (lifetime: 5, 7, 10), 3 (window: 5, 7, 10).
    t=14 D  (window: t <= 4 leaves, so Z's four retrievals are gone: Z 0) must evict one of
            X, Y, Z with counts (adm, life, win): X (1, 3, 3), Y (2, 2, 2), Z (4, 4, 0):
            admission evicts X, lifetime Y, window Z.
    """
    kt = lfu_tree(scope)
    for t, doc in [(0, Z), (1, Z), (2, Z), (3, Z), (5, X), (6, Y), (7, X), (8, Y), (9, V),
                   (10, X), (14, D)]:
        kt.access([doc], [100], now_s=float(t))
        kt.check_invariants()
    assert in_gpu(kt) == survivors
    assert {n.key: n.frequency for n in kt.iter_nodes() if n.parent is not None} == counts


@pytest.mark.parametrize(("scope", "survivors", "evicted"), [
    ("admission", [Z, Y, D], X), ("lifetime", [Z, X, D], Y), ("window", [X, Y, D], Z)])
def test_flat_lfu_evicts_the_same_three_documents(scope, survivors, evicted):
    """The hand-worked sequence above through flat LFU (unit sizes, room for three): probing
    at t=14 the three documents each rule keeps hits, then the one it evicted misses."""
    times = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 14]
    keys = [Z, Z, Z, Z, X, Y, X, Y, V, X, D]
    cache = make_policy("lfu").flat_cache(3, frequency_scope=scope,
                                          frequency_window_s=WINDOW_S if scope == "window"
                                          else None)
    probes = [*survivors, evicted]
    keys += probes
    times += [14] * len(probes)
    extra = () if scope != "window" else (None, None, [float(t) for t in times])
    hits = list(cache.process(keys, [1] * len(keys), *extra))
    assert hits[-4:] == [1, 1, 1, 0]


@pytest.mark.parametrize(("scope", "a_hits"), [("window", 1), ("lifetime", 0),
                                               ("admission", 0)])
def test_flat_window_forgets_an_access_exactly_window_seconds_old(scope, a_hits):
    """Room for two unit objects, window 10 s. B at 0, A at 1 and 2, B at 3: two each. At
    t=10 B's access at 0 leaves the window (0 <= 10 - 10), so C evicts B (count 1); counting
    over the lifetime or from admission A and B tie at 2 and A, retrieved longer ago, goes.
    A's probe at t=10 hits only under the window."""
    keys, times = [2, 1, 1, 2, 3, 1], [0.0, 1.0, 2.0, 3.0, 10.0, 10.0]
    window = WINDOW_S if scope == "window" else None
    cache = make_policy("lfu").flat_cache(2, frequency_scope=scope, frequency_window_s=window)
    extra = () if scope != "window" else (None, None, times)
    assert list(cache.process(keys, [1] * len(keys), *extra)) == [0, 0, 1, 1, 0, a_hits]


def test_a_retrieval_leaving_the_window_lowers_value_and_priority():
    """GDSF, 100-byte documents, value 1e6 x count / 100 = 1e4 per retrieval, room for 3.

    t=0 A, t=1 A: A count 2, priority 0 + 2e4.  t=2 B, t=3 C: 1e4 each.
    t=4 D evicts B (1e4, older than C); clock 1e4; D = 1e4 + 1e4 = 2e4.
    t=5 A: count 3, priority 1e4 + 3e4 = 4e4.
    t=11 D (hit): t <= 1 leaves the window: A's two retrievals. A: count 1, value 1e4, and its
         priority keeps its clock at t=5: 4e4 - 3e4 + 1e4 = 2e4. D: count 2 -> 1e4 + 2e4 = 3e4.
    t=14 E: t <= 4 leaves: C (count 0, priority 1e4 - 1e4 = 0) and D's t=4 (count 1,
         3e4 - 2e4 + 1e4 = 2e4). C (0) is evicted; the clock stays 1e4; E = 2e4.
    t=14 F: A, D and E all stand at 2e4; A was retrieved longest ago (t=5) and goes.
    Counting over the lifetime instead, A (4e4) would stay and E (2e4, with D at 3e4) go.
    """
    A, B, C, D_, E, F = range(1, 7)
    results = {}
    for scope in ("window", "lifetime"):
        kt = lfu_tree(scope, policy="gdsf")
        for t, doc in [(0, A), (1, A), (2, B), (3, C), (4, D_), (5, A), (11, D_)]:
            kt.access([doc], [100], now_s=float(t))
        a, d = kt.root.children[A], kt.root.children[D_]
        if scope == "window":
            assert (a.frequency, a.value, a.priority_gpu) == (1, 1e4, 2e4)
            assert d.priority_gpu == 3e4
        else:
            assert (a.frequency, a.value, a.priority_gpu) == (3, 3e4, 4e4)
        kt.access([E], [100], now_s=14.0)
        kt.check_invariants()
        assert kt.clock_gpu == 1e4
        if scope == "window":  # D's retrieval at t=4 has just left (4 <= 14 - 10)
            assert (d.frequency, d.priority_gpu) == (1, 2e4)
        kt.access([F], [100], now_s=14.0)
        kt.check_invariants()
        results[scope] = in_gpu(kt)
    assert results == {"window": {D_, E, F}, "lifetime": {A, D_, F}}


def bilinear_table(c0: float, c_new: float, c_pair: float) -> BilinearGrid:
    """T(a, b) = c0 + c_new*b + c_pair*a*b: bilinear, so interpolation on it is exact."""
    cached, new = [0.0, 10_000.0], [1.0, 10_000.0]
    grid = [[c0 + c_new * b + c_pair * a * b for b in new] for a in cached]
    return BilinearGrid("test", "cached_tokens", "new_tokens", cached, new, grid)


@pytest.mark.parametrize(("policy", "values"), [
    # request 1: [1, 2] of 100 + 50 tokens, query 10: a = 0, b = 160,
    #            T1 = 0.01 + 0.001 x 160 = 0.17, both nodes computed by it
    # request 2: [1, 3] of 100 + 40, query 10: node 1 hits, a = 100, b = 50,
    #            T2 = 0.01 + 0.05 + 1e-6 x 100 x 50 = 0.065; node 1 count 2, node 3 count 1
    ("pgdsf", {1: 2 * 0.17 / 160, 2: 0.17 / 160, 3: 0.065 / 50}),  # count x mean T/b
    ("pgdsf-no-size", {1: 2 * 0.17, 2: 0.17, 3: 0.065}),  # count x mean T
    ("pgdsf-const-cost", {1: 2.0, 2: 1.0, 3: 1.0}),  # count x 1.0
])
def test_each_ablation_values_a_hand_worked_node(policy, values):
    kt = KnowledgeTree(make_policy(policy), gpu_capacity_bytes=10**6, kv_bytes_per_token=1,
                       prefill_cost_s=bilinear_table(0.01, 0.001, 1e-6).at)
    kt.access([1, 2], [100, 50], 10)
    kt.access([1, 3], [100, 40], 10)
    got = {1: kt.root.children[1].value, 2: kt.root.children[1].children[2].value,
           3: kt.root.children[1].children[3].value}
    assert got == pytest.approx(values, rel=1e-12)


def test_ablations_are_registered_and_described():
    rows = {row["name"]: row for row in describe_policies()}
    assert set(rows) == set(POLICY_NAMES)
    assert {"pgdsf-const-cost", "pgdsf-no-size"} <= set(rows)
    assert all(row["keeps"] and row["family"] and row["algorithm1"] for row in rows.values())
    assert not rows["pgdsf-const-cost"]["needs_profile"] and rows["pgdsf-no-size"]["needs_profile"]
    assert [r["name"] for r in rows.values() if r["uses_frequency_scope"]] == \
        ["pgdsf", "gdsf", "lfu", "pgdsf-const-cost", "pgdsf-no-size"]


def reference_lfu(keys: list[int], sizes: list[int], capacity: int, lifetime: bool) -> list[int]:
    """Brute-force LFU: on a miss evict the cached object of lowest (count, last access) until
    the newcomer fits, then admit it. Lifetime counts every retrieval; admission restarts an
    object's count when it is evicted."""
    count: dict[int, int] = {}
    last: dict[int, int] = {}
    cached: dict[int, int] = {}
    hits = []
    for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
        if key in cached:
            count[key] += 1
            last[key] = i
            hits.append(1)
            continue
        hits.append(0)
        if size > capacity:
            continue
        while sum(cached.values()) + size > capacity:
            victim = min(cached, key=lambda k: (count[k], last[k]))
            del cached[victim]
            if not lifetime:
                count[victim] = 0
        count[key] = count.get(key, 0) + 1
        last[key] = i
        cached[key] = size
    return hits


@pytest.mark.parametrize(("scope", "last_is_hit"), [("lifetime", 1), ("admission", 0)])
def test_flat_lfu_brings_a_returning_count_back(scope, last_is_hit):
    """Room for three unit objects. A x5, B x2, C; D evicts C (1), E evicts D (1), E again
    (2); F: B and E tie at 2, B retrieved longer ago goes. B returns (evicting F, 1) with
    count 3 (lifetime) or 1 (admission). G then evicts E (2) under lifetime but B (1) under
    admission, so only lifetime's last B hits."""
    keys = [ord(k) for k in "AAAAABBCDEEFBGB"]
    flat = make_policy("lfu").flat_cache(3, frequency_scope=scope)
    hits = list(flat.process(keys, [1] * len(keys)))
    assert hits == [0, 1, 1, 1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, last_is_hit]
    assert reference_lfu(keys, [1] * len(keys), 3, scope == "lifetime") == hits


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=120), st.integers(1, 30),
       st.sampled_from(["admission", "lifetime"]))
def test_flat_lfu_equals_a_brute_force_reference(keys, capacity, scope):
    sizes = [1 + (k * 5) % 7 for k in keys]
    flat = make_policy("lfu").flat_cache(capacity, frequency_scope=scope)
    assert list(flat.process(keys, sizes)) == reference_lfu(keys, sizes, capacity,
                                                             scope == "lifetime")


def test_window_needs_times_that_do_not_go_back():
    kt = lfu_tree("window")
    with pytest.raises(ValueError, match="now_s"):
        kt.access([1], [100])
    kt.access([1], [100], now_s=5.0)
    with pytest.raises(ValueError, match="must not decrease"):
        kt.access([1], [100], now_s=4.0)


@pytest.mark.parametrize(("scope", "window"), [("weekly", None), ("window", None),
                                                ("window", 0.0), ("lifetime", 5.0)])
def test_the_tree_refuses_a_bad_scope(scope, window):
    with pytest.raises(ValueError):
        KnowledgeTree(make_policy("lfu"), gpu_capacity_bytes=100, kv_bytes_per_token=1,
                      frequency_scope=scope, frequency_window_s=window)


@pytest.mark.parametrize(("given", "field"), [
    ({"frequency_scope": "weekly"}, "frequency_scope"),
    ({"frequency_scope": "window"}, "frequency_window_s"),
    ({"frequency_window_s": 60.0}, "frequency_window_s"),
    ({"frequency_scope": "window", "frequency_window_s": -1.0}, "frequency_window_s"),
])
def test_the_config_names_the_bad_field(given, field):
    with pytest.raises(ConfigError) as caught:
        build_config(given)
    assert caught.value.field == field


def test_the_config_records_the_scope():
    config = build_config({"frequency_scope": "window", "frequency_window_s": 600.0})
    assert 'frequency_scope = "window"' in config.to_toml()
    assert "frequency_window_s = 600.0" in config.to_toml()
    assert SimConfig().frequency_scope == "lifetime"


@pytest.fixture(scope="module")
def small_trace():
    return resolve_trace("mmlu", n_requests=1500)


@pytest.mark.parametrize("policy", ["lfu", "pgdsf"])
def test_a_window_longer_than_the_trace_is_the_lifetime(small_trace, policy):
    """Nothing leaves a window longer than the trace, so every count, and with it every
    decision, is the lifetime one; a short window must change something (it is not inert)."""
    profile = load_profile("a10g-mistral-7b")
    span = float(small_trace.arrival_s[-1] - small_trace.arrival_s[0])

    def summary(**scope):
        config = ReplayConfig(trace="mmlu", policy=policy, gpu_capacity_bytes=2**30,
                              host_capacity_bytes=2 * 2**30, **scope)
        return run_replay(small_trace, config, profile).summary

    lifetime = summary(frequency_scope="lifetime")
    long = summary(frequency_scope="window", frequency_window_s=2 * span + 1)
    short = summary(frequency_scope="window", frequency_window_s=span / 50)
    keys = ("hit_tokens_gpu", "hit_tokens_host", "evictions_gpu", "evictions_host")
    assert [long[k] for k in keys] == [lifetime[k] for k in keys]
    assert [short[k] for k in keys] != [lifetime[k] for k in keys]
    assert long["config"]["frequency_scope"] == "window"


@pytest.mark.parametrize("policy", ["lfu", "gdsf", "pgdsf"])
def test_a_flat_window_longer_than_the_trace_is_the_lifetime(small_trace, policy):
    """Flat mode counts over a window too: longer than the trace it is the lifetime (the
    same hits), a short one changes them."""
    profile = load_profile("a10g-mistral-7b")
    span = float(small_trace.arrival_s[-1] - small_trace.arrival_s[0])

    def hits(**scope):
        config = ReplayConfig(trace="mmlu", policy=policy, flat=True,
                              gpu_capacity_bytes=2 * 2**30, host_capacity_bytes=0, **scope)
        return run_replay(small_trace, config, profile).summary["object_hits"]

    lifetime = hits(frequency_scope="lifetime")
    assert hits(frequency_scope="window", frequency_window_s=2 * span + 1) == lifetime
    assert hits(frequency_scope="window", frequency_window_s=span / 50) != lifetime


def reference_windowed_lfu(keys: list[int], sizes: list[int], times: list[float],
                           capacity: int, window_s: float) -> list[int]:
    """Brute force: an object's count is its accesses in (now - window, now], recounted from
    the whole history at every eviction; evict the lowest (count, last access) first."""
    last: dict[int, int] = {}
    cached: dict[int, int] = {}
    hits = []
    for i, (key, size, now) in enumerate(zip(keys, sizes, times, strict=True)):

        def count(k: int, i: int = i, now: float = now) -> int:
            return sum(1 for j in range(i + 1) if keys[j] == k and times[j] > now - window_s)

        if key in cached:
            last[key] = i
            hits.append(1)
            continue
        hits.append(0)
        if size > capacity:
            continue
        while sum(cached.values()) + size > capacity:
            victim = min(cached, key=lambda k: (count(k), last[k]))
            del cached[victim]
        last[key] = i
        cached[key] = size
    return hits


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from([0.0, 0.5, 1.0, 3.0])),
                min_size=1, max_size=80), st.integers(1, 30))
def test_windowed_lfu_flat_tree_and_brute_force_agree(accesses, capacity):
    """Three implementations of windowed LFU on single-document requests: the flat cache, the
    knowledge tree (no host tier) and a brute-force recount."""
    keys = [k for k, _ in accesses]
    times = [sum(gap for _, gap in accesses[:i + 1]) for i in range(len(accesses))]
    sizes = [1 + (k * 5) % 7 for k in keys]
    window = 2.0
    flat = make_policy("lfu").flat_cache(capacity, frequency_scope="window",
                                         frequency_window_s=window)
    flat_hits = list(flat.process(keys, sizes, None, None, times))
    kt = KnowledgeTree(make_policy("lfu"), gpu_capacity_bytes=capacity, kv_bytes_per_token=1,
                       frequency_scope="window", frequency_window_s=window)
    tree_hits = []
    for key, size, now in zip(keys, sizes, times, strict=True):
        tree_hits.append(int(kt.access([key], [size], now_s=now).hit_tokens_gpu > 0))
        kt.check_invariants()
    assert flat_hits == tree_hits == reference_windowed_lfu(keys, sizes, times, capacity,
                                                            window)


def test_the_simulator_counts_in_simulated_time(small_trace):
    """The simulator passes simulated time: a window longer than the run is the lifetime, a
    short one changes the hits (so the times are not all the same)."""
    trace = small_trace.head(300)
    profile = load_profile("a10g-mistral-7b")
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    base = dict(policy="lfu", speculate=False, host_cache_bytes=2**30, host_replicas=0,
                gpu_kv_bytes=2**30)
    lifetime = run_simulation(trace, build_config(base), profile).summary
    window = run_simulation(trace, build_config({**base, "frequency_scope": "window",
                                                 "frequency_window_s": 10 * span + 60}),
                            profile).summary
    short = run_simulation(trace, build_config({**base, "frequency_scope": "window",
                                                "frequency_window_s": span / 50}),
                           profile).summary
    assert window["config"]["frequency_scope"] == "window"
    keys = ("token_hit_rate_gpu", "token_hit_rate_host", "ttft_mean_s")
    assert [window[k] for k in keys] == [lifetime[k] for k in keys]
    assert [short[k] for k in keys] != [lifetime[k] for k in keys]


def test_the_policies_command_lists_every_policy_and_scope():
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["policies", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [row["name"] for row in data["policies"]] == list(POLICY_NAMES)
    assert data["frequency_scopes"] == ["admission", "lifetime", "window"]
    table = CliRunner().invoke(app, ["policies"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "pgdsf-no-size" in table.output


@pytest.mark.parametrize(("args", "flag"), [
    (["--frequency-scope", "window"], "--frequency-scope"),
    (["--frequency-scope", "weekly"], "--frequency-scope"),
    (["--frequency-window", "60"], "--frequency-window"),
    (["--frequency-scope", "window", "--frequency-window", "-1"], "--frequency-window"),
])
def test_replay_refuses_a_bad_scope_in_the_users_words(args, flag):
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["replay", "--requests", "50", *args])
    assert result.exit_code == 2
    assert flag in result.output


def test_run_and_replay_record_the_scope_they_used():
    from typer.testing import CliRunner

    from ragsim.cli import app

    window = ["--frequency-scope", "window", "--frequency-window", "30", "--json"]
    for command in (["replay", "--policy", "lfu"], ["run", "--policy", "lfu", "--no-speculate"]):
        result = CliRunner().invoke(app, [*command, "--requests", "100", *window])
        assert result.exit_code == 0, result.output
        config = json.loads(result.output)["config"]
        assert (config["frequency_scope"], config["frequency_window_s"]) == ("window", 30.0)
