"""FIFO: evict the leaf that entered the cache first; hits do not change the order."""

from __future__ import annotations

import cython

from ragsim.cache.policies.base import TreePolicy
from ragsim.cache.policies.lru import FlatLRU
from ragsim.cache.tree import Node


@cython.cclass
class FIFO(TreePolicy):
    name = "fifo"
    family = "recency"
    description = "leaf that entered the cache first goes first; hits change nothing"
    algorithm1 = "none: no clock, frequency, cost or size"
    tracks_cache_entry = True

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        """Insertion order is set in ``on_enter_cache``; an access changes nothing."""

    @cython.annotation_typing(False)
    def on_enter_cache(self, node: Node, seq: int) -> None:
        node.value = float(seq)

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str | None = None,
                   frequency_window_s: float | None = None) -> FlatLRU:
        # FIFO is LRU without promotion on hit: one implementation, not two.
        return FlatLRU(capacity_bytes, promote_on_hit=False)
