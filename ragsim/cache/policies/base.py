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

import cython
import numpy as np

from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, NodePolicy, check_frequency_scope


class FlatCache(Protocol):
    """One-tier object cache. ``process`` returns one byte per request: 1 if it hit.

    ``keys`` is a list of ints (dictionary keys); sizes, tokens, next accesses and times are
    aligned with it. Frequency caches counting over a window need ``times_s`` (seconds, never
    decreasing); the others do not take it.
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


@cython.cclass
class TreePolicy(NodePolicy):
    """Base class: frequency and recency are kept by the tree, policies derive ``value``.

    The per-node hooks (``on_access``, ``value_of``, ``on_enter_cache``) are inherited from
    ``ragsim.cache.tree.NodePolicy``, where they are documented. The built-in policies are
    compiled classes that override them in C (each with a .pxd); a policy written in plain
    Python subclasses this class and overrides them as Python methods.

    How retrievals are counted (``node.frequency``) is not a policy's choice: the tree applies
    one frequency scope to every policy (see ``ragsim.cache.tree.FREQUENCY_SCOPES``), so that
    comparing policies never compares counting rules.
    """

    name = "base"
    family = "base"  # what it is a variant of, for ``ragsim policies``
    description = ""  # one line: what it keeps
    algorithm1 = ""  # which parts of RAGCache's Algorithm 1 it has
    uses_clock = False  # greedy-dual policies raise a per-tier clock on eviction
    uses_frequency = False  # its value depends on node.frequency (the scope matters to it)
    needs_future = False  # offline bounds need next-use information
    tracks_cache_entry = False  # True if on_enter_cache does something (FIFO)
    needs_cost = False  # True if on_access uses the request's prefill cost (PGDSF)
    # False: on_access receives the request's prefill time per uncached token, T(a, b) / b.
    # True: the request's whole prefill time T(a, b) (PGDSF without the size term).
    cost_per_request = False

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
                   frequency_window_s: float | None = None) -> FlatCache:
        raise NotImplementedError(f"{self.name} has no flat mode")

    def config(self) -> dict:
        return {"name": self.name}


def flat_counting(frequency_scope: str, frequency_window_s: float | None) -> dict:
    """A flat cache's counting settings for a scope: keep an evicted object's count
    (lifetime), restart it at admission, or count the accesses in a window of time."""
    check_frequency_scope(frequency_scope, frequency_window_s)
    return {"remember_frequency": frequency_scope == "lifetime",
            "window_s": frequency_window_s if frequency_scope == "window" else None}
