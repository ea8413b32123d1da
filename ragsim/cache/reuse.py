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

**Position-free reuse** (``ReuseRule``: ``prefix``, ``blend:R``, ``epic:K``). Beyond the exact
prefix, the tree can find a document's KV held at any other position (CacheBlend, EPIC; see
``KnowledgeTree``'s ``reuse``). Such a hit is not free: the engine recomputes part of it to
restore the attention across documents, ``blend:R`` the fraction R of its tokens (CacheBlend's
selected tokens; rounded *up* per document, so any R > 0 recomputes at least one token of each)
and ``epic:K`` its first K tokens (all of a shorter one). The engine computes those beside the
new tokens; what it reuses is the prefix plus the position-free hits less what it recomputes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

REUSE_KINDS = ("prefix", "blend", "epic")
_RULE = re.compile(r"(prefix)|(blend):([0-9]*\.?[0-9]+)|(epic):([0-9]+)")


class ReuseRule(NamedTuple):
    """How a request reuses documents' KV: ``prefix`` (only behind the same ordered prefix,
    RAGCache), ``blend`` (also at any position, recomputing ``ratio`` of each such document's
    tokens) or ``epic`` (also at any position, recomputing its first ``first_tokens``)."""

    kind: str = "prefix"
    ratio: Fraction = Fraction(0)  # blend: the fraction recomputed, exactly as written
    first_tokens: int = 0  # epic: the tokens recomputed at the start of each document

    @property
    def position_free(self) -> bool:
        return self.kind != "prefix"

    def recompute_tokens(self, tokens: int) -> int:
        """Of a document of ``tokens`` reused position-free, the tokens recomputed: blend
        ``ceil(ratio x tokens)`` (exact: the ratio is the decimal as written), epic
        ``min(first_tokens, tokens)``; 0 under prefix (no position-free hits)."""
        if self.kind == "blend":
            return -(-self.ratio.numerator * tokens // self.ratio.denominator)
        if self.kind == "epic":
            return min(self.first_tokens, tokens)
        return 0

    def __str__(self) -> str:
        if self.kind == "blend":
            return f"blend:{_decimal(self.ratio)}"
        if self.kind == "epic":
            return f"epic:{self.first_tokens}"
        return "prefix"


def _decimal(ratio: Fraction) -> str:
    return f"{float(ratio):g}" if ratio not in (0, 1) else str(int(ratio))


PREFIX = ReuseRule()


def parse_reuse(text: object) -> ReuseRule:
    """``prefix``, ``blend:R`` (0 <= R <= 1) or ``epic:K`` (a whole K >= 0); ValueError with a
    one-line reason otherwise."""
    if isinstance(text, ReuseRule):
        return text
    match = _RULE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"must be prefix, blend:R (R in [0, 1], e.g. blend:0.15) or epic:K "
                         f"(K whole tokens >= 0, e.g. epic:32), got {text!r}")
    if match.group(1):
        return PREFIX
    if match.group(2):
        ratio = Fraction(match.group(3))
        if ratio > 1:
            raise ValueError(f"blend's recompute ratio must lie in [0, 1], got {match.group(3)}")
        return ReuseRule("blend", ratio, 0)
    return ReuseRule("epic", Fraction(0), int(match.group(5)))


class Reuse(NamedTuple):
    cached_tokens: int  # alpha: what the engine reuses (prefix and position-free, less recompute)
    new_tokens: int  # beta: what it computes (new tokens and recomputed parts of hits)
    hit_tokens_gpu: int  # every reused document token found in GPU, prefix or position-free
    hit_tokens_host: int
    recomputed_tokens: int  # documents' tokens computed (misses and given-back hits)
    position_free_hit_tokens: int = 0  # of the hits, those found outside the exact prefix
    blend_recomputed_tokens: int = 0  # of those, the tokens the engine recomputes


def _reuse(cached, new, gpu, host, recomputed, block_tokens: int,
           minimum: Callable, maximum: Callable, free_gpu=0, free_host=0,
           free_recompute=0) -> Reuse:
    """The rule, once, for ints (``min``, ``max``) and for arrays (``np.minimum``,
    ``np.maximum``). Tokens given
    back come off the end of the prefix: host hits first (host nodes lie below GPU ones in the
    tree), then GPU hits, then the system prompt.

    Position-free hits (``free_*``) lie after the prefix; the engine computes
    ``free_recompute`` of their tokens beside the new ones. When that leaves nothing to compute
    (no new tokens, nothing recomputed), the context's last token is a position-free hit's and
    is recomputed (counted in ``blend_recomputed_tokens``); the prefix then gives back nothing."""
    free = free_gpu + free_host
    computed = new + free_recompute
    # the context's last token is computed: by the new tokens, or one position-free token
    give_back_free = minimum(free - free_recompute, maximum(1 - computed, 0))
    free_recompute = free_recompute + give_back_free
    usable = minimum(cached, cached + new + free - 1)
    if block_tokens > 1:
        usable = usable // block_tokens * block_tokens
    usable = maximum(usable, 0)
    lost = cached - usable
    lost_host = minimum(lost, host)
    lost_gpu = minimum(lost - lost_host, gpu)
    return Reuse(usable + free - free_recompute, new + lost + free_recompute,
                 gpu - lost_gpu + free_gpu, host - lost_host + free_host,
                 recomputed + lost_host + lost_gpu, free, free_recompute)


def engine_reuse(cached_tokens: int, new_tokens: int, hit_tokens_gpu: int,
                 hit_tokens_host: int, recomputed_tokens: int, block_tokens: int = 1,
                 free_hit_tokens_gpu: int = 0, free_hit_tokens_host: int = 0,
                 free_recompute_tokens: int = 0) -> Reuse:
    """The reusable part of one request's cached prefix of ``cached_tokens`` before
    ``new_tokens``, and of its position-free hits (``free_*``, as the tree reports them)."""
    return _reuse(cached_tokens, new_tokens, hit_tokens_gpu, hit_tokens_host,
                  recomputed_tokens, block_tokens, min, max, free_hit_tokens_gpu,
                  free_hit_tokens_host, free_recompute_tokens)


def engine_reuse_columns(cached_tokens: np.ndarray, new_tokens: np.ndarray,
                         hit_tokens_gpu: np.ndarray, hit_tokens_host: np.ndarray,
                         recomputed_tokens: np.ndarray, block_tokens: int = 1,
                         free_hit_tokens_gpu=0, free_hit_tokens_host=0,
                         free_recompute_tokens=0) -> Reuse:
    """``engine_reuse`` for every request at once (int64 columns in, new columns out; the
    position-free columns are zeros when not given)."""
    zeros = np.zeros_like(cached_tokens)
    free_hit_tokens_gpu = free_hit_tokens_gpu + zeros
    free_hit_tokens_host = free_hit_tokens_host + zeros
    free_recompute_tokens = free_recompute_tokens + zeros
    return _reuse(cached_tokens, new_tokens, hit_tokens_gpu, hit_tokens_host,
                  recomputed_tokens, block_tokens, np.minimum, np.maximum,
                  free_hit_tokens_gpu, free_hit_tokens_host, free_recompute_tokens)


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
