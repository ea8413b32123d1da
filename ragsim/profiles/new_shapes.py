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

The built products are kept in a bounded cache, least recently used out: oneDNN's
process-wide primitive cache holds 1,024 primitives, 4 per token count on a Mistral-like
model (its 4 linear-layer shapes), so 256 counts (``built_capacity_counts``; None: every count
stays built). Measured (``benchmarks/shape_cache.py``, 2026-12-03): a count last run 400 counts
ago is built again (+4 ms), and with ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=4096`` it is not (the
"none once seen, even after 200 other sizes" above fits: 200 < 256). A profile may also carry
what a step pays after new counts grew that cache since the engine last ran a step as big
(``after_new_counts``, ``ragsim/profiles/after_new_shapes.py``); the charge prices both, in the
order steps run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.after_new_shapes import (
    AfterNewShapes,
    FreshCountsSince,
    after_new_shapes_from_dict,
    increasing_ints,
)
from ragsim.profiles.growth import EngineGrowth, engine_growth_from_dict
from ragsim.profiles.steps import _check_model

NEW_SHAPES_MODEL = "first_pass_extra_by_step_tokens"


@dataclass(frozen=True)
class NewShapes:
    """``extra_s[i]``: the median first-time extra of a step of ``step_tokens[i]`` tokens.
    ``warm_step_tokens``: the token counts the priced engine had already run before the run
    began, each once, the least recently run first (``warmed``; never in the file): a
    validation's engine runs in a process that has served earlier points and measured its
    speed, and its shapes stay built there. ``after``: what a step pays after new counts
    (None: not measured, nothing charged). ``built_capacity_counts``: how many counts stay
    built (None: all of them). ``growth``: what a step pays above the largest its process has
    run (``ragsim/profiles/growth.py``; None: nothing)."""

    step_tokens: list[int]
    extra_s: list[float]
    fit: dict = field(default_factory=dict)
    warm_step_tokens: tuple[int, ...] = field(default=(), compare=False)
    after: AfterNewShapes | None = None
    built_capacity_counts: int | None = None
    growth: EngineGrowth | None = None

    def warmed(self, step_tokens: Iterable[int]) -> NewShapes:
        """These prices for an engine that has since run steps of ``step_tokens`` tokens (in
        that order: the last one run last)."""
        order = dict.fromkeys(self.warm_step_tokens)
        for t in step_tokens:
            order.pop(int(t), None)
            order[int(t)] = None
        return replace(self, warm_step_tokens=tuple(order))

    def extra_at(self, step_tokens: int) -> float:
        """The extra of a step of ``step_tokens`` tokens run for the first time (linear between
        the measured sizes, the nearest one past either end, never below 0)."""
        return max(0.0, float(np.interp(step_tokens, self.step_tokens, self.extra_s)))

    def scaled(self, factor: float) -> NewShapes:
        return replace(self, extra_s=[s * factor for s in self.extra_s],
                       after=None if self.after is None else self.after.scaled(factor),
                       growth=None if self.growth is None else self.growth.scaled(factor))

    def describe(self) -> str:
        pairs = ", ".join(f"{t:,}: {s * 1e3:.3g} ms"
                          for t, s in zip(self.step_tokens, self.extra_s, strict=True))
        text = f"first-time price of a step's token count (tokens: extra) {pairs}"
        if self.built_capacity_counts is not None:
            text += f"; {self.built_capacity_counts:,} counts stay built"
        if self.after is not None:
            text += f"; {self.after.describe()}"
        return text if self.growth is None else f"{text}; {self.growth.describe()}"

    def to_dict(self) -> dict:
        data = {"model": NEW_SHAPES_MODEL, "step_tokens": self.step_tokens,
                "extra_s": self.extra_s, "fit": self.fit}
        if self.built_capacity_counts is not None:
            data["built_capacity_counts"] = self.built_capacity_counts
        if self.after is not None:
            data["after_new_counts"] = self.after.to_dict()
        if self.growth is not None:
            data["engine_growth"] = self.growth.to_dict()
        return data


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
    """The token counts one engine has built, and what a step pays for new ones
    (``profile.new_shapes``; always 0 without it): the first-time extra of a step of a count
    not built (never run, or dropped from the bounded cache since), and, where the profile
    measured it, the extra of a step after counts were built while the cache was still
    growing, since the engine's last step as big (``after``: once the cache is full, a new
    count's products take the memory of the one they push out), and the memory a step above
    the largest its process has run faults in (``growth``). One per engine: the simulated
    engine and the replay of a real run's decisions each keep their own, in the order their
    steps run."""

    def __init__(self, new_shapes: NewShapes | None, seen: Iterable[int] = ()) -> None:
        self.new_shapes = new_shapes
        self.capacity = None if new_shapes is None else new_shapes.built_capacity_counts
        warm = () if new_shapes is None else new_shapes.warm_step_tokens
        order = [*warm, *(int(t) for t in seen)]
        # every count the engine's process has built: once they reach the capacity, the
        # cache is full and stays so
        self.ever_built = len(set(order))
        kept = dict.fromkeys(order)  # built now, the least recently run first
        while self.capacity is not None and len(kept) > self.capacity:
            del kept[next(iter(kept))]
        self.built: dict[int, None] = kept
        self.since = FreshCountsSince()
        # the largest step the engine's process has run (``growth``): memory an engine freed
        # stays with the process's allocator, and the next engine's steps use it
        self.largest_tokens = max(order, default=0)

    @property
    def seen(self) -> set[int]:
        """The counts built now."""
        return set(self.built)

    def __call__(self, step_tokens: int) -> float:
        """The extra of a step of ``step_tokens`` tokens, noting it run (and built)."""
        shapes = self.new_shapes
        if shapes is None or step_tokens <= 0:
            return 0.0
        built = self.built
        fresh = step_tokens not in built
        growing = fresh and (self.capacity is None or self.ever_built < self.capacity)
        extra = 0.0
        if fresh:
            extra = shapes.extra_at(step_tokens)
            self.ever_built += 1
            built[step_tokens] = None
            if self.capacity is not None and len(built) > self.capacity:
                del built[next(iter(built))]  # the least recently run
        else:
            del built[step_tokens]
            built[step_tokens] = None
        if shapes.after is not None:
            extra += shapes.after.extra_at(step_tokens, self.since.step(step_tokens, growing))
        if shapes.growth is not None and step_tokens > self.largest_tokens:
            extra += shapes.growth.extra_above(self.largest_tokens, step_tokens)
            self.largest_tokens = step_tokens
        return extra


class StepSizesRun:
    """The step token counts one kind of engine has run in this process, each once, the least
    recently run first (a dict keeps insertion order; a count run again moves to the end): what
    a process has paid a step's first-time price for stays paid, which a run records before
    its clock starts (``engine_warm_step_tokens``; ``Profile.warmed``). One per engine kind:
    the torch engine's (``torch_model``) and vLLM's (``realrun.vllm.shapes``)."""

    def __init__(self) -> None:
        self._order: dict[int, None] = {}

    def note(self, tokens: int) -> None:
        """A step of ``tokens`` tokens ran (nothing for an empty one)."""
        if tokens > 0:
            self._order.pop(tokens, None)
            self._order[tokens] = None

    def counts(self) -> tuple[int, ...]:
        """Every count run so far, in the order of their last run."""
        return tuple(self._order)


def new_shapes_from_dict(data: object, *, source: str) -> NewShapes:
    where = "new_shapes"
    _check_model(data, where, NEW_SHAPES_MODEL, source)
    tokens, extra = data.get("step_tokens"), data.get("extra_s")
    tokens = increasing_ints(tokens, f"{where}.step_tokens", source)
    if not isinstance(extra, list) or len(extra) != len(tokens):
        raise ProfileError(f"must be a list as long as step_tokens ({len(tokens)})",
                           file=source, field=f"{where}.extra_s")
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
    capacity = data.get("built_capacity_counts")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity < 1):
        raise ProfileError(f"is {capacity!r}; must be an integer >= 1 (or absent: every count "
                           "stays built)", file=source, field=f"{where}.built_capacity_counts")
    after, growth = data.get("after_new_counts"), data.get("engine_growth")
    return NewShapes(tokens, seconds, fit, after=None if after is None else
                     after_new_shapes_from_dict(after, source=source),
                     built_capacity_counts=capacity, growth=None if growth is None else
                     engine_growth_from_dict(growth, source=source))
