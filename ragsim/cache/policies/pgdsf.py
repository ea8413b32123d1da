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
system starts or the cache is cleared". How the count is kept is the tree's frequency scope,
the same for every policy (lifetime by default: the window is the whole run, there being no
cache-clear event in a run); the GDS clock still ages counts that stop growing.

Two ablations take one term out of Algorithm 1 each, everything else unchanged:

* ``pgdsf-const-cost``: Cost/Size is a constant per token (1.0; any constant makes the same
  choices, since every priority and the clock scale with it). Value = Frequency x 1.0: LFU
  with greedy-dual aging (LFU-DA) on the knowledge tree. It asks what the prefix-aware cost
  adds.
* ``pgdsf-no-size``: the size term is taken out of Cost/Size. Value = Frequency x (1/m) sum_i
  T(alpha_i, beta_i): the mean prefill time of the m requests that computed the node, not
  divided by their uncached tokens. This is Algorithm 1's listing as printed (TotalCost
  accumulates T(alpha, beta)); the paper's equation divides each term by NewSize_i = beta_i.
"""

from __future__ import annotations

from collections.abc import Callable

import cython

from ragsim.cache.policies.base import TreePolicy, flat_counting
from ragsim.cache.policies.gdsf import FlatGreedyDual
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, Node

CONST_COST_PER_TOKEN = 1.0  # pgdsf-const-cost's Cost/Size; its scale changes no decision


@cython.cclass
class PGDSF(TreePolicy):
    name = "pgdsf"
    family = "greedy-dual"
    description = ("clock + frequency x prefix-aware cost per token: mean T(a,b)/b over the "
                   "requests that computed the node")
    algorithm1 = "all of it: Clock, Frequency, prefix-aware Cost/Size from the profile"
    uses_clock = True
    uses_frequency = True
    needs_cost = True

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        # UPDATE_NODE_IN_GPU: frequency was already incremented by the tree.
        if not is_cached:
            node.total_cost += cost_per_token_s
            node.num_computed += 1
        node.value = self.value_of(node)

    @cython.annotation_typing(False)
    def value_of(self, node: Node) -> float:
        avg_cost = node.total_cost / node.num_computed if node.num_computed else 0.0
        return avg_cost * node.frequency

    def flat_cache(self, capacity_bytes: int,
                   cost_per_token_s: Callable[[int, int], float] | None = None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
                   frequency_window_s: float | None = None) -> FlatGreedyDual:
        """Flat PGDSF: no prefixes, so an object's cost is computing it alone: T(0, n)/n per
        token, or T(0, n) for the ablation without the size term (``cost_per_request``)."""
        if cost_per_token_s is None:
            raise ValueError(f"flat {self.name} needs a prefill-cost function")
        per_request = bool(self.cost_per_request)

        def unit_cost(size_bytes: int, tokens: int) -> float:
            # Priority = L + freq x cost; FlatGreedyDual divides the unit by size, so multiply
            # it back in
            cost = cost_per_token_s(0, tokens)
            return (cost * tokens if per_request else cost) * size_bytes

        return FlatGreedyDual(capacity_bytes, unit_cost,
                              **flat_counting(frequency_scope, frequency_window_s))


@cython.cclass
class PGDSFConstCost(PGDSF):
    """PGDSF with a constant cost per token: no profile, no prefix awareness."""

    name = "pgdsf-const-cost"
    family = "pgdsf ablation"
    description = "PGDSF with a constant cost per token (LFU with greedy-dual aging)"
    algorithm1 = "Clock, Frequency; Cost/Size a constant (no profile, no prefix awareness)"
    needs_cost = False

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        PGDSF.on_access(self, node, is_cached, CONST_COST_PER_TOKEN, request_index, depth)

    def flat_cache(self, capacity_bytes: int, cost_per_token_s=None,
                   frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
                   frequency_window_s: float | None = None) -> FlatGreedyDual:
        return FlatGreedyDual(capacity_bytes,
                              lambda size_bytes, tokens: CONST_COST_PER_TOKEN * size_bytes,
                              **flat_counting(frequency_scope, frequency_window_s))


@cython.cclass
class PGDSFNoSize(PGDSF):
    """PGDSF without the size term: the mean prefill time of the requests that computed the
    node, not divided by their uncached tokens (Algorithm 1's listing as printed)."""

    name = "pgdsf-no-size"
    family = "pgdsf ablation"
    description = ("PGDSF without the size term: clock + frequency x mean prefill time "
                   "T(a,b) of the requests that computed the node")
    algorithm1 = "Clock, Frequency, prefix-aware Cost from the profile; no division by Size"
    cost_per_request = True
