"""Two greedy generations compared as vLLM's own tests compare them (``check_logprobs_close``):
token for token until they first part, and there only where the two chosen tokens were tied.

Prefilling a prompt whole and on a cached prefix computes the same numbers in another order
(matrix products of other sizes), so their log-probabilities differ by float rounding (9e-6
measured here, ``tests/test_vllm_connector.py``). Where the best two tokens of a step lie closer
than that, the two runs may pick different ones, and everything after differs too: on random
weights and a 32,000-token vocabulary, one CI run of ten requests parted so at step 28 of one
of them. Wrong KV parts them by far more: with the connector's loaded blocks scaled by 0.99,
the host-tier test's second request parted at its first token, 3.3e-2 apart (2026-12-05)."""

from __future__ import annotations

# how close two tokens' log-probabilities must be for a parting there to count as a tie: ten
# times the rounding difference measured between the two computation orders
TIE_LOGPROB = 1e-4


def parting(first: list[int], second: list[int], first_logprobs: list[dict[int, float]],
            second_logprobs: list[dict[int, float]], tie: float = TIE_LOGPROB) -> str | None:
    """None where two greedy outputs are identical, or first part at a step whose two chosen
    tokens each run scored within ``tie`` of each other (each run's log-probabilities hold
    its top tokens and the one it chose); else what differs."""
    if len(first) != len(second):
        return f"{len(first)} tokens against {len(second)}"
    step = next((k for k, (a, b) in enumerate(zip(first, second, strict=True)) if a != b), None)
    if step is None:
        return None
    a, b = first[step], second[step]
    for name, scores in (("first", first_logprobs[step]), ("second", second_logprobs[step])):
        if a not in scores or b not in scores:
            return (f"step {step}: token {a} against {b}, not both among the {name} run's top "
                    f"tokens {sorted(scores)}")
        gap = abs(scores[a] - scores[b])
        if gap > tie:
            return (f"step {step}: token {a} against {b}, {gap:.2e} apart in the {name} run's "
                    f"log-probabilities (a tie is within {tie:g})")
    return None
