"""The answer cache in the simulator: decisions worked out by hand on a small trace, what the
summary reports, the KV figures behind it, and sim vs real (same trace, same decisions).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ragsim.profiles.profile import load_profile
from ragsim.serving.answer_stage import core_config, embed_texts
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace
from ragsim.traces.paraphrase import with_questions
from tests import answer_server

answer_redis = answer_server.answer_redis
answer_url = answer_server.answer_url

GOLDEN = Path(__file__).parent / "data" / "answer_golden_gsm8k.jsonl"


@pytest.fixture(scope="module")
def profile():
    return load_profile("a10g-mistral-7b")


def small_trace(texts: list[str], keys: list[str] | None = None):
    import dataclasses

    base = resolve_trace("mmlu", seed=0, n_requests=len(texts))
    return dataclasses.replace(base, query_text=pa.array(texts, pa.string()),
                               answer_key=pa.array(keys or texts, pa.string()))


def simulate(trace, profile, **settings):
    config = build_config({"trace": "mmlu", "answer_cache": True, "answer_semantic": False,
                           "arrival": "sequential", **settings})
    return run_simulation(trace, config, profile)


def test_exact_tiers_on_a_hand_worked_sequence(profile):
    texts = ["a", "b", "a", "A?", "c", "b"]
    result = simulate(small_trace(texts), profile)
    # one instance: a and b miss, a again (and "A?", normalised to "a") from L1, c misses, b L1
    assert result.columns["answer_tier"].tolist() == ["miss", "miss", "l1", "l1", "miss", "l1"]
    s = result.summary
    assert s["answer_cache_hits"] == {"l1": 3, "l2": 0, "semantic": 0}
    assert s["answer_cache_hit_rate"] == pytest.approx(0.5)
    assert s["answer_cache_engine"]["requests"] == 3
    # the answered requests retrieved and prefilled nothing
    answered = result.columns["answer_tier"] == "l1"
    assert (result.columns["doc_tokens"][answered] == 0).all()
    assert np.isnan(result.columns["search_start_s"][answered]).all()
    # the L1 lookup's latency, as the shipped latency profile gives it
    shipped = json.loads((resources.files("ragsim.serving") / "data" / "answer-profile.json")
                         .read_text())
    assert result.columns["ttft_s"][answered] == pytest.approx(shipped["l1"]["lookup_s"])


def test_two_instances_each_with_its_own_l1(profile):
    texts = ["a", "b", "a", "a", "c", "b"]
    result = simulate(small_trace(texts), profile, instances=2)
    # round robin: 0,2,4 -> instance 0 and 1,3,5 -> instance 1; request 3 asks instance 1,
    # whose L1 never saw "a": L2 serves it
    assert result.columns["answer_tier"].tolist() == ["miss", "miss", "l1", "l2", "miss", "l1"]
    hashed = simulate(small_trace(texts), profile, instances=2, answer_routing="hash")
    assert hashed.columns["answer_tier"].tolist() == ["miss", "miss", "l1", "l1", "miss", "l1"]


def test_ttl_expiry_in_simulated_time(profile):
    texts = ["a"] * 4
    trace = small_trace(texts)
    trace.arrival_s = np.array([0.0, 10.0, 200.0, 5000.0])
    result = simulate(trace, profile, arrival="trace", answer_l1_ttl_s=60.0, answer_ttl_s=1000.0,
                      answer_ttl_jitter=0.0)
    # L1 until 60 s after the write-back, L2 until 1000 s, then gone
    assert result.columns["answer_tier"].tolist() == ["miss", "l1", "l2", "miss"]


def test_run_without_the_answer_cache_records_nothing_of_it(profile):
    config = build_config({"trace": "mmlu"})
    assert not any(k.startswith("answer") for k in config.to_dict())
    result = run_simulation(small_trace(["a", "a"]), config, profile)
    assert "answer_tier" not in result.columns
    assert not any(k.startswith("answer_cache") for k in result.summary)


def golden_questions():
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    return [r["question"] for r in rows], [f"gsm8k-{i}" for i in range(len(rows))]


@pytest.fixture(scope="module")
def paraphrased():
    questions, keys = golden_questions()
    base = resolve_trace("mmlu", seed=0, n_requests=400)
    return with_questions(base, questions, keys, zipf_s=1.1, paraphrase_p=0.4, seed=3,
                          n_requests=400)


def test_semantic_hits_on_paraphrases_and_false_hits_counted(paraphrased, profile):
    result = simulate(paraphrased, profile, answer_semantic=True)
    s = result.summary
    assert s["answer_cache_semantic"]
    assert s["answer_cache_hits"]["semantic"] > 0
    tiers = result.columns["answer_tier"]
    # a false hit is a hit whose stored answer key differs from the request's; with the
    # exact tiers on distinct texts it cannot happen, so false hits are all semantic
    false = result.columns["answer_false_hit"]
    assert set(tiers[false]) <= {"semantic"}
    assert s["answer_cache_false_hit_rate"] == pytest.approx(
        false.sum() / sum(s["answer_cache_hits"].values()))
    # an upper bound worked out independently: a request can only hit if its answer key, or a
    # text within the threshold, was asked before; the first request of each key never hits
    keys = paraphrased.answer_key.to_pylist()
    first_of_key = {k: i for i, k in reversed(list(enumerate(keys)))}
    hits = tiers != "miss"
    for k, i in first_of_key.items():
        if hits[i]:
            assert false[i], (k, i)


def test_sim_and_real_make_the_same_decisions(paraphrased, profile, answer_url):
    """Same trace, same embeddings, same config: the simulated answer cache (modelled stores,
    simulated time) and the real one (cachetools + Redis + redisvl FLAT, wall time) decide
    every request alike. TTLs are long enough that nothing expires in either clock."""
    from ragsim.realrun.answers.golden import replay_decisions

    settings = {"answer_semantic": True, "instances": 2, "answer_l1_size": 20,
                "answer_l1_ttl_s": 1e6, "answer_ttl_s": 1e6}
    sim = simulate(paraphrased, profile, **settings)
    texts = paraphrased.query_text.to_pylist()
    keys = paraphrased.answer_key.to_pylist()
    real = replay_decisions(texts, keys, embed_texts(texts), answer_url,
                            config=core_config(sim.config), instances=2)
    sim_tiers = sim.columns["answer_tier"].tolist()
    assert sim_tiers == real
    assert {"l1", "l2", "semantic", "miss"} <= set(real)  # every kind of decision compared


def test_a_semantic_hit_on_another_answer_key_is_a_false_hit(profile):
    # the second text paraphrases the first but is labelled with another answer: whatever the
    # cache serves it is the first one's answer, a false hit; the third is unrelated
    texts = ["What is the capital of France?", "Quick question: What is the capital of France?",
             "How many legs does a spider have?"]
    result = simulate(small_trace(texts, ["paris", "lyon", "eight"]), profile,
                      answer_semantic=True)
    assert result.columns["answer_tier"].tolist() == ["miss", "semantic", "miss"]
    assert result.columns["answer_false_hit"].tolist() == [False, True, False]
    assert result.summary["answer_cache_false_hit_rate"] == 1.0
    assert result.summary["answer_cache_false_hits_by_tier"] == {"l1": 0, "l2": 0,
                                                                 "semantic": 1}


def test_an_exact_hit_after_the_answer_changed_is_a_stale_false_hit(profile):
    # the same question asked three times; its answer changed before the third: the cache,
    # which nothing invalidated, serves the old one from L1 (a stale exact hit)
    texts = ["Who is the president of the club?"] * 3
    result = simulate(small_trace(texts, ["ann", "ann", "bob"]), profile,
                      answer_semantic=False)
    assert result.columns["answer_tier"].tolist() == ["miss", "l1", "l1"]
    assert result.columns["answer_false_hit"].tolist() == [False, False, True]
    assert result.summary["answer_cache_false_hits_by_tier"] == {"l1": 1, "l2": 0,
                                                                 "semantic": 0}


@pytest.mark.parametrize(("l1_ttl_s", "invalidate", "tiers", "stale"), [
    # long L1 TTL: the instances' L1s keep serving the old answer after the update
    (60.0, True, ["miss", "l2", "l1", "l1", "l1", "l1"], {"l1": 3, "l2": 0, "semantic": 0}),
    # short L1 TTL, L2 invalidated by the update: the new answer everywhere (the article's fix)
    (12.0, True, ["miss", "l2", "l2", "miss", "l2", "l2"], {"l1": 0, "l2": 0, "semantic": 0}),
    # short L1 TTL but nothing invalidates L2: L2 itself serves the old answer
    (12.0, False, ["miss", "l2", "l2", "l2", "l2", "l2"], {"l1": 0, "l2": 3, "semantic": 0}),
])
def test_multi_instance_l1_consistency_after_an_answer_changes(profile, l1_ttl_s, invalidate,
                                                               tiers, stale):
    """Two instances, round-robin (requests 0, 2, 4 to the first, 1, 3, 5 to the second), one
    question every 10 s whose answer changes at the fourth request (a knowledge-base update).
    Worked by hand: a request's answer is written back ~2.4 s after it arrives (its RAG
    end-to-end time here, well under 10 s), an L1 entry lives ``l1_ttl_s`` from its write."""
    import dataclasses

    texts = ["Who chairs the club?"] * 6
    trace = dataclasses.replace(small_trace(texts, ["ann"] * 3 + ["bob"] * 3),
                                arrival_s=np.arange(6) * 10.0)
    result = simulate(trace, profile, arrival="trace", instances=2,
                      answer_l1_ttl_s=l1_ttl_s, answer_invalidate=invalidate)
    ends = result.columns["finish_s"] - result.columns["arrival_s"]
    assert (ends[result.columns["answer_tier"] == "miss"] < 8).all()  # the hand-work's premise
    assert result.columns["answer_tier"].tolist() == tiers
    assert result.summary["answer_cache_false_hits_by_tier"] == stale
    assert result.summary["answer_cache_counters"]["invalidations"] == int(invalidate)
