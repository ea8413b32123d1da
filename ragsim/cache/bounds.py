"""What no online replacement policy can beat by much on stationary traffic: a frequency oracle.

Under the independent reference model (each request draws its documents from a fixed
popularity, as the stationary synthetic traces do), caching a knowledge-tree node of ``s``
tokens that is retrieved ``f`` times saves ``(f - 1) * s`` tokens (its first retrieval computes
it). Maximising saved tokens under a capacity is a knapsack whose value per token is ``f - 1``,
so the best *static* contents are the most retrieved nodes, taken greedily until full: optimal
up to the one node that does not fit. A parent is retrieved at least as often as any child, so
the greedy set is prefix-closed, as the tree's residency rule requires.

Told every node's final count in advance and never admitting a node it will not keep, this
oracle is the ceiling for frequency-based policies (LFU, PGDSF) on stationary traffic; online
policies lose to it by admitting one-time documents and by learning counts as they go. It is
*not* a bound on traffic with temporal locality (topics that move), where recency beats any
static set, nor on Belady's offline policy, which changes its contents over time.
"""

from __future__ import annotations

from collections.abc import Sequence


def static_frequency_oracle(requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                            capacity_tokens: float, max_depth: int | None = None) -> float:
    """Token hit rate of the best static cache contents for ``requests``.

    ``requests``: (document ids in rank order, their token counts) per request, in arrival
    order. A node is a prefix of a request's document list (the knowledge tree's key); only
    the first ``max_depth`` documents of a request are cacheable (None: all). A retrieval hits
    when its node is in the chosen set and was retrieved before. Ties in count go to the
    shallower node, then to the one retrieved first (deterministic)."""
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
            count[key] = count.get(key, 0) + 1  # dicts keep first-retrieval order for ties
            size.setdefault(key, tokens[d - 1])
    if not total_tokens:
        return 0.0
    order = sorted((key for key, c in count.items() if c > 1),
                   key=lambda key: (-count[key], len(key)))
    chosen: set[tuple[int, ...]] = set()
    used = 0
    for key in order:
        if used + size[key] <= capacity_tokens and (len(key) == 1 or key[:-1] in chosen):
            chosen.add(key)
            used += size[key]
    # each chosen node hits on every retrieval but its first
    hit_tokens = sum((count[key] - 1) * size[key] for key in chosen)
    return hit_tokens / total_tokens
