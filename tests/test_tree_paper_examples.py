"""Hand-worked examples from the RAGCache paper, on the knowledge tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ragsim.cache import KnowledgeTree, Tier, make_policy
from ragsim.cache.bounds import static_frequency_bound
from ragsim.profiles.grid import BilinearGrid


def bilinear_table(c0: float, c_new: float, c_pair: float) -> BilinearGrid:
    """T(a, b) = c0 + c_new*b + c_pair*a*b: bilinear, so interpolation on it is exact."""
    cached, new = [0.0, 10_000.0], [1.0, 10_000.0]
    grid = [[c0 + c_new * b + c_pair * a * b for b in new] for a in cached]
    return BilinearGrid("test", "cached_tokens", "new_tokens", cached, new, grid)


def tree(policy: str = "pgdsf", *, gpu: int, host: int = 0, table=None, **kw) -> KnowledgeTree:
    table = table or bilinear_table(0.0, 0.001, 0.0)
    return KnowledgeTree(make_policy(policy), gpu_capacity_bytes=gpu, host_capacity_bytes=host,
                         kv_bytes_per_token=1, prefill_cost_s=table.at, **kw)


class TestFigure9CostEstimation:
    """Request [S, D1, D2, Q]: D2's cost depends on what of its prefix was cached."""

    S, D1, D2, Q = 100, 200, 300, 50
    table = bilinear_table(0.01, 0.001, 1e-6)

    def t(self, a: float, b: float) -> float:
        return 0.01 + 0.001 * b + 1e-6 * a * b

    def test_only_system_prompt_cached(self):
        kt = tree(gpu=10_000, table=self.table, system_prompt_tokens=self.S)
        r = kt.access([1, 2], [self.D1, self.D2], self.Q)
        alpha, beta = self.S, self.D1 + self.D2 + self.Q
        assert (r.cached_tokens, r.new_tokens) == (alpha, beta)
        expected = self.t(alpha, beta) / beta  # 0.615 s over 550 uncached tokens
        d1, d2 = r.path
        assert d1.total_cost == pytest.approx(expected, rel=1e-12)
        assert d2.total_cost == pytest.approx(expected, rel=1e-12)
        assert d2.num_computed == 1 and d2.value == pytest.approx(expected, rel=1e-12)

    def test_system_prompt_and_d1_cached(self):
        kt = tree(gpu=10_000, table=self.table, system_prompt_tokens=self.S)
        kt.access([1], [self.D1], self.Q)  # caches D1 after S
        r = kt.access([1, 2], [self.D1, self.D2], self.Q)
        alpha, beta = self.S + self.D1, self.D2 + self.Q
        assert (r.cached_tokens, r.new_tokens, r.hit_tokens_gpu) == (alpha, beta, self.D1)
        d1, d2 = r.path
        assert d2.avg_cost_per_token_s == pytest.approx(self.t(alpha, beta) / beta, rel=1e-12)
        # D1 was cached this time: frequency grows, its average cost does not change
        first = self.t(self.S, self.D1 + self.Q) / (self.D1 + self.Q)
        assert d1.frequency == 2 and d1.num_computed == 1
        assert d1.value == pytest.approx(2 * first, rel=1e-12)

    def test_cost_averages_over_the_m_requests_that_computed_the_node(self):
        kt = tree(gpu=300, table=self.table)
        kt.access([1], [200], 0)  # D1 computed alone
        kt.access([2], [200], 0)  # evicts D1 (capacity 300 bytes)
        assert kt.tier_of([1]) is Tier.NONE
        kt.access([1], [200], 100)  # D1 computed again, other beta
        node = kt.root.children[1]
        costs = [self.t(0, 200) / 200, self.t(0, 300) / 300]
        assert node.num_computed == 2
        assert node.avg_cost_per_token_s == pytest.approx(sum(costs) / 2, rel=1e-12)
        # PGDSF's Frequency counts from system start: eviction keeps it, and the cost statistics
        assert node.frequency == 2


@pytest.mark.parametrize("policy", ["pgdsf", "gdsf", "lfu", "lru", "pgdsf-const-cost"])
@pytest.mark.parametrize(("scope", "count_after_return"), [("lifetime", 3), ("admission", 1)])
def test_every_policy_counts_by_the_trees_one_rule(policy, scope, count_after_return):
    """The counting rule belongs to the tree, not the policy: under lifetime every policy's
    node comes back with its two earlier retrievals (3), under admission with none (1)."""
    kt = tree(policy, gpu=100, frequency_scope=scope)
    kt.access([1], [100])
    kt.access([1], [100])
    kt.access([2], [100])  # evicts document 1 entirely (no host tier)
    assert kt.tier_of([1]) is Tier.NONE
    kt.access([1], [100])
    assert kt.root.children[1].frequency == count_after_return


def test_a_remembered_count_keeps_a_returning_document_over_a_newer_one():
    """Hand-worked, two 100-token slots, cost c per token for every computation.

    A, A (A: 2c), B (c), C: evicts B (clock c; C = c + c = 2c), D: A and C tie at 2c, A is
    older and goes (clock 2c; D = 3c). A returns: with its count kept it is computed once more
    at frequency 3, priority 2c + 3c = 5c; counting from admission it would be 2c + c = 3c.
    Room for A evicts C (2c). E (2c + c = 3c) evicts D (3c, older than A either way). F: the
    remembered count keeps A (5c) and evicts E; counting from admission A (3c) is older than
    E (3c) and goes.
    """
    A, B, C, D, E, F = range(1, 7)
    survivors = {}
    for label, scope in (("kept", "lifetime"), ("reset", "admission")):
        kt = KnowledgeTree(make_policy("pgdsf"), gpu_capacity_bytes=200, kv_bytes_per_token=1,
                           prefill_cost_s=bilinear_table(0.0, 0.001, 0.0).at,
                           frequency_scope=scope)
        c = kt.prefill_cost_s(0, 100) / 100
        for doc in (A, A, B, C, D):
            kt.access([doc], [100])
        assert kt.tier_of([A]) is Tier.NONE and kt.clock_gpu == pytest.approx(2 * c)
        kt.access([A], [100])
        expected = 5 * c if label == "kept" else 3 * c
        assert kt.root.children[A].priority_gpu == pytest.approx(expected)
        kt.access([E], [100])
        kt.access([F], [100])
        survivors[label] = {n.key for n in kt.iter_nodes() if n.in_gpu and n.parent is not None}
        kt.check_invariants()
    assert survivors == {"kept": {A, F}, "reset": {E, F}}


def test_algorithm1_evict_in_gpu_leaf_order_and_clock():
    """EVICT_IN_GPU takes the lowest-priority *leaf*; a parent becomes a candidate once its
    last GPU child leaves; the clock rises to each victim's priority."""
    kt = tree(gpu=300)  # three 100-token documents
    c = kt.prefill_cost_s(0, 100) / 100  # cost per token, the same for every computation here
    for _ in range(3):
        kt.access([ord("A")], [100])
    kt.access([ord("B")], [100])
    kt.access([ord("A"), ord("C")], [100, 100])  # A: freq 4 -> 4c; B: c; C: c
    assert kt.root.children[ord("A")].value == pytest.approx(4 * c)

    def step(doc: str):
        before = {n.key for n in kt.iter_nodes() if n.in_gpu}
        kt.access([ord(doc)], [100])
        after = {n.key for n in kt.iter_nodes() if n.in_gpu}
        (evicted,) = before - after
        return chr(evicted), kt.clock_gpu / c

    # B and C tie at c: the least recently accessed (B) goes first. A is not a leaf yet.
    assert step("D") == pytest.approx(("B", 1.0))
    # D entered at clock c with priority 2c; C (c) is the lowest leaf
    assert step("E") == pytest.approx(("C", 1.0))
    # C gone: A is a GPU leaf now (4c) but D (2c) and E (2c) are lower; D is older
    assert step("F") == pytest.approx(("D", 2.0))
    assert step("G") == pytest.approx(("E", 2.0))
    # F and G both 3c: F is older; A (4c) survives on its frequency
    assert step("H") == pytest.approx(("F", 3.0))
    assert kt.tier_of([ord("A")]) is Tier.GPU
    kt.check_invariants()


def test_a_swapped_out_node_keeps_the_host_priority_of_its_last_retrieval():
    """The clock part of a priority records when a node was retrieved (the paper: "when a
    document is retrieved, its node's clock is set"); a swap-out is not a retrieval.

    GPU 200, host 200, 100-token documents, cost c per token. X three times (3c in both tiers,
    host clock 0). A, B, C: A and then B leave the GPU for host; making room for X evicts A
    from host, raising the host clock to c. X arrives in host with 3c (0 + 3c at its last
    retrieval), not c + 3c: its frequency is worth what it was, not more.
    """
    kt = tree("pgdsf", gpu=200, host=200)
    c = kt.prefill_cost_s(0, 100) / 100
    X, A, B, C, D = range(1, 6)
    for doc in (X, X, X, A, B, C):
        kt.access([doc], [100])
    assert kt.tier_of([X]) is Tier.GPU and kt.clock_host == 0.0
    kt.access([D], [100])  # GPU: X (3c, oldest) and C (3c) tie; X goes, A leaves the host
    assert kt.tier_of([X]) is Tier.HOST and kt.tier_of([A]) is Tier.NONE
    assert kt.clock_host == pytest.approx(c)
    assert kt.root.children[X].priority_host == pytest.approx(3 * c)
    kt.check_invariants()


def test_swap_out_only_once():
    kt = tree("lru", gpu=100, host=1_000)
    kt.access([1], [100])
    kt.access([2], [100])  # A leaves the GPU for the first time: copied to host
    assert kt.swap_out_bytes == 100 and kt.tier_of([1]) is Tier.HOST
    r = kt.access([1], [100])  # host hit: copied back, host copy kept
    assert (r.hit_tokens_host, r.swap_in_bytes) == (100, 100)
    assert kt.tier_of([1]) is Tier.GPU and kt.root.children[1].host_copy
    assert kt.swap_out_bytes == 200  # B copied out on its first departure
    kt.access([2], [100])  # A leaves the GPU again: its KV is already in host, no copy
    assert kt.swap_out_bytes == 200
    assert kt.tier_of([1]) is Tier.HOST and kt.host_used_bytes == 200
    kt.check_invariants()


def test_host_hit_is_reported_and_promoted_under_its_gpu_parent():
    kt = tree("lru", gpu=200, host=1_000)
    kt.access([1, 2], [100, 100])
    kt.access([3, 4], [100, 100])  # 2, then 1 (a leaf once 2 left) go to host
    assert kt.tier_of([1]) is Tier.HOST and kt.tier_of([1, 2]) is Tier.HOST
    kt.check_invariants()
    r = kt.access([1, 2], [100, 100])
    assert (r.hit_tokens_gpu, r.hit_tokens_host, r.swap_in_bytes) == (0, 200, 200)
    assert kt.tier_of([1]) is Tier.GPU and kt.tier_of([1, 2]) is Tier.GPU
    kt.check_invariants()


def test_thrashing_example_and_reordering():
    """Q odd -> D1, Q even -> D2, room for one document: in arrival order nothing hits;
    reordered {Q1, Q3, Q5, Q2, Q4, Q6} the hit rate is 4/6 (the paper's 66%)."""
    in_order = [1, 2, 1, 2, 1, 2]
    reordered = [1, 1, 1, 2, 2, 2]
    for policy in ("pgdsf", "lru"):
        kt = tree(policy, gpu=100)
        hits = [kt.access([d], [100]).hit_tokens_gpu > 0 for d in in_order]
        assert sum(hits) == 0
        kt = tree(policy, gpu=100)
        hits = [kt.access([d], [100]).hit_tokens_gpu > 0 for d in reordered]
        assert sum(hits) == 4


def test_order_matters_same_documents_different_positions():
    """[D1, D3] and [D2, D3]: D3's KV differs by prefix, so no hit for D3 the second time."""
    kt = tree("lru", gpu=10_000)
    kt.access([1, 3], [10, 10])
    r = kt.access([2, 3], [10, 10])
    assert r.hit_tokens_gpu == 0 and r.recomputed_tokens == 20
    r = kt.access([3, 1], [10, 10])
    assert r.hit_tokens_gpu == 0
    r = kt.access([1, 3, 2], [10, 10, 10])
    assert (r.hit_tokens_gpu, r.recomputed_tokens) == (20, 10)


def test_pinned_nodes_are_not_evicted_and_admission_can_fail():
    kt = tree("lru", gpu=200)
    running = kt.access([1, 2], [100, 100], keep_pinned=True)
    r = kt.access([3], [100])
    assert r.recomputed_tokens == 100 and kt.tier_of([3]) is Tier.NONE
    assert kt.admission_failures == 1
    kt.release(running.path)
    kt.access([3], [100])
    assert kt.tier_of([3]) is Tier.GPU and kt.tier_of([1, 2]) is Tier.NONE
    kt.check_invariants()


def test_cached_depth_cap_caches_only_the_first_k_documents():
    kt = tree("lru", gpu=10_000, max_cached_depth=2)
    kt.access([1, 2, 3, 4, 5], [10] * 5)
    r = kt.access([1, 2, 3, 4, 5], [10] * 5)
    assert (r.hit_tokens_gpu, r.recomputed_tokens) == (20, 30)
    assert kt.node_count == 3  # root + two cached positions


def test_dropping_a_gpu_leaf_drops_its_host_only_children():
    """If a GPU node cannot be copied to host, it is freed, and the prefix property then
    forbids keeping its host-only descendants."""
    kt = tree("lru", gpu=150, host=50)
    kt.access([1, 2], [100, 50])  # P=1 (100), C=2 (50), both in GPU
    kt.access([3], [50])  # C is the only GPU leaf: it goes to host
    assert kt.tier_of([1, 2]) is Tier.HOST and kt.tier_of([1]) is Tier.GPU
    kt.access([4], [100])  # P is the LRU leaf; 100 bytes cannot go to a 50-byte host
    assert kt.tier_of([1]) is Tier.NONE
    assert kt.tier_of([1, 2]) is Tier.NONE  # cascaded
    assert kt.dropped_bytes == 150 and kt.host_used_bytes == 0
    assert kt.tier_of([3]) is Tier.GPU and kt.tier_of([4]) is Tier.GPU
    kt.check_invariants()


def test_capacity_zero_never_hits():
    kt = tree("pgdsf", gpu=0, host=0)
    for _ in range(3):
        r = kt.access([1, 2], [10, 20], 5)
        assert (r.hit_tokens_gpu, r.hit_tokens_host, r.recomputed_tokens) == (0, 0, 30)
    kt.check_invariants()


def test_reservations_evict_cache_but_never_pinned_nodes():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=300, kv_bytes_per_token=1)
    old = kt.access([1], [100])
    running = kt.access([2], [100], keep_pinned=True)
    assert kt.gpu_available_bytes == 200  # doc 1 is evictable, doc 2 is not
    assert not kt.reserve_gpu(201)
    assert kt.tier_of([1]) == Tier.GPU  # a refused reservation changes nothing
    assert kt.reserve_gpu(150)  # evicts doc 1 (no host tier: dropped)
    assert kt.tier_of([1]) == Tier.NONE and kt.tier_of([2]) == Tier.GPU
    assert kt.gpu_used_bytes == 250 and kt.gpu_available_bytes == 50
    kt.release(running.path)
    kt.free_gpu(150)
    assert kt.gpu_available_bytes == 300
    assert old.recomputed_tokens == 100
    kt.check_invariants()


def test_gpu_failure_keeps_host_copies_and_drops_what_hangs_below_a_lost_node():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=250, host_capacity_bytes=1000,
                       kv_bytes_per_token=1, system_prompt_tokens=50)
    kt.access([1], [100])
    kt.access([2], [100])  # GPU full: 50 + 100 + 100
    kt.access([3], [100])  # evicts doc 1 to host (its first departure: a copy)
    kt.access([1, 4], [100, 100])  # doc 1 back to GPU (host copy kept), [1, 4] placed
    assert kt.tier_of([1]) == Tier.GPU and kt.tier_of([1, 4]) == Tier.GPU
    tiers_before = {k: kt.tier_of(list(k)) for k in ((1,), (2,), (3,), (1, 4))}
    lost = kt.fail_gpu()
    kt.check_invariants()
    assert kt.gpu_used_bytes == 50  # the system prompt, recovered from its replica
    assert kt.tier_of([1]) == Tier.HOST  # it had a host copy
    assert kt.tier_of([1, 4]) == Tier.NONE  # GPU only: gone
    # what was only in GPU is lost; host copies survive
    gpu_only = [k for k, t in tiers_before.items() if t == Tier.GPU and k != (1,)]
    assert lost == sum(100 for _ in gpu_only)
    again = kt.access([1, 4], [100, 100])
    assert again.hit_tokens_host == 100 and again.recomputed_tokens == 100
    assert kt.gpu_failures == 1


@pytest.mark.parametrize("policy", ["pgdsf", "lfu"])
@pytest.mark.parametrize(("scope", "count"), [("lifetime", 3), ("admission", 1)])
def test_gpu_failure_loses_kv_not_the_controllers_counts(policy, scope, count):
    """Counts live in the controller, so a GPU failure does not reset lifetime counts; under
    admission the lost node left the cache entirely, so its count restarts."""
    kt = tree(policy, gpu=300, frequency_scope=scope)
    kt.access([1], [100])
    kt.access([1], [100])
    kt.fail_gpu()
    assert kt.tier_of([1]) is Tier.NONE
    kt.access([1], [100])
    assert kt.root.children[1].frequency == count
    kt.check_invariants()


def test_gpu_failure_refuses_while_requests_hold_the_gpu():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=300, kv_bytes_per_token=1)
    r = kt.access([1], [100], keep_pinned=True)
    with pytest.raises(ValueError, match="release"):
        kt.fail_gpu()
    kt.release(r.path)
    kt.fail_gpu()
    kt.check_invariants()


def test_gpu_failure_invalidates_host_copies_below_a_lost_gpu_node():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=250, host_capacity_bytes=1000,
                       kv_bytes_per_token=1, system_prompt_tokens=50)
    kt.access([1, 4], [100, 100])
    kt.access([2], [100])  # evicts the leaf [1, 4] to host; [1] stays, GPU only
    assert kt.tier_of([1]) == Tier.GPU and kt.tier_of([1, 4]) == Tier.HOST
    lost = kt.fail_gpu()
    kt.check_invariants()
    assert kt.tier_of([1]) == Tier.NONE and kt.tier_of([1, 4]) == Tier.NONE
    assert lost == 300 and kt.host_used_bytes == 0


def test_a_replica_keeps_the_host_priority_of_its_last_retrieval():
    """As for a swap-out: X (retrieved three times while the host clock was 0, so 3c) is
    replicated after host evictions raised the host clock to c; it enters with 3c, not 4c."""
    kt = tree("pgdsf", gpu=300, host=100)
    c = kt.prefill_cost_s(0, 100) / 100
    X, A, B, C, D = range(1, 6)
    for doc in (X, X, X, A, B, C, D):  # C sends A to host; D sends B there, evicting A
        kt.access([doc], [100])
    assert kt.tier_of([X]) is Tier.GPU and kt.tier_of([B]) is Tier.HOST
    assert kt.clock_host == pytest.approx(c)
    assert kt.replicate_upper_nodes(1) == 100  # X, the most retrieved, replaces B
    assert kt.tier_of([B]) is Tier.NONE
    assert kt.root.children[X].priority_host == pytest.approx(3 * c)
    kt.check_invariants()


def test_replicas_of_the_most_used_upper_nodes_survive_a_gpu_failure():
    kt = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=1000, host_capacity_bytes=150,
                       kv_bytes_per_token=1)
    kt.access([1], [100])
    kt.access([1], [100])  # the most retrieved
    kt.access([2], [100])
    kt.access([3, 4], [100, 100])  # only first-level nodes are replicated
    assert kt.replicate_upper_nodes(2) == 100  # room for one: the second may not evict it
    assert kt.replica_bytes == 100 and kt.tier_of([1]) == Tier.GPU
    kt.check_invariants()
    kt.fail_gpu()
    assert kt.tier_of([1]) == Tier.HOST
    assert [kt.tier_of(k) for k in ([2], [3], [3, 4])] == [Tier.NONE] * 3
    assert kt.replicate_upper_nodes(2) == 0  # nothing left in GPU to replicate
    kt.check_invariants()


def _csr(reqs):
    """(documents, tokens) per request -> the trace's CSR columns."""
    offsets = np.cumsum([0] + [len(docs) for docs, _ in reqs])
    ids = np.array([d for docs, _ in reqs for d in docs], dtype=np.int64)
    tokens = np.array([t for _, toks in reqs for t in toks], dtype=np.int64)
    return offsets, ids, tokens


def test_static_frequency_bound_by_hand():
    """[A,B], [A,B], [A,C], [D] with A=2, B=3, C=1, D=5 tokens (18 in all). Counts: A 3,
    AB 2, AC 1, D 1 (only A and AB are worth keeping). Five tokens hold A and AB: A hits
    twice (4), AB once (3): 7/18. Four tokens: A, and 2 of AB's 3 tokens in the LP bound
    (4 + 2 = 6/18) or A alone with whole nodes (4/18)."""
    A, B, C, D = range(4)
    sizes = {A: 2, B: 3, C: 1, D: 5}
    csr = _csr([(docs, [sizes[d] for d in docs]) for docs in ([A, B], [A, B], [A, C], [D])])
    assert static_frequency_bound(*csr, 5) == pytest.approx(7 / 18)
    assert static_frequency_bound(*csr, 4) == pytest.approx(6 / 18)
    assert static_frequency_bound(*csr, 4, whole_nodes=True) == pytest.approx(4 / 18)
    assert static_frequency_bound(*csr, 100) == pytest.approx(7 / 18)
    assert static_frequency_bound(*csr, 100, max_depth=1) == pytest.approx(4 / 18)


def _static_hit_rate(reqs, kept: set) -> float:
    """Replay ``reqs`` against fixed contents ``kept`` (prefix-closed): the tree's lookup."""
    seen, hits, total = set(), 0, 0
    for docs, tokens in reqs:
        total += sum(tokens)
        for d in range(1, len(docs) + 1):
            key = tuple(docs[:d])
            if key not in kept:
                break
            if key in seen:
                hits += tokens[d - 1]
            seen.add(key)
    return hits / total


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),
                min_size=1, max_size=25),
       st.integers(0, 20))
def test_static_frequency_bound_is_above_every_fixed_contents_and_greedy_is_feasible(docs_lists,
                                                                                  capacity):
    """Brute force over every prefix-closed set of nodes that fits: none keeps more than the
    bound, and the whole-node greedy contents are one of them."""
    sizes = {d: 1 + (d * 5) % 7 for d in range(5)}
    reqs = [(docs, [sizes[d] for d in docs]) for docs in docs_lists]
    nodes = sorted({tuple(docs[:d]) for docs in docs_lists for d in range(1, len(docs) + 1)})
    assume(len(nodes) <= 12)
    bound = static_frequency_bound(*_csr(reqs), capacity)
    best = 0.0
    for mask in range(1 << len(nodes)):
        kept = {n for i, n in enumerate(nodes) if mask >> i & 1}
        if sum(sizes[n[-1]] for n in kept) > capacity:
            continue
        if any(len(n) > 1 and n[:-1] not in kept for n in kept):
            continue
        best = max(best, _static_hit_rate(reqs, kept))
    assert best <= bound + 1e-12
    assert static_frequency_bound(*_csr(reqs), capacity, whole_nodes=True) <= best + 1e-12
