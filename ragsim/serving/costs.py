"""What the cost profile predicts for one engine iteration (the simulator's clock, and what the
real harness compares its measured iterations with)."""

from __future__ import annotations

from collections.abc import Sequence

from ragsim.profiles.new_shapes import NewShapeCharge
from ragsim.profiles.profile import Profile

# CacheBlend's selection pass, when the profile has no measurement: the first layer's KV of
# every reused token is recomputed to find the tokens whose KV deviates most, so it costs one
# layer's share of a prefill of those tokens, priced at this many new tokens on an empty context
SELECTION_PRICED_AT_TOKENS = 1024


def prefill_compute_s(profile: Profile, cached_tokens: Sequence[int],
                      new_tokens: Sequence[int], new_shape: NewShapeCharge | None = None
                      ) -> float:
    """A prefill iteration's forward pass: one request from the T(alpha, beta) grid, a batch
    from the batched-prefill model (priced on that grid); plus the profile's step overhead
    (``step_overhead``, none in profiles without it) for as many rows, and, with ``new_shape``
    (one engine's token counts so far, fed its steps in order), the first-time price of the
    step's token count (its new tokens)."""
    seconds = profile.prefill_pass_s(cached_tokens, new_tokens) + profile.step_overhead_s(
        len(new_tokens), len(new_tokens))
    return seconds + (new_shape(sum(new_tokens)) if new_shape is not None else 0.0)


def decode_step_s(profile: Profile, batch_size: int, mean_context_tokens: float,
                  new_shape: NewShapeCharge | None = None) -> float:
    """One decode step of ``batch_size`` running requests (the decode grid, plus the step
    overhead for as many rows where the profile measured one; with ``new_shape``, the
    first-time price of its token count, one a row)."""
    seconds = profile.decode.at(batch_size, mean_context_tokens) + profile.step_overhead_s(
        batch_size)
    return seconds + (new_shape(batch_size) if new_shape is not None else 0.0)


def step_overhead_s(profile: Profile, rows: int) -> float:
    """What a step of ``rows`` rows spends outside its timed pass (``Profile.step_overhead_s``:
    0 for a profile without a ``step_overhead``)."""
    return profile.step_overhead_s(rows)


def mixed_step_s(profile: Profile, chunk_cached_tokens: Sequence[int],
                 chunk_new_tokens: Sequence[int], decode_batch_size: int,
                 mean_context_tokens: float, new_shape: NewShapeCharge | None = None
                 ) -> float:
    """One mixed step (prompt chunks prefilled and running requests decoded in one pass):
    ``Profile.mixed_step_s``, measured where the profile has ``mixed_steps``, else additive
    (an upper bound); with ``new_shape``, the first-time price of its token count (the chunks'
    tokens and one a decode row)."""
    seconds = profile.mixed_step_s(chunk_cached_tokens, chunk_new_tokens, decode_batch_size,
                                   mean_context_tokens)
    if new_shape is None:
        return seconds
    return seconds + new_shape(sum(chunk_new_tokens) + decode_batch_size)


def blend_selection_s(profile: Profile, kind: str, reused_tokens: int) -> float:
    """CacheBlend's token selection over ``reused_tokens`` position-free tokens: the profile's
    ``blend_selection_s_per_token`` (measured on an engine) or, without it, one layer's share
    of a prefill of them (the grid's prefill of ``SELECTION_PRICED_AT_TOKENS`` new tokens less
    the fixed overhead, per token, over the layer count). EPIC recomputes a fixed set of tokens
    and selects nothing: 0. ``prefix`` reuses nothing position-free: 0."""
    if kind != "blend" or reused_tokens <= 0:
        return 0.0
    per_token = profile.blend_selection_s_per_token
    if per_token is None:
        n = SELECTION_PRICED_AT_TOKENS
        per_token = (max(profile.prefill.at(0, n) - profile.overhead_s, 0.0) / n
                     / profile.model.num_layers)
    return per_token * reused_tokens
