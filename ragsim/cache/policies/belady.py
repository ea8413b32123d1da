"""Offline optimum bounds (Belady/MIN): what no online policy can beat, to show the headroom.

Flat mode follows libCacheSim's Belady: admit every object that fits and evict the cached object
whose next request is furthest in the future (never again counts as infinitely far).

On the knowledge tree the optimum is NP-hard in general (sizes, prefix constraints, two tiers);
ragsim's documented heuristic applies the same rule to the leaves of each tier: a node's value is
minus the index of the next request whose cached path includes it, so the leaf needed furthest in
the future (or never) is evicted first, in GPU and in host memory alike. It is an upper reference,
not a proven optimum.
"""

from __future__ import annotations

from heapq import heappop, heappush

import cython
import numpy as np

from ragsim.cache.policies.base import TreePolicy, checked_sizes
from ragsim.cache.tree import Node

NEVER = 2**62


def next_use_by_position(keys: np.ndarray) -> np.ndarray:
    """For each position, the next position holding the same key, or NEVER."""
    keys = np.asarray(keys)
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    next_pos = np.full(n, NEVER, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    next_pos[order[:-1][same]] = order[1:][same]
    return next_pos


def tree_node_ids(doc_offsets: np.ndarray, doc_ids: np.ndarray, max_depth: int | None
                  ) -> np.ndarray:
    """An integer per (request, depth) naming the prefix path, -1 past ``max_depth``."""
    trie: dict[tuple[int, int], int] = {}
    out = np.full(len(doc_ids), -1, dtype=np.int64)
    ids = doc_ids.tolist()
    offsets = doc_offsets.tolist()
    for r in range(len(offsets) - 1):
        parent = -1
        stop = offsets[r + 1] if max_depth is None else min(offsets[r + 1], offsets[r] + max_depth)
        for p in range(offsets[r], stop):
            node = trie.setdefault((parent, ids[p]), len(trie))
            out[p] = node
            parent = node
    return out


class Belady(TreePolicy):
    """Tree heuristic; construct with ``for_trace`` so it knows each node's next use."""

    name = "belady"
    family = "offline bound"
    description = "leaf needed furthest in the future first (needs the future: replay only)"
    algorithm1 = "none: an offline reference, not an online policy"
    needs_future = True

    def __init__(self) -> None:
        self._next_request: list[int] | None = None
        self._offsets: list[int] | None = None

    def prepare(self, doc_offsets: np.ndarray, doc_ids: np.ndarray, max_depth: int | None
                ) -> None:
        node_ids = tree_node_ids(doc_offsets, doc_ids, max_depth)
        request_of = np.repeat(np.arange(len(doc_offsets) - 1), np.diff(doc_offsets))
        valid = node_ids >= 0
        next_request = np.full(len(doc_ids), NEVER, dtype=np.int64)
        positions = np.flatnonzero(valid)
        nxt = next_use_by_position(node_ids[valid])
        found = nxt != NEVER
        next_request[positions[found]] = request_of[positions[nxt[found]]]
        self._next_request = next_request.tolist()
        self._offsets = np.asarray(doc_offsets).tolist()

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        if self._next_request is None:
            raise RuntimeError("Belady needs the future: call prepare() with the trace first")
        node.value = -float(self._next_request[self._offsets[request_index] + depth - 1])

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str | None = None,
                   frequency_window_s: float | None = None) -> FlatBelady:
        return FlatBelady(capacity_bytes)


class FlatBelady:
    """libCacheSim's Belady: needs ``next_access`` (position of the next request for the key)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._next: dict[int, int] = {}
        self._size: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []

    def process(self, keys: list, sizes_bytes, tokens: list | None = None,
                next_access: list | None = None) -> bytearray:
        if next_access is None:
            raise ValueError("Belady needs next_access for every request")
        n: cython.Py_ssize_t = len(keys)
        sizes_view: cython.longlong[:] = checked_sizes(keys, sizes_bytes, next_access)
        nexts: dict = self._next
        sizes: dict = self._size
        heap: list = self._heap
        capacity: cython.longlong = self.capacity_bytes
        size: cython.longlong
        i: cython.Py_ssize_t
        hits = bytearray(n)
        for i in range(n):
            key = keys[i]
            nxt = next_access[i]
            if key in nexts:
                hits[i] = 1
                nexts[key] = nxt
                heappush(heap, (-nxt, key))
                continue
            size = sizes_view[i]
            if size > capacity:
                continue
            while self.used_bytes + size > capacity:
                popped = heappop(heap)
                victim = popped[1]
                if nexts.get(victim) != -popped[0]:
                    continue
                del nexts[victim]
                self.used_bytes -= sizes.pop(victim)
                self.evictions += 1
            nexts[key] = nxt
            sizes[key] = size
            self.used_bytes += size
            heappush(heap, (-nxt, key))
        return hits
