"""Cache-aware reordering (RAGCache section 5.3): which waiting request to prefill next.

``OrderPriority = CachedLength / ComputationLength``: among waiting requests, serve first the one
whose context is most cached relative to what it must compute (Figure 10's two insights: prefer
longer cached prefixes, prefer shorter recomputation). A request's cached length changes as the
cache does, so the priority is recomputed at every decision, never stored.

**The window is a time bound**, as in the paper ("every request is served no later than the
window after it arrives"), in seconds of the driver's clock: the pool is given ``now_s`` and
keeps no clock of its own, so it stays engine-agnostic. (It counted scheduling decisions
before; a count means a different time at every load, and at saturation ~32 decisions are a
few seconds while requests wait longer than that, so every decision was forced.)

**When does the window start?** The paper's literal rule starts it at arrival. That rule cannot
hold once requests queue for longer than the window (FCFS cannot keep it either), and it then
forces *every* decision to the oldest request: the pool becomes FCFS exactly where reordering is
meant to help (measured: ``benchmarks/reorder_ablation.py``). So by default (``start="head"``)
a request's window starts when it arrives *or*, if older requests are still waiting then, when
the last of them has left: reordering may pass over the oldest waiting request for at most the
window. Below saturation a request that arrives to an empty queue gets exactly the paper's
bound; at saturation the pool still reorders among the rest and serves the oldest request at
least once per window, so nothing starves (a request's wait is bounded by its position in the
queue times the window). ``start="arrival"`` is the literal rule, kept for the ablation.

With ``reorder=False`` the pool is plain FCFS. The driver hands the pool the function that tells
a request's cached and computation lengths.

**Orders** (``order``): what a decision maximises over the scanned requests, each under the same
window, so that a comparison of orders measures the order and nothing else:

* ``cache-aware``: the paper's ``OrderPriority`` (cached / to compute);
* ``sjf``: shortest job first, the fewest tokens to compute (the uncached prompt) first, a
  baseline that prefers short recomputation alone (Figure 10's second insight without the first);
* ``lpm``: longest prefix match, the most cached tokens first (SGLang's ``lpm`` schedule
  policy: ``python/sglang/srt/managers/router/scheduler.py`` sorts the queue by ``-len(
  prefix_indices)``), the first insight alone;
* ``fcfs``: arrival order (what ``reorder=False`` is).

Ties keep the older request under every order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")
LengthsOf = Callable[[object], tuple[int, int]]  # item -> (cached tokens, tokens to compute)

# The paper gives no value. One second is the order of one prefill batch on the paper's A10G
# (8 requests of ~1,500 tokens: ~1 s) and the TTFT the paper's Figure 16 holds RAGCache under
# (1.4 s): a request is passed over for at most about one batch.
DEFAULT_WINDOW_S = 1.0
DEFAULT_SCAN_LIMIT = 256
WINDOW_STARTS = ("head", "arrival")
ORDERS = ("fcfs", "cache-aware", "sjf", "lpm")


def order_priority(cached_tokens: int, computation_tokens: int) -> float:
    """The paper's ``CachedLength / ComputationLength`` (a fully cached request: infinite)."""
    if computation_tokens <= 0:
        return float("inf")
    return cached_tokens / computation_tokens


def shortest_job_priority(cached_tokens: int, computation_tokens: int) -> float:
    """SJF: the fewer tokens to compute, the higher (the cached length plays no part)."""
    return -float(computation_tokens)


def longest_prefix_priority(cached_tokens: int, computation_tokens: int) -> float:
    """LPM: the more tokens cached, the higher (the length to compute plays no part)."""
    return float(cached_tokens)


# order -> priority of (cached, to compute); higher is served first
PRIORITY_OF_ORDER = {"cache-aware": order_priority, "sjf": shortest_job_priority,
                     "lpm": longest_prefix_priority}


class RequestPool(Generic[Item]):
    """Waiting requests keyed by a hashable key, in arrival (insertion) order.

    ``scan_limit`` bounds how many of the oldest waiting requests a decision looks at, so one
    decision costs O(scan_limit) prefix lookups even when thousands wait at saturation.
    """

    def __init__(self, *, reorder: bool, window_s: float = DEFAULT_WINDOW_S,
                 start: str = "head", scan_limit: int = DEFAULT_SCAN_LIMIT,
                 order: str | None = None) -> None:
        if not window_s >= 0:
            raise ValueError("window_s must be >= 0")
        if start not in WINDOW_STARTS:
            raise ValueError(f"start must be one of {', '.join(WINDOW_STARTS)}")
        if scan_limit < 1:
            raise ValueError("scan_limit must be >= 1")
        if order is None:  # reorder alone: the paper's order or FCFS
            order = "cache-aware" if reorder else "fcfs"
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}")
        if reorder != (order != "fcfs"):
            raise ValueError(f"order {order} with reorder={reorder}: reordering is every "
                             "order but fcfs")
        self.reorder = reorder
        self.order = order
        self._priority = PRIORITY_OF_ORDER.get(order)
        self.window_s = window_s
        self.start = start
        self.scan_limit = scan_limit
        self.decisions = 0
        self.overdue_served = 0  # decisions forced by the window
        self.reordered = 0  # decisions that did not take the oldest request
        self._entries: dict[Hashable, tuple[float, Item]] = {}
        self._oldest: Hashable | None = None  # the oldest waiting request, as last seen
        self._oldest_since_s = 0.0  # when it became the oldest

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: Hashable, item: Item, now_s: float) -> None:
        if key in self._entries:
            raise KeyError(f"{key!r} is already waiting")
        self._entries[key] = (now_s, item)
        if len(self._entries) == 1:
            self._oldest, self._oldest_since_s = key, now_s

    def discard(self, key: Hashable, now_s: float) -> Item | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._head_left(key, now_s)
        return entry[1]

    def _head_left(self, key: Hashable, now_s: float) -> None:
        if key == self._oldest:
            self._oldest = next(iter(self._entries), None)
            self._oldest_since_s = now_s

    def window_started_s(self, key: Hashable) -> float:
        """When ``key``'s window started (see the module's docstring)."""
        entered = self._entries[key][0]
        if self.start == "head" and key == self._oldest:
            return max(entered, self._oldest_since_s)
        return entered

    def overdue(self, key: Hashable, now_s: float) -> bool:
        """``key`` has waited its window: the next decision must take it. Only the oldest
        request can be (with ``start="head"`` the others' windows have not started)."""
        if self.start == "head" and key != self._oldest:
            return False
        return now_s - self.window_started_s(key) >= self.window_s

    def peek(self, lengths_of: LengthsOf | None = None, now_s: float = 0.0,
             skip: Callable[[Item], bool] | None = None) -> tuple[Hashable, Item] | None:
        """The request the next decision would take (None if none is eligible).

        ``skip`` excludes requests the caller cannot serve now (e.g. already tried this round).
        """
        entries = self._entries
        if len(entries) == 1 and skip is None:  # one request waits: it is the decision
            key, (_, item) = next(iter(entries.items()))
            return key, item
        best_key = best_item = None
        best_priority = -float("inf")
        priority_of = self._priority
        first = True
        for scanned, (key, (_, item)) in enumerate(entries.items()):
            if skip is not None and skip(item):
                continue
            if not self.reorder or (first and self.overdue(key, now_s)):
                return key, item  # FCFS, or the oldest request, overdue
            first = False
            if scanned >= self.scan_limit:
                break
            priority = priority_of(*lengths_of(item))
            if priority > best_priority:  # ties keep the older request
                best_key, best_item, best_priority = key, item, priority
        return None if best_key is None else (best_key, best_item)

    def take(self, key: Hashable, now_s: float) -> Item:
        """Remove ``key`` as the outcome of one scheduling decision at ``now_s``."""
        oldest = next(iter(self._entries))
        if key != oldest:
            self.reordered += 1
        if self.reorder and key == oldest and self.overdue(key, now_s):
            self.overdue_served += 1
        _, item = self._entries.pop(key)
        self.decisions += 1
        self._head_left(key, now_s)
        return item
