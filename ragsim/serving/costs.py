"""What the cost profile predicts for one engine iteration (the simulator's clock, and what the
real harness compares its measured iterations with)."""

from __future__ import annotations

from collections.abc import Sequence

from ragsim.profiles.profile import Profile


def prefill_compute_s(profile: Profile, cached_tokens: Sequence[int],
                      new_tokens: Sequence[int]) -> float:
    """A prefill iteration's forward pass: one request from the T(alpha, beta) grid, a batch
    from the batched-prefill model (priced on that grid)."""
    if len(cached_tokens) == 1:
        return profile.prefill.at(cached_tokens[0], new_tokens[0])
    return profile.batched_prefill.iteration_s(list(cached_tokens), list(new_tokens))


def decode_step_s(profile: Profile, batch_size: int, mean_context_tokens: float) -> float:
    """One decode step of ``batch_size`` running requests (the decode grid)."""
    return profile.decode.at(batch_size, mean_context_tokens)
