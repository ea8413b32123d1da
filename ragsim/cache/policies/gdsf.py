"""GDSF (greedy-dual-size-frequency): priority = clock + frequency x cost / size.

Classic GDSF has no notion of prefixes: its cost is a constant, so cost/size favours small
objects. The constant is 1e6 per byte, libCacheSim's scaling, so that in flat mode priorities
round exactly as libCacheSim's do and ties break the same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from ragsim.cache.node import Node
from ragsim.cache.policies.base import TreePolicy

GDSF_CONSTANT_COST = 1.0e6


class GDSF(TreePolicy):
    name = "gdsf"
    uses_clock = True

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = node.frequency * GDSF_CONSTANT_COST / node.size_bytes if node.size_bytes \
            else float("inf")

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None) -> FlatGreedyDual:
        return FlatGreedyDual(capacity_bytes)


class FlatGreedyDual:
    """Object greedy-dual cache with libCacheSim's GDSF semantics.

    Priority = L + freq x unit_cost / size; L becomes the priority of each evicted object; the
    frequency restarts at 1 when an object is re-admitted; equal priorities evict the least
    recently accessed first; a missed object is inserted before the evictions that make room
    for it, so it competes with the residents (libCacheSim does the same). ``unit_cost(size_bytes, tokens)`` returns cost per byte; by default
    the GDSF constant 1e6, for PGDSF the prefill time per token of computing the object alone.
    """

    def __init__(self, capacity_bytes: int,
                 unit_cost: Callable[[int, int], float] | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self.clock = 0.0
        self._unit_cost = unit_cost
        self._entries: dict[int, list] = {}  # key -> [priority, seq, freq, size, unit]
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0

    def process(self, keys: Sequence[int], sizes_bytes: Sequence[int],
                tokens: Sequence[int] | None = None,
                next_access: Sequence[int] | None = None) -> list[bool]:
        entries, heap = self._entries, self._heap
        push, pop = heapq.heappush, heapq.heappop
        capacity = self.capacity_bytes
        unit_cost = self._unit_cost
        token_counts = tokens if tokens is not None else sizes_bytes
        seq = self._seq
        hits = []
        record = hits.append
        for key, size, n_tokens in zip(keys, sizes_bytes, token_counts, strict=True):
            seq += 1
            entry = entries.get(key)
            if entry is not None:
                record(True)
                entry[2] += 1
                entry[0] = self.clock + entry[2] * entry[4] / entry[3]
                entry[1] = seq
                push(heap, (entry[0], seq, key))
                continue
            record(False)
            if size > capacity:
                continue
            # libCacheSim inserts first and then evicts, so a newcomer whose priority is the
            # lowest is evicted at once (and its priority sets the clock).
            unit = GDSF_CONSTANT_COST if unit_cost is None else unit_cost(size, n_tokens)
            priority = self.clock + 1 * unit / size
            entries[key] = [priority, seq, 1, size, unit]
            self.used_bytes += size
            push(heap, (priority, seq, key))
            while self.used_bytes > capacity:
                priority, entry_seq, victim = pop(heap)
                current = entries.get(victim)
                if current is None or current[1] != entry_seq:
                    continue  # stale entry left by a later access
                del entries[victim]
                self.clock = priority
                self.used_bytes -= current[3]
                self.evictions += 1
            if len(heap) > 4 * len(entries) + 4096:
                self._heap = heap = [(e[0], e[1], k) for k, e in entries.items()]
                heapq.heapify(heap)
        self._seq = seq
        return hits
