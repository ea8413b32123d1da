"""Two optional profile terms for what a step costs beyond the prefill and decode grids.

* ``mixed_steps``: a step that prefills prompt chunks and decodes the running requests in one
  forward pass (vLLM >= 0.4, SGLang, the simulator's ``scheduler="mixed"``). Without it the
  simulator prices such a step additively, the batched prefill of its chunks plus a decode
  step: that pays the fixed cost of a step and the weight reads twice, a stated upper bound.
  With it the decode rows add what was measured they add to a step that prefills.
* ``step_overhead``: what the engine does with a step's output that the timed forward passes
  of the grids leave out: each row's next token picked from its logits and handed back to
  Python (greedy sampling), ``per_step_s + per_row_s * rows``, added to every iteration. A
  step with prompt rows may pay more (``prompt_step_s + prompt_row_s * prompt rows``: the
  engine's work for a prompt around its pass, its tokens looked up and its new KV kept), which
  the profiler does not time; ``validate`` measures all four terms on its probe runs' own
  steps (``realrun.probe_runs.step_costs_in_runs``).

A profile without them loads and simulates exactly as before (both are ``None``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.grid import BilinearGrid

MIXED_MODEL = "decode_increment"
# per-iteration accuracy on held-out shapes (issue 27): the median of predicted / measured
# within 5% of 1, the 90th percentile of |predicted / measured - 1| within 15%
ITERATION_MEDIAN_TARGET = 0.05
ITERATION_P90_TARGET = 0.15
OVERHEAD_MODEL = "per_step_plus_per_row"


@dataclass(frozen=True)
class MixedSteps:
    """What ``batch_size`` decode rows of ``context_tokens`` each add to a step that prefills
    ``chunk_tokens`` prompt tokens (in all its chunks).

    ``levels[i]`` is measured at ``chunk_tokens[i]``: T(the step with the chunk and the decode
    rows, timed in the grid's sweeps) - the price of that step without an increment (the
    chunk's batched prefill on the grid), so that the priced step is the measured one at every
    cell, as a bilinear grid over batch size x context. A step's increment is bilinear in
    (batch, context) on each level and linear in its chunk tokens between the two levels
    around them; below the first level or past the last, the nearest level (a step's chunk
    tokens are bounded by its token budget, which the plan's last level reaches). Never below
    zero.

    Why an increment on the chunk's batched-prefill price and not a table of whole steps: the
    chunks of a step differ (their cached contexts, how many), which the batched-prefill model
    already prices from the grid; what it cannot know is how much of a decode step the
    prefill's pass absorbs (the fixed cost, the weight reads) and what the decode rows add to
    it (their attention, their LM head rows, on a padding engine their padded queries).
    """

    chunk_tokens: list[float]
    levels: list[BilinearGrid]
    heldout: dict | None = None
    fit: dict = field(default_factory=dict)

    def increment_s(self, batch_size: float, context_tokens: float, chunk_tokens: float
                    ) -> float:
        ks = self.chunk_tokens
        if chunk_tokens <= ks[0]:
            return self.levels[0].at(batch_size, context_tokens)
        if chunk_tokens >= ks[-1]:
            return self.levels[-1].at(batch_size, context_tokens)
        i = bisect_right(ks, chunk_tokens) - 1
        lo = self.levels[i].at(batch_size, context_tokens)
        hi = self.levels[i + 1].at(batch_size, context_tokens)
        w = (chunk_tokens - ks[i]) / (ks[i + 1] - ks[i])
        return max(lo + w * (hi - lo), 0.0)

    @property
    def extrapolated_queries(self) -> int:
        return sum(level.extrapolated_queries for level in self.levels)

    def scaled(self, factor: float) -> MixedSteps:
        levels = [BilinearGrid(g.name, g.x_name, g.y_name, g.x_axis, g.y_axis,
                               [[v * factor for v in row] for row in g.values])
                  for g in self.levels]
        return MixedSteps(list(self.chunk_tokens), levels, self.heldout, self.fit)

    def describe(self) -> str:
        held = "held-out steps not measured"
        if self.heldout:
            held = (f"held-out steps predicted/measured median {self.heldout['median_ratio']:.3f}"
                    f", p90 {self.heldout['p90_ratio']:.3f} over {self.heldout['points']}")
        sizes = ", ".join(f"{k:g}" for k in self.chunk_tokens)
        return (f"mixed steps: the chunks' batched prefill + the measured decode increment at "
                f"{len(self.chunk_tokens)} chunk sizes ({sizes} tokens); {held}")

    def to_dict(self) -> dict:
        first = self.levels[0]
        return {"model": MIXED_MODEL, "chunk_tokens": list(self.chunk_tokens),
                "batch_sizes": list(first.x_axis), "context_tokens": list(first.y_axis),
                "seconds": [[list(row) for row in g.values] for g in self.levels],
                "heldout": self.heldout, "fit": self.fit}


@dataclass(frozen=True)
class StepOverhead:
    """Seconds an iteration of ``rows`` rows, ``prompt_rows`` of them prompts, spends outside
    the timed pass: ``per_step_s + per_row_s * rows``, and where it has prompt rows
    ``prompt_step_s + prompt_row_s * prompt_rows`` more (0 in a profile's own measurement,
    which times the sampling alone)."""

    per_step_s: float
    per_row_s: float
    fit: dict = field(default_factory=dict)
    prompt_step_s: float = 0.0
    prompt_row_s: float = 0.0

    def seconds(self, rows: int, prompt_rows: int = 0) -> float:
        seconds = self.per_step_s + self.per_row_s * rows
        if prompt_rows:
            seconds += self.prompt_step_s + self.prompt_row_s * prompt_rows
        return seconds

    def scaled(self, factor: float) -> StepOverhead:
        return StepOverhead(self.per_step_s * factor, self.per_row_s * factor, self.fit,
                            self.prompt_step_s * factor, self.prompt_row_s * factor)

    def describe(self) -> str:
        prompts = (f"; a step with prompts {self.prompt_step_s * 1e3:.3g} ms + "
                   f"{self.prompt_row_s * 1e6:.3g} us a prompt more"
                   if self.prompt_step_s or self.prompt_row_s else "")
        return (f"step overhead (sampling, output handling): {self.per_step_s * 1e3:.3g} ms a "
                f"step + {self.per_row_s * 1e6:.3g} us a row{prompts}")

    def to_dict(self) -> dict:
        data = {"model": OVERHEAD_MODEL, "per_step_s": self.per_step_s,
                "per_row_s": self.per_row_s, "fit": self.fit}
        if self.prompt_step_s or self.prompt_row_s:
            data.update(prompt_step_s=self.prompt_step_s, prompt_row_s=self.prompt_row_s)
        return data


def fit_step_overhead(rows: Sequence[int], seconds: Sequence[float], *, against: str = ""
                      ) -> StepOverhead:
    """``per_step_s + per_row_s * rows`` fitted to timed steps (least squares, both terms >= 0,
    each point weighted by 1 / its time so that small steps count as much as large ones)."""
    from ragsim.profiles.fitting import relative_nnls

    r = np.asarray(rows, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if len(r) < 2 or len(set(r.tolist())) < 2:
        raise ValueError("the step overhead needs timings at two or more row counts")
    coef, errors = relative_nnls(np.column_stack([np.ones_like(r), r]), y)
    return StepOverhead(float(coef[0]), float(coef[1]), {
        "points": len(y), "median_rel_error": float(np.median(errors)),
        "max_rel_error": float(errors.max()), "against": against})


def ratio_summary(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """The distribution of predicted / measured over held-out steps: how many, the median,
    the 10th and 90th percentiles, and the median and p90 of |predicted / measured - 1|."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    ratio = p / np.maximum(m, 1e-12)
    off = np.abs(ratio - 1.0)
    return {"points": len(ratio), "median_ratio": float(np.median(ratio)),
            "p10_ratio": float(np.percentile(ratio, 10)),
            "p90_ratio": float(np.percentile(ratio, 90)),
            "median_abs_error": float(np.median(off)),
            "p90_abs_error": float(np.percentile(off, 90))}


def misses_iteration_targets(summary: dict) -> bool:
    """Whether a held-out kind's ratios (``ratio_summary``) miss the per-iteration targets."""
    return (abs(summary["median_ratio"] - 1.0) > ITERATION_MEDIAN_TARGET
            or summary["p90_abs_error"] > ITERATION_P90_TARGET)


def heldout_misses(obtained: dict, *, biased_by: float | None = None) -> dict[str, dict]:
    """The held-out kinds of a profile (its ``obtained``) whose per-iteration ratios miss the
    targets (``obtained.validation.iteration_ratios``), each with its summary: how uncertain
    the profile's prices are before any run prices with them. ``biased_by``: only the kinds
    whose median ratio is further than that from 1 (a price biased for a whole kind of step,
    where a p90 past its target on a shared CPU's noise is common)."""
    if not isinstance(obtained, dict):
        return {}
    ratios = (obtained.get("validation") or {}).get("iteration_ratios") or {}
    if biased_by is not None:
        return {kind: s for kind, s in ratios.items()
                if abs(s["median_ratio"] - 1.0) > biased_by}
    return {kind: s for kind, s in ratios.items() if misses_iteration_targets(s)}


def heldout_words(misses: dict[str, dict]) -> str:
    """The misses of ``heldout_misses`` in one clause."""
    return "; ".join(f"{kind.replace('_', ' ')} predicted/measured {s['median_ratio']:.2f} "
                     f"(p90 |error| {s['p90_abs_error']:.0%}, {s['points']} points)"
                     for kind, s in misses.items())


def iteration_warning(kind: str, summary: dict, *, threads: int | None = 1) -> str | None:
    """One sentence where held-out ``kind`` misses the per-iteration targets, else None."""
    median, p90 = summary["median_ratio"], summary["p90_abs_error"]
    if not misses_iteration_targets(summary):
        return None
    advice = "remeasure on an idle machine" + ("" if threads == 1 else " with --threads 1")
    return (f"per iteration, held-out {kind.replace('_', ' ')}: predicted/measured median "
            f"{median:.3f} "
            f"(target within {ITERATION_MEDIAN_TARGET:.0%} of 1), p90 |error| {p90:.1%} "
            f"(target {ITERATION_P90_TARGET:.0%}) over {summary['points']}: a busy machine's "
            f"noise or a shape the model misses; {advice}")


def iteration_ratio_lines(validation: dict) -> list[str]:
    """``obtained.validation.iteration_ratios`` for people: one line per held-out kind."""
    lines = []
    for kind, s in (validation.get("iteration_ratios") or {}).items():
        lines.append(f"held-out {kind.replace('_', ' ')} ({s['points']}): predicted/measured "
                     f"median {s['median_ratio']:.3f}, p10 {s['p10_ratio']:.3f}, p90 "
                     f"{s['p90_ratio']:.3f}; |error| median {s['median_abs_error']:.1%}, p90 "
                     f"{s['p90_abs_error']:.1%} (targets: median within "
                     f"{ITERATION_MEDIAN_TARGET:.0%}, p90 {ITERATION_P90_TARGET:.0%})")
    return lines


# --------------------------------------------------------------------------- reading files
def _number(data: dict, key: str, source: str, where: str, minimum: float = 0.0) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"must be a number, got {value!r}", file=source, field=f"{where}.{key}")
    number = float(value)
    if not math.isfinite(number) or number < minimum:
        raise ProfileError(f"must be finite and >= {minimum:g}, got {value!r}", file=source,
                           field=f"{where}.{key}")
    return number


def _check_model(data: object, where: str, model: str, source: str) -> None:
    """A profile term is an object naming the model it is written in (``model``)."""
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field=where)
    if data.get("model") != model:
        raise ProfileError(f"unknown model {data.get('model')!r}; expected {model!r}",
                           file=source, field=f"{where}.model")


def mixed_steps_from_dict(data: object, *, name: str, source: str) -> MixedSteps:
    where = "mixed_steps"
    _check_model(data, where, MIXED_MODEL, source)
    for key in ("chunk_tokens", "batch_sizes", "context_tokens", "seconds"):
        if not isinstance(data.get(key), list):
            raise ProfileError("missing or not a list", file=source, field=f"{where}.{key}")
    chunks = data["chunk_tokens"]
    for i, k in enumerate(chunks):
        if (isinstance(k, bool) or not isinstance(k, int | float) or not math.isfinite(k)
                or k < 1):
            raise ProfileError(f"entry {i} is {k!r}; must be a finite number >= 1",
                               file=source, field=f"{where}.chunk_tokens")
        if i and k <= chunks[i - 1]:
            raise ProfileError(f"must increase strictly; entry {i} ({k}) follows "
                               f"{chunks[i - 1]}", file=source, field=f"{where}.chunk_tokens")
    if not chunks:
        raise ProfileError("needs at least one chunk size", file=source,
                           field=f"{where}.chunk_tokens")
    if len(data["seconds"]) != len(chunks):
        raise ProfileError(f"has {len(data['seconds'])} levels but chunk_tokens has "
                           f"{len(chunks)}", file=source, field=f"{where}.seconds")
    levels = []
    for i, values in enumerate(data["seconds"]):
        if not isinstance(values, list) or not all(isinstance(r, list) for r in values):
            raise ProfileError("must be a list of rows", file=source,
                               field=f"{where}.seconds[{i}]")
        levels.append(BilinearGrid(name, "batch_sizes", "context_tokens", data["batch_sizes"],
                                   data["context_tokens"], values, source=source,
                                   field=f"{where}.seconds[{i}]"))
    heldout = data.get("heldout")
    if heldout is not None:
        if not isinstance(heldout, dict):
            raise ProfileError("must be an object or null", file=source,
                               field=f"{where}.heldout")
        for key in ("median_ratio", "p90_ratio", "points"):
            _number(heldout, key, source, f"{where}.heldout")
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    return MixedSteps([float(k) for k in chunks], levels, heldout, fit)


def step_overhead_from_dict(data: object, *, source: str) -> StepOverhead:
    where = "step_overhead"
    _check_model(data, where, OVERHEAD_MODEL, source)
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=f"{where}.fit")
    prompts = [_number(data, key, source, where) if key in data else 0.0
               for key in ("prompt_step_s", "prompt_row_s")]
    return StepOverhead(_number(data, "per_step_s", source, where),
                        _number(data, "per_row_s", source, where), fit, *prompts)
