"""The answer cache in a real run (``--backend torch``) on the real stores, and the real
server's ``maxmemory`` limit.

A real run's per-request decisions must be those of the simulated answer cache on the same
trace (sequential arrivals, TTLs far longer than the run: the clocks differ, the decisions do
not). Under ``maxmemory`` with ``noeviction`` writes fail: counted, failed open, every request
still answered, and what was written before stays (nothing lost, exact and vector entries
never disagree, as they are written in one transaction); with ``allkeys-lru`` the server evicts,
which the store reports, and an evicted entry is only a miss.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch  # noqa: F401 - [profile] is in [dev]: missing is a broken set-up, not a skip

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, exact_key
from ragsim.cache.answers.stores import L1Store
from ragsim.profiles.profile import load_profile
from ragsim.realrun.answers import EmbeddedServer, RedisSharedStore, VectorIndex, connect
from ragsim.realrun.harness import RealRun
from ragsim.serving.answer_stage import embed_texts
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.paraphrase import with_questions
from tests.test_realrun_harness import small_trace

PROFILE = "cpu-mistral-7b-l2-h256"
GOLDEN = Path(__file__).parent / "data" / "answer_golden_gsm8k.jsonl"


def golden(n: int) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()][:n]
    return [r["question"] for r in rows], [f"gsm8k-{i}" for i in range(len(rows))]


@pytest.fixture(scope="module")
def trace():
    """60 requests over 15 questions (Zipf), 40% templated paraphrases, with stored vectors."""
    questions, keys = golden(15)
    built = with_questions(small_trace(60), questions, keys, zipf_s=1.1, paraphrase_p=0.4,
                           seed=5, n_requests=60)
    return dataclasses.replace(built,
                               query_embedding=embed_texts(built.query_text.to_pylist()))


def test_real_run_with_the_answer_cache_decides_as_the_simulator(trace):
    settings = {"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                "arrival": "sequential", "speculate": False, "search_s": 0.002,
                "answer_cache": True, "instances": 2, "answer_l1_size": 3,
                "answer_l1_ttl_s": 1e6, "answer_ttl_s": 1e6}
    config = build_config(settings)
    profile = load_profile(PROFILE)
    real = RealRun(trace, config, profile).run()
    sim = run_simulation(trace, config, profile)
    s = real.summary
    assert s["requests_completed"] == trace.n_requests
    assert s["answer_cache_latency"]["source"].startswith("measured")
    assert s["answer_cache_server"]["server"].startswith("embedded")
    real_tiers = real.columns["answer_tier"].tolist()
    assert real_tiers == sim.columns["answer_tier"].tolist()
    hits = s["answer_cache_hits"]
    # counted from the per-request tiers here, by hand
    assert hits == {t: real_tiers.count(t) for t in ("l1", "l2", "semantic")}
    assert min(hits.values()) > 0 and "miss" in real_tiers  # every kind of decision compared
    assert s["answer_cache_counters"]["store_errors"] == 0
    # the answered requests never reached the engine: the real engine saw only the misses
    assert s["answer_cache_engine"]["requests"] == real_tiers.count("miss")


def _fill(server: EmbeddedServer, n: int, headroom_bytes: int = 500_000
          ) -> tuple[AnswerCache, RedisSharedStore, list[str]]:
    """``n`` write-backs (exact + vector, ~1.5 KB together) through the tier logic, under a
    memory limit ``headroom_bytes`` above what the server uses once its index holds its first
    vector (the index allocates its first block then); returns the questions."""
    import numpy as np

    store = RedisSharedStore(server.url, dims=16, distance_threshold=0.05,
                             index=VectorIndex(algorithm="flat"), timeout_s=5.0)
    config = AnswerCacheConfig(l1_size=10, ttl_s=3600.0, ttl_jitter=0.0, distance_threshold=0.05)
    rng = np.random.default_rng(0)
    AnswerCache(config, store).write_back("first", "answer", 0.0, embedding=rng.normal(size=16))
    client = connect(server.url, timeout_s=5.0)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + headroom_bytes)
    cache = AnswerCache(config, store)
    questions = []
    for i in range(n):
        q = f"question {i} " + "x" * 400
        questions.append(q)
        got = cache.lookup(q, 0.0, embedding=rng.normal(size=16))
        assert not got.hit
        cache.write_back(q, f"answer {i} " + "y" * 400, 0.0, embedding=rng.normal(size=16))
    return cache, store, questions


def test_maxmemory_noeviction_writes_fail_open_and_nothing_is_lost():
    with EmbeddedServer(maxmemory_policy="noeviction") as server:
        cache, store, questions = _fill(server, 600)
        counters = cache.counters
        # some writes were refused (OOM): counted, never raised, and in a burst or a few (the
        # lookups that kept succeeding meanwhile do not end it; a write that fits again as the
        # server's memory moves a little does), not one per refused write
        assert counters.store_errors > 100, counters
        assert 1 <= counters.error_bursts <= 5, counters
        assert counters.writes == 600 and counters.misses == 600
        client = connect(server.url, timeout_s=5.0)
        assert store.server_stats()["evicted_keys"] == 0
        # what was written stays, and each exact entry has its vector (one transaction):
        # a second instance (cold L1) finds exactly the written ones in L2
        written = {k.decode().split(":")[-1] for k in client.keys(store.redis_key("exact:*"))}
        written -= {exact_key("first").removeprefix("exact:")}
        vectors = {k.decode().split(":")[-1] for k in client.keys(store.vector_key("exact:*"))}
        vectors -= {exact_key("first").removeprefix("exact:")}
        assert 100 < len(written) < 600, (len(written), store.server_stats())
        assert written == vectors
        assert counters.store_errors == 600 - len(written)  # each refused write counted once
        cold = AnswerCache(cache.config, store, l1=L1Store(10), seed_offset=1)
        tiers = [cold.lookup(q, 1.0).tier for q in questions]
        assert cold.counters.store_errors == 0, cold.counters  # reads are never refused
        assert tiers.count("l2") == len(written)


def test_maxmemory_allkeys_lru_evicts_and_an_evicted_entry_is_a_miss():
    with EmbeddedServer(maxmemory_policy="allkeys-lru") as server:
        cache, store, questions = _fill(server, 600)
        assert cache.counters.store_errors == 0  # the server made room instead
        evicted = store.server_stats()["evicted_keys"]
        assert evicted > 0
        client = connect(server.url, timeout_s=5.0)
        kept = {k.decode() for k in client.keys(store.redis_key("exact:*"))}
        kept -= {store.redis_key(exact_key("first"))}
        assert 0 < len(kept) < 600
        cold = AnswerCache(cache.config, store, l1=L1Store(10), seed_offset=1)
        tiers = [cold.lookup(q, 1.0).tier for q in questions]
        # an evicted question misses (RAG answers it); a kept one is an L2 hit, unless the
        # server evicted it meanwhile (a server over its limit evicts before any command)
        for q, tier in zip(questions, tiers, strict=True):
            if store.redis_key(exact_key(q)) not in kept:
                assert tier == "miss", q
        assert set(tiers) == {"l2", "miss"} and 0 < tiers.count("l2") <= len(kept)


def test_recorded_configuration_never_holds_the_redis_password():
    config = build_config({"answer_cache": True,
                           "answer_redis_url": "redis://user:secret@cache.example:6380/0"})
    assert config.to_dict()["answer_redis_url"] == "redis://user:***@cache.example:6380/0"
    assert "secret" not in config.to_toml()
    plain = build_config({"answer_cache": True, "answer_redis_url": "redis://127.0.0.1:6379/0"})
    assert plain.to_dict()["answer_redis_url"] == "redis://127.0.0.1:6379/0"


def test_real_run_refuses_a_redis_that_does_not_answer(trace, tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.traces.io import write_trace

    write_trace(trace.head(3), tmp_path / "t")
    res = CliRunner().invoke(app, ["run", "--trace", str(tmp_path / "t"), "--answer-cache",
                                   "--profile", PROFILE, "--backend", "torch", "--redis-url",
                                   "redis://127.0.0.1:1/0"])
    assert res.exit_code == 2
    assert "--redis-url" in res.output and "no Redis answers" in res.output
