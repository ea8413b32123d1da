"""The answer cache's tier logic on hand-worked examples and property tests.

Every expected value below is worked out by hand from the article's rules (lookup order
L1 → L2 → semantic → miss, backfill of L1, write-back of all tiers, NULL_RESULT with its own TTL,
TTL × (1 + U[0, jitter)), hot-key top N in a sliding window, history bypass), not read back
from the code. The stores are the simulator's modelled ones; the real stores are tested in
test_answer_real.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragsim.cache.answers import (
    NULL_RESULT,
    AnswerCache,
    AnswerCacheConfig,
    Instances,
    ModelSharedStore,
    exact_key,
    normalize_query,
    similarity_to_distance,
)

E1 = np.array([1.0, 0.0, 0.0])


def at_cos(c: float) -> np.ndarray:
    """A unit vector at cosine ``c`` from E1."""
    return np.array([c, math.sqrt(1 - c * c), 0.0])


def cache(**kw) -> AnswerCache:
    kw.setdefault("ttl_jitter", 0.0)
    return AnswerCache(AnswerCacheConfig(**kw), ModelSharedStore())


def test_normalisation_and_key():
    assert normalize_query("  What IS  the\tcapital of France? ") == "what is the capital of france"
    assert exact_key("what is the capital of france") == exact_key("What is the capital of France?")
    # the article's key: exact:{md5 of the text}
    assert exact_key("abc") == "exact:900150983cd24fb0d6963f7d28e17f72"
    assert exact_key("a, b") != exact_key("a b")


def test_lookup_order_backfill_and_write_back():
    c = cache(l1_ttl_s=60, ttl_s=3600, distance_threshold=0.25)
    assert c.lookup("Who wrote Hamlet?", 0.0, embedding=E1).tier == "miss"
    assert c.write_back("Who wrote Hamlet?", "Shakespeare", 0.0, embedding=E1, answer_key="q1")
    assert c.lookup("who wrote hamlet", 1.0, embedding=E1).tier == "l1"
    # L1 expires at 60 s, L2 lives on: an L2 hit, backfilled, so the next one is from L1
    hit = c.lookup("Who wrote Hamlet?", 60.0, embedding=E1)
    assert (hit.tier, hit.entry.answer, hit.entry.answer_key) == ("l2", "Shakespeare", "q1")
    assert c.lookup("Who wrote Hamlet?", 61.0).tier == "l1"
    # a paraphrase at cosine 0.8 (distance 0.2 <= 0.25): semantic, backfilled under its own key
    para = c.lookup("Hamlet was written by whom?", 62.0, embedding=at_cos(0.8))
    assert para.tier == "semantic" and para.entry.answer == "Shakespeare"
    assert para.distance == pytest.approx(0.2, abs=1e-6)
    assert c.lookup("Hamlet was written by whom?", 63.0).tier == "l1"
    # the semantic hit was not written to L2: after L1 expires it is semantic again
    assert c.lookup("Hamlet was written by whom?", 200.0, embedding=at_cos(0.8)).tier == "semantic"
    # at cosine 0.7 (distance 0.3 > 0.25): a miss
    assert c.lookup("Who directed Hamlet?", 64.0, embedding=at_cos(0.7)).tier == "miss"
    # everything gone after the shared TTL
    assert c.lookup("Who wrote Hamlet?", 3600.0, embedding=E1).tier == "miss"
    assert c.counters.hits == {"l1": 3, "l2": 1, "semantic": 2}
    assert (c.counters.lookups, c.counters.misses, c.counters.writes) == (9, 3, 1)


def test_threshold_is_a_distance_and_similarity_converts():
    assert similarity_to_distance(0.88) == pytest.approx(0.12)
    for threshold, tier in ((0.21, "semantic"), (0.19, "miss")):
        c = cache(distance_threshold=threshold)
        c.write_back("a", "A", 0.0, embedding=E1)
        assert c.lookup("b", 1.0, embedding=at_cos(0.8)).tier == tier
    off = cache(semantic=False)
    off.write_back("a", "A", 0.0, embedding=E1)
    assert off.lookup("b", 1.0, embedding=E1).tier == "miss"


def test_embedding_is_computed_only_when_the_semantic_tier_is_asked():
    calls = []

    def embed():
        calls.append(1)
        return E1

    c = cache()
    c.write_back("a", "A", 0.0, embedding=embed)
    assert c.lookup("a", 1.0, embedding=embed).tier == "l1"
    assert len(calls) == 1


def test_null_result_guards_penetration_with_its_own_ttl():
    c = cache(l1_ttl_s=60, ttl_s=3600, null_ttl_s=600)
    assert c.lookup("unanswerable", 0.0).tier == "miss"
    c.write_back("unanswerable", None, 0.0, embedding=E1)
    for t, tier in ((1.0, "l1"), (60.0, "l2"), (61.0, "l1"), (599.0, "l2"), (599.5, "l1")):
        got = c.lookup("unanswerable", t)
        assert got.tier == tier and got.entry.answer == NULL_RESULT and got.entry.negative
    # the backfill at 599 s lasts only the 1 s left of the shared entry, not L1's 60 s
    assert c.lookup("unanswerable", 600.0).tier == "miss"
    # negative entries are not put in the semantic tier
    assert c.lookup("something near", 1.0, embedding=E1).tier == "miss"
    assert c.counters.negative_hits == 5
    # a short L1 TTL bounds negatives in L1 too; a longer null TTL does not lengthen L1
    short = cache(l1_ttl_s=60, null_ttl_s=30)
    short.write_back("x", None, 0.0)
    assert short.lookup("x", 29.0).tier == "l1"
    assert short.lookup("x", 30.0).tier == "miss"


def expiries(jitter: float, n: int = 400) -> np.ndarray:
    c = cache(ttl_s=100.0, l1_ttl_s=1.0, ttl_jitter=jitter, seed=3)
    for i in range(n):
        c.write_back(f"q{i}", "a", 0.0)
    alive = []
    for t in (99.999, 100.0, 125.0, 150.0):
        alive.append(sum(c.shared.get_exact(exact_key(f"q{i}"), t) is not None for i in range(n)))
    return np.array(alive) / n


def test_ttl_jitter_spreads_expiry():
    # without jitter every entry dies at the same instant (an avalanche)
    assert list(expiries(0.0)) == [1.0, 0.0, 0.0, 0.0]
    # with 50 % jitter the TTL is uniform on [100, 150): all alive at 100, about half at 125
    # (binomial n=400, p=0.5: 0.40..0.60 is beyond 4 sigma), none at 150
    spread = expiries(0.5)
    assert spread[0] == spread[1] == 1.0
    assert 0.40 < spread[2] < 0.60
    assert spread[3] == 0.0


def test_hot_key_admission_top_n_in_a_sliding_window():
    c = cache(hot_top_n=2, hot_window_s=10.0)
    for t, q in enumerate("aaabbc"):
        c.lookup(q, float(t))
    # counts a:3 b:2 c:1 in the window: a and b are the top 2, c is not admitted
    assert c.write_back("a", "A", 6.0)
    assert c.write_back("b", "B", 6.0)
    assert not c.write_back("c", "C", 6.0)
    assert c.counters.not_admitted == 1
    # a NULL_RESULT is always written (the penetration guard must not depend on popularity)
    assert c.write_back("c", None, 6.0)
    # 10 s after the last a/b lookups the window holds only c's new lookups: c is now hot
    c.lookup("c", 15.5)
    assert c.write_back("c", "C", 15.5)
    assert not c.write_back("d", "D", 15.5)  # never looked up


def test_hot_key_ties_keep_at_most_n():
    c = cache(hot_top_n=2, hot_window_s=100.0)
    for t, q in enumerate("abcd"):
        c.lookup(q, float(t))
    admitted = [q for q in "abcd" if c.write_back(q, q.upper(), 5.0)]
    assert len(admitted) == 2


def test_history_bypasses_every_tier():
    c = cache()
    c.write_back("a", "A", 0.0)
    assert c.lookup("a", 1.0, history=True).tier == "bypass"
    assert not c.write_back("b", "B", 1.0, history=True)
    assert c.lookup("b", 2.0).tier == "miss"
    assert c.counters.bypassed == 1


def test_l1_capacity_evicts_least_recently_used():
    c = cache(l1_size=2, l1_ttl_s=60)
    c.write_back("a", "A", 0.0)
    c.write_back("b", "B", 1.0)
    assert c.lookup("a", 2.0).tier == "l1"
    c.write_back("c", "C", 3.0)  # evicts b, the least recently used
    assert [c.lookup(q, 4.0 + t).tier for t, q in enumerate("cab")] == ["l1", "l1", "l2"]
    # b's backfill evicted c (used at 4 s; a was used at 5 s)
    assert c.lookup("c", 8.0).tier == "l2"
    assert len(c.l1) == 2


def test_instances_round_robin_each_with_its_own_l1():
    shared = ModelSharedStore()
    group = Instances(AnswerCacheConfig(ttl_jitter=0.0), shared, 2)
    first = group.route("q")
    assert first.lookup("q", 0.0).tier == "miss"
    first.write_back("q", "A", 0.0)
    # request 2 goes to instance 1: its L1 is empty, L2 serves it (and backfills it)
    tiers = []
    for t in range(1, 5):
        tiers.append(group.route("q").lookup("q", float(t)).tier)
    assert tiers == ["l2", "l1", "l1", "l1"]
    assert group.counters.hits == {"l1": 3, "l2": 1, "semantic": 0}


def test_instances_hash_routing_is_sticky():
    group = Instances(AnswerCacheConfig(ttl_jitter=0.0), ModelSharedStore(), 3, routing="hash")
    first = group.route("Some question?")
    assert all(group.route("some  question") is first for _ in range(5))
    first.lookup("Some question?", 0.0)
    first.write_back("Some question?", "A", 0.0)
    assert [group.route("some question").lookup("some question", 1.0).tier
            for _ in range(3)] == ["l1"] * 3


def test_shared_capacities_evict_lru():
    shared = ModelSharedStore(l2_capacity=2, semantic_capacity=2)
    c = AnswerCache(AnswerCacheConfig(ttl_jitter=0.0, l1_size=1), shared)
    vecs = {q: np.eye(3)[i] for i, q in enumerate("abc")}
    for t, q in enumerate("abc"):
        c.write_back(q, q.upper(), float(t), embedding=vecs[q])
    assert shared.live_counts(5.0) == (2, 2)
    assert shared.get_exact(exact_key("a"), 5.0) is None
    assert c.lookup("z", 5.0, embedding=vecs["a"]).tier == "miss"


OPS = st.lists(
    st.tuples(st.sampled_from(["lookup", "write", "null"]), st.integers(0, 7),
              st.floats(0.0, 40.0, allow_nan=False)),
    min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, l1_size=st.integers(1, 4), cap=st.integers(1, 5),
       jitter=st.floats(0.0, 1.0), threshold=st.floats(0.0, 0.5))
@example(ops=[("write", 2, 0.0), ("null", 2, 0.0), ("lookup", 2, 20.0)], l1_size=1, cap=1,
         jitter=0.0, threshold=0.0)
def test_capacities_hold_and_no_hit_outlives_its_ttl(ops, l1_size, cap, jitter, threshold):
    config = AnswerCacheConfig(l1_size=l1_size, l1_ttl_s=30.0, ttl_s=60.0, null_ttl_s=20.0,
                               ttl_jitter=jitter, distance_threshold=threshold)
    shared = ModelSharedStore(l2_capacity=cap, semantic_capacity=cap)
    group = Instances(config, shared, 2)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(8, 4))
    # key -> (time, negative) of its writes: one instance may still serve, from its own L1, a
    # positive answer another instance has since overwritten with NULL_RESULT (the article's
    # multi-instance L1 consistency question), so a hit is checked against the last write of
    # its own kind
    written: dict[tuple[str, bool], float] = {}
    l1_filled: dict[tuple[int, str], float] = {}  # (instance, key) -> last L1 put
    now = 0.0
    for op, q, dt in ops:
        now += dt
        query = f"question {q}"
        key = exact_key(query)
        c = group.route(query)
        i = group.caches.index(c)
        if op == "lookup":
            got = c.lookup(query, now, embedding=vectors[q])
            if got.tier == "l1":
                assert now < l1_filled[i, key] + 30.0
            if got.hit:  # no tier serves an entry past the TTL of its last write
                negative = got.entry.negative
                w = written[got.entry.key, negative]
                ttl = 20.0 if negative else 60.0
                assert now < w + ttl * (1 + jitter)
            if got.tier in ("l2", "semantic"):
                l1_filled[i, key] = now
        else:
            c.write_back(query, None if op == "null" else f"A{q}", now, embedding=vectors[q])
            written[key, op == "null"] = now
            l1_filled[i, key] = now
        for each in group.caches:
            assert len(each.l1) <= l1_size
        exact, vec = shared.live_counts(now)
        assert exact <= cap and vec <= cap
