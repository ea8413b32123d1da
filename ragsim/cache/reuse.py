"""What an engine can reuse of what the cache found.

The cache reports the cached prefix of a request (system prompt, then documents hit in GPU,
then in host memory). An engine cannot always use all of it:

* it computes at least the last token of the context, whose logits give the first output
  token, so a context that is cached to the end (a request with no question tokens whose
  documents all hit) recomputes one token, as vLLM and SGLang do;
* a block-level prefix cache (vLLM's, ``block_tokens`` > 1) reuses only whole blocks of that
  prefix and recomputes the partial one.

Both drivers apply this one rule, so ``replay`` and ``run`` count the same hits.
"""

from __future__ import annotations

from typing import NamedTuple


class Reuse(NamedTuple):
    cached_tokens: int  # alpha: the prefix the engine reuses
    new_tokens: int  # beta: what it computes
    hit_tokens_gpu: int
    hit_tokens_host: int
    recomputed_tokens: int  # documents' tokens computed (misses and given-back hits)


def engine_reuse(cached_tokens: int, new_tokens: int, hit_tokens_gpu: int,
                 hit_tokens_host: int, recomputed_tokens: int, block_tokens: int = 1) -> Reuse:
    """The reusable part of a cached prefix of ``cached_tokens`` before ``new_tokens``.

    Tokens given back come off the end of the prefix: host hits first (host nodes lie below
    GPU ones in the tree), then GPU hits, then the system prompt."""
    usable = min(cached_tokens, cached_tokens + new_tokens - 1)
    if block_tokens > 1:
        usable = usable // block_tokens * block_tokens
    usable = max(usable, 0)
    lost = cached_tokens - usable
    if not lost:
        return Reuse(cached_tokens, new_tokens, hit_tokens_gpu, hit_tokens_host,
                     recomputed_tokens)
    lost_host = min(lost, hit_tokens_host)
    lost_gpu = min(lost - lost_host, hit_tokens_gpu)
    return Reuse(usable, new_tokens + lost, hit_tokens_gpu - lost_gpu,
                 hit_tokens_host - lost_host, recomputed_tokens + lost_host + lost_gpu)
