"""Position-free reuse run for real: ``run --backend torch --reuse blend:R|epic:K``.

The policy core decides which documents a request reads position-free (``free_nodes``) and how
many of their tokens it recomputes; the torch engine carries that out with a blended prefill
over the stored KV of those nodes, moved from the positions they were computed at. Checked
here, independently of the machine's speed (sequential arrivals):

* the real run and the simulator count the same hits and recomputes, request by request, and
  the engine's own count of what its blended prefills reused and recomputed is the core's;
  the real store holds what the tree says, where it says;
* ``blend:1`` recomputes every reused token: greedy generation is a prefix run's (a reference
  that moves nothing), token for token;
* a document read position-free at the very position and behind the very tokens it was
  computed at, recomputing nothing (``blend:0``, ``epic:0``), gets the KV the prefix cache's
  prefill computes there: a wrong recorded position or a wrong node read breaks it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_realrun_harness import tiers_of_tree

from ragsim.profiles.profile import load_profile
from ragsim.realrun.harness import RealRun
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

PROFILE = "cpu-mistral-7b-l2-h256"
KV = load_profile(PROFILE).model.kv_bytes_per_token
SIZES = {0: 40, 1: 24, 2: 56, 3: 32, 4: 40}
# the same documents in different orders: after the first, most requests find documents only
# position-free (a different first document breaks the exact prefix)
ORDERS = [[0, 1, 2], [2, 0, 1], [1, 2, 3], [0, 2, 1], [3, 1, 0], [2, 3], [1, 0, 2, 3],
          [0, 1, 3]]


def trace_of(orders, query_tokens: int = 5):
    b = TraceBuilder("blend-realrun")
    for i, docs in enumerate(orders):
        b.add(i, 0.05 * i, query_tokens, 3, docs, [SIZES[d] for d in docs])
    return b.build({"name": "blend-realrun"})


def config(reuse: str, **flags):
    return build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                         "arrival": "sequential", "speculate": False, "search_s": 0.002,
                         "reuse": reuse, **flags})


def real_run(trace, cfg, logits: bool = False, same_tokens: dict | None = None) -> RealRun:
    run = RealRun(trace, cfg, load_profile(PROFILE), speed_probes=False)
    run.iterations.record_logits = logits
    for doc, like in (same_tokens or {}).items():  # a passage duplicated under another id
        run.iterations.tokens._docs[(doc, SIZES[doc])] = run.iterations.tokens.document(
            like, SIZES[like])
    run.result = run.run()
    return run




# GPU room for ~3 requests' documents, host for more: nodes are evicted, swapped out and read
# position-free from both tiers
SMALL = {"gpu_kv_bytes": 260 * KV, "host_cache_bytes": 400 * KV}


@pytest.mark.parametrize("reuse", ["blend:0.15", "epic:4"])
@pytest.mark.parametrize("memory", [{}, SMALL], ids=["unlimited", "small"])
def test_the_real_run_reuses_and_recomputes_what_the_core_counts(reuse, memory):
    trace = trace_of(ORDERS)
    cfg = config(reuse, **memory)
    real = real_run(trace, cfg)
    sim = run_simulation(trace, cfg, load_profile(PROFILE))
    r, s = real.result.columns, sim.columns
    assert (r["status"] == "completed").all()
    for column in ("cached_tokens", "hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens",
                   "swap_in_bytes", "position_free_hit_tokens", "blend_recomputed_tokens"):
        assert r[column].tolist() == s[column].tolist(), column
    summary = real.result.summary
    # what the blended prefills reused and recomputed, counted by the engine itself
    assert summary["engine_position_free_hit_tokens"] == summary["position_free_hit_tokens"]
    assert summary["engine_blend_recomputed_tokens"] == summary["blend_recomputed_tokens"]
    assert summary["engine_blended_prefills"] == int((r["position_free_hit_tokens"] > 0).sum())
    # by hand: request 1 ([2, 0, 1]) misses the exact prefix (0 first before) and finds all
    # three documents position-free, recomputing ceil(0.15 x n) or min(4, n) of each
    recompute = {"blend:0.15": lambda n: -(-15 * n // 100), "epic:4": lambda n: min(4, n)}
    assert r["position_free_hit_tokens"][1] == SIZES[2] + SIZES[0] + SIZES[1]
    assert r["blend_recomputed_tokens"][1] == sum(recompute[reuse](SIZES[d]) for d in (2, 0, 1))
    assert summary["position_free_hit_tokens"] > summary["blend_recomputed_tokens"] > 0
    # the real store holds what the tree says, where it says, in its budgets
    gpu, host = tiers_of_tree(real.tree)
    store = real.iterations.store
    assert set(store.gpu) - {real.tree.root} == gpu
    assert set(store.host) == host
    assert store.gpu_bytes <= real.tree.gpu_capacity_bytes
    if memory:
        assert r["hit_tokens_host"].sum() > 0  # not trivial: host hits too
        assert summary["engine_moves"].get("swap_out", 0) > 0


def test_blend_1_generates_a_prefix_runs_tokens():
    """Every reused token recomputed over the assembled context is the full prefill: greedy
    tokens equal those of the prefix cache (random weights, fp32: exact), first logits
    within float rounding."""
    trace = trace_of(ORDERS)
    blended = real_run(trace, config("blend:1"), logits=True)
    prefix = real_run(trace, config("prefix"), logits=True)
    assert blended.result.summary["position_free_hit_tokens"] > 0
    assert blended.result.summary["engine_blended_prefills"] > 0
    assert blended.iterations.outputs == prefix.iterations.outputs
    for request, (first, _) in prefix.iterations.logits.items():
        assert torch.allclose(blended.iterations.logits[request][0], first, atol=1e-4, rtol=0)


@pytest.mark.parametrize("reuse", ["blend:0", "epic:0"])
def test_a_document_read_where_and_behind_what_it_was_computed_is_the_prefix_caches(reuse):
    """Request 0 computes [0, 1]; request 1 is [4, 1] where document 4 is document 0's passage
    under another id: document 1 is read position-free (the exact prefix breaks at 4) at the
    position and behind the tokens it was computed at, recomputing nothing. Its KV there must
    be what the prefix cache's prefill computes for [4, 1] (the prefix run computes it)."""
    trace = trace_of([[0, 1], [4, 1]])
    same = {4: 0}
    blended = real_run(trace, config(reuse), logits=True, same_tokens=same)
    prefix = real_run(trace, config("prefix"), logits=True, same_tokens=same)
    columns = blended.result.columns
    assert columns["position_free_hit_tokens"].tolist() == [0, SIZES[1]]
    assert columns["blend_recomputed_tokens"].tolist() == [0, 0]
    assert "position_free_hit_tokens" not in prefix.result.columns  # nothing position-free

    def kv_of_path(run, docs):
        node = run.tree.root
        for doc in docs:
            node = node.children[doc]
        return run.iterations.store.read(node)

    got, expected = kv_of_path(blended, [4, 1]), kv_of_path(prefix, [4, 1])
    for (gk, gv), (ek, ev) in zip(got, expected, strict=True):
        assert torch.allclose(gk, ek, atol=1e-5, rtol=0)
        assert torch.allclose(gv, ev, atol=1e-5, rtol=0)
    assert blended.iterations.outputs == prefix.iterations.outputs
    for request, (first, _) in prefix.iterations.logits.items():
        assert torch.allclose(blended.iterations.logits[request][0], first, atol=1e-4, rtol=0)


def test_vllm_still_refuses_position_free_reuse():
    import ragsim
    from ragsim.errors import RagsimInputError

    with pytest.raises(RagsimInputError, match="reuse"):
        ragsim.simulate(requests=2, backend="vllm", reuse="blend:0.15")


def test_position_free_hits_are_not_needed_for_the_engine_to_run_them():
    """No repeated document: nothing is read position-free, and no blended prefill runs."""
    trace = trace_of([[0, 1], [2, 3], [4]])
    run = real_run(trace, config("blend:0.15"))
    assert run.result.summary["engine_blended_prefills"] == 0
    assert np.asarray(run.result.columns["position_free_hit_tokens"]).sum() == 0


@pytest.mark.parametrize("reuse", ["blend:0.15", "epic:4"])
def test_validate_on_torch_compares_a_blended_run_with_its_simulation(tmp_path, reuse):
    """``validate --backend torch --reuse blend:0.15`` (and ``epic:4``, issue 29: validate
    covers both rules): the real run and the simulation are compared as for prefix reuse (hit
    agreement per request), and the report carries both sides' position-free counts and the
    engine's own, which agree."""
    import ragsim

    found = ragsim.validate(tmp_path, backend="torch", requests=8, sequential=True,
                            reuse=reuse)
    report = found.report
    assert report["reuse"] == reuse
    assert report["hit_agreement"] == 1.0
    counts = report["position_free"]
    assert counts["agree"] is True
    assert counts["real"] == counts["sim"] == counts["engine"]
    free = counts["sim"]["position_free_hit_tokens"]
    recomputed = counts["sim"]["blend_recomputed_tokens"]
    assert free > 0
    if reuse.startswith("epic"):  # the first 4 tokens of each reused document
        assert 0 < recomputed < free and recomputed % 4 == 0
    else:  # 15% of each reused document's tokens, rounded per document
        assert 0.1 < recomputed / free < 0.2
    assert report["real"]["backend"] == "torch"


def test_validate_on_vllm_refuses_position_free_reuse(tmp_path):
    """vLLM has no blended prefill (its block-granular cache also refuses whole-document
    reuse first: a one-line error naming the reuse field either way)."""
    import ragsim
    from ragsim.errors import RagsimInputError

    with pytest.raises(RagsimInputError, match="reuse"):
        ragsim.validate(tmp_path, backend="vllm", requests=4, reuse="epic:32")


@pytest.mark.parametrize("sharing", [False, True], ids=["own-kv", "batch-kv-sharing"])
def test_a_burst_blends_beside_batched_prefills_and_counts_what_the_core_counts(sharing):
    """All requests at once, in little memory (position-free reads from host copies too):
    blended jobs run beside the batch's other rows; with batch KV sharing a job that reads a
    node a batch mate computes waits for a second pass. Under blend:1 every token is
    recomputed, so greedy tokens are a prefix run's (an order-free reference)."""
    trace = trace_of(ORDERS * 2)
    burst = {"arrival": "poisson", "rate_rps": 1e6, "max_prefill_bs": 4,
             "batch_kv_sharing": sharing, **SMALL}
    run = real_run(trace, config("blend:1", **burst))
    alone = real_run(trace, config("prefix"))
    summary = run.result.summary
    assert summary["requests_completed"] == len(ORDERS) * 2
    assert summary["iterations_prefill"] < len(ORDERS) * 2  # requests shared iterations
    assert summary["engine_blended_prefills"] > 0
    assert summary["engine_position_free_hit_tokens"] == summary["position_free_hit_tokens"]
    assert summary["engine_blend_recomputed_tokens"] == summary["blend_recomputed_tokens"]
    assert run.iterations.outputs == alone.iterations.outputs
    gpu, host = tiers_of_tree(run.tree)
    assert set(run.iterations.store.gpu) - {run.tree.root} == gpu
    assert set(run.iterations.store.host) == host
