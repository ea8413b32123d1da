"""A knowledge-tree node: one document's KV at one position (its prefix path)."""

from __future__ import annotations

from enum import IntEnum


class Tier(IntEnum):
    """Where a node's KV lives. A GPU node may also keep a host copy (swap out only once)."""

    NONE = 0
    HOST = 1
    GPU = 2


class Node:
    """Tree node. ``__slots__`` because a long replay holds millions of them.

    Fields fall in three groups: structure (key, parent, children, depth, sizes); residency
    (``in_gpu``, ``host_copy``, counts of children resident, pins); and policy metadata
    (frequency, cost statistics, ``value`` and the per-tier priorities derived from it). A node
    that left the cache stays in the tree as a *ghost* (tier NONE) so that PGDSF keeps its cost
    statistics over the m requests that computed it.
    """

    __slots__ = (
        "cached_children",
        "children",
        "depth",
        "frequency",
        "gpu_children",
        "host_copy",
        "in_gpu",
        "key",
        "last_access",
        "num_computed",
        "parent",
        "pins",
        "priority_gpu",
        "priority_host",
        "size_bytes",
        "stamp",
        "tokens",
        "total_cost",
        "value",
    )

    def __init__(self, key: int, parent: Node | None, tokens: int, size_bytes: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] | None = None
        self.depth = 0 if parent is None else parent.depth + 1
        self.tokens = tokens
        self.size_bytes = size_bytes
        self.in_gpu = False
        self.host_copy = False
        self.gpu_children = 0
        self.cached_children = 0
        self.pins = 0
        self.frequency = 0
        self.total_cost = 0.0
        self.num_computed = 0
        self.value = 0.0
        self.last_access = 0
        self.priority_gpu = 0.0
        self.priority_host = 0.0
        self.stamp = 0

    @property
    def tier(self) -> Tier:
        if self.in_gpu:
            return Tier.GPU
        if self.host_copy:
            return Tier.HOST
        return Tier.NONE

    @property
    def cached(self) -> bool:
        return self.in_gpu or self.host_copy

    @property
    def avg_cost_per_token_s(self) -> float:
        return self.total_cost / self.num_computed if self.num_computed else 0.0

    def path_keys(self) -> list[int]:
        keys = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return keys[::-1]

    def __repr__(self) -> str:
        return (f"Node({self.path_keys()}, {self.tier.name}, tokens={self.tokens}, "
                f"freq={self.frequency}, value={self.value:.6g})")
