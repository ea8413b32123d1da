"""Property tests: invariants after every operation, conservation, determinism."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragsim.cache import KnowledgeTree, make_policy
from ragsim.cache.policies import POLICY_NAMES
from ragsim.cache.tree import FREQUENCY_SCOPES
from ragsim.profiles.profile import load_profile

TABLE = load_profile("a10g-mistral-7b").prefill
DOC_TOKENS = {d: 1 + (d * 7) % 9 for d in range(10)}

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
        st.integers(0, 6),  # query tokens
        st.booleans(),  # keep pinned for a while
    ),
    min_size=1,
    max_size=60,
)
configs = st.fixed_dictionaries({
    "policy": st.sampled_from([p for p in POLICY_NAMES if p != "belady"]),
    "gpu": st.integers(0, 40),
    "host": st.integers(0, 60),
    "system": st.integers(0, 3),
    "depth": st.one_of(st.none(), st.integers(0, 3)),
    "scope": st.sampled_from(FREQUENCY_SCOPES),
    # seconds between consecutive requests (0: same instant); the window is WINDOW_S
    "gaps": st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=60, max_size=60),
    # the host tier's rules: RAGCache's write-back, vLLM's and HiCache's write-through
    "host_write": st.sampled_from(["back", "through"]),
    "host_evicts_gpu_copies": st.booleans(),
})
WINDOW_S = 2.0


def make_tree(config: dict) -> KnowledgeTree:
    window = WINDOW_S if config.get("scope") == "window" else None
    return KnowledgeTree(make_policy(config["policy"]),
                         gpu_capacity_bytes=config["gpu"] + config["system"],
                         host_capacity_bytes=config["host"], kv_bytes_per_token=1,
                         prefill_cost_s=TABLE.at,
                         system_prompt_tokens=config["system"],
                         max_cached_depth=config["depth"],
                         frequency_scope=config.get("scope", "lifetime"),
                         frequency_window_s=window,
                         host_write=config.get("host_write", "back"),
                         host_evicts_gpu_copies=config.get("host_evicts_gpu_copies", True))


def times_of(config: dict, n: int) -> list[float]:
    gaps = config.get("gaps") or [1.0] * n
    return [sum(gaps[:i + 1]) for i in range(n)]


def run(config: dict, reqs: list) -> tuple[list, KnowledgeTree]:
    kt = make_tree(config)
    results, running = [], []
    times = times_of(config, len(reqs))
    for i, (docs, query, keep) in enumerate(reqs):
        tokens = [DOC_TOKENS[d] for d in docs]
        r = kt.access(docs, tokens, query, request_index=i, keep_pinned=keep, now_s=times[i])
        kt.check_invariants()
        assert r.hit_tokens_gpu + r.hit_tokens_host + r.recomputed_tokens == sum(tokens)
        assert r.cached_tokens == config["system"] + r.hit_tokens_gpu + r.hit_tokens_host
        assert r.new_tokens == r.recomputed_tokens + query
        if keep:
            running.append(r.path)
        if len(running) > 2:  # requests finish out of order
            kt.release(running.pop(i % len(running)))
            kt.check_invariants()
        results.append((r.hit_tokens_gpu, r.hit_tokens_host, r.recomputed_tokens,
                        r.swap_in_bytes))
    for path in running:
        kt.release(path)
    kt.check_invariants()
    assert all(n.pins == 0 for n in kt.iter_nodes() if n is not kt.root)
    return results, kt


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, requests)
def test_invariants_hold_after_every_operation(config, reqs):
    run(config, reqs)


@settings(max_examples=100, deadline=None)
@given(configs, requests)
def test_same_input_same_result(config, reqs):
    first, a = run(config, reqs)
    second, b = run(config, reqs)
    assert first == second
    assert (a.evictions_gpu, a.evictions_host, a.swap_out_bytes) == \
        (b.evictions_gpu, b.evictions_host, b.swap_out_bytes)


@settings(max_examples=100, deadline=None)
@given(requests)
def test_unbounded_capacity_recomputes_exactly_the_first_seen_pairs(reqs):
    """With room for everything, a (document, prefix path) pair is computed once."""
    config = {"policy": "pgdsf", "gpu": 10**9, "host": 0, "system": 0, "depth": None}
    results, _ = run(config, [(d, q, False) for d, q, _ in reqs])
    seen: set[tuple[int, ...]] = set()
    for (_, _, recomputed, _), (docs, _, _) in zip(results, reqs, strict=True):
        expected = 0
        for depth in range(1, len(docs) + 1):
            if tuple(docs[:depth]) not in seen:
                seen.add(tuple(docs[:depth]))
                expected += DOC_TOKENS[docs[depth - 1]]
        assert recomputed == expected


@settings(max_examples=50, deadline=None)
@given(requests, st.sampled_from(POLICY_NAMES))
def test_zero_capacity_nothing_hits(reqs, policy):
    config = {"policy": policy, "gpu": 0, "host": 0, "system": 0, "depth": None}
    if policy == "belady":
        return
    results, _ = run(config, reqs)
    assert all(g == 0 and h == 0 for g, h, _, _ in results)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=200), st.integers(1, 40),
       st.sampled_from(["lru", "lfu", "fifo"]), st.sampled_from(["admission", "lifetime"]))
def test_tree_of_single_documents_equals_the_flat_cache(docs, capacity, policy, scope):
    """Top-1 requests and no host tier make the tree a flat cache: same hits as flat mode
    (which the libCacheSim differential test pins down), under either counting rule."""
    kt = KnowledgeTree(make_policy(policy), gpu_capacity_bytes=capacity,
                       kv_bytes_per_token=1, frequency_scope=scope)
    tree_hits = [kt.access([d], [DOC_TOKENS[d]]).hit_tokens_gpu > 0 for d in docs]
    flat = make_policy(policy).flat_cache(capacity, frequency_scope=scope)
    flat_hits = flat.process(docs, [DOC_TOKENS[d] for d in docs])
    assert tree_hits == [bool(h) for h in flat_hits]


running_ops = st.lists(
    st.tuples(
        st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
        st.integers(0, 8),  # private bytes the running request reserves
        st.sampled_from(["run", "run", "run", "finish", "fail", "replicate"]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, running_ops)
def test_reservations_and_gpu_failures_keep_every_invariant(config, ops):
    """Running requests' private KV competes with the cache; a GPU failure loses GPU nodes;
    replicas of the upper nodes (taken while requests run) go to host memory."""
    kt = make_tree(config)
    running: list = []
    times = times_of(config, len(ops))
    for step, (docs, private, op) in enumerate(ops):
        if op == "finish" and running:
            path, reserved = running.pop(0)
            kt.release(path)
            kt.free_gpu(reserved)
        elif op == "fail":
            for path, reserved in running:
                kt.release(path)
                kt.free_gpu(reserved)
            running.clear()
            host_before = {id(n) for n in kt.iter_nodes() if n.host_copy}
            kt.fail_gpu()
            assert kt.gpu_used_bytes == config["system"]
            # survivors were in host memory before; nothing appears from nowhere
            assert {id(n) for n in kt.iter_nodes() if n.host_copy} <= host_before
        elif op == "replicate":
            upper = [n for n in (kt.root.children or {}).values() if n.in_gpu]
            had_copy = {id(n) for n in upper if n.host_copy}
            copied = kt.replicate_upper_nodes(2)
            most_retrieved = sorted(upper, key=lambda n: (-n.frequency, -n.last_access))[:2]
            new_copies = [n for n in upper if n.host_copy and id(n) not in had_copy]
            # replicas go to the two most retrieved first-level GPU nodes only, and count
            assert {id(n) for n in new_copies} <= {id(n) for n in most_retrieved}
            assert sum(n.size_bytes for n in new_copies) == copied
        else:
            available = kt.gpu_available_bytes
            r = kt.access(docs, [DOC_TOKENS[d] for d in docs], 0, keep_pinned=True,
                          now_s=times[step])
            assert kt.gpu_available_bytes <= available
            if kt.reserve_gpu(private):
                running.append((r.path, private))
            else:
                assert private > kt.gpu_available_bytes
                running.append((r.path, 0))
        kt.check_invariants()
        assert kt.gpu_available_bytes >= 0
