"""A policy written in plain Python still drives the compiled tree.

The built-in policies override the tree's per-node hooks in C (tree.pxd); a user's policy is a
Python subclass of ``TreePolicy`` whose hooks the tree must reach through Python. Each Python
policy here is a second, independent implementation of a built-in one (its rule written out in
Python), so the two must make the same decisions on the same requests.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragsim.cache import KnowledgeTree, make_policy
from ragsim.cache.policies.base import TreePolicy
from ragsim.profiles.profile import load_profile

TABLE = load_profile("a10g-mistral-7b").prefill


class PythonLRU(TreePolicy):
    name = "python-lru"

    def on_access(self, node, is_cached, cost_per_token_s, request_index, depth):
        node.value = float(node.last_access)


class PythonFIFO(TreePolicy):
    name = "python-fifo"
    tracks_cache_entry = True

    def on_access(self, node, is_cached, cost_per_token_s, request_index, depth):
        pass

    def on_enter_cache(self, node, seq):
        node.value = float(seq)


class PythonPGDSF(TreePolicy):
    """Clock + frequency x the mean T(a, b)/b of the requests that computed the node."""

    name = "python-pgdsf"
    uses_clock = True
    uses_frequency = True
    needs_cost = True

    def __init__(self) -> None:
        self.computed: dict = {}  # node -> [sum of cost per token, requests]

    def on_access(self, node, is_cached, cost_per_token_s, request_index, depth):
        totals = self.computed.setdefault(node, [0.0, 0])
        if not is_cached:
            totals[0] += cost_per_token_s
            totals[1] += 1
        node.value = self.value_of(node)

    def value_of(self, node):
        total, m = self.computed.get(node, (0.0, 0))
        return (total / m if m else 0.0) * node.frequency


def replay(policy, requests, scope: str) -> list[tuple]:
    tree = KnowledgeTree(policy, gpu_capacity_bytes=3_000, host_capacity_bytes=5_000,
                         kv_bytes_per_token=1, prefill_cost_s=TABLE.at,
                         frequency_scope=scope,
                         frequency_window_s=30.0 if scope == "window" else None)
    seen = []
    for t, (docs, tokens) in enumerate(requests):
        r = tree.access(docs, tokens, 20, request_index=t, now_s=float(t))
        seen.append((r.hit_tokens_gpu, r.hit_tokens_host, r.swap_in_bytes,
                     tree.evictions_gpu, tree.evictions_host))
    tree.check_invariants()
    return seen


def zipf_requests(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(100, 900, size=200)
    out = []
    for _ in range(n):
        docs = list(dict.fromkeys(int(d) % 200 for d in rng.zipf(1.3, size=3)))
        out.append((docs, [int(sizes[d]) for d in docs]))
    return out


@pytest.mark.parametrize(("python_policy", "builtin", "scope"), [
    (PythonLRU, "lru", "lifetime"),
    (PythonFIFO, "fifo", "lifetime"),
    (PythonPGDSF, "pgdsf", "lifetime"),
    (PythonPGDSF, "pgdsf", "window"),  # value_of is called when retrievals leave the window
])
def test_python_policy_decides_like_the_compiled_one(python_policy, builtin, scope):
    requests = zipf_requests(600, seed=3)
    theirs = replay(python_policy(), requests, scope)
    ours = replay(make_policy(builtin), requests, scope)
    assert theirs[-1][3] > 50 and theirs[-1][4] > 20  # enough evictions to tell policies apart
    assert theirs == ours


def test_a_policy_without_hooks_is_refused_at_its_first_retrieval():
    tree = KnowledgeTree(TreePolicy(), gpu_capacity_bytes=1_000, kv_bytes_per_token=1)
    with pytest.raises(NotImplementedError):
        tree.access([1], [10])


def test_the_tree_takes_only_tree_policies():
    with pytest.raises(TypeError, match="TreePolicy"):
        KnowledgeTree(object(), gpu_capacity_bytes=1_000, kv_bytes_per_token=1)
