"""How much any *fixed* cache contents could keep: the static frequency bound.

Caching a knowledge-tree node of ``s`` tokens that a trace retrieves ``f`` times saves
``(f - 1) * s`` tokens (its first retrieval computes it). Choosing fixed contents under a
capacity is then a knapsack whose value per token is ``f - 1``; its linear relaxation is solved
greedily: the most retrieved nodes first, the first one that does not fit taken in part. That
is an upper bound on every fixed choice of contents, prefix-closed or not (a parent is
retrieved at least as often as its child and sorts first on ties, so the greedy order never
takes a child before its parent). ``whole_nodes=True`` stops before that node instead: a
feasible prefix-closed choice, at most one node's value below the bound.

What it is a reference for. With independent requests from a fixed popularity and the
popularity known, keeping the most popular items is the best any demand policy can do in
expectation (Aho, Denning and Ullman's A0; here with sizes, up to the knapsack's rounding), so
on stationary synthetic traces (``--drift 0``) the bound says how much LFU or PGDSF leave on
the table, mostly to documents retrieved once that they must admit and to counts they learn as
they go.
It is *not* a ceiling on a finite trace (a policy that changes its contents can beat any fixed
contents: [A], [A], [B], [B] with room for one) nor on traffic whose topics move.
"""

from __future__ import annotations

import numpy as np

from ragsim.cache.policies.belady import tree_node_ids


def static_frequency_bound(doc_offsets: np.ndarray, doc_ids: np.ndarray,
                           doc_tokens: np.ndarray, capacity_tokens: float,
                           max_depth: int | None = None, whole_nodes: bool = False) -> float:
    """Token hit rate of the best fixed contents for a trace's requests (LP bound, or with
    ``whole_nodes`` the greedy feasible contents).

    The trace's CSR columns: request ``r`` retrieved ``doc_ids[doc_offsets[r]:doc_offsets[r+1]]``
    in rank order, of ``doc_tokens`` tokens each. A node is a prefix of a request's list (the
    knowledge tree's key, as Belady's ``tree_node_ids`` numbers them); only the first
    ``max_depth`` documents of a request are cacheable (None: all). Every retrieval of a kept
    node but its first hits."""
    if capacity_tokens < 0:
        raise ValueError("capacity_tokens must be >= 0")
    doc_tokens = np.asarray(doc_tokens, dtype=np.int64)
    total_tokens = int(doc_tokens.sum())
    if not total_tokens:
        return 0.0
    node_of = tree_node_ids(np.asarray(doc_offsets), np.asarray(doc_ids), max_depth)
    cacheable = node_of >= 0
    count = np.bincount(node_of[cacheable])
    size = np.zeros(len(count), dtype=np.int64)
    size[node_of[cacheable]] = doc_tokens[cacheable]  # a node's size is its document's
    # most retrieved first; ties in first-retrieval order, which puts a parent (numbered when
    # first retrieved, before any child) ahead of its children: deterministic, prefix-closed
    order = np.lexsort((np.arange(len(count)), -count))
    order = order[count[order] > 1]
    room = float(capacity_tokens)
    saved = 0.0
    for node in order.tolist():
        value_per_token = int(count[node]) - 1
        if size[node] <= room:
            saved += value_per_token * int(size[node])
            room -= int(size[node])
        else:
            if not whole_nodes:
                saved += value_per_token * room
            break
    return saved / total_tokens
