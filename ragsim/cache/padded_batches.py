"""Which waiting prompt joins a padded prefill batch: only one whose joining costs less than
running it in a step of its own.

Why: an engine that pads a batch to its longest prompt (ragsim's torch reference engine,
Hugging Face style batching) has every row compute what the longest does. A greedy batcher
that fills the step up to ``max_prefill_bs`` then lets one long prompt turn five short ones
into six long ones: on the project's CPU, five RAG prompts of 35-140 new tokens beside one of
1,978 took 0.84-0.89 s together, where apart they take about 0.20 s (docs/validation.md, run
AK's 50% point). Whether the long prompt arrived just before or just after the step began
decided the run (a knee a few milliseconds wide), so greedy padded batching is both slow and
bistable. Engines that pad group prompts of similar length instead; this rule does it with the
engine's own prices, so a step joins what it would run faster together and nothing else.

A varlen engine (vLLM: every request its own tokens) never pays for another row's length, and
does not use the rule (the pipeline passes no price).

The prices are the cost profile's pass prices (``Profile.prefill_pass_quote_s``: the pass
price, not counted as a run's extrapolation): the simulator and the real harness decide on the
same numbers, so the same state gives the same batch in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# join-if-cheaper (the default), or greedy filling as before 2026-12-07 (``always``)
PADDED_JOINS = ("if-cheaper", "always")

PassPrice = Callable[[Sequence[float], Sequence[float]], float]


def joining_is_cheaper(price_s: PassPrice, cached_tokens: Sequence[float],
                       new_tokens: Sequence[float], job_cached_tokens: float,
                       job_new_tokens: float) -> bool:
    """Whether a batch of rows (``cached_tokens``, ``new_tokens``: one entry a prompt) and one
    more prompt cost no more together than as two steps.

    Ties join: a row that costs nothing more (a batch's fixed cost shared) should ride along.
    A batch with no rows yet is always joined."""
    if not new_tokens:
        return True
    together = price_s([*cached_tokens, job_cached_tokens], [*new_tokens, job_new_tokens])
    apart = price_s(cached_tokens, new_tokens) + price_s([job_cached_tokens], [job_new_tokens])
    return together <= apart
