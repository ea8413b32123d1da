"""The real engine's KV reuse is exact: cached runs generate what uncached runs generate.

The engine is ``TorchIterations`` as the real harness drives it (the knowledge tree decides,
the store holds the tensors, prefills run on the cached prefix). The expected output comes from
a second implementation: the profile's model run by hand on the whole prompt with no cache at
all, greedy, recomputing everything at every step (no padding, no position ids, no KV store),
with the prompt's token ids drawn here from the trace (``realrun.tokens``' deterministic ids
per document and per query).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch  # [profile] is in [dev]: missing is a broken set-up, not a skip

from ragsim.profiles.profile import load_profile
from ragsim.realrun.engine import KVCapacityError, KVStore, kv_bytes
from ragsim.realrun.harness import RealRun
from ragsim.realrun.tokens import document_token_ids, query_token_ids
from ragsim.serving.config import build_config
from ragsim.traces.io import TraceBuilder

VOCAB = 512
PROFILE = "cpu-mistral-7b-l2-h256"  # 2 layers, hidden 256, fp32, vocab 32,000
KV = load_profile(PROFILE).model.kv_bytes_per_token
# measured: cached vs uncached logits differ by at most ~2e-6 (fp32, this model, logits of
# magnitude ~1); 1e-4 leaves a wide margin and is far below what a wrong position or a
# wrong prefix does (~1e-1)
LOGITS_ATOL = 1e-4
SYSTEM_PROMPT_TOKENS = 24


def trace_of(requests: list[tuple[list[int], int]], sizes: dict[int, int], gap_s: float = 0.05):
    """A trace of (documents, query tokens) requests, 2-5 output tokens each (so requests
    leave a decode batch at different steps)."""
    b = TraceBuilder("exactness-test")
    for i, (docs, query_tokens) in enumerate(requests):
        b.add(i, gap_s * i, query_tokens, 2 + i % 4, docs, [sizes[d] for d in docs])
    return b.build({"name": "exactness-test"})


def served(trace, **flags) -> RealRun:
    given = {"trace": "mmlu", "system": "ragcache", "profile": PROFILE, "arrival": "sequential",
             "speculate": False, "search_s": 0.001,
             "system_prompt_tokens": SYSTEM_PROMPT_TOKENS, **flags}
    run = RealRun(trace, build_config(given), load_profile(PROFILE))
    run.iterations.record_logits = True
    run.result = run.run()
    assert (run.result.columns["status"] == "completed").all()
    return run


def uncached_generation(run: RealRun, trace, row: int) -> tuple[list[int], torch.Tensor,
                                                                  torch.Tensor]:
    """Greedy generation recomputing the whole sequence at every step, no cache at all: the
    tokens, the first token's logits and the last one's."""
    vocab = run.profile.model.vocab_size
    parts = [document_token_ids("__system_prompt__", SYSTEM_PROMPT_TOKENS, vocab)]
    parts += [document_token_ids(int(d), SIZES[int(d)], vocab) for d in trace.docs_of(row)]
    parts.append(query_token_ids(int(trace.request_id[row]), int(trace.query_tokens[row]),
                                 vocab))
    sequence = torch.as_tensor(np.concatenate(parts), dtype=torch.long)[None]
    tokens, first = [], None
    with torch.no_grad():
        for _ in range(int(trace.output_tokens[row])):
            logits = run.model.model(input_ids=sequence, use_cache=False).logits[0, -1]
            first = logits if first is None else first
            token = int(logits.argmax())
            tokens.append(token)
            sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
    return tokens, first, logits


def assert_exact(run: RealRun, trace) -> None:
    for row in range(trace.n_requests):
        tokens, first, last = uncached_generation(run, trace, row)
        assert run.iterations.outputs[row] == tokens, f"request {row}"
        got_first, got_last = run.iterations.logits[row]
        assert torch.allclose(got_first, first, atol=LOGITS_ATOL, rtol=0), f"request {row}"
        assert torch.allclose(got_last, last, atol=LOGITS_ATOL, rtol=0), f"request {row}"


SIZES = {0: 37, 1: 21, 2: 29, 3: 13, 4: 44, 5: 60}


def test_document_tokens_are_deterministic_per_id():
    first = document_token_ids(7, 300, VOCAB)
    assert np.array_equal(first, document_token_ids(7, 300, VOCAB))
    assert np.array_equal(first, document_token_ids("7", 300, VOCAB))  # ids from a file: text
    assert not np.array_equal(first, document_token_ids(8, 300, VOCAB))
    assert not np.array_equal(first, query_token_ids(7, 300, VOCAB))
    assert first.min() >= 0 and first.max() < VOCAB and len(set(first.tolist())) > 100
    assert len(document_token_ids(7, 0, VOCAB)) == 0


def test_cached_single_requests_generate_the_uncached_tokens():
    """One request at a time: the second (a, b) reuses both documents, (a, e) one of them."""
    trace = trace_of([([0, 1], 9), ([0, 1], 5), ([0, 4], 11), ([2, 3], 3)], SIZES)
    run = served(trace)
    hits = run.result.columns["cached_tokens"].tolist()
    assert hits == [SYSTEM_PROMPT_TOKENS, SYSTEM_PROMPT_TOKENS + 37 + 21,
                    SYSTEM_PROMPT_TOKENS + 37, SYSTEM_PROMPT_TOKENS]
    assert_exact(run, trace)


def test_a_batch_with_mixed_cached_lengths_is_exact():
    """Requests arriving together share prefill passes although their cached prefixes differ
    (left padding, per-row positions), and the decode batch changes as they join and leave."""
    warm = [([0, 1], 3), ([0, 4], 2)]
    burst = [([2, 3], 5), ([0, 5], 11), ([0, 1], 2), ([0, 4], 7), ([5, 2], 4)]
    trace = trace_of(warm + burst, SIZES)
    # padded_join "always": the burst shares padded passes whatever their lengths
    run = served(trace, arrival="poisson", rate_rps=1e6, max_prefill_bs=4, padded_join="always")
    summary = run.result.summary
    assert summary["iterations_prefill"] < trace.n_requests  # some requests shared a pass
    assert summary["engine_decode_rebuilds"] >= 1 and summary["engine_decode_reshapes"] >= 1
    assert len(set(run.result.columns["cached_tokens"].tolist())) >= 3
    assert_exact(run, trace)


@pytest.mark.parametrize("overlap_swap", [False, True])
def test_kv_swapped_out_dropped_and_swapped_in_stays_exact(overlap_swap):
    """GPU room for ~2 documents and host room for ~3: the tree evicts to the host, swaps back
    in and drops, and every move is a real copy of real tensors; generation stays exact and
    the store never holds more than its budgets. With --overlap-swap host hits are copied layer
    by layer as the prefill reaches each layer (the batch's cache filled lazily)."""
    rng = np.random.default_rng(5)
    requests = [([int(d) for d in rng.choice(6, size=2, replace=False)], int(rng.integers(2, 9)))
                for _ in range(14)]
    trace = trace_of(requests, SIZES)
    run = served(trace, gpu_kv_bytes=(SYSTEM_PROMPT_TOKENS + 110) * KV,
                 host_cache_bytes=130 * KV, overlap_swap=overlap_swap)
    summary = run.result.summary
    assert (summary["engine_layerwise_swap_ins"] > 0) == overlap_swap
    moves = summary["engine_moves"]
    assert moves.get("swap_out", 0) > 0 and moves.get("swap_in", 0) > 0
    assert moves.get("drop", 0) + moves.get("free_gpu", 0) > 0
    assert run.result.columns["hit_tokens_host"].sum() > 0
    store = run.iterations.store
    assert store.gpu_bytes <= run.tree.gpu_capacity_bytes
    assert store.host_bytes <= run.tree.host_capacity_bytes
    assert_exact(run, trace)


def test_the_gpu_pool_refuses_what_does_not_fit():
    one_doc = 2 * 2 * 37 * 2 * 16 * 4  # layers x (K, V) x tokens x kv heads x head dim x fp32
    store = KVStore("cpu", one_doc, host_capacity_bytes=one_doc)
    kv = [(torch.ones(2, 37, 16), torch.ones(2, 37, 16)) for _ in range(2)]
    store.put("a", kv)
    assert kv_bytes(store.get("a")) == one_doc == store.gpu_bytes
    with pytest.raises(KVCapacityError, match="GPU pool"):
        store.put("b", [(k.clone(), v.clone()) for k, v in kv])
    store.copy_to_host("a")  # swap out once: both copies for a moment
    store.free_gpu("a")
    assert store.gpu_bytes == 0 and store.host_bytes == one_doc
    store.copy_to_gpu("a")  # a host hit keeps the host copy, and copies, never aliases
    assert store.tier("a") == "gpu" and "a" in store.host
    assert store.get("a")[0][0].data_ptr() != store.host["a"][0][0].data_ptr()
    assert torch.equal(store.get("a")[0][0], kv[0][0])
    store.drop("a")
    assert store.tier("a") is None and store.gpu_bytes == store.host_bytes == 0


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


class _CountingTorch:
    """torch, with each ``empty`` (a rebuild's buffer allocation) calling ``on_empty`` first."""

    def __init__(self, on_empty) -> None:
        self._on_empty = on_empty

    def empty(self, *args, **kwargs):
        self._on_empty()
        return torch.empty(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(torch, name)


def test_a_rebuild_frees_the_old_batch_before_allocating_the_next_layer(monkeypatch):
    """The old decode batch's buffers are gone, layer by layer, before the new batch allocates
    the next layer (on a GPU the old and the new batch together ran out of memory): when the
    rebuild allocates layer L, no old layer before L is alive; when it returns, none is. The
    buffers are watched through weak references, so only real frees pass."""
    from ragsim.realrun.iterations import TorchIterations

    rebuild = TorchIterations._rebuild
    watched: list[list[int]] = []  # per rebuild over an old batch: old layers alive per alloc

    def rebuild_watched(self, members):
        if self._row_storage is None:
            return rebuild(self, members)
        old = [[weakref.ref(buffer) for buffer in pair] for pair in self._row_storage]
        alive_at_alloc: list[int] = []

        def on_empty():
            alive = [layer for layer, refs in enumerate(old)
                     if any(ref() is not None for ref in refs)]
            layer = len(alive_at_alloc) // 2  # two buffers (keys, values) a layer
            alive_at_alloc.append(layer)
            assert all(alive_layer >= layer for alive_layer in alive), (layer, alive)

        model = self.model
        model.torch = _CountingTorch(on_empty)
        try:
            result = rebuild(self, members)
        finally:
            model.torch = torch
        gc.collect()
        assert all(ref() is None for refs in old for ref in refs), "an old buffer outlived it"
        watched.append(alive_at_alloc)
        return result

    monkeypatch.setattr(TorchIterations, "_rebuild", rebuild_watched)
    # a short request decoding for a while (~1 s here), then longer ones joining its batch:
    # longer than its rows' common end, they cannot join in place (a rebuild over its batch)
    b = TraceBuilder("rebuild-test")
    b.add(0, 0.0, 5, 200, [3], [SIZES[3]])
    for i, docs in enumerate([[4, 5], [5, 4], [0, 5]], start=1):
        b.add(i, 0.1, 7, 3, docs, [SIZES[d] for d in docs])
    run = served(b.build({"name": "rebuild-test"}), arrival="trace")
    assert watched, "no rebuild replaced an existing batch: the test saw nothing"
    assert all(len(allocs) == 2 * run.model.num_layers for allocs in watched)
