"""Documents in vLLM's blocks: which whole blocks a knowledge-tree node's KV is, and which
blocks of a cached prefix a request can load.

vLLM pages KV in blocks of ``block`` tokens and caches whole blocks only; it always computes a
prompt's last token (its logits give the first output token). A node of the knowledge tree is
one document in its prefix context, and documents do not end on block boundaries, so block
``i`` (tokens ``[i*block, (i+1)*block)``) belongs to the node whose token span holds its last
token: a block straddling two documents is the second's (its path fixes everything before it).
Plain arithmetic, no vLLM: the connector (``connector.py``) uses it and the main test suite
checks it by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragsim.cache.reuse import engine_reuse


def block_owners(spans: Sequence[tuple[int, int]], block: int) -> list[int]:
    """For each whole block that ends inside one of ``spans`` (``[start, end)`` token spans,
    consecutive from token 0), the index of that span, in block order."""
    owners = []
    for k, (start, end) in enumerate(spans):
        # blocks i with start < (i + 1) * block <= end
        owners.extend(k for _ in range(start // block, end // block))
    return owners


def loadable_tokens(cached_prefix_tokens: int, prompt_tokens: int, block: int) -> int:
    """The tokens a request can take from a cached prefix of ``cached_prefix_tokens``: whole
    blocks of it, never the prompt's last token (the policy core's reuse rule, the one the
    simulator applies)."""
    cached = min(cached_prefix_tokens, prompt_tokens)
    return engine_reuse(cached, prompt_tokens - cached, 0, 0, 0, block).cached_tokens
