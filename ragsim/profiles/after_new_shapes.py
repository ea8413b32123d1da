"""What a step pays, past its steady price, when the engine has built the products of new token
counts since it last ran a step as big, while its cache of built products was still growing.

A profile prices a step as the engine runs it after other steps it has run before (the grid's
sweeps). vLLM's CPU engine builds oneDNN matrix products per step token count and keeps them
in a process-wide cache of 1,024 primitives (256 counts of a Mistral-like model). While that
cache grows, each new count's products take new memory, and the next big step runs far slower
than its steady time: 1.7-2.4x after each 16 new counts, with thousands of page faults,
until 256 counts were built; then 0.96-1.13x with none, as a new count's products take the
memory of the ones they push out; with a capacity of 4,096, 1.7-3.0x through 400 counts
(``benchmarks/shape_cache.py``, ``benchmarks/cold_steps.py``, 2026-12-03, one thread,
tcmalloc; docs/profiles.md). Small steps pay little (a step of 256 tokens measured none).
The torch engine, which builds nothing per count, measured 0.98-1.01x.

``AfterNewShapes`` records, at a few step sizes and numbers k of fresh counts, the median of
(the step right after k prefills of fresh counts - the same step in sweeps of steps it had
run), clipped at 0, measured while the cache grows (the profiler times only what fits in the
room the engine's cache has left). Its price of a step of T tokens after k such counts is
linear in k up to the largest k measured and flat past it, and linear in T through 0 at 0
tokens, flat past the largest size. :class:`FreshCountsSince` keeps, for one engine, how many
counts grew its cache since its last step of at least T tokens: a step as big touched all the
memory a smaller one will use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.steps import _check_model

AFTER_NEW_SHAPES_MODEL = "extra_by_step_tokens_and_fresh_counts_since_a_step_as_big"


@dataclass(frozen=True)
class AfterNewShapes:
    """``extra_s[i][j]``: the median extra of a step of ``step_tokens[i]`` tokens right after
    ``fresh_counts[j]`` steps of token counts the engine had not run."""

    step_tokens: list[int]
    fresh_counts: list[int]
    extra_s: list[list[float]]
    fit: dict = field(default_factory=dict)

    def extra_at(self, step_tokens: int, fresh: int) -> float:
        """The extra of a step of ``step_tokens`` tokens after ``fresh`` new counts (0 after
        none; linear in both, through 0 at 0 tokens, flat past the largest measured)."""
        if fresh <= 0 or step_tokens <= 0:
            return 0.0
        counts = [0, *self.fresh_counts]
        per_size = [float(np.interp(fresh, counts, [0.0, *row])) for row in self.extra_s]
        return max(0.0, float(np.interp(step_tokens, [0, *self.step_tokens],
                                        [0.0, *per_size])))

    def scaled(self, factor: float) -> AfterNewShapes:
        return AfterNewShapes(self.step_tokens, self.fresh_counts,
                              [[s * factor for s in row] for row in self.extra_s], self.fit)

    def describe(self) -> str:
        last = self.fresh_counts[-1]
        pairs = ", ".join(f"{t:,}: {row[-1] * 1e3:.3g} ms"
                          for t, row in zip(self.step_tokens, self.extra_s, strict=True))
        return f"a step after {last} new token counts (tokens: extra) {pairs}"

    def to_dict(self) -> dict:
        return {"model": AFTER_NEW_SHAPES_MODEL, "step_tokens": self.step_tokens,
                "fresh_counts": self.fresh_counts, "extra_s": self.extra_s, "fit": self.fit}


def fit_after_new_shapes(steady: dict[int, float],
                         timings: Sequence[tuple[int, int, float]], *, against: str = ""
                         ) -> AfterNewShapes:
    """``AfterNewShapes`` from each size's steady time (``steady[size]``) and timings ``(size,
    k, seconds)`` of the step right after k fresh counts: per (size, k) the median of
    ``seconds - steady[size]``, at least 0 (a step faster than its steady time is noise)."""
    cells: dict[tuple[int, int], list[float]] = {}
    for size, k, seconds in timings:
        cells.setdefault((int(size), int(k)), []).append(float(seconds))
    sizes = sorted({z for z, _ in cells})
    counts = sorted({k for _, k in cells})
    if not sizes or counts[0] < 1:
        raise ValueError("a step after new counts needs timings after one fresh count or more")
    missing = [(z, k) for z in sizes for k in counts if (z, k) not in cells]
    if missing:
        raise ValueError(f"no timing of size {missing[0][0]} after {missing[0][1]} fresh counts")
    extra = [[max(0.0, float(np.median(cells[z, k])) - steady[z]) for k in counts]
             for z in sizes]
    ratios = [[float(np.median(cells[z, k])) / steady[z] for k in counts] for z in sizes]
    return AfterNewShapes(sizes, counts, extra, {
        "statistic": "median over repeats of (the step right after k prefills of fresh token "
                     "counts - its median in sweeps of steps already run), at least 0",
        "steady_s": [steady[z] for z in sizes], "over_steady_median": ratios,
        "repeats": max(len(v) for v in cells.values()), "against": against})


class FreshCountsSince:
    """For one engine, in the order its steps run: how many steps of a token count new to it
    (that grew its cache) ran since its last step of at least as many tokens (since the run
    began, before any).

    A stack of (step tokens, fresh counts so far), its tokens decreasing: a step pops the
    smaller ones (it is both later and bigger than they are), and the top left is the last
    step as big."""

    def __init__(self) -> None:
        self.fresh = 0
        self._stack: list[tuple[int, int]] = []

    def step(self, step_tokens: int, fresh: bool) -> int:
        """Notes a step of ``step_tokens`` tokens (``fresh``: a count new to the engine that
        grew its cache) and returns the fresh counts since the last step at least as big,
        before this one."""
        stack = self._stack
        while stack and stack[-1][0] < step_tokens:
            stack.pop()
        since = self.fresh - (stack[-1][1] if stack else 0)
        self.fresh += fresh
        if stack and stack[-1][0] == step_tokens:
            stack.pop()
        stack.append((step_tokens, self.fresh))
        return since


def after_new_shapes_from_dict(data: object, *, source: str) -> AfterNewShapes:
    where = "new_shapes.after_new_counts"
    _check_model(data, where, AFTER_NEW_SHAPES_MODEL, source)
    sizes = increasing_ints(data.get("step_tokens"), f"{where}.step_tokens", source)
    counts = increasing_ints(data.get("fresh_counts"), f"{where}.fresh_counts", source)
    extra = data.get("extra_s")
    if not isinstance(extra, list) or len(extra) != len(sizes):
        raise ProfileError(f"must be a list of {len(sizes)} rows (one per step size)",
                           file=source, field=f"{where}.extra_s")
    rows = []
    for i, row in enumerate(extra):
        if not isinstance(row, list) or len(row) != len(counts):
            raise ProfileError(f"row {i} must be a list of {len(counts)} numbers (one per "
                               "fresh count)", file=source, field=f"{where}.extra_s")
        for j, s in enumerate(row):
            if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) \
                    or s < 0:
                raise ProfileError(f"row {i} entry {j} is {s!r}; must be a finite number "
                                   ">= 0", file=source, field=f"{where}.extra_s")
        rows.append([float(s) for s in row])
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    return AfterNewShapes(sizes, counts, rows, fit)


def running_seconds(values: object, length: int, axis: str, where: str, source: str
                    ) -> list[float]:
    """A term's extras along its axis (``axis``, ``length`` entries): finite seconds >= 0,
    never below the one before (a running sum, or a curve made non-decreasing)."""
    if not isinstance(values, list) or len(values) != length:
        raise ProfileError(f"must be a list as long as {axis} ({length})", file=source,
                           field=where)
    for i, s in enumerate(values):
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) \
                or s < 0 or (i and s < values[i - 1]):
            raise ProfileError(f"entry {i} is {s!r}; must be a finite number >= 0 of seconds, "
                               "never below the one before", file=source, field=where)
    return [float(s) for s in values]


def fit_object(data: dict, where: str, source: str) -> dict:
    """A term's ``fit``: how it was obtained (an object; empty where absent)."""
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    return fit


def increasing_ints(values: object, where: str, source: str) -> list[int]:
    if not isinstance(values, list) or not values:
        raise ProfileError("missing, empty or not a list", file=source, field=where)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"entry {i} is {v!r}; must be an integer >= 1", file=source,
                               field=where)
        if i and v <= values[i - 1]:
            raise ProfileError(f"must increase strictly; entry {i} ({v}) follows "
                               f"{values[i - 1]}", file=source, field=where)
    return [int(v) for v in values]
