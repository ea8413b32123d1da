"""LRU: evict the least recently used leaf. SGLang's radix tree and vLLM's prefix cache use it."""

from __future__ import annotations

from collections import OrderedDict

import cython

from ragsim.cache.policies.base import TreePolicy, checked_sizes
from ragsim.cache.tree import Node


@cython.cclass
class LRU(TreePolicy):
    name = "lru"
    family = "recency"
    description = "least recently retrieved leaf first (SGLang's radix tree, vLLM's prefix cache)"
    algorithm1 = "none: no clock, frequency, cost or size"

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = float(node.last_access)

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str | None = None,
                   frequency_window_s: float | None = None) -> FlatLRU:
        return FlatLRU(capacity_bytes)


class FlatLRU:
    """Object LRU with libCacheSim's semantics: an object larger than the cache is not admitted."""

    def __init__(self, capacity_bytes: int, *, promote_on_hit: bool = True) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self.promote_on_hit = promote_on_hit
        self._entries: OrderedDict[int, int] = OrderedDict()

    def process(self, keys: list, sizes_bytes, tokens: list | None = None,
                next_access: list | None = None) -> bytearray:
        n: cython.Py_ssize_t = len(keys)
        sizes_view: cython.longlong[:] = checked_sizes(keys, sizes_bytes)
        entries = self._entries
        promote = entries.move_to_end
        pop_oldest = entries.popitem
        do_promote: cython.bint = self.promote_on_hit
        capacity: cython.longlong = self.capacity_bytes
        used: cython.longlong = self.used_bytes
        evictions: cython.longlong = self.evictions
        size: cython.longlong
        i: cython.Py_ssize_t
        hits = bytearray(n)
        for i in range(n):
            key = keys[i]
            if key in entries:
                if do_promote:
                    promote(key)
                hits[i] = 1
                continue
            size = sizes_view[i]
            if size > capacity:
                continue
            used += size
            while used > capacity:
                used -= cython.cast(cython.longlong, pop_oldest(False)[1])
                evictions += 1
            entries[key] = size
        self.used_bytes = used
        self.evictions = evictions
        return hits
