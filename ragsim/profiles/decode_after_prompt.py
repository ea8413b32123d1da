"""What the decode steps after a step with prompts pay: a batch's first ones cost more.

A served request decodes few tokens (the held-out trace's 2-6), so most of its decode steps are
its first ones, right after the step that ran its prompt. Those cost more than a batch's steady
steps, by an amount that fades step by step and grows with the prompt step's size:

* vLLM's CPU engine (2 layers x 256 hidden, one thread, 2026-12-05): after a step that ran a
  190-token prompt, one row's next decode steps took +1.1, +0.5, +0.3, +0.2, +0.1 ms over its
  steady 3.5 ms; after a 1,500-token prompt +2.9, +2.0, +1.4, +1.0, +0.8, +0.5, +0.5, +0.3 ms;
  two rows more. It is not a matter of time: 30 ms of sleep, or of other work, between the
  prompt step and the first decode step left the curve as it was; the decode steps themselves
  wear it off. In serving runs (run E, docs/validation.md) the 1-row decode steps after prompt
  steps of up to 300 new tokens ran +0.8, +0.6, +0.4 ms over their prices at the 2nd-4th
  positions at idle, +1.4, +1.0, +0.8 ms at 50% load, where an earlier term charged the 1st
  position only: the loaded points' decode steps ran 1.21-1.29x their prices.
* the torch engine: the step after a prefill copies the joiner's KV into the padded decode
  batch (or rebuilds it) and runs the masked forward path. The write is priced apart
  (``batch_copy``, by the rows it writes), so the profiler times this step from its forward
  pass on.

``DecodeAfterPrompt`` is that extra, in seconds, by the prompt step's new tokens and the decode
step's position after it (1: right after), measured by the profiler on the engine itself
(``TimingEngine.first_decode``): per cell (rows, prompt tokens), fresh requests of that many
tokens admitted together and stepped to their first tokens, then their next
``FIRST_DECODE_STEPS`` steps timed one by one. A position's extra is its median less the median
of the steady steps (the ``STEADY_FROM``-th on), averaged over the rows measured and clipped at
0. The decode grid's cells are timed after as many settling steps (``DECODE_SETTLE_STEPS``), so
that the grid prices the steady steps the extras are measured against.

The simulator charges the extra to a decode-only step, by the decode steps run since the last
step that ran prompts (a prefill, or a mixed step with prompt chunks) and that step's new tokens
(linear between the sizes measured, the nearest size's outside them); the replay of a real run
charges a real step likewise. Not charged: the decode rows of a mixed step (they run inside a
step with prompts, and those ran 0.97-1.04x their prices), and decode steps before any prompt
step. Profiles measured before the positions were timed hold one number, charged at the first
position after any prompt step.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.after_new_shapes import fit_object
from ragsim.profiles.steps import _check_model

DECODE_AFTER_PROMPT_MODEL = "extra_of_the_first_decode_step_after_a_prompt_step"
# by the prompt step's size and the decode step's position after it
DECODE_AFTER_PROMPT_POSITIONS_MODEL = "extra_of_decode_steps_after_a_prompt_step_by_position"
DECODE_POSITIONS = 12  # positions whose extra is measured and charged (the curve's length)
STEADY_FROM = 17  # the first step of the steady ones a cell's positions are measured against
FIRST_DECODE_STEPS = 24  # decode steps timed after the prompts' step
# steps the decode grid's cells run before their timed ones: their timed steps are the steady
# ones the positions' extras are measured against (a 1,500-token cell settled 12 steps still ran
# 1.08x the 17th step on)
DECODE_SETTLE_STEPS = STEADY_FROM - 1
FIRST_DECODE_ROWS = (1, 2)  # the rows of the cells timed (a served batch's joiners: 1-2)
FIRST_DECODE_CONTEXTS = (256, 768, 2048)  # the prompts' tokens, within the plan's decode axis
FIRST_DECODE_REPEATS = 8


def first_decode_cells(context_axis: list[int]) -> list[tuple[int, int]]:
    """The (rows, prompt tokens) cells the profiler times the decode steps after a prompt step
    at: 1-2 rows of ``FIRST_DECODE_CONTEXTS`` tokens, each brought within the plan's decode
    context axis."""
    low, high = min(context_axis), max(context_axis)
    contexts = sorted({min(max(c, low), high) for c in FIRST_DECODE_CONTEXTS})
    return [(rows, c) for rows in FIRST_DECODE_ROWS for c in contexts]


def positions_row(rows: int, prompt_tokens: int, times: list[float]) -> list[float]:
    """One repeat of a cell as the profiler keeps it: ``[rows, prompt_tokens, steady_s, t_1,
    ..., t_P]`` from its ``FIRST_DECODE_STEPS`` decode steps' ``times`` after the prompts'
    step (``steady_s``: the median of the ``STEADY_FROM``-th on)."""
    if len(times) < FIRST_DECODE_STEPS:
        raise ValueError(f"{FIRST_DECODE_STEPS} decode steps are timed, got {len(times)}")
    return [float(rows), float(prompt_tokens), float(np.median(times[STEADY_FROM - 1:])),
            *map(float, times[:DECODE_POSITIONS])]


@dataclass(frozen=True)
class DecodeAfterPrompt:
    """``extra_s[i][k]``: what the (k+1)-th decode step after a step with
    ``prompt_tokens[i]`` new prompt tokens pays beyond its price."""

    prompt_tokens: tuple[int, ...]
    extra_s: tuple[tuple[float, ...], ...]
    fit: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompt_tokens or len(self.extra_s) != len(self.prompt_tokens):
            raise ValueError("one row of extras per prompt size, at least one")

    @classmethod
    def flat(cls, extra_s: float, fit: dict | None = None) -> DecodeAfterPrompt:
        """One extra at the first position after any prompt step (the earlier term)."""
        return cls((0,), ((float(extra_s),),), fit or {})

    @property
    def positions(self) -> int:
        return len(self.extra_s[0])

    def at(self, position: int, prompt_tokens: int) -> float:
        """The extra of the ``position``-th decode step after a step of ``prompt_tokens`` new
        prompt tokens (0 past the positions measured)."""
        row = self.after(prompt_tokens)
        return row[position - 1] if 1 <= position <= len(row) else 0.0

    def after(self, prompt_tokens: int) -> tuple[float, ...]:
        """The extras of positions 1, 2, ... after a step of ``prompt_tokens`` new prompt
        tokens: each position's linear between the sizes measured, the nearest's outside.
        (Plain Python: the simulator asks at every prompt step.)"""
        sizes, rows = self.prompt_tokens, self.extra_s
        if prompt_tokens <= sizes[0]:
            return rows[0]
        if prompt_tokens >= sizes[-1]:
            return rows[-1]
        i = bisect_right(sizes, prompt_tokens) - 1
        w = (prompt_tokens - sizes[i]) / (sizes[i + 1] - sizes[i])
        return tuple(lo + (hi - lo) * w for lo, hi in zip(rows[i], rows[i + 1], strict=True))

    def scaled(self, factor: float) -> DecodeAfterPrompt:
        return DecodeAfterPrompt(self.prompt_tokens,
                                 tuple(tuple(x * factor for x in row) for row in self.extra_s),
                                 self.fit)

    def describe(self) -> str:
        rows = "; ".join(f"after {size:,} prompt tokens "
                         + ", ".join(f"+{x * 1e3:.2g}" for x in row[:6] if x > 0) + " ms"
                         for size, row in zip(self.prompt_tokens, self.extra_s, strict=True))
        return f"the decode steps right after a step with prompts, by position: {rows}"

    def to_dict(self) -> dict:
        return {"model": DECODE_AFTER_PROMPT_POSITIONS_MODEL,
                "prompt_tokens": list(self.prompt_tokens),
                "extra_s": [list(row) for row in self.extra_s], "fit": self.fit}


def fit_decode_after_prompt(rows: list[list[float]], *, against: str = ""
                            ) -> DecodeAfterPrompt:
    """``DecodeAfterPrompt`` from ``[rows, prompt_tokens, steady_s, t_1, ..., t_P]`` timings
    (one per repeat of a cell: the median of its steady steps, then its decode steps at
    positions 1..P after the prompts' step): per cell and position the median less the median
    steady; per prompt size the mean over its cells (the rows measured), clipped at 0 (a step
    after a prompt step cannot be cheaper than the steady ones: noise would say so)."""
    by: dict[tuple[int, int], list[list[float]]] = {}
    for n, tokens, steady, *positions in rows:
        if not positions:
            raise ValueError("a timing needs at least one position after its prompt step")
        by.setdefault((int(n), int(tokens)), []).append([float(steady), *map(float, positions)])
    if not by:
        raise ValueError("the decode steps' extra needs at least one timed cell")
    cells = sorted(by)
    per_cell = {}
    for cell in cells:
        timed = np.array(by[cell])
        steady = float(np.median(timed[:, 0]))
        per_cell[cell] = (steady, np.median(timed[:, 1:], axis=0) - steady)
    sizes = sorted({tokens for _, tokens in cells})
    extra = tuple(tuple(float(max(0.0, x)) for x in np.mean(
        [per_cell[c][1] for c in cells if c[1] == size], axis=0)) for size in sizes)
    return DecodeAfterPrompt(tuple(sizes), extra, {
        "statistic": "per cell (rows, prompt tokens), each position's median decode step "
                     "after the step that ran the rows' prompts less the median of their "
                     f"steady steps (the {STEADY_FROM}th on); per prompt size the mean over "
                     "its cells, clipped at 0",
        "cells": [[n, c] for n, c in cells],
        "extra_s_by_cell": [per_cell[c][1].tolist() for c in cells],
        "steady_s_by_cell": [per_cell[c][0] for c in cells], "against": against})


def decode_after_prompt_from_dict(data: object, *, source: str) -> DecodeAfterPrompt:
    where = "decode_after_prompt"
    if isinstance(data, dict) and data.get("model") == DECODE_AFTER_PROMPT_MODEL:
        extra = data.get("extra_s")  # a profile measured before the positions were timed
        _seconds(extra, source, f"{where}.extra_s")
        return DecodeAfterPrompt.flat(float(extra), fit_object(data, where, source))
    _check_model(data, where, DECODE_AFTER_PROMPT_POSITIONS_MODEL, source)
    sizes, table = data.get("prompt_tokens"), data.get("extra_s")
    if not isinstance(sizes, list) or not sizes or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sizes) \
            or any(b <= a for a, b in pairwise(sizes)):
        raise ProfileError(f"is {sizes!r}; must be increasing integers >= 0", file=source,
                           field=f"{where}.prompt_tokens")
    if not isinstance(table, list) or len(table) != len(sizes) or not all(
            isinstance(row, list) and row and len(row) == len(table[0]) for row in table):
        raise ProfileError("must be one list of seconds per prompt size, all of one length",
                           file=source, field=f"{where}.extra_s")
    for i, row in enumerate(table):
        for k, x in enumerate(row):
            _seconds(x, source, f"{where}.extra_s[{i}][{k}]")
    return DecodeAfterPrompt(tuple(sizes), tuple(tuple(float(x) for x in row) for row in table),
                             fit_object(data, where, source))


def _seconds(value: object, source: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise ProfileError(f"is {value!r}; must be a finite number >= 0 of seconds",
                           file=source, field=where)


class AfterPrompt:
    """Where each decode step stands after the last step with prompts, step by step, for one
    engine: the simulator's and the replay's shared rule (``charge`` is called on every step
    in order; ``prompt_tokens`` is None for a step of decodes alone)."""

    def __init__(self, term: DecodeAfterPrompt | None) -> None:
        self.term = term
        self.position = 0  # decode steps since the last step with prompts
        self.prompt_tokens: int | None = None  # that step's new tokens (None: no such step)
        self._extras: tuple[float, ...] = ()  # the term's positions after that step

    def due(self, steps: int = 1) -> list[float]:
        """What the next ``steps`` decode-only steps would pay (the state unchanged: a run of
        decode steps priced at once records its steps when it ends, ``decodes``)."""
        ahead = list(self._extras[self.position:self.position + steps])
        return ahead + [0.0] * (steps - len(ahead))

    def record(self, prompt_tokens: int | None) -> int:
        """Record a step (``prompt_tokens``: the new tokens of the prompts it ran, None for
        decodes alone); for a decode-only step after a step with prompts, its position after
        it (1: right after), else 0."""
        if prompt_tokens is not None:
            self.position, self.prompt_tokens = 0, int(prompt_tokens)
            self._extras = () if self.term is None else self.term.after(self.prompt_tokens)
            return 0
        if self.prompt_tokens is None:
            return 0
        self.position += 1
        return self.position

    def decodes(self, steps: int) -> None:
        """Record ``steps`` decode-only steps run at once (a run priced by ``due``)."""
        if self.prompt_tokens is not None:
            self.position += steps

    def charge(self, prompt_tokens: int | None) -> float:
        """What a step pays for the steps before it (``record``): the term at its position,
        or nothing."""
        position = self.record(prompt_tokens)
        return self._extras[position - 1] if 0 < position <= len(self._extras) else 0.0

    def reset(self) -> None:
        """The engine lost its batch (a GPU failure): no decode step follows a prompt."""
        self.position, self.prompt_tokens, self._extras = 0, None, ()
