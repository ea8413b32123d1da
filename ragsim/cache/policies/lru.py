"""LRU: evict the least recently used leaf. SGLang's radix tree and vLLM's prefix cache use it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ragsim.cache.node import Node
from ragsim.cache.policies.base import TreePolicy


class LRU(TreePolicy):
    name = "lru"

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = float(node.last_access)

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None) -> FlatLRU:
        return FlatLRU(capacity_bytes)


class FlatLRU:
    """Object LRU with libCacheSim's semantics: an object larger than the cache is not admitted."""

    def __init__(self, capacity_bytes: int, *, promote_on_hit: bool = True) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self.promote_on_hit = promote_on_hit
        self._entries: OrderedDict[int, int] = OrderedDict()

    def process(self, keys: Sequence[int], sizes_bytes: Sequence[int],
                tokens: Sequence[int] | None = None,
                next_access: Sequence[int] | None = None) -> list[bool]:
        entries = self._entries
        promote = entries.move_to_end if self.promote_on_hit else None
        pop_oldest = entries.popitem
        capacity = self.capacity_bytes
        used = self.used_bytes
        evictions = self.evictions
        hits = []
        record = hits.append
        for key, size in zip(keys, sizes_bytes, strict=True):
            if key in entries:
                if promote is not None:
                    promote(key)
                record(True)
                continue
            record(False)
            if size > capacity:
                continue
            used += size
            while used > capacity:
                used -= pop_oldest(last=False)[1]
                evictions += 1
            entries[key] = size
        self.used_bytes = used
        self.evictions = evictions
        return hits
