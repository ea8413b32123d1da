"""The reference engine's KV reuse is exact: cached runs generate what uncached runs generate.

The expected output comes from a second implementation: the model run by hand on the whole
prompt with no cache at all, greedy, recomputing everything at every step (no padding, no
position ids, no KV store). Model: 2 layers, hidden 64, 4 heads over 2 KV heads, fp32, CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch  # [profile] is in [dev]: missing is a broken set-up, not a skip

from ragsim.profiles.models import ModelSpec
from ragsim.profiles.torch_model import TorchModel
from ragsim.realrun.engine import (
    Document,
    EngineRequest,
    KVCapacityError,
    KVStore,
    ReferenceEngine,
    kv_bytes,
)
from ragsim.realrun.tokens import document_token_ids, query_token_ids

VOCAB = 512
# measured: cached vs uncached last-token logits differ by at most 1.2e-7 (fp32, this model,
# logits of magnitude ~0.5); 1e-5 leaves ~80x margin, far below a wrong-position error
LOGITS_ATOL = 1e-5
SPEC = ModelSpec(name="tiny", num_layers=2, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                 hidden_size=64, intermediate_size=128, vocab_size=VOCAB, dtype="fp32")
DOC_TOKENS = {"a": 37, "b": 21, "c": 29, "d": 13, "e": 44}


@pytest.fixture(scope="module")
def model() -> TorchModel:
    return TorchModel.build(SPEC, "cpu", "fp32", threads=1, seed=0)


def _request(rid: str, docs: str, query_tokens: int, max_new: int = 6) -> EngineRequest:
    """Documents keyed by their path (a document's KV depends on everything before it)."""
    documents = [Document(tuple(docs[:i + 1]), document_token_ids(d, DOC_TOKENS[d], VOCAB))
                 for i, d in enumerate(docs)]
    return EngineRequest(rid, documents, query_token_ids(rid, query_tokens, VOCAB), max_new)


def _reference(model: TorchModel, request: EngineRequest
               ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Greedy generation recomputing the whole sequence at every step, no cache at all:
    the tokens, the first step's logits and the last step's."""
    ids = np.concatenate([*(d.token_ids for d in request.documents), request.query_ids])
    sequence = torch.as_tensor(ids, dtype=torch.long)[None]
    tokens, first = [], None
    with torch.no_grad():
        for _ in range(request.max_new_tokens):
            logits = model.model(input_ids=sequence, use_cache=False).logits[0, -1]
            first = logits if first is None else first
            token = int(logits.argmax())
            tokens.append(token)
            sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
    return tokens, first, logits


def _engine(model: TorchModel, capacity: int = 1 << 30) -> ReferenceEngine:
    return ReferenceEngine(model, KVStore("cpu", capacity, host_capacity_bytes=1 << 30))


def test_document_tokens_are_deterministic_per_id():
    first = document_token_ids(7, 300, VOCAB)
    assert np.array_equal(first, document_token_ids(7, 300, VOCAB))
    assert np.array_equal(first, document_token_ids("7", 300, VOCAB))  # ids from a file: text
    assert not np.array_equal(first, document_token_ids(8, 300, VOCAB))
    assert not np.array_equal(first, query_token_ids(7, 300, VOCAB))
    assert first.min() >= 0 and first.max() < VOCAB and len(set(first.tolist())) > 100
    assert len(document_token_ids(7, 0, VOCAB)) == 0


def test_cached_single_request_generates_the_uncached_tokens(model):
    engine = _engine(model)
    request = _request("q1", "ab", query_tokens=9)
    expected_tokens, expected_first, expected_last = _reference(model, request)

    cold = engine.run([request])[0]
    assert cold.cached_documents == 0 and cold.stored == [("a",), ("a", "b")]
    warm = engine.run([request])[0]
    assert warm.cached_documents == 2 and warm.cached_tokens == 37 + 21
    assert warm.computed_tokens == 9
    for result in (cold, warm):
        assert result.tokens == expected_tokens
        assert torch.allclose(result.first_logits, expected_first, atol=LOGITS_ATOL, rtol=0)
        assert torch.allclose(result.last_logits, expected_last, atol=LOGITS_ATOL, rtol=0)


def test_batch_with_mixed_cached_lengths_is_exact(model):
    engine = _engine(model)
    engine.run([_request("warmup", "ab", query_tokens=3)])  # caches (a,) and (a, b)
    requests = [_request("none", "cd", query_tokens=5),   # nothing cached
                _request("one", "ae", query_tokens=11),   # one-document prefix
                _request("two", "ab", query_tokens=2)]    # two-document prefix
    results = engine.run(requests)
    assert [r.cached_documents for r in results] == [0, 1, 2]
    assert [r.cached_tokens for r in results] == [0, 37, 58]
    for request, result in zip(requests, results, strict=True):
        expected_tokens, expected_first, expected_last = _reference(model, request)
        assert result.tokens == expected_tokens, request.request_id
        assert torch.allclose(result.first_logits, expected_first, atol=LOGITS_ATOL, rtol=0)
        assert torch.allclose(result.last_logits, expected_last, atol=LOGITS_ATOL, rtol=0)


def test_kv_moved_to_host_and_back_generates_the_same(model):
    engine = _engine(model)
    request = _request("q2", "abc", query_tokens=7)
    engine.run([request])
    before = engine.run([request])[0]
    keys = [d.key for d in request.documents]
    originals = {k: [(kk.clone(), vv.clone()) for kk, vv in engine.store.get(k)] for k in keys}
    gpu_bytes = engine.store.gpu_bytes
    for key in keys:
        engine.store.copy_to_host(key)  # swap out once: both copies for a moment
        engine.store.free_gpu(key)
    assert engine.store.gpu_bytes == 0 and engine.store.host_bytes == gpu_bytes
    assert engine.cached_documents(request) == 0  # a forward pass reads only the GPU pool
    for key in keys:
        engine.store.copy_to_gpu(key)  # a host hit: the host copy stays
        assert engine.store.tier(key) == "gpu" and key in engine.store.host
        assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0)
                   in zip(engine.store.get(key), originals[key], strict=True))
    assert engine.store.host_bytes == engine.store.gpu_bytes == gpu_bytes
    after = engine.run([request])[0]
    assert after.cached_documents == 3
    assert after.tokens == before.tokens
    assert torch.equal(after.first_logits, before.first_logits)


def test_dropped_node_is_recomputed_to_the_same_kv(model):
    engine = _engine(model)
    request = _request("q3", "ab", query_tokens=4)
    engine.run([request])
    original = [(k.clone(), v.clone()) for k, v in engine.store.get(("a", "b"))]
    engine.store.drop(("a", "b"))
    assert engine.store.tier(("a", "b")) is None
    again = engine.run([request])[0]
    assert again.cached_documents == 1 and again.stored == [("a", "b")]
    for (k, v), (k0, v0) in zip(engine.store.get(("a", "b")), original, strict=True):
        assert k.shape == k0.shape == (2, 21, 16)
        assert torch.allclose(k, k0, atol=LOGITS_ATOL, rtol=0)
        assert torch.allclose(v, v0, atol=LOGITS_ATOL, rtol=0)


def test_the_gpu_pool_refuses_what_does_not_fit(model):
    engine = _engine(model)
    engine.run([_request("q4", "a", query_tokens=2)], store_new=False)
    assert engine.store.gpu == {}
    one_doc = 2 * 2 * 37 * 2 * 16 * 4  # layers x (K, V) x tokens x kv heads x head dim x fp32
    small = _engine(model, capacity=one_doc)
    small.run([_request("q5", "a", query_tokens=2)])
    assert kv_bytes(small.store.get(("a",))) == one_doc == small.store.gpu_bytes
    with pytest.raises(KVCapacityError, match="GPU pool"):
        small.run([_request("q6", "ab", query_tokens=2)])


def test_the_trees_moves_applied_to_the_store_keep_it_in_step_with_the_tree():
    """The wiring to come, in miniature: a real knowledge tree (LRU, GPU room for three
    100-token documents, host for two) serves requests, and its drained moves, applied to a
    KVStore whose tensors take the tree's bytes per token, leave the store holding exactly the
    tree's residency and bytes after every request (swap-outs keep the GPU copy until the tree
    frees it, host hits keep the host copy)."""
    from ragsim.cache.policies import make_policy
    from ragsim.cache.tree import KnowledgeTree

    dim = 2
    bytes_per_token = 2 * dim * 4  # one layer of fp32 keys and values, one head
    tree = KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=300 * bytes_per_token,
                         host_capacity_bytes=200 * bytes_per_token,
                         kv_bytes_per_token=bytes_per_token, record_moves=True)
    store = KVStore("cpu", 300 * bytes_per_token, host_capacity_bytes=200 * bytes_per_token)
    rng = np.random.default_rng(0)
    kinds: set[str] = set()
    for _ in range(200):
        docs = [int(d) for d in rng.choice(8, size=2, replace=False)]
        tree.access(docs, [100, 100])
        for move in tree.drain_moves():
            kinds.add(move.kind)
            if move.kind == "admit_gpu":  # what the engine's prefill would have stored
                kv = torch.zeros(1, move.node.tokens, dim)
                store.put(move.node, [(kv, kv.clone())])
            else:
                store.apply(move.kind, move.node)
        nodes = [n for n in tree.iter_nodes() if n.parent is not None]
        assert {n for n in nodes if n.in_gpu} == set(store.gpu)
        assert {n for n in nodes if n.host_copy} == set(store.host)
        assert store.gpu_bytes == tree.gpu_used_bytes and store.host_bytes == tree.host_used_bytes
    assert {"admit_gpu", "swap_out", "free_gpu", "swap_in", "drop"} <= kinds
    with pytest.raises(ValueError, match="admit_gpu"):
        store.apply("admit_gpu", "x")
