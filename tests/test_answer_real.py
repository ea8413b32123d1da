"""The answer cache on a real server (embedded valkey + RediSearch): the article's golden-set
acceptance test, the fault test (server killed and restarted mid-run), the guards, and the CLI.

Latencies are compared only as ratios measured in one run; hit counts and answers are exact.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ragsim.cache.answers import NULL_RESULT, AnswerCache, AnswerCacheConfig, exact_key
from ragsim.errors import RagsimInputError
from ragsim.realrun.answers import EmbeddedServer, RedisSharedStore, VectorIndex, connect
from ragsim.realrun.answers.golden import Golden, run_golden
from tests import answer_server

answer_redis = answer_server.answer_redis  # the fixtures, shared with the sim-vs-real test
answer_url = answer_server.answer_url

GOLDEN = Path(__file__).parent / "data" / "answer_golden_gsm8k.jsonl"


@pytest.fixture(scope="module")
def embedder():
    from ragsim.traces.corpus.embedding import Embedder

    return Embedder()


def golden_set() -> Golden:
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    return Golden([r["question"] for r in rows], [r["answer"] for r in rows])


@pytest.mark.parametrize("cold_l1", [False, True])
def test_golden_set_second_pass_hits_identical_and_ten_times_faster(answer_url, embedder,
                                                                    cold_l1):
    golden = golden_set()

    def embed(text: str) -> np.ndarray:
        # the model itself, not Embedder.embed: its in-memory cache would hand the second
        # parametrization's first pass every vector for free, and a service's first pass pays
        # the embedding (found flaky: a 4.2x L2 speed-up against the 5x asked, at rest)
        return embedder.model.encode([text], normalize_embeddings=True,
                                     convert_to_numpy=True)[0].astype(np.float32)

    result = run_golden(golden, answer_url, embed, 384,
                        config=AnswerCacheConfig(), index=VectorIndex(), cold_l1=cold_l1)
    assert result["questions"] == 100
    assert result["first_pass_hit_rate"] == 0.0  # a cold cache
    assert result["second_pass_hit_rate"] >= 0.99
    assert result["answers_identical"]
    # same process: L1 serves the second pass; another instance: L2 (exact) does
    assert result["second_pass_hits"]["l2" if cold_l1 else "l1"] == 100
    # the article's test: the service that asked re-asks, and its L1 answers (measured ~2,000x
    # here); from another instance an L2 hit still skips the embedding and the KNN search but
    # pays a Redis round trip, ~10-20x here and 9.9x once on a loaded machine: asked for 5x
    speedup = 5 if cold_l1 else 10
    assert result["first_pass_mean_s"] >= speedup * result["second_pass_mean_s"], result


def vectors(n: int, dims: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dims)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_fault_server_killed_and_restarted_mid_run():
    """Kill the server at request 100, restart it on the same port at request 200: every
    request is answered (RAG serves while Redis is down), the outage is counted as one burst,
    and hits from Redis resume after the restart."""
    vecs = vectors(20)
    rng = np.random.default_rng(1)
    asked = rng.integers(0, 20, size=300)
    with EmbeddedServer() as server:
        store = RedisSharedStore(server.url, dims=16, distance_threshold=0.05,
                                 index=VectorIndex(algorithm="flat"))
        config = AnswerCacheConfig(l1_ttl_s=0.001, ttl_jitter=0.0)  # L1 expires at once
        cache = AnswerCache(config, store)
        served, tiers, rag_calls = [], [], 0
        for i, q in enumerate(asked):
            if i == 100:
                server.kill()
            if i == 200:
                server.restart()
                time.sleep(0.002)
            question = f"question {q}"
            got = cache.lookup(question, time.time(), embedding=vecs[q])
            if got.hit:
                answer = got.entry.answer
            else:
                rag_calls += 1
                answer = f"answer {q}"
                cache.write_back(question, answer, time.time(), embedding=vecs[q])
            served.append(answer)
            tiers.append(got.tier)
            time.sleep(0.002)
    assert served == [f"answer {q}" for q in asked]  # nothing lost, nothing wrong
    assert cache.counters.error_bursts == 1
    outage = tiers[100:200]
    assert outage.count("miss") == 100 and cache.counters.store_errors >= 100
    after = tiers[200:]
    assert after[0] == "miss"  # the restarted server is empty (no persistence)
    assert after.count("l2") >= 50  # ... and fills again: hits resume
    assert rag_calls == 100 + len(set(asked[:100])) + len(set(asked[200:]))


def test_penetration_served_from_null_result(answer_url):
    store = RedisSharedStore(answer_url, dims=16, distance_threshold=0.05)
    rag_calls = 0
    for round_ in range(20):
        cache = AnswerCache(AnswerCacheConfig(), store)  # a new instance: L1 empty, L2 shared
        for q in range(5):
            got = cache.lookup(f"unanswerable {q}", time.time())
            if not got.hit:
                rag_calls += 1
                cache.write_back(f"unanswerable {q}", None, time.time())
            else:
                assert got.entry.answer == NULL_RESULT and got.tier == "l2", round_
    assert rag_calls == 5
    client = connect(answer_url)
    ttl_ms = client.pttl(store.redis_key(exact_key("unanswerable 0")))
    assert 0 < ttl_ms <= 600_000 * 1.1  # the null TTL (10 min) with its jitter, not the hour


def expiry_spread_s(url: str, jitter: float) -> float:
    store = RedisSharedStore(url, dims=16, distance_threshold=0.05)
    cache = AnswerCache(AnswerCacheConfig(ttl_s=100.0, ttl_jitter=jitter, seed=7), store)
    now = time.time()
    for i in range(200):
        cache.write_back(f"q{i}", "a", now)
    client = connect(url)
    ttl_ms = np.array([client.pttl(store.redis_key(exact_key(f"q{i}"))) for i in range(200)])
    return float(ttl_ms.max() - ttl_ms.min()) / 1000


def test_avalanche_jitter_spreads_expiry(answer_url):
    without = expiry_spread_s(answer_url, 0.0)
    with_jitter = expiry_spread_s(answer_url, 0.5)
    # without jitter they all expire within the time it took to write them (well under 5 s);
    # with TTL x U[1, 1.5) over 200 entries the spread is close to 50 s
    assert without < 5.0
    assert with_jitter > 40.0


def test_hot_keys_only_top_n_reach_redis(answer_url):
    store = RedisSharedStore(answer_url, dims=16, distance_threshold=0.05)
    cache = AnswerCache(AnswerCacheConfig(hot_top_n=3, hot_window_s=60.0), store)
    # popularity 10, 9, ..., 1 for q0..q9: only q0, q1, q2 are admitted
    now = time.time()
    for q in range(10):
        for _ in range(10 - q):
            cache.lookup(f"q{q}", now)
    for q in range(10):
        cache.write_back(f"q{q}", f"a{q}", now)
    keys = {k.decode() for k in connect(answer_url).keys(store.redis_key("exact:*"))}
    assert keys == {store.redis_key(exact_key(f"q{q}")) for q in range(3)}


def test_semantic_hit_and_false_hit_on_redisvl(answer_url):
    vecs = vectors(3)
    store = RedisSharedStore(answer_url, dims=16, distance_threshold=0.1,
                             index=VectorIndex(algorithm="flat"))
    cache = AnswerCache(AnswerCacheConfig(distance_threshold=0.1), store)
    cache.write_back("capital of france", "Paris", time.time(), embedding=vecs[0],
                     answer_key="france")
    near = vecs[0] * 0.98 + vecs[1] * 0.2  # cosine ~0.98 to vecs[0]
    got = cache.lookup("france's capital city", time.time(), embedding=near)
    assert got.tier == "semantic" and got.entry.answer_key == "france"
    assert got.distance == pytest.approx(1 - float(near @ vecs[0] / np.linalg.norm(near)),
                                         abs=1e-5)
    assert cache.lookup("other", time.time(), embedding=vecs[2]).tier == "miss"


def test_an_update_drops_the_exact_key_and_its_vector_but_not_another_instances_l1(
        answer_url):
    vecs = vectors(2, seed=3)
    store = RedisSharedStore(answer_url, dims=16, distance_threshold=0.1,
                             index=VectorIndex(algorithm="flat"))
    writer = AnswerCache(AnswerCacheConfig(distance_threshold=0.1), store)
    reader = AnswerCache(AnswerCacheConfig(distance_threshold=0.1), store)
    writer.write_back("who chairs the club", "Ann", time.time(), embedding=vecs[0],
                      answer_key="ann")
    assert reader.lookup("who chairs the club", time.time()).tier == "l2"  # now in its L1
    key = exact_key("who chairs the club")
    assert store.client.exists(store.redis_key(key), store.vector_key(key)) == 2
    writer.invalidate("who chairs the club")
    assert store.client.exists(store.redis_key(key), store.vector_key(key)) == 0
    assert store.get_exact(key, time.time()) is None
    assert store.nearest(vecs[0], time.time()) is None  # the vector went with it
    # the reader's L1 still holds the old answer (in-process, out of an update's reach)
    stale = reader.lookup("who chairs the club", time.time())
    assert stale.tier == "l1" and stale.entry.answer == "Ann"
    assert writer.counters.invalidations == 1 and writer.counters.store_errors == 0


def test_index_dimension_is_checked(answer_url):
    store = RedisSharedStore(answer_url, dims=8, distance_threshold=0.1, namespace="dims")
    store.write_back("k", AnswerCache(AnswerCacheConfig(), store).entry_for(
        "k", "a", time.time())[1], 10.0, time.time(), vectors(1, 8)[0])
    other = RedisSharedStore(answer_url, dims=16, distance_threshold=0.1, namespace="dims")
    with pytest.raises(RagsimInputError, match="8-d"):
        other.nearest(vectors(1)[0], time.time())
    # another namespace has an index of its own, of its own dimension
    fresh = RedisSharedStore(answer_url, dims=16, distance_threshold=0.1)
    assert fresh.nearest(vectors(1)[0], time.time()) is None


def test_cli_golden_json_and_bench(answer_url, tmp_path):
    from ragsim.cli import app

    small = tmp_path / "golden.jsonl"
    small.write_text("\n".join(GOLDEN.read_text().splitlines()[:10]) + "\n")
    runner = CliRunner()
    res = runner.invoke(app, ["answers", "golden", "--questions", str(small), "--redis-url",
                              answer_url, "--json", "--threshold", "0.9"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in ("second_pass_hit_rate", "answers_identical", "first_pass_mean_s",
                "second_pass_mean_s", "server"):
        assert key in data
    assert data["second_pass_hit_rate"] == 1.0 and data["answers_identical"]
    assert data["config"]["distance_threshold"] == pytest.approx(0.1)
    res = runner.invoke(app, ["answers", "bench", "--entries", "300", "--samples", "20",
                              "--redis-url", answer_url, "--json", "--algorithm", "flat"])
    assert res.exit_code == 0, res.output
    lookup = json.loads(res.stdout)["lookup"]
    assert set(lookup) == {"l1", "l2", "semantic", "miss"}
    assert lookup["l1"]["p50_us"] < lookup["l2"]["p50_us"]  # in-process vs a round trip


def test_cli_bad_golden_file_names_row_and_field(tmp_path):
    from ragsim.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "b"}\n{"question": "", "answer": "c"}\n')
    res = CliRunner().invoke(app, ["answers", "golden", "--questions", str(bad)])
    assert res.exit_code == 2
    assert "row 2" in res.output and "question" in res.output
