"""GDSF (greedy-dual-size-frequency): priority = clock + frequency x cost / size.

Classic GDSF has no notion of prefixes: its cost is a constant, so cost/size favours small
objects. The constant is 1e6 per byte, libCacheSim's scaling, so that in flat mode priorities
round exactly as libCacheSim's do and ties break the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heapify, heappop, heappush

import cython

from ragsim.cache.policies.base import TreePolicy, checked_sizes, flat_counting
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, Node

GDSF_CONSTANT_COST = 1.0e6


@cython.cclass
class GDSF(TreePolicy):
    name = "gdsf"
    family = "greedy-dual"
    description = "clock + frequency x constant cost / size: small, often retrieved nodes stay"
    algorithm1 = "Clock, Frequency, Size; a constant Cost (no profile, no prefix awareness)"
    uses_clock = True
    uses_frequency = True

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        node.value = self.value_of(node)

    @cython.annotation_typing(False)
    def value_of(self, node: Node) -> float:
        return node.frequency * GDSF_CONSTANT_COST / node.size_bytes if node.size_bytes \
            else float("inf")

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
                   frequency_window_s: float | None = None) -> FlatGreedyDual:
        return FlatGreedyDual(capacity_bytes,
                              **flat_counting(frequency_scope, frequency_window_s))


class FlatGreedyDual:
    """Object greedy-dual cache with libCacheSim's GDSF semantics.

    Priority = L + freq x unit_cost / size; L becomes the priority of each evicted object; the
    frequency restarts at 1 when an object is re-admitted (the admission scope) unless
    ``remember_frequency`` (the lifetime scope) or ``window_s`` (the window scope: the count is
    the object's accesses in the last ``window_s`` seconds of ``times_s``, and a cached
    object's priority follows its count down as accesses leave the window, as in the tree);
    equal priorities evict the least recently accessed first; a missed object is inserted
    before the evictions that make room for it, so it competes with the residents (libCacheSim
    does the same), unless ``evict_first`` (room is made among the residents, then the object
    is admitted, as the knowledge tree does). ``aging=False`` leaves L at 0: priority = value.
    ``unit_cost(size_bytes, tokens)`` is the cost term over which size is divided: by default
    the GDSF constant 1e6; for PGDSF, the prefill time per token of computing the object alone
    times its size. ``remember_frequency`` keeps an evicted object's count, so that it comes
    back with count + 1 instead of 1.
    """

    def __init__(self, capacity_bytes: int,
                 unit_cost: Callable[[int, int], float] | None = None,
                 remember_frequency: bool = False, *, window_s: float | None = None,
                 aging: bool = True, evict_first: bool = False) -> None:
        if window_s is not None and not window_s > 0:
            raise ValueError(f"the frequency window must be > 0 seconds, got {window_s!r}")
        self.capacity_bytes = capacity_bytes
        self._evicted_counts: dict[int, int] | None = {} if remember_frequency else None
        self._window_s = window_s
        self._window_counts: dict[int, int] = {}  # window scope: accesses in the window
        self._retrievals: deque = deque()  # window scope: (time, key), oldest first
        self._now_s = -float("inf")
        self._aging = aging
        self._evict_first = evict_first
        self.used_bytes = 0
        self.evictions = 0
        self.clock = 0.0
        self._unit_cost = unit_cost
        self._entries: dict[int, list] = {}  # key -> [priority, seq, freq, size, unit]
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0

    def _expire(self, now_s: float) -> None:
        """Window scope: forget accesses that left the window; cached objects' priorities
        drop by their value's drop (priority - old value + new value)."""
        if now_s < self._now_s:
            raise ValueError(f"access times must not decrease: {now_s} after {self._now_s}")
        self._now_s = now_s
        cutoff: cython.double = now_s - self._window_s
        retrievals = self._retrievals
        counts: dict = self._window_counts
        entries: dict = self._entries
        heap: list = self._heap
        entry: list
        old: cython.double
        new: cython.double
        while retrievals and retrievals[0][0] <= cutoff:
            key = retrievals.popleft()[1]
            count = counts[key] - 1
            if count:
                counts[key] = count
            else:
                del counts[key]
            found = entries.get(key)
            if found is None:
                continue
            entry = found
            old = entry[2] * entry[4] / entry[3]
            entry[2] = count
            new = count * entry[4] / entry[3]
            if new != old:
                entry[0] = entry[0] - old + new
                heappush(heap, (entry[0], entry[1], key))

    def _evict_one(self) -> cython.bint:
        """Evict the lowest-priority object (stale heap entries skipped); False if none."""
        heap: list = self._heap
        entries: dict = self._entries
        current: list
        while heap:
            popped = heappop(heap)
            victim = popped[2]
            found = entries.get(victim)
            if found is None:
                continue
            current = found
            if current[1] != popped[1] or current[0] != popped[0]:
                continue  # stale: a later access or a window expiry moved it
            del entries[victim]
            if self._evicted_counts is not None:
                self._evicted_counts[victim] = current[2]
            if self._aging:
                self.clock = popped[0]
            self.used_bytes -= current[3]
            self.evictions += 1
            return True
        return False

    def process(self, keys: list, sizes_bytes, tokens: list | None = None,
                next_access: list | None = None, times_s: list | None = None) -> bytearray:
        n: cython.Py_ssize_t = len(keys)
        windowed: cython.bint = self._window_s is not None
        if windowed and times_s is None:
            raise ValueError("the window frequency scope needs each access's time (times_s)")
        sizes_view: cython.longlong[:] = checked_sizes(keys, sizes_bytes, tokens,
                                                        times_s if windowed else None)
        entries: dict = self._entries
        capacity: cython.longlong = self.capacity_bytes
        unit_cost = self._unit_cost
        evicted_counts = self._evicted_counts
        window_counts: dict = self._window_counts
        retrievals = self._retrievals
        evict_first: cython.bint = self._evict_first
        count: cython.longlong
        token_counts = tokens if tokens is not None else sizes_bytes
        seq: cython.longlong = self._seq
        size: cython.longlong
        priority: cython.double
        unit: cython.double
        i: cython.Py_ssize_t
        entry: list
        hits = bytearray(n)
        for i in range(n):
            key = keys[i]
            if windowed:
                self._expire(times_s[i])
                window_counts[key] = window_counts.get(key, 0) + 1
                retrievals.append((times_s[i], key))
            seq += 1
            found = entries.get(key)
            if found is not None:
                hits[i] = 1
                entry = found
                entry[2] = window_counts[key] if windowed else entry[2] + 1
                entry[0] = self.clock + entry[2] * entry[4] / entry[3]
                entry[1] = seq
                heappush(self._heap, (entry[0], seq, key))
                continue
            size = sizes_view[i]
            if size > capacity:
                continue
            unit = GDSF_CONSTANT_COST if unit_cost is None else unit_cost(size, token_counts[i])
            if windowed:
                count = window_counts[key]
            else:
                count = 1 if evicted_counts is None else evicted_counts.pop(key, 0) + 1
            if evict_first:
                while self.used_bytes + size > capacity and self._evict_one():
                    pass
            # libCacheSim inserts first and then evicts, so a newcomer whose priority is the
            # lowest is evicted at once (and its priority sets the clock).
            priority = self.clock + count * unit / size
            entries[key] = [priority, seq, count, size, unit]
            self.used_bytes += size
            heappush(self._heap, (priority, seq, key))
            while self.used_bytes > capacity:
                self._evict_one()
            if len(self._heap) > 4 * len(entries) + 4096:
                self._heap = [(e[0], e[1], k) for k, e in entries.items()]
                heapify(self._heap)
        self._seq = seq
        return hits
