"""Position-free document KV reuse (``--reuse blend:R`` / ``epic:K``, issue 29): the rule, the
tree's document store, what replay and the simulator count, and the blended prefill's price.

The expected counts are brute force over the trace, written here without the tree: at unlimited
memory a document is found if any earlier request held it, at any position; its exact-prefix
part is the longest prefix of the request's list that an earlier request's list began with."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import ragsim
from ragsim.cache import KnowledgeTree, make_policy
from ragsim.cache.reuse import ReuseRule, engine_reuse, parse_reuse
from ragsim.cli import app
from ragsim.errors import RagsimInputError
from ragsim.profiles.profile import Profile, load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace

TiB = 2**40
PROFILE = load_profile("a10g-mistral-7b")


# ------------------------------------------------------------------ the rule
def test_rule_rounds_up_per_document_exactly():
    blend = parse_reuse("blend:0.15")
    # ceil(0.15 x t), by hand: 20 -> 3 exactly (no float drift to 4), 21 -> 3.15 -> 4, 7 -> 2
    assert [blend.recompute_tokens(t) for t in (20, 21, 7, 1, 0)] == [3, 4, 2, 1, 0]
    epic = parse_reuse("epic:32")
    assert [epic.recompute_tokens(t) for t in (10, 32, 100)] == [10, 32, 32]
    assert parse_reuse("blend:0").recompute_tokens(500) == 0
    assert parse_reuse("blend:1").recompute_tokens(500) == 500
    assert parse_reuse("prefix") == ReuseRule() and not parse_reuse("prefix").position_free
    assert str(parse_reuse("blend:0.150")) == "blend:0.15"


@pytest.mark.parametrize("bad", ["blend:1.5", "epic:-1", "blend:x", "blend", "epic:1.5", "",
                                 "lru"])
def test_rule_refuses_bad_values(bad):
    with pytest.raises(ValueError):
        parse_reuse(bad)


@pytest.mark.parametrize("command", [["run"], ["replay"]])
@pytest.mark.parametrize("bad", ["blend:1.5", "epic:-1", "blend:x"])
def test_cli_bad_values_are_one_line_naming_the_flag(command, bad):
    result = CliRunner().invoke(app, [*command, "--requests", "20", "--reuse", bad])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--reuse" in lines[0], result.output


def test_api_names_the_keyword():
    with pytest.raises(RagsimInputError) as caught:
        ragsim.simulate(requests=20, reuse="blend:2")
    assert caught.value.field == "reuse"
    with pytest.raises(RagsimInputError) as caught:
        ragsim.replay(requests=20, reuse="epic:x")
    assert caught.value.field == "reuse"
    with pytest.raises(RagsimInputError) as caught:  # whole documents, not vLLM's blocks
        ragsim.simulate(requests=20, system="vllm-apc", reuse="blend:0.15")
    assert caught.value.field == "reuse"


def test_engine_rule_by_hand():
    # prefix 100 (GPU), a position-free document of 40 (host) of which 6 recomputed, 30 new
    u = engine_reuse(100, 30, 100, 0, 20, 1, 0, 40, 6)
    assert u.cached_tokens == 100 + 40 - 6 and u.new_tokens == 30 + 6
    assert (u.hit_tokens_gpu, u.hit_tokens_host) == (100, 40)
    assert (u.position_free_hit_tokens, u.blend_recomputed_tokens) == (40, 6)
    # nothing new, nothing recomputed (blend:0, no query): the last token is computed, from
    # the position-free document at the context's end; the prefix keeps all it has
    u = engine_reuse(100, 0, 100, 0, 0, 1, 40, 0, 0)
    assert (u.cached_tokens, u.new_tokens, u.blend_recomputed_tokens) == (139, 1, 1)
    assert u.hit_tokens_gpu == 140


# ------------------------------------------------------------------ the tree's store
def lru_tree(reuse: str, **kw) -> KnowledgeTree:
    return KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=kw.pop("gpu", 10**9),
                         kv_bytes_per_token=1, reuse=reuse, **kw)


def test_standalone_kv_is_kept_from_its_first_prefill():
    """A document computed once, inside another request, is found at a new position with no
    second computation and no memory of its own: the store's entry is that node."""
    tree = lru_tree("blend:0.15")
    first = tree.access([1, 2], [100, 50], 10)
    assert first.free_hit_tokens_gpu == 0 and first.recomputed_tokens == 150
    second = tree.access([3, 2], [20, 50], 10)
    assert (second.free_hit_tokens_gpu, second.free_recompute_tokens) == (50, 8)  # ceil(7.5)
    assert second.recomputed_tokens == 20  # only document 3
    assert [n.path_keys() for n in second.free_nodes] == [[1, 2]]
    # the path nodes only: [1], [1, 2], [3], [3, 2]; nothing stored twice for the store
    assert tree.gpu_used_bytes == 100 + 50 + 20 + 50
    assert [n.path_keys() for n in tree.holders(2)] == [[1, 2], [3, 2]]
    tree.check_invariants()


def test_prefix_rule_finds_nothing_out_of_order():
    tree = lru_tree("prefix")
    tree.access([1, 2], [100, 50], 10)
    r = tree.access([3, 2], [20, 50], 10)
    assert (r.hit_tokens_gpu, r.free_hit_tokens_gpu, r.recomputed_tokens) == (0, 0, 70)


def test_a_host_copy_is_read_from_host_and_counted_as_swapped_in():
    # GPU for one document at a time: [1] goes to host when [2] comes; [2, 1] reads it there
    tree = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=60, host_capacity_bytes=1000,
                         kv_bytes_per_token=1, reuse="epic:4")
    tree.access([1], [30], 1)
    tree.access([2], [30], 1)
    tree.access([5], [30], 1)  # evicts [1] to host (LRU)
    r = tree.access([2, 1], [30, 30], 1)
    assert r.free_hit_tokens_host == 30 and r.free_recompute_tokens == 4
    assert r.swap_in_bytes == 30
    assert [n.tier.name for n in r.free_nodes] == ["HOST"]
    tree.check_invariants()


def test_pgdsf_counts_the_recompute_a_position_free_hit_needs():
    """Prefill cost = new tokens x 1 s, so every request's cost per token is 1. [1, 2] computes
    node [1, 2] (one sample: 1). [3, 2] under blend:0.5 recomputes 5 of its 10 tokens: the hit
    is a sample of what it saved, 1 x 5/10; mean 0.75, times 2 retrievals = 1.5."""
    tree = KnowledgeTree(make_policy("pgdsf"), gpu_capacity_bytes=10**6, kv_bytes_per_token=1,
                         prefill_cost_s=lambda cached, new: float(new), reuse="blend:0.5")
    tree.access([1, 2], [10, 10], 0)
    r = tree.access([3, 2], [10, 10], 0)
    node = r.free_nodes[0]
    assert node.path_keys() == [1, 2]
    assert node.num_computed == 2 and node.total_cost == pytest.approx(1.5)
    assert node.value == pytest.approx(1.5)


# ------------------------------------------------------------------ brute force at unlimited memory
def recompute_by_hand(reuse: str, tokens: int) -> int:
    """The rule as the issue states it, written apart from ReuseRule: blend R of each
    document's tokens (rounded up), epic its first K."""
    kind, _, value = reuse.partition(":")
    if kind == "blend":
        return math.ceil(Fraction(value) * tokens)
    return min(int(value), tokens)


def brute_force(trace, reuse: str) -> tuple[int, int, int]:
    """(hit tokens, position-free hit tokens, recomputed of them): every document some earlier
    request held, at any position; the exact prefix is the longest list prefix seen before."""
    offsets, ids, toks = (trace.doc_offsets.tolist(), trace.doc_ids.tolist(),
                          trace.doc_tokens_flat.tolist())
    seen: set[int] = set()
    prefixes: set[tuple] = set()
    hits = free = recomputed = 0
    for i in range(trace.n_requests):
        docs, tokens = ids[offsets[i]:offsets[i + 1]], toks[offsets[i]:offsets[i + 1]]
        k = 0
        while k < len(docs) and tuple(docs[:k + 1]) in prefixes:
            k += 1
        hits += sum(tokens[:k])
        for d, t in zip(docs[k:], tokens[k:], strict=True):
            if d in seen:
                hits += t
                free += t
                recomputed += recompute_by_hand(reuse, t)
        seen.update(docs)
        prefixes.update(tuple(docs[:j]) for j in range(1, len(docs) + 1))
    return hits, free, recomputed


@pytest.mark.parametrize("name", ["mmlu", "nq"])
@pytest.mark.parametrize("reuse", ["blend:0", "blend:0.15", "epic:32"])
def test_replay_reuses_every_document_held_before(name, reuse):
    trace = resolve_trace(name, n_requests=600)
    assert (trace.query_tokens > 0).all()  # so no hit is given back for the last token
    config = ReplayConfig(trace=name, policy="lru", gpu_capacity_bytes=TiB,
                          host_capacity_bytes=0, n_requests=600, reuse=reuse)
    s = run_replay(trace, config).summary
    hits, free, recomputed = brute_force(trace, reuse)
    assert s["hit_tokens_gpu"] + s["hit_tokens_host"] == hits
    assert s["position_free_hit_tokens"] == free > 0
    assert s["blend_recomputed_tokens"] == recomputed
    prefix = run_replay(trace, ReplayConfig(trace=name, policy="lru", gpu_capacity_bytes=TiB,
                                            host_capacity_bytes=0, n_requests=600)).summary
    assert prefix["hit_tokens_gpu"] == hits - free  # the prefix part is the prefix rule's
    assert "position_free_hit_tokens" not in prefix and "reuse" not in prefix["config"]


def test_simulated_run_reuses_every_document_held_before():
    """One request at a time (sequential arrivals, no speculation), memory to spare: the
    engine's counts are the brute force's."""
    n = 150
    trace = resolve_trace("mmlu", n_requests=n)
    summary = ragsim.simulate(trace="mmlu", requests=n, arrival="sequential", speculate=False,
                              gpu_mem=TiB, reuse="blend:0.15").summary
    hits, free, recomputed = brute_force(trace, "blend:0.15")
    assert summary["prefix_cache_hits"] == hits
    assert summary["position_free_hit_tokens"] == free > 0
    assert summary["blend_recomputed_tokens"] == recomputed
    assert summary["config"]["reuse"] == "blend:0.15"


# ------------------------------------------------------------------ the blended prefill's price
def test_blended_prefill_price():
    from ragsim.serving.costs import SELECTION_PRICED_AT_TOKENS, blend_selection_s
    from ragsim.serving.engine import Job
    from ragsim.sim.predicted import PredictedIterations

    job = Job(0, 0, [1, 2], [300, 200], 40, 5, False)
    job.alpha, job.beta, job.free_hit_tokens = 460, 80, 200  # 200 found, 40 of them recomputed
    n = SELECTION_PRICED_AT_TOKENS
    # one layer's share of a prefill of n tokens, per token, by the stated default
    per_token = ((PROFILE.prefill.at(0, n) - PROFILE.overhead_s) / n
                 / PROFILE.model.num_layers)
    assert per_token > 0
    blend = PredictedIterations(None, PROFILE, False, "blend").timing([job])
    assert blend.compute_s == pytest.approx(PROFILE.prefill.at(460, 80) + 200 * per_token)
    epic = PredictedIterations(None, PROFILE, False, "epic").timing([job])
    assert epic.compute_s == PROFILE.prefill.at(460, 80)  # EPIC selects nothing
    measured = Profile.from_dict({**PROFILE.to_dict(), "blend_selection_s_per_token": 1e-5})
    assert blend_selection_s(measured, "blend", 200) == pytest.approx(2e-3)
    assert "blend_selection_s_per_token" not in PROFILE.to_dict()  # shipped files unchanged


def test_sweep_varies_reuse(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[base]\ntrace = "mmlu"\nn_requests = 60\n[axes]\n'
                    'reuse = ["prefix", "blend:0.15", "epic:32"]\n')
    result = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o"),
                                      "--jobs", "1"])
    assert result.exit_code == 0, result.output
    import pandas as pd

    table = pd.read_parquet(next((tmp_path / "o").glob("*.parquet")))
    assert sorted(table["reuse"].fillna("prefix")) == ["blend:0.15", "epic:32", "prefix"]


# ------------------------------------------------------------------ properties
requests = st.lists(
    st.tuples(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
              st.integers(0, 4), st.booleans()),
    min_size=1, max_size=50)
DOC_TOKENS = {d: 1 + (d * 7) % 9 for d in range(10)}


def serve_all(reuse: str, policy: str, gpu: int, host: int, reqs, probe: bool = True
              ) -> tuple[list, KnowledgeTree]:
    tree = KnowledgeTree(make_policy(policy), gpu_capacity_bytes=gpu, host_capacity_bytes=host,
                         kv_bytes_per_token=1, prefill_cost_s=PROFILE.prefill.at, reuse=reuse)
    held: list = []
    out = []
    for docs, query, keep in reqs:
        r = tree.access(docs, [DOC_TOKENS[d] for d in docs], query, keep_pinned=keep)
        out.append((*r[:6], r.free_hit_tokens_gpu, r.free_hit_tokens_host,
                    r.free_recompute_tokens))
        assert tree.gpu_used_bytes <= tree.gpu_capacity_bytes
        assert tree.host_used_bytes <= tree.host_capacity_bytes
        assert r.free_recompute_tokens <= r.free_hit_tokens_gpu + r.free_hit_tokens_host
        tree.check_invariants()
        # what a running request may still reserve can really be freed (unpinned GPU nodes
        # are evictable: a node read position-free pins its ancestors too)
        if probe:  # (it evicts every unpinned node)
            assert tree.reserve_gpu(tree.gpu_available_bytes)
            tree.free_gpu(tree.reserved_gpu_bytes)
        if keep:
            held.append(r)
        if len(held) > 2:  # a running request ends: its path and the nodes it read go
            done = held.pop(0)
            tree.release(done.path)
            tree.release_read(done.free_nodes)
            tree.check_invariants()
    return out, tree


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, gpu=st.integers(0, 40), host=st.integers(0, 60),
       policy=st.sampled_from(["pgdsf", "lru", "lfu", "gdsf", "fifo"]),
       reuse=st.sampled_from(["blend:0", "blend:0.15", "blend:1", "epic:2"]))
def test_capacity_invariants_and_determinism(reqs, gpu, host, policy, reuse):
    first, _ = serve_all(reuse, policy, gpu, host, reqs)
    again, _ = serve_all(reuse, policy, gpu, host, reqs)
    assert first == again
    # the exact prefix never shrinks for position-free hits: the prefix rule's hits come first
    prefix, _ = serve_all("prefix", policy, 10**6, 0, reqs, probe=False)
    free, _ = serve_all(reuse, policy, 10**6, 0, reqs, probe=False)
    for p, f in zip(prefix, free, strict=True):
        assert f[2] == p[2]  # unlimited memory: same exact-prefix GPU hits
        assert f[4] + f[6] + f[7] == p[4]  # recomputed documents: misses plus free hits
    assert math.isfinite(sum(x[0] for x in free))
