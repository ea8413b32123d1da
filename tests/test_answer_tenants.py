"""Tenant scoping: entries written for one tenant are never served to another, by any tier (an
instance's L1 is shared by every tenant it serves; L2 and the semantic index are the tenant's
own), on the real server and in the simulator; emptying the namespace empties its tenants."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, ModelSharedStore
from ragsim.cache.answers.keys import tenant_name
from ragsim.profiles.profile import load_profile
from ragsim.realrun.answers import EmbeddedServer, connect
from ragsim.realrun.answers.stores import RedisSharedStore, VectorIndex
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder


def _tiers_seen_across_tenants(store) -> dict:
    """Tenant A writes a question; who is served it, and by which tier?"""
    vec = np.ones(8, dtype=np.float32)
    near = vec + np.float32(0.01)  # a near vector: the semantic tier's hit if it may see it
    config = AnswerCacheConfig(distance_threshold=0.05, guard="none", ttl_jitter=0.0)
    cache = AnswerCache(config, store)
    now = time.time()
    cache.write_back("what is x", "A's answer", now, embedding=vec, tenant="A")
    other = AnswerCache(config, store)  # another instance: its own, empty L1
    return {
        "A, same instance": cache.lookup("what is x", now, embedding=vec, tenant="A").tier,
        "A, other instance": other.lookup("what is x", now, embedding=vec, tenant="A").tier,
        "A, near question": other.lookup("what is y", now, embedding=near, tenant="A").tier,
        "B, same instance": cache.lookup("what is x", now, embedding=vec, tenant="B").tier,
        "B, near question": other.lookup("what is y", now, embedding=near, tenant="B").tier,
        "untenanted": cache.lookup("what is x", now, embedding=vec).tier,
    }


EXPECTED = {"A, same instance": "l1", "A, other instance": "l2", "A, near question": "semantic",
            "B, same instance": "miss", "B, near question": "miss", "untenanted": "miss"}


def test_one_tenant_never_sees_anothers_entries_in_the_model_store():
    assert _tiers_seen_across_tenants(ModelSharedStore()) == EXPECTED


def test_one_tenant_never_sees_anothers_entries_on_the_real_server():
    with EmbeddedServer() as server:
        client = connect(server.url, timeout_s=5.0)
        store = RedisSharedStore(server.url, dims=8, distance_threshold=0.05,
                                 index=VectorIndex(algorithm="flat"))
        assert _tiers_seen_across_tenants(store) == EXPECTED
        tenant_keys = list(client.scan_iter(match=f"{store.prefix}tenant:A:*"))
        assert tenant_keys  # A's entries lie under its own prefix, inside the namespace
        assert b"ragsim:%s:tenant:A:semantic" % store.namespace.encode() in \
            client.execute_command("FT._LIST")
        store.clear()  # emptying the namespace empties its tenants: keys and indexes
        assert list(client.scan_iter(match=f"{store.prefix}*")) == []
        assert not [i for i in client.execute_command("FT._LIST")
                    if i.startswith(store.prefix.encode())]


def test_a_tenant_name_is_a_valid_name_for_any_label():
    assert tenant_name("1757476916095-afhwfadnh5ew") == "1757476916095-afhwfadnh5ew"
    odd = tenant_name("user:42 *")
    assert ":" not in odd and "*" not in odd and odd == tenant_name("user:42 *")


def test_the_simulator_scopes_entries_per_session_when_asked():
    """Two sessions ask the same question twice each: shared, only the very first request
    misses; scoped per session, each session's first request misses."""
    builder = TraceBuilder("test")
    for i in range(4):
        builder.add(i, 10.0 * i, 20, 5, [1], [200])
    trace = builder.build({"name": "test"})
    trace = dataclasses.replace(
        trace, query_text=pa.array(["what is x"] * 4), answer_key=pa.array(["x"] * 4),
        session_id=pa.array(["s1", "s2", "s1", "s2"]))
    profile = load_profile("a10g-mistral-7b")
    found = {}
    for scope in ("none", "session"):
        config = build_config({"answer_cache": True, "answer_semantic": False,
                               "answer_tenant": scope})
        records = run_simulation(trace, config, profile).summary
        found[scope] = records["answer_cache_misses"]
    assert found == {"none": 1, "session": 2}
