"""The one small interface every replacement policy implements.

A policy turns what happened to a node (accessed, cached or not, at which estimated cost) into a
number, ``node.value``. The tree adds the tier's clock to get the priority and always evicts the
lowest priority among the leaves of a tier; ties go to the least recently accessed node. Policies
of the greedy-dual family (GDSF, PGDSF) also raise the tier's clock on eviction.

Each policy file also provides a *flat* cache (every document an independent object, one tier),
the mode in which ragsim is checked against libCacheSim.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ragsim.cache.tree import Node


class FlatCache(Protocol):
    """One-tier object cache. ``process`` returns one byte per request: 1 if it hit.

    ``keys`` is a list of ints (dictionary keys); sizes, tokens and next accesses are aligned
    with it.
    """

    capacity_bytes: int
    used_bytes: int
    evictions: int

    def process(
        self,
        keys: list[int],
        sizes_bytes,  # int64 array (or any sequence of ints)
        tokens: list[int] | None = None,
        next_access: list[int] | None = None,
    ) -> bytearray: ...


def checked_sizes(keys: list, sizes_bytes, *aligned) -> np.ndarray:
    """The sizes as a contiguous int64 array, after checking every aligned column's length."""
    sizes = np.ascontiguousarray(sizes_bytes, dtype=np.int64)
    for column in (sizes, *aligned):
        if column is not None and len(column) != len(keys):
            raise ValueError(f"flat cache inputs differ in length: {len(keys)} keys, "
                             f"{len(column)} values")
    return sizes


class TreePolicy:
    """Base class: frequency and recency are kept by the tree, policies derive ``value``."""

    name = "base"
    uses_clock = False  # greedy-dual policies raise a per-tier clock on eviction
    needs_future = False  # offline bounds need next-use information
    tracks_cache_entry = False  # True if on_enter_cache does something (FIFO)
    needs_cost = False  # True if on_access uses the request's prefill cost (PGDSF)
    # False: the count restarts when a node leaves the cache entirely (libCacheSim's LFU and
    # GDSF, Cherkasova's GDSF). True: it counts every retrieval since the system started, as
    # RAGCache defines PGDSF's Frequency; a GPU failure does not reset it either (the counts
    # live in the controller, not in GPU memory).
    frequency_survives_eviction = False

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        """Called once per retrieval of ``node`` (after frequency and recency were updated)."""
        raise NotImplementedError

    def on_enter_cache(self, node: Node, seq: int) -> None:
        """Called when a node goes from nowhere into a tier."""

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None) -> FlatCache:
        raise NotImplementedError(f"{self.name} has no flat mode")

    def config(self) -> dict:
        return {"name": self.name}
