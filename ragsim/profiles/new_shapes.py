"""The first-time price of a step's shape: what an engine's step costs the first time it runs
that many tokens, past what the same step costs once the engine has seen it.

A profile times every grid point after a warm-up pass of the same shape, so its grids price the
steady state. An engine may pay once per new shape: vLLM's CPU engine runs its linear layers
through oneDNN, whose matrix products are built (just-in-time compiled) per shape, the row
count being the step's token count, and kept in a cache; a run's prompts have every length, so
most of its prefill steps are of a token count the engine has not run yet. Measured on two
cores with tcmalloc (``benchmarks/new_shapes.py``, 2026-12-03): a new size 1.24x the same
prefill again, and none once seen, even after 200 other sizes. The torch engine (MKL's
matrix products, nothing built per shape) measured 1.01x.

``new_shapes`` records, at a few step sizes, the median of (first pass - the same pass again)
over fresh token counts; :class:`NewShapeCharge` keeps the token counts an engine has run and
charges a step of a new one the extra, interpolated in its token count (the nearest measured
size past either end). A profile without it charges nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.steps import _check_model

NEW_SHAPES_MODEL = "first_pass_extra_by_step_tokens"


@dataclass(frozen=True)
class NewShapes:
    """``extra_s[i]``: the median first-time extra of a step of ``step_tokens[i]`` tokens.
    ``warm_step_tokens``: the token counts the priced engine had already run before the run
    began (``warmed``; never in the file): a validation's engine runs in a process that has
    served earlier points and measured its speed, and its shapes stay built there."""

    step_tokens: list[int]
    extra_s: list[float]
    fit: dict = field(default_factory=dict)
    warm_step_tokens: frozenset[int] = field(default=frozenset(), compare=False)

    def warmed(self, step_tokens: Iterable[int]) -> NewShapes:
        """These prices for an engine that has already run steps of ``step_tokens`` tokens."""
        return replace(self, warm_step_tokens=self.warm_step_tokens | frozenset(
            int(t) for t in step_tokens))

    def extra_at(self, step_tokens: int) -> float:
        """The extra of a step of ``step_tokens`` tokens run for the first time (linear between
        the measured sizes, the nearest one past either end, never below 0)."""
        return max(0.0, float(np.interp(step_tokens, self.step_tokens, self.extra_s)))

    def scaled(self, factor: float) -> NewShapes:
        return NewShapes(self.step_tokens, [s * factor for s in self.extra_s], self.fit,
                         self.warm_step_tokens)

    def describe(self) -> str:
        pairs = ", ".join(f"{t:,}: {s * 1e3:.3g} ms"
                          for t, s in zip(self.step_tokens, self.extra_s, strict=True))
        return f"first-time price of a step's token count (tokens: extra) {pairs}"

    def to_dict(self) -> dict:
        return {"model": NEW_SHAPES_MODEL, "step_tokens": self.step_tokens,
                "extra_s": self.extra_s, "fit": self.fit}


def fit_new_shapes(timings: Sequence[tuple[int, int, float, float]], *, against: str = ""
                   ) -> NewShapes:
    """``NewShapes`` from timings ``(size, step_tokens, first_s, again_s)``: at each target
    size, the median of ``first_s - again_s`` over its fresh token counts (at least 0: a
    first pass faster than the repeat is noise)."""
    by_size: dict[int, list[tuple[int, float, float]]] = {}
    for size, tokens, first_s, again_s in timings:
        by_size.setdefault(size, []).append((tokens, first_s, again_s))
    if not by_size:
        raise ValueError("the first-time price needs timings at one size or more")
    sizes = sorted(by_size)
    extra, ratios = [], []
    for size in sizes:
        rows = by_size[size]
        extra.append(max(0.0, float(np.median([f - a for _, f, a in rows]))))
        ratios.append(float(np.median([f / max(a, 1e-12) for _, f, a in rows])))
    return NewShapes(sizes, extra, {
        "statistic": "median over fresh token counts of (first pass - the same pass again)",
        "token_counts_per_size": max(len(v) for v in by_size.values()),
        "first_over_again_median": ratios, "against": against})


class NewShapeCharge:
    """The token counts one engine has run, and the first-time extra a step of a new one pays
    (``profile.new_shapes``; always 0 without it). One per engine: the simulated engine and the
    replay of a real run's decisions each keep their own, in the order their steps run."""

    def __init__(self, new_shapes: NewShapes | None, seen: Iterable[int] = ()) -> None:
        self.new_shapes = new_shapes
        self.seen: set[int] = set(seen)
        if new_shapes is not None:  # what the engine ran before the run: built already
            self.seen |= new_shapes.warm_step_tokens

    def __call__(self, step_tokens: int) -> float:
        """The extra of a step of ``step_tokens`` tokens (0 once seen), noting it seen."""
        if self.new_shapes is None or step_tokens <= 0 or step_tokens in self.seen:
            return 0.0
        self.seen.add(step_tokens)
        return self.new_shapes.extra_at(step_tokens)


def new_shapes_from_dict(data: object, *, source: str) -> NewShapes:
    where = "new_shapes"
    _check_model(data, where, NEW_SHAPES_MODEL, source)
    tokens, extra = data.get("step_tokens"), data.get("extra_s")
    if not isinstance(tokens, list) or not tokens:
        raise ProfileError("missing, empty or not a list", file=source,
                           field=f"{where}.step_tokens")
    if not isinstance(extra, list) or len(extra) != len(tokens):
        raise ProfileError(f"must be a list as long as step_tokens ({len(tokens)})",
                           file=source, field=f"{where}.extra_s")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ProfileError(f"entry {i} is {t!r}; must be an integer >= 1", file=source,
                               field=f"{where}.step_tokens")
        if i and t <= tokens[i - 1]:
            raise ProfileError(f"must increase strictly; entry {i} ({t}) follows "
                               f"{tokens[i - 1]}", file=source, field=f"{where}.step_tokens")
    seconds = []
    for i, s in enumerate(extra):
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) \
                or s < 0:
            raise ProfileError(f"entry {i} is {s!r}; must be a finite number >= 0",
                               file=source, field=f"{where}.extra_s")
        seconds.append(float(s))
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    return NewShapes([int(t) for t in tokens], seconds, fit)
