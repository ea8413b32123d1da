"""LFU: evict the least frequently used leaf; ties go to the least recently used.

What "frequency" counts is the tree's frequency scope, the same for every policy: since
admission (libCacheSim's in-cache LFU), over the whole run (perfect LFU), or over a sliding
window of trace time (windowed LFU).
"""

from __future__ import annotations

from collections import OrderedDict

import cython

from ragsim.cache.policies.base import TreePolicy, checked_sizes, flat_counting
from ragsim.cache.policies.gdsf import FlatGreedyDual
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, Node


@cython.cclass
class LFU(TreePolicy):
    name = "lfu"
    family = "frequency"
    description = "least frequently retrieved leaf first; ties: least recently retrieved"
    algorithm1 = "Frequency only: no clock, no cost, no size"
    uses_frequency = True

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = float(node.frequency)

    @cython.annotation_typing(False)
    def value_of(self, node: Node) -> float:
        return float(node.frequency)

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
                   frequency_window_s: float | None = None) -> FlatLFU | FlatGreedyDual:
        counting = flat_counting(frequency_scope, frequency_window_s)
        if counting["window_s"] is not None:
            # counts that drop need a heap, not frequency buckets: the greedy-dual cache with
            # value = count (unit cost = size), no aging, room made before admission
            return FlatGreedyDual(capacity_bytes, lambda size_bytes, tokens: float(size_bytes),
                                  aging=False, evict_first=True, **counting)
        return FlatLFU(capacity_bytes, remember_frequency=counting["remember_frequency"])


class FlatLFU:
    """O(1) LFU: one insertion-ordered bucket per frequency, the lowest non-empty one tracked.

    An object enters bucket f at the access that raised its count to f, so each bucket is in
    order of last access and its first entry is the least recently used of the least frequent.
    ``remember_frequency`` (the lifetime scope) keeps an evicted object's count, so it comes
    back with count + 1 instead of 1 (libCacheSim's LFU restarts at 1).
    """

    def __init__(self, capacity_bytes: int, remember_frequency: bool = False) -> None:
        self._evicted_counts: dict[int, int] | None = {} if remember_frequency else None
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._freq: dict[int, int] = {}
        self._size: dict[int, int] = {}
        self._buckets: dict[int, OrderedDict[int, None]] = {}
        self._min_freq = 0

    def process(self, keys: list, sizes_bytes, tokens: list | None = None,
                next_access: list | None = None) -> bytearray:
        n: cython.Py_ssize_t = len(keys)
        sizes_view: cython.longlong[:] = checked_sizes(keys, sizes_bytes)
        freq: dict = self._freq
        size_of: dict = self._size
        buckets: dict = self._buckets
        capacity: cython.longlong = self.capacity_bytes
        evicted_counts = self._evicted_counts
        size: cython.longlong
        f: cython.longlong
        i: cython.Py_ssize_t
        hits = bytearray(n)
        for i in range(n):
            key = keys[i]
            found = freq.get(key)
            if found is not None:
                hits[i] = 1
                f = found
                bucket = buckets[f]
                del bucket[key]
                if not bucket:
                    del buckets[f]
                    if self._min_freq == f:
                        self._min_freq = f + 1
                freq[key] = f + 1
                nxt = buckets.get(f + 1)
                if nxt is None:
                    nxt = buckets[f + 1] = OrderedDict()
                nxt[key] = None
                continue
            size = sizes_view[i]
            if size > capacity:
                continue
            while self.used_bytes + size > capacity:
                bucket = buckets[self._min_freq]
                victim = bucket.popitem(False)[0]
                if not bucket:
                    del buckets[self._min_freq]
                    self._min_freq = min(buckets) if buckets else 0
                f = freq.pop(victim)
                if evicted_counts is not None:
                    evicted_counts[victim] = f
                self.used_bytes -= size_of.pop(victim)
                self.evictions += 1
            f = 1 if evicted_counts is None else evicted_counts.pop(key, 0) + 1
            freq[key] = f
            size_of[key] = size
            self.used_bytes += size
            first = buckets.get(f)
            if first is None:
                first = buckets[f] = OrderedDict()
            first[key] = None
            self._min_freq = f if len(freq) == 1 else min(self._min_freq, f)
        return hits
