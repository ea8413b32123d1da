"""What a decode step pays when the step before it ran prompts: the batch's first step after a join.

A profile's decode grid times a batch's steps back to back, after a warm-up step: the steady
steps of a batch that does not change. A served request decodes few tokens (the held-out
trace's 2-6), so most of its decode steps are its first ones, right after the step that ran its
prompt, and those cost more than the steady ones:

* vLLM's CPU engine (2 layers x 256 hidden, one thread; ``benchmarks/vllm_first_decode.py``,
  2026-12-05): the first decode step after a prefill took 4.0-5.6 ms, the steady ones 3.3-4.5
  ms and the profile's cell 3.2-4.2 ms, at 1-2 rows over 256 and 768 tokens (1.14-1.36x). In a
  50% load validation (run B) its 1-row decode steps ran 1.22-1.32x their price, 0.61 s of the
  0.82 s by which the steps exceeded their prices. The engine's persistent batch takes the new
  request in (its block table, its sampling state) on the first step it decodes.
* the torch engine: the step after a prefill copies the joiner's KV into the padded decode
  batch (or rebuilds it) and runs the masked forward path; in run B such steps ran 1.12-1.26x
  their price at 50% and 90% load, 1.14x at idle, an unchanged batch's 1.05-1.12x.

``DecodeAfterPrompt`` is that extra, in seconds, measured by the profiler on the engine itself
(``TimingEngine.first_decode``): per cell (rows, context), requests of that context admitted
together, stepped to their first tokens, then their next steps timed one by one; the extra is
the median first decode step less the median of the steady ones (the third step on). The term
is the mean over the cells, clipped at 0: on the engines measured it was about the same number
of milliseconds at every cell (0.7-1.1 ms on vLLM's), not a share of the step. The simulator
charges it to a decode step whose engine's previous step ran prompts (a prefill, or a mixed
step with prompt chunks), the replay of a real run to such a real step.

Where it is not charged: a mixed step after a prompt step (its decode rows' first step runs
inside a step with prompts; those ran 0.97-1.04x their prices), and a batch that changed only
because a request left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.after_new_shapes import fit_object
from ragsim.profiles.steps import _check_model

DECODE_AFTER_PROMPT_MODEL = "extra_of_the_first_decode_step_after_a_prompt_step"
FIRST_DECODE_STEPS = 6  # decode steps timed after the prompts' step: the first, then steady ones
FIRST_DECODE_ROWS = (1, 2)  # the rows of the cells timed (a served batch's joiners: 1-2)
FIRST_DECODE_CONTEXTS = (256, 768)  # their contexts, within the plan's decode axis
FIRST_DECODE_REPEATS = 8


def first_decode_cells(context_axis: list[int]) -> list[tuple[int, int]]:
    """The (rows, context) cells the profiler times the first decode step at: 1-2 rows over
    ``FIRST_DECODE_CONTEXTS`` tokens, each brought within the plan's decode context axis."""
    low, high = min(context_axis), max(context_axis)
    contexts = sorted({min(max(c, low), high) for c in FIRST_DECODE_CONTEXTS})
    return [(rows, c) for rows in FIRST_DECODE_ROWS for c in contexts]


@dataclass(frozen=True)
class DecodeAfterPrompt:
    """``extra_s``: what a decode step right after a step with prompts pays beyond its price."""

    extra_s: float
    fit: dict = field(default_factory=dict)

    def scaled(self, factor: float) -> DecodeAfterPrompt:
        return DecodeAfterPrompt(self.extra_s * factor, self.fit)

    def describe(self) -> str:
        return (f"a decode step right after a step with prompts: +{self.extra_s * 1e3:.2g} ms "
                "(the batch's first step after a join)")

    def to_dict(self) -> dict:
        return {"model": DECODE_AFTER_PROMPT_MODEL, "extra_s": self.extra_s, "fit": self.fit}


def fit_decode_after_prompt(rows: list[list[float]], *, against: str = ""
                            ) -> DecodeAfterPrompt:
    """``DecodeAfterPrompt`` from ``[rows, context_tokens, first_s, steady_s]`` timings (one
    per repeat of a cell: its first decode step after the prompts' step, and the median of its
    steady steps): per cell the median first less the median steady; the mean over the cells,
    clipped at 0 (a first step cannot be cheaper than the steady ones: noise would say so)."""
    by: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for n, context, first, steady in rows:
        by.setdefault((int(n), int(context)), []).append((float(first), float(steady)))
    if not by:
        raise ValueError("the first decode step's extra needs at least one timed cell")
    cells = sorted(by)
    per_cell = [float(np.median([f for f, _ in by[c]]) - np.median([s for _, s in by[c]]))
                for c in cells]
    steady = [float(np.median([s for _, s in by[c]])) for c in cells]
    return DecodeAfterPrompt(max(0.0, float(np.mean(per_cell))), {
        "statistic": "per cell (rows, context), the median first decode step after the step "
                     "that ran the rows' prompts less the median of their steady steps (the "
                     "third on); the mean over the cells, clipped at 0",
        "cells": [[n, c] for n, c in cells], "extra_s_by_cell": per_cell,
        "steady_s_by_cell": steady, "against": against})


def decode_after_prompt_from_dict(data: object, *, source: str) -> DecodeAfterPrompt:
    where = "decode_after_prompt"
    _check_model(data, where, DECODE_AFTER_PROMPT_MODEL, source)
    extra = data.get("extra_s")
    if isinstance(extra, bool) or not isinstance(extra, int | float) \
            or not math.isfinite(extra) or extra < 0:
        raise ProfileError(f"is {extra!r}; must be a finite number >= 0 of seconds",
                           file=source, field=f"{where}.extra_s")
    return DecodeAfterPrompt(float(extra), fit_object(data, where, source))


class AfterPrompt:
    """Which decode step follows a step with prompts, step by step, for one engine: the
    simulator's and the replay's shared rule (``charge`` is called on every step in order)."""

    def __init__(self, term: DecodeAfterPrompt | None) -> None:
        self.extra_s = 0.0 if term is None else term.extra_s
        self.after_prompt = False  # the last step ran prompts

    def due(self) -> float:
        """What a decode-only step beginning now would pay (the state unchanged: a run of
        decode steps priced at once records its first step when it ends)."""
        return self.extra_s if self.after_prompt else 0.0

    def record(self, prompts: bool) -> bool:
        """Record a step (``prompts``: it ran prompts); True for a decode-only step right
        after a step with prompts, the step the term is charged to."""
        follows = self.after_prompt and not prompts
        self.after_prompt = prompts
        return follows

    def charge(self, prompts: bool) -> float:
        """What a step pays for the one before it (``record``): the term, or nothing."""
        return self.extra_s if self.record(prompts) else 0.0

    def reset(self) -> None:
        """The engine lost its batch (a GPU failure): no decode step follows a prompt."""
        self.after_prompt = False
