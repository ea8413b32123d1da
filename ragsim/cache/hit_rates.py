"""Hit-rate fields every driver reports, computed one way (names follow vLLM's where it has one).

``replay``, ``run`` and later the real-engine harness all summarise the same per-request counts;
keeping the arithmetic here means their numbers can be compared field by field.
"""

from __future__ import annotations

import numpy as np


def hit_rate_fields(doc_tokens: int, hit_tokens_gpu: int, hit_tokens_host: int,
                    request_hit: np.ndarray) -> dict:
    """``request_hit``: one bool per served request, True if any of its documents hit."""
    hits = hit_tokens_gpu + hit_tokens_host

    def share(x: int) -> float:
        return x / doc_tokens if doc_tokens else 0.0

    return {
        "token_hit_rate": share(hits),
        "token_hit_rate_gpu": share(hit_tokens_gpu),
        "token_hit_rate_host": share(hit_tokens_host),
        "request_hit_rate": float(np.mean(request_hit)) if len(request_hit) else 0.0,
        # vLLM's metric names for the same quantities (tokens queried / tokens hit)
        "prefix_cache_queries": doc_tokens,
        "prefix_cache_hits": hits,
    }
