"""Cache-aware reordering (RAGCache section 5.3): which waiting request to prefill next.

``OrderPriority = CachedLength / ComputationLength``: among waiting requests, serve first the one
whose context is most cached relative to what it must compute (Figure 10's two insights: prefer
longer cached prefixes, prefer shorter recomputation). A request's cached length changes as the
cache does, so the priority is recomputed at every decision, never stored.

Starvation is bounded by a window counted in **scheduling decisions** (one decision = one
request taken from the pool): a request that has waited ``window`` decisions is served before
any other, oldest first. Decisions, not seconds, because the bound then holds at any load and
for any time scale, and a run is reproducible without reference to wall or simulated clocks.

With ``reorder=False`` the pool is plain FCFS. The pool is engine-agnostic: the driver hands it
the function that tells a request's cached and computation lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")
LengthsOf = Callable[[object], tuple[int, int]]  # item -> (cached tokens, tokens to compute)

DEFAULT_WINDOW_DECISIONS = 32
DEFAULT_SCAN_LIMIT = 256


def order_priority(cached_tokens: int, computation_tokens: int) -> float:
    """The paper's ``CachedLength / ComputationLength`` (a fully cached request: infinite)."""
    if computation_tokens <= 0:
        return float("inf")
    return cached_tokens / computation_tokens


class RequestPool(Generic[Item]):
    """Waiting requests keyed by a hashable key, in arrival (insertion) order.

    ``scan_limit`` bounds how many of the oldest waiting requests a decision looks at, so one
    decision costs O(scan_limit) prefix lookups even when thousands wait at saturation.
    """

    def __init__(self, *, reorder: bool, window_decisions: int = DEFAULT_WINDOW_DECISIONS,
                 scan_limit: int = DEFAULT_SCAN_LIMIT) -> None:
        if window_decisions < 1:
            raise ValueError("window_decisions must be >= 1")
        if scan_limit < 1:
            raise ValueError("scan_limit must be >= 1")
        self.reorder = reorder
        self.window_decisions = window_decisions
        self.scan_limit = scan_limit
        self.decisions = 0
        self.overdue_served = 0  # decisions forced by the window
        self.reordered = 0  # decisions that did not take the oldest request
        self._entries: dict[Hashable, tuple[int, Item]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: Hashable, item: Item) -> None:
        if key in self._entries:
            raise KeyError(f"{key!r} is already waiting")
        self._entries[key] = (self.decisions, item)

    def discard(self, key: Hashable) -> Item | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def peek(self, lengths_of: LengthsOf | None = None,
             skip: Callable[[Item], bool] | None = None) -> tuple[Hashable, Item] | None:
        """The request the next decision would take (None if none is eligible).

        ``skip`` excludes requests the caller cannot serve now (e.g. already tried this round).
        """
        best_key = best_item = None
        best_priority = -1.0
        for scanned, (key, (entered, item)) in enumerate(self._entries.items()):
            if skip is not None and skip(item):
                continue
            if not self.reorder or self.decisions - entered >= self.window_decisions:
                return key, item  # FCFS, or the oldest overdue request
            if scanned >= self.scan_limit:
                break
            priority = order_priority(*lengths_of(item))
            if priority > best_priority:  # ties keep the older request
                best_key, best_item, best_priority = key, item, priority
        return None if best_key is None else (best_key, best_item)

    def take(self, key: Hashable) -> Item:
        """Remove ``key`` as the outcome of one scheduling decision."""
        oldest = next(iter(self._entries))
        entered, item = self._entries.pop(key)
        if key != oldest:
            self.reordered += 1
        if self.reorder and self.decisions - entered >= self.window_decisions:
            self.overdue_served += 1
        self.decisions += 1
        return item
