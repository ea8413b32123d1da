"""What an engine can reuse of what the cache found.

The cache reports the cached prefix of a request (system prompt, then documents hit in GPU,
then in host memory). An engine cannot always use all of it:

* it computes at least the last token of the context, whose logits give the first output
  token, so a context that is cached to the end (a request with no question tokens whose
  documents all hit) recomputes one token, as vLLM and SGLang do;
* a block-level prefix cache (vLLM's, ``block_tokens`` > 1) reuses only whole blocks of that
  prefix and recomputes the partial one.

Both drivers apply this one rule, ``run`` per request (Python ints) and ``replay`` per column
(numpy arrays), so they count the same hits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np


class Reuse(NamedTuple):
    cached_tokens: int  # alpha: the prefix the engine reuses
    new_tokens: int  # beta: what it computes
    hit_tokens_gpu: int
    hit_tokens_host: int
    recomputed_tokens: int  # documents' tokens computed (misses and given-back hits)


def _reuse(cached, new, gpu, host, recomputed, block_tokens: int,
           minimum: Callable, maximum: Callable) -> Reuse:
    """The rule, once, for ints (``min``, ``max``) and for arrays (``np.minimum``,
    ``np.maximum``). Tokens given
    back come off the end of the prefix: host hits first (host nodes lie below GPU ones in the
    tree), then GPU hits, then the system prompt."""
    usable = minimum(cached, cached + new - 1)
    if block_tokens > 1:
        usable = usable // block_tokens * block_tokens
    usable = maximum(usable, 0)
    lost = cached - usable
    lost_host = minimum(lost, host)
    lost_gpu = minimum(lost - lost_host, gpu)
    return Reuse(usable, new + lost, gpu - lost_gpu, host - lost_host,
                 recomputed + lost_host + lost_gpu)


def engine_reuse(cached_tokens: int, new_tokens: int, hit_tokens_gpu: int,
                 hit_tokens_host: int, recomputed_tokens: int, block_tokens: int = 1) -> Reuse:
    """The reusable part of one request's cached prefix of ``cached_tokens`` before
    ``new_tokens``."""
    return _reuse(cached_tokens, new_tokens, hit_tokens_gpu, hit_tokens_host,
                  recomputed_tokens, block_tokens, min, max)


def engine_reuse_columns(cached_tokens: np.ndarray, new_tokens: np.ndarray,
                         hit_tokens_gpu: np.ndarray, hit_tokens_host: np.ndarray,
                         recomputed_tokens: np.ndarray, block_tokens: int = 1) -> Reuse:
    """``engine_reuse`` for every request at once (int64 columns in, new columns out)."""
    return _reuse(cached_tokens, new_tokens, hit_tokens_gpu, hit_tokens_host,
                  recomputed_tokens, block_tokens, np.minimum, np.maximum)


def own_hit_tokens(hit_node_tokens: Sequence[int], own: Sequence[bool], usable_gpu: int,
                   hit_gpu: int, usable_host: int) -> tuple[int, int]:
    """(GPU, host) tokens of the reused prefix that lie in nodes marked ``own``.

    ``hit_node_tokens`` are the hit documents' sizes in path order, GPU hits first (a node's
    parent is in a tier at least as fast); ``hit_gpu`` is what the cache found in GPU, and
    ``usable_gpu``/``usable_host`` what the engine reuses of each tier (``engine_reuse``: given-
    back tokens come off the end). So the reused GPU tokens are ``[0, usable_gpu)`` of the
    documents' span and the reused host tokens ``[hit_gpu, hit_gpu + usable_host)``; an own node
    counts where it overlaps them."""
    own_gpu = own_host = 0
    start = 0
    host_end = hit_gpu + usable_host
    for tokens, mine in zip(hit_node_tokens, own, strict=True):
        end = start + tokens
        if mine:
            own_gpu += max(0, min(end, usable_gpu) - start)
            own_host += max(0, min(end, host_end) - max(start, hit_gpu))
        start = end
    return own_gpu, own_host
