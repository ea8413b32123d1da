"""PGDSF: RAGCache's prefix-aware greedy-dual-size-frequency (Algorithm 1 of the paper).

Priority = Clock + Frequency x Cost/Size with one clock per tier, and a prefix-aware Cost/Size:
the average, over the m requests that computed the node (it was not cached for them), of each
request's prefill time per uncached token, Cost_i / NewSize_i = T(alpha_i, beta_i) / beta_i,
where T is the bilinear interpolation of an offline prefill profile. The tree estimates T once
per request and hands ``cost_per_token_s`` to every node the request computes.

Algorithm 1's listing accumulates T(alpha, beta) in ``TotalCost``; the formula it implements
divides each term by the request's uncached size (the paper's equation for Cost/Size). We follow
the equation: ``total_cost`` sums T/beta, and ``value = frequency x total_cost / num_computed``.

Frequency is "the total retrievals of the document in a time window, reset to zero when the
system starts or the cache is cleared": unlike classic GDSF and LFU, whose count restarts when
an object is evicted, a node that leaves the cache and comes back keeps its count (the tree
keeps it on the ghost node). Without that, a popular document evicted once in a burst comes
back as if new and competes with one-off documents; with it, the GDS clock still ages counts
that stop growing. The window is the whole run (there is no cache-clear event in a run).
"""

from __future__ import annotations

from collections.abc import Callable

from ragsim.cache.policies.base import TreePolicy
from ragsim.cache.policies.gdsf import FlatGreedyDual
from ragsim.cache.tree import Node


class PGDSF(TreePolicy):
    name = "pgdsf"
    uses_clock = True
    needs_cost = True
    frequency_survives_eviction = True

    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        # UPDATE_NODE_IN_GPU: frequency was already incremented by the tree.
        if not is_cached:
            node.total_cost += cost_per_token_s
            node.num_computed += 1
        avg_cost = node.total_cost / node.num_computed if node.num_computed else 0.0
        node.value = avg_cost * node.frequency

    def flat_cache(self, capacity_bytes: int,
                   cost_per_token_s: Callable[[int, int], float] | None = None
                   ) -> FlatGreedyDual:
        """Flat PGDSF: no prefixes, so an object's cost is computing it alone, T(0, n)/n;
        counts survive eviction as in the tree."""
        if cost_per_token_s is None:
            raise ValueError("flat PGDSF needs a prefill-cost function")

        def unit_cost(size_bytes: int, tokens: int) -> float:
            # Priority = L + freq x (T/tokens); FlatGreedyDual divides the unit by size.
            return cost_per_token_s(0, tokens) * size_bytes

        return FlatGreedyDual(capacity_bytes, unit_cost,
                              remember_frequency=self.frequency_survives_eviction)
