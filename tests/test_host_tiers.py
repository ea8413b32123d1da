"""Host-tier rules of today's engines (issue 26), on hand-worked sequences.

Three rules, each as its engine's source has it (ragsim/serving/system_sources.py):

* RAGCache (``host_write="back"``): KV is copied to host when the GPU first evicts it;
* SGLang HiCache (write_through, ``host_evicts_gpu_copies=False``): a node is written to host when
  it is computed; a GPU eviction frees a backed-up node's GPU copy and deletes one without a host
  copy; the host evicts only host copies of nodes the GPU has evicted;
* vLLM's CPU offloading connector (write-through, ``host_evicts_gpu_copies=True``): every
  computed block is stored; the CPU LRU drops any copy, also of a block still in GPU.

Every expected state below is worked out by hand from those rules (documents of 100 tokens, one
byte a token, LRU: within a request the earlier document is the less recent).
"""

from __future__ import annotations

import pytest

from ragsim.cache import KnowledgeTree, make_policy
from ragsim.serving.config import SYSTEM_PRESETS, build_config
from ragsim.serving.system_sources import SYSTEM_SOURCES

P, X, Y, A, B, C, D = 1, 2, 3, 4, 5, 6, 7
RULES = {
    "ragcache": dict(host_write="back"),
    "hicache": dict(host_write="through", host_evicts_gpu_copies=False),
    "vllm-offload": dict(host_write="through", host_evicts_gpu_copies=True),
}


def lru_tree(*, gpu: int, host: int, **rule) -> KnowledgeTree:
    return KnowledgeTree(make_policy("lru"), gpu_capacity_bytes=gpu, host_capacity_bytes=host,
                         kv_bytes_per_token=1, **rule)


def tiers(tree: KnowledgeTree, *paths: list[int]) -> dict:
    """Each path's last node: 'gpu+host', 'gpu', 'host' or 'none'."""
    out = {}
    for path in paths:
        node = tree.root
        for key in path:
            node = node.children[key]
        out[path[-1]] = ("gpu+host" if node.in_gpu and node.host_copy else
                         "gpu" if node.in_gpu else "host" if node.host_copy else "none")
    return out


@pytest.mark.parametrize("system", list(RULES))
def test_what_each_rule_stores_evicts_and_loads(system):
    # GPU and host hold two documents each.
    kt = lru_tree(gpu=200, host=200, **RULES[system])
    # 1. [P, X]: both computed. Write-through copies both to host now; write-back copies none.
    kt.access([P, X], [100, 100])
    first = tiers(kt, [P], [P, X])
    # 2. [Y]: the GPU needs room. Its only leaf is X (P has X below it): X leaves the GPU.
    #    back:    X is copied to host now (host: X); Y computed. GPU P, Y.
    #    through: X has its host copy, only its GPU copy goes. Y is computed and written
    #             through, and the host (P, X) is full:
    #       HiCache evicts only host copies of GPU-evicted nodes: X goes, P's copy stays.
    #       vLLM's LRU takes the least recent copy: P's (P came before X in step 1), though P
    #       is still in GPU.
    kt.access([Y], [100])
    second = tiers(kt, [P], [P, X], [Y])
    # 3. [P, X] again: P hits in GPU; X hits in host (loaded back) or is recomputed.
    r = kt.access([P, X], [100, 100])
    kt.check_invariants()
    expected = {
        "ragcache": ({P: "gpu", X: "gpu"}, {P: "gpu", X: "host", Y: "gpu"},
                     (100, 100, 100, 0), 200),
        "hicache": ({P: "gpu+host", X: "gpu+host"}, {P: "gpu+host", X: "none", Y: "gpu+host"},
                    (100, 0, 0, 100), 400),
        "vllm-offload": ({P: "gpu+host", X: "gpu+host"}, {P: "gpu", X: "host", Y: "gpu+host"},
                         (100, 100, 100, 0), 300),
    }[system]
    assert first == expected[0]
    assert second == expected[1]
    assert (r.hit_tokens_gpu, r.hit_tokens_host, r.swap_in_bytes, r.recomputed_tokens) == \
        expected[2]
    # host writes. Step 3 first makes GPU room for X: P is pinned, so Y leaves the GPU.
    #   back: X (step 2) and Y (now, its first eviction): 200
    #   HiCache: P, X, Y written through (300); Y keeps its copy when the GPU drops it, then
    #            the recomputed X is written through, evicting Y's (a host-only leaf): 400
    #   vLLM: P, X, Y stored (300); X was loaded, not computed, and Y has its copy: 300
    assert kt.swap_out_bytes == expected[3]


def test_hicache_frees_without_a_copy_what_the_host_could_not_take():
    # GPU two documents, host one. HiCache's host keeps copies of GPU nodes, so it fills up.
    kt = lru_tree(gpu=200, host=100, **RULES["hicache"])
    kt.access([A], [100])   # GPU A; written through: host A
    kt.access([B], [100])   # GPU A, B; B's write finds the host full of A (still in GPU): none
    assert tiers(kt, [A], [B]) == {A: "gpu+host", B: "gpu"}
    kt.access([C], [100])   # GPU evicts A (LRU), which keeps its host copy; C's write evicts
    #                         A's host copy (now a host-only leaf) and takes its place
    assert tiers(kt, [A], [B], [C]) == {A: "none", B: "gpu", C: "gpu+host"}
    kt.access([D], [100])   # GPU evicts B, never written to host: freed, nothing copied;
    #                         D's write finds the host full of C (in GPU): none
    assert tiers(kt, [B], [C], [D]) == {B: "none", C: "gpu+host", D: "gpu"}
    assert kt.swap_out_bytes == 200  # A's and C's writes, nothing else
    kt.check_invariants()


def test_write_back_with_the_same_sequence_copies_only_on_eviction():
    kt = lru_tree(gpu=200, host=100, **RULES["ragcache"])
    for doc in (A, B, C, D):
        kt.access([doc], [100])
    # A evicted first (copied to host), then B (copied: the host's LRU drops A)
    assert tiers(kt, [A], [B], [C], [D]) == {A: "none", B: "host", C: "gpu", D: "gpu"}
    assert kt.swap_out_bytes == 200
    kt.check_invariants()


def test_a_tree_refuses_an_unknown_write_rule():
    with pytest.raises(ValueError, match="host_write"):
        lru_tree(gpu=100, host=100, host_write="around")


def test_presets_set_the_rules_their_engines_have():
    hicache = build_config({"system": "sglang-hicache"})
    assert (hicache.host_write, hicache.host_evicts_gpu_copies, hicache.policy,
            hicache.order, hicache.prefix_block_tokens) == ("through", False, "lru", "fcfs", 1)
    offload = build_config({"system": "vllm-offload"})
    assert (offload.host_write, offload.host_evicts_gpu_copies, offload.policy,
            offload.order, offload.prefix_block_tokens, offload.batch_kv_sharing) == \
        ("through", True, "lru", "fcfs", 16, True)
    lpm = build_config({"system": "sglang-lpm"})
    assert (lpm.order, lpm.reorder, lpm.host_cache_bytes) == ("lpm", True, 0)
    ragcache = build_config({})
    # equal memory: every system with a host tier gets the same host memory by default
    assert hicache.host_cache_bytes == offload.host_cache_bytes == ragcache.host_cache_bytes
    assert ragcache.host_write == "back"


def test_every_preset_says_what_it_follows():
    assert set(SYSTEM_SOURCES) == set(SYSTEM_PRESETS)
    for name, source in SYSTEM_SOURCES.items():
        assert {"engine", "version", "files", "modelled", "not_modelled"} <= set(source), name
    for name in ("sglang-hicache", "vllm-offload", "sglang-lpm"):
        assert SYSTEM_SOURCES[name]["files"], name

