"""GDSF (greedy-dual-size-frequency): priority = clock + frequency x cost / size.

Classic GDSF has no notion of prefixes: its cost is a constant, so cost/size favours small
objects. The constant is 1e6 per byte, libCacheSim's scaling, so that in flat mode priorities
round exactly as libCacheSim's do and ties break the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush

import cython

from ragsim.cache.policies.base import TreePolicy, checked_sizes, flat_remembers_counts
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, Node

GDSF_CONSTANT_COST = 1.0e6


class GDSF(TreePolicy):
    name = "gdsf"
    family = "greedy-dual"
    description = "clock + frequency x constant cost / size: small, often retrieved nodes stay"
    algorithm1 = "Clock, Frequency, Size; a constant Cost (no profile, no prefix awareness)"
    uses_clock = True
    uses_frequency = True

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = self.value_of(node)

    def value_of(self, node: Node) -> float:
        return node.frequency * GDSF_CONSTANT_COST / node.size_bytes if node.size_bytes \
            else float("inf")

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE) -> FlatGreedyDual:
        return FlatGreedyDual(capacity_bytes,
                              remember_frequency=flat_remembers_counts(frequency_scope))


class FlatGreedyDual:
    """Object greedy-dual cache with libCacheSim's GDSF semantics.

    Priority = L + freq x unit_cost / size; L becomes the priority of each evicted object; the
    frequency restarts at 1 when an object is re-admitted (the admission scope) unless
    ``remember_frequency`` (the lifetime scope);
    equal priorities evict the least recently accessed first; a missed object is inserted
    before the evictions that make room for it, so it competes with the residents (libCacheSim
    does the same).
    ``unit_cost(size_bytes, tokens)`` is the cost term over which size is divided: by default
    the GDSF constant 1e6; for PGDSF, the prefill time per token of computing the object alone
    times its size. ``remember_frequency`` keeps an evicted object's count, so that it comes
    back with count + 1 instead of 1.
    """

    def __init__(self, capacity_bytes: int,
                 unit_cost: Callable[[int, int], float] | None = None,
                 remember_frequency: bool = False) -> None:
        self.capacity_bytes = capacity_bytes
        self._evicted_counts: dict[int, int] | None = {} if remember_frequency else None
        self.used_bytes = 0
        self.evictions = 0
        self.clock = 0.0
        self._unit_cost = unit_cost
        self._entries: dict[int, list] = {}  # key -> [priority, seq, freq, size, unit]
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0

    def process(self, keys: list, sizes_bytes, tokens: list | None = None,
                next_access: list | None = None) -> bytearray:
        n: cython.Py_ssize_t = len(keys)
        sizes_view: cython.longlong[:] = checked_sizes(keys, sizes_bytes, tokens)
        entries: dict = self._entries
        heap: list = self._heap
        capacity: cython.longlong = self.capacity_bytes
        unit_cost = self._unit_cost
        evicted_counts = self._evicted_counts
        count: cython.longlong
        token_counts = tokens if tokens is not None else sizes_bytes
        seq: cython.longlong = self._seq
        size: cython.longlong
        priority: cython.double
        unit: cython.double
        i: cython.Py_ssize_t
        entry: list
        current: list
        hits = bytearray(n)
        for i in range(n):
            key = keys[i]
            seq += 1
            found = entries.get(key)
            if found is not None:
                hits[i] = 1
                entry = found
                entry[2] += 1
                entry[0] = self.clock + entry[2] * entry[4] / entry[3]
                entry[1] = seq
                heappush(heap, (entry[0], seq, key))
                continue
            size = sizes_view[i]
            if size > capacity:
                continue
            # libCacheSim inserts first and then evicts, so a newcomer whose priority is the
            # lowest is evicted at once (and its priority sets the clock).
            unit = GDSF_CONSTANT_COST if unit_cost is None else unit_cost(size, token_counts[i])
            count = 1 if evicted_counts is None else evicted_counts.pop(key, 0) + 1
            priority = self.clock + count * unit / size
            entries[key] = [priority, seq, count, size, unit]
            self.used_bytes += size
            heappush(heap, (priority, seq, key))
            while self.used_bytes > capacity:
                popped = heappop(heap)
                victim = popped[2]
                found = entries.get(victim)
                if found is None:
                    continue
                current = found
                if current[1] != popped[1]:
                    continue  # stale entry left by a later access
                del entries[victim]
                if evicted_counts is not None:
                    evicted_counts[victim] = current[2]
                self.clock = popped[0]
                self.used_bytes -= current[3]
                self.evictions += 1
            if len(heap) > 4 * len(entries) + 4096:
                self._heap = heap = [(e[0], e[1], k) for k, e in entries.items()]
                heapify(heap)
        self._seq = seq
        return hits
