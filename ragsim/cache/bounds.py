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
on the stationary synthetic traces the bound says how much LFU or PGDSF leave on the table,
mostly to documents retrieved once that they must admit and to counts they learn as they go.
It is *not* a ceiling on a finite trace (a policy that changes its contents can beat any fixed
contents: [A], [A], [B], [B] with room for one) nor on traffic whose topics move.
"""

from __future__ import annotations

from collections.abc import Sequence


def static_frequency_bound(requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                           capacity_tokens: float, max_depth: int | None = None,
                           whole_nodes: bool = False) -> float:
    """Token hit rate of the best fixed contents for ``requests`` (LP bound, or with
    ``whole_nodes`` the greedy feasible contents).

    ``requests``: (document ids in rank order, their token counts) per request, in arrival
    order. A node is a prefix of a request's document list (the knowledge tree's key); only
    the first ``max_depth`` documents of a request are cacheable (None: all). Every retrieval
    of a kept node but its first hits."""
    if capacity_tokens < 0:
        raise ValueError("capacity_tokens must be >= 0")
    count: dict[tuple[int, ...], int] = {}
    size: dict[tuple[int, ...], int] = {}
    total_tokens = 0
    for docs, tokens in requests:
        total_tokens += sum(tokens)
        depth = len(docs) if max_depth is None else min(len(docs), max_depth)
        for d in range(1, depth + 1):
            key = tuple(docs[:d])
            count[key] = count.get(key, 0) + 1
            size.setdefault(key, tokens[d - 1])
    if not total_tokens:
        return 0.0
    # ties: the shallower node first (a parent before its children), then first retrieved
    # (dicts keep insertion order and the sort is stable): deterministic
    order = sorted((key for key, c in count.items() if c > 1),
                   key=lambda key: (-count[key], len(key)))
    room = float(capacity_tokens)
    saved = 0.0
    for key in order:
        value_per_token = count[key] - 1
        if size[key] <= room:
            saved += value_per_token * size[key]
            room -= size[key]
        else:
            if not whole_nodes:
                saved += value_per_token * room
            break
    return saved / total_tokens
