"""What a step pays the first time it is bigger than every step its engine's process has run:
the memory its activations need, taken from the system page by page.

A profile times each step after a warm-up pass of the same shape, so its prices are those of
a process whose memory has already grown to the step. On vLLM's CPU engine (one thread,
tcmalloc, 2026-12-03) a new engine's first step of 16 x 256 tokens in a new process took 377
ms against 97 ms again (21,000 page faults), its first of 64 x 256 1,410 ms against 382
(76,000), and a step of 32 x 256 after it 193 against 186: a step below the largest pays
nothing. At an overload point in a new process this was all of the cost model's miss: the
first step of 16,383 tokens ran 1,539 ms where 404 were priced, every later step within 0-19%.
The memory stays with the process once an engine is gone: in a process whose earlier engines
had run such steps and were freed, the same run's first step took 334 ms (1,250 priced with
this term per engine). A second engine built while the first still held its memory paid it
again (the profiler's twin).

``EngineGrowth`` records, at a few step sizes in increasing order, the cumulative extra of
each first step (``G(T)``: the sum of (first - again) over the sizes up to T), measured by the
profiler on a twin of its engine built while its own engine holds its memory, as a new
process pays it. A step of T tokens, where the largest step its process had run had H tokens
(``NewShapeCharge``: the largest of the counts the process had run before the run, then of
the run's own), pays ``G(T) - G(H)`` (linear between the sizes, through 0 at 0 tokens, flat
past the largest).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ragsim.profiles.after_new_shapes import fit_object, increasing_ints, running_seconds
from ragsim.profiles.steps import _check_model

ENGINE_GROWTH_MODEL = "cumulative_first_step_extra_above_the_processs_largest"


@dataclass(frozen=True)
class EngineGrowth:
    """``extra_s[i]``: the cumulative first-time extra up to a step of ``step_tokens[i]``."""

    step_tokens: list[int]
    extra_s: list[float]
    fit: dict = field(default_factory=dict)

    def cumulative_at(self, step_tokens: int) -> float:
        if step_tokens <= 0:
            return 0.0
        return float(np.interp(step_tokens, [0, *self.step_tokens], [0.0, *self.extra_s]))

    def extra_above(self, largest_tokens: int, step_tokens: int) -> float:
        """The extra of a step of ``step_tokens`` on an engine whose largest step so far had
        ``largest_tokens`` (0 when it is not bigger)."""
        if step_tokens <= largest_tokens:
            return 0.0
        return max(0.0, self.cumulative_at(step_tokens) - self.cumulative_at(largest_tokens))

    def scaled(self, factor: float) -> EngineGrowth:
        return EngineGrowth(self.step_tokens, [s * factor for s in self.extra_s], self.fit)

    def describe(self) -> str:
        return (f"a step above the largest its process ran: {self.extra_s[-1] * 1e3:.3g} ms "
                f"up to {self.step_tokens[-1]:,} tokens")

    def to_dict(self) -> dict:
        return {"model": ENGINE_GROWTH_MODEL, "step_tokens": self.step_tokens,
                "extra_s": self.extra_s, "fit": self.fit}


def fit_engine_growth(timings: list[tuple[int, float, float]], *, against: str = ""
                      ) -> EngineGrowth:
    """``EngineGrowth`` from ``(step_tokens, first_s, again_s)`` in the order they ran (sizes
    increasing): the running sum of ``first_s - again_s``, each at least 0."""
    sizes = [int(t) for t, _, _ in timings]
    if not sizes or any(b <= a for a, b in itertools.pairwise(sizes)):
        raise ValueError("engine growth needs timings at increasing step sizes")
    extras = [max(0.0, f - a) for _, f, a in timings]
    return EngineGrowth(sizes, [float(x) for x in np.cumsum(extras)], {
        "statistic": "running sum over increasing sizes of (a new engine's first step - the "
                     "same step again), each at least 0",
        "first_over_again": [f / max(a, 1e-12) for _, f, a in timings], "against": against})


def engine_growth_from_dict(data: object, *, source: str) -> EngineGrowth:
    where = "new_shapes.engine_growth"
    _check_model(data, where, ENGINE_GROWTH_MODEL, source)
    sizes = increasing_ints(data.get("step_tokens"), f"{where}.step_tokens", source)
    extra = running_seconds(data.get("extra_s"), len(sizes), "step_tokens", f"{where}.extra_s",
                            source)
    return EngineGrowth(sizes, extra, fit_object(data, where, source))
