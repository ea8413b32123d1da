"""Profile format v2: what one (hardware, model, dtype, tensor-parallel degree, engine) costs.

A profile is one JSON file::

    {"format": "ragsim.profile", "version": 2, "name": "a10g-mistral-7b",
     "hardware": {"name": "a10g", "device": "NVIDIA A10G", "gpus": 1, ...},
     "model": {...architecture...}, "dtype": "fp16", "tensor_parallel": 1, "engine": "vllm",
     "obtained": {"kind": "derived", "formula": ..., "constants": ..., "sources": ...}
              or {"kind": "measured", "date": ..., "device": ..., "libraries": ..., ...},
     "kv_capacity_bytes": ...,        # GPU memory left for KV once weights and activations fit
     "overhead_s": ...,               # fixed cost of one engine iteration, already inside
                                      # every grid point (a record, at most the cheapest)
     "prefill": {"cached_tokens": [...], "new_tokens": [...], "seconds": [[...]]},
     "batched_prefill": {"model": "equivalent_request", "padding": "none",
                         "per_extra_request_s": ..., "heldout_median_error": ...,
                         "heldout_max_error": ..., "fit": {...}},
     "decode": {"batch_sizes": [...], "context_tokens": [...], "seconds": [[...]]},
     "transfers": {"host_to_device_bytes_per_s": ..., "host_to_device_latency_s": ...,
                   "device_to_host_bytes_per_s": ..., "device_to_host_latency_s": ...}}

* ``prefill``: T(alpha, beta) of a single request with alpha cached and beta new tokens.
* ``batched_prefill``: one iteration that prefills several requests at once, priced on the
  prefill grid as the single request that computes as many tokens and query-key pairs (see
  ``BatchedPrefill``), plus a fitted term per extra request, never below its costliest member.
  ``padding`` is ``"none"`` (varlen kernels), ``"left"`` or ``"left_masked"`` (the torch
  reference engine: left padding under a 2-D mask, attention over the full padded rectangle).
  ``heldout_*_error`` are its relative errors on batches it was not fitted to (fractions).
* ``decode``: one decode iteration (one token for each of ``batch_size`` requests) as a function
  of batch size and context length per request.
* ``transfers``: copying KV between host and GPU memory: ``latency + bytes / bandwidth``.
* ``obtained.warnings`` (optional): sentences saying where the profile misses its accuracy
  targets (``ragsim.profiles.heldout``); ``ragsim profiles show`` prints them.

Version 1 files (a separable least-squares batch model, which could price a batch below the
weight reads every iteration pays) still load: their batch model becomes the equivalent-request
model with no fitted term and no held-out error, and saving writes version 2.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from ragsim.atomic import write_text_atomically
from ragsim.errors import ProfileError
from ragsim.profiles.batch_copy import BatchCopy, batch_copy_from_dict
from ragsim.profiles.decode_after_prompt import (
    DecodeAfterPrompt,
    decode_after_prompt_from_dict,
)
from ragsim.profiles.decode_layout import DECODE_PADDINGS
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.heldout import median_and_max, relative_errors
from ragsim.profiles.idle_start import IdleStart, idle_start_from_dict
from ragsim.profiles.models import DTYPE_BYTES, ModelSpec
from ragsim.profiles.new_shapes import NewShapes, new_shapes_from_dict
from ragsim.profiles.steps import (
    MixedSteps,
    StepOverhead,
    mixed_steps_from_dict,
    ratio_summary,
    step_overhead_from_dict,
)

FORMAT_NAME = "ragsim.profile"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
BATCH_MODEL = "equivalent_request"
PADDINGS = ("none", "left", "left_masked")  # see BatchedPrefill
_TOP_KEYS = ("format", "version", "name", "hardware", "model", "dtype", "tensor_parallel",
             "engine", "obtained", "kv_capacity_bytes", "overhead_s", "prefill",
             "batched_prefill", "decode", "transfers")
# optional: CacheBlend's token-selection pass per reused token, as measured on an engine (None:
# ragsim's default, one layer's share of a prefill: ragsim.serving.costs.blend_selection_s)
# optional: measured mixed prefill+decode steps and the per-step overhead outside the timed
# passes (ragsim.profiles.steps; None: mixed steps priced additively, no overhead term)
_OPTIONAL_KEYS = ("blend_selection_s_per_token", "mixed_steps", "step_overhead", "new_shapes",
                  "idle_start", "decode_padding", "decode_after_prompt", "batch_copy")


# the most rows of the batches the per-request term is fitted on (the profiler's random
# batches draw 2 to this many)
FITTED_ROWS = 4


@dataclass(frozen=True)
class WideBatches:
    """What each request adds to a batch of ``rows[i]`` rows (``per_extra_request_s[i]``),
    measured on batches of that many rows of ``row_new_tokens`` new tokens on
    ``row_cached_tokens`` cached ones, beside the term fitted on random batches of 2 to
    ``FITTED_ROWS``.

    Why, on vLLM's CPU engine: a request added to a batch of several costs more than in a batch
    of two to four (measured: 8, 20 and 57 rows of 291 tokens took 47, 140 and 470 ms where the
    term fitted on two to four rows priced 33, 74 and 202 ms), and an engine that takes every
    waiting prompt into a step runs such batches at load. Its levels start above
    ``FITTED_ROWS``: between ``FITTED_ROWS`` and the first level the term moves linearly from
    the fitted one.

    Why, on the torch engine's CPU path: what a request adds depends on the row count itself,
    not only on how many there are. Masked batches of 2 and 3 rows took 3.2-4.3 ms a request
    over their tokens and pairs, 4 to 8 rows 0.1-1.0 ms (``benchmarks/batch_rows.py``), as its
    decode steps of 2-3 rows take a slower path than 4. One constant fitted on 2-4 rows priced
    the overloaded runs' 8-row batches 20-25% high. Its levels are every row count from 2 to
    the engine's batch limit, and replace the fitted term where they are measured.

    Past the last level the term stays there; below the first (and at one row) it is the
    fitted one.

    Where the levels' own times are kept (``seconds``, with ``pair_s``: an engine that runs
    each request over its own tokens, vLLM), a batch of at least the first level's rows and
    tokens is priced from them instead (``levels_s``): the levels' time at the batch's new
    tokens (linear between them, along the last two past the last), plus its query-key pairs
    beyond a level's at ``pair_s`` a pair. Why: the term above is the level's time less the
    grid's price of its tokens and pairs, and that price of many short rows is the
    single request of all their tokens less the pairs they do not compute, priced at the
    grid's rate per cached token, ``T(0, b) - (T(|a|, b) - T(0, b))`` at 3,072 tokens and a
    prefix of -1,408: a difference of two large numbers. On six profiles of one machine
    (2026-12-06, runs V, W and Y) that price of 64 rows of 256 tokens was 497 to 1,768 ms where
    the batch measured 961 to 1,025 ms; the term made up the difference at the levels' shape
    and missed it elsewhere (held-out wide batches 0.92-1.74x; overload steps 0.79x in run Y).
    The levels' own times were stable across the same profiles (8 rows 127-158 ms, 64 rows
    961-1,025 ms)."""

    rows: list[float]
    per_extra_request_s: list[float]
    row_new_tokens: int
    heldout: dict | None = None
    row_cached_tokens: int = 0
    # the levels' measured times and the price of a query-key pair (None: the term alone)
    seconds: list[float] | None = None
    pair_s: float | None = None

    def prices_levels(self, rows: int, new_tokens: float) -> bool:
        """Whether ``levels_s`` prices a batch of ``rows`` rows and ``new_tokens`` new tokens:
        the levels' times are kept and the batch is as wide as the first level, in rows and
        in tokens."""
        return (self.seconds is not None and self.pair_s is not None
                and rows >= self.rows[0] and new_tokens >= self.rows[0] * self.row_new_tokens)

    def levels_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]) -> float:
        """The batch priced from the levels (see the class): their time at its new tokens, plus
        ``pair_s`` for each query-key pair it computes beyond a level of as many tokens (its
        rows' own causal pairs and their cached prefixes against the levels' rows'), never
        below zero."""
        xs = [r * self.row_new_tokens for r in self.rows]
        ys = list(self.seconds)
        n = float(sum(new_tokens))
        if len(xs) == 1:
            base = ys[0] * n / xs[0]  # one level: in proportion to its tokens
        else:
            i = min(max(bisect_right(xs, n) - 1, 0), len(xs) - 2)
            base = ys[i] + (n - xs[i]) * (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        row = float(self.row_new_tokens)
        level_pairs = n * (self.row_cached_tokens + row / 2)  # each level row's, per token
        pairs = sum(b * (a + b / 2) for a, b in zip(cached_tokens, new_tokens, strict=True))
        return max(base + self.pair_s * (pairs - level_pairs), 0.0)

    def extra_s(self, rows: int, fitted_s: float) -> float:
        xs, ys = list(self.rows), list(self.per_extra_request_s)
        if xs[0] > FITTED_ROWS:
            xs, ys = [float(FITTED_ROWS), *xs], [fitted_s, *ys]
        if rows < xs[0]:
            return fitted_s
        if rows >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, rows) - 1
        w = (rows - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + w * (ys[i + 1] - ys[i])

    def to_dict(self) -> dict:
        levels = ({} if self.seconds is None else
                  {"seconds": list(self.seconds), "pair_s": self.pair_s})
        return {"rows": list(self.rows), "per_extra_request_s": list(self.per_extra_request_s),
                "row_new_tokens": self.row_new_tokens, "row_cached_tokens": self.row_cached_tokens,
                **levels, "heldout": self.heldout}


@dataclass(frozen=True)
class BatchedPrefill:
    """Time of one iteration prefilling several requests, priced on the per-request grid.

    A batch computes ``tokens`` new tokens and ``pairs`` query-key pairs (``batch_features``).
    One request of beta new tokens on alpha cached ones computes beta tokens and
    ``beta * (alpha + beta / 2)`` pairs, so the batch costs what the grid says for the single
    request with ``beta = tokens`` and ``alpha = pairs / tokens - tokens / 2``, plus
    ``per_extra_request_s`` for each request after the first, and never less than its costliest
    member alone.

    Why the grid and not separate per-token and per-pair rates: every grid point already pays
    what any iteration pays once whatever its size -- the overhead and reading the weights, the
    memory floor under small prefills -- and the dense layers and attention at their real
    efficiency for that many tokens. A linear fit of rates cannot have a floor: it priced two
    10-token prefills at half of one. Here a batch of one is exactly the grid, a batch of tiny
    prefills costs what one slightly bigger prefill does, and a big batch reaches the grid's
    compute-bound columns. ``per_extra_request_s`` (fitted, >= 0) is what each request adds
    beyond its tokens and pairs: its LM head, per-row work.

    Many short requests compute fewer pairs than one long one (alpha < 0): the missing pairs are
    priced at the rate of as many cached tokens, ``T(0, beta) - (T(|alpha|, beta) - T(0, beta))``,
    exact where time is linear in cached tokens (attention is, at a fixed beta).

    ``padding`` says what the engine computes: ``"none"`` for varlen kernels (vLLM: each request
    its own tokens and pairs), ``"left"`` for engines that left-pad the batch to its longest
    cached prefix and longest new segment, where every row costs what the longest does, and
    ``"left_masked"`` for the torch reference engine, which left-pads too and hides the padding
    with a 2-D mask: an attention kernel given a mask cannot skip the causal half, so every row
    computes the full rectangle of longest-new queries by longest-cached + longest-new keys.
    A single request with a cached prefix takes that masked path as well (its queries and keys
    differ in length), computing ``beta * (alpha + beta)`` pairs, so a masked batch is priced on
    the grid's columns with cached tokens; only ``T(0, beta)``, a request with nothing cached,
    runs the causal fast path (measured on the CPU engine: T(1, 1024) is 15% above T(0, 1024)),
    and so does a batch of equal uncached rows, which needs no mask.
    """

    grid: BilinearGrid
    padding: str = "none"
    per_extra_request_s: float = 0.0
    heldout_median_error: float | None = None
    heldout_max_error: float | None = None
    fit: dict = field(default_factory=dict)
    wide: WideBatches | None = None  # batches of many rows, measured (vLLM's profiles)

    def equivalent_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]
                     ) -> float:
        """The grid's time for the one request computing the batch's tokens and pairs."""
        tokens, pairs = batch_features(cached_tokens, new_tokens, self.padding)
        if tokens <= 0:
            return 0.0
        at = self.grid.at
        if self.padding == "left_masked":
            return self._masked_engine_s(cached_tokens, new_tokens, tokens, pairs)
        alpha = pairs / tokens - tokens / 2
        if alpha >= 0:
            return at(alpha, tokens)
        none_cached = at(0.0, tokens)
        return max(2 * none_cached - at(-alpha, tokens), 0.0)

    def _masked_engine_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float],
                         tokens: float, pairs: float) -> float:
        """``equivalent_s`` for the torch engine's two attention paths.

        A masked batch is the masked request of ``tokens`` new tokens and ``pairs`` rectangle
        pairs, ``beta (alpha + beta)``; an unmasked one (equal uncached rows) the causal fast
        path's ``T(0, tokens)`` less the pairs it does not compute, ``beta^2 / 2 - pairs``.
        Pairs missing below a column are priced at the masked columns' rate per cached token
        (linear at a fixed beta, as attention is), never across the jump between T(0, .) and
        T(1, .), which is the kernel switching paths, not the cost of one cached token.
        """
        at, first = self.grid.at, self._first_masked_column()
        if masked(cached_tokens, new_tokens):
            alpha = pairs / tokens - tokens
            if alpha >= first:
                return at(alpha, tokens)
            anchor, missing = at(first, tokens), first - alpha
        else:
            alpha = pairs / tokens - tokens / 2
            if alpha >= 0:
                return at(alpha, tokens)
            anchor, missing = at(0.0, tokens), -alpha
        return max(anchor - (at(first + missing, tokens) - at(first, tokens)), 0.0)

    def _first_masked_column(self) -> float:
        """The fewest cached tokens the grid measured on the masked path (1 in the profiler's
        plans); 0 if it measured none."""
        return min((float(x) for x in self.grid.x_axis if x > 0), default=0.0)

    def iteration_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]) -> float:
        at = self.grid.at
        costliest = max(at(a, b) for a, b in zip(cached_tokens, new_tokens, strict=True))
        if len(new_tokens) == 1:
            return costliest
        if self._padded_beyond_grid(new_tokens):
            return self._padded_rows_s(cached_tokens, new_tokens)
        rows = len(new_tokens)
        if (self.wide is not None and self.padding == "none"
                and self.wide.prices_levels(rows, sum(new_tokens))):
            return max(self.wide.levels_s(cached_tokens, new_tokens), costliest)
        return max(self.tokens_and_pairs_s(cached_tokens, new_tokens)
                   + self._per_request_s(rows) * (rows - 1), costliest)

    def tokens_and_pairs_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]
                           ) -> float:
        """The batch's tokens and pairs priced on the grid (without the per-request term):
        its equivalent request, or for a varlen batch of more new tokens than the grid
        measured, grid-sized groups of its rows."""
        if self.padding == "none" and sum(new_tokens) > max(self.grid.y_axis):
            return self._grid_sized_groups_s(cached_tokens, new_tokens)
        return self.equivalent_s(cached_tokens, new_tokens)

    def _grid_sized_groups_s(self, cached_tokens: Sequence[float],
                             new_tokens: Sequence[float]) -> float:
        """A varlen batch with more new tokens than the grid measured, priced as consecutive
        groups of its rows that each fit the grid, the step's fixed cost (``T(0, 1)``) paid
        once. Its equivalent single request would lie far past the grid (a CPU vLLM step of
        57 prompts of ~290 tokens: 16,384 tokens with the pairs of a prefix of -8,000), where
        the extrapolated price fell to 21 ms for a step vLLM ran in 376-888 ms; each group's
        equivalent request is one the grid was measured around. Rows are grouped in order;
        a row larger than the grid is a group of its own."""
        limit = max(self.grid.y_axis)
        groups: list[tuple[list[float], list[float]]] = [([], [])]
        for a, b in zip(cached_tokens, new_tokens, strict=True):
            if groups[-1][1] and sum(groups[-1][1]) + b > limit:
                groups.append(([], []))
            groups[-1][0].append(a)
            groups[-1][1].append(b)
        seconds = sum(max(self.equivalent_s(a, b), *(self.grid.at(x, y) for x, y in
                                                      zip(a, b, strict=True)))
                      for a, b in groups)
        return seconds - (len(groups) - 1) * self.grid.at(0.0, 1.0)

    def _padded_beyond_grid(self, new_tokens: Sequence[float]) -> bool:
        """A padded batch whose equivalent single request (rows x longest new tokens) lies past
        the grid's new tokens: pricing it would extrapolate the grid several times its size."""
        return (self.padding in ("left", "left_masked")
                and len(new_tokens) * max(new_tokens) > max(self.grid.y_axis))

    def _padded_rows_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]
                       ) -> float:
        """Every row of a padded batch as a request of the padded shape (the longest cached and
        new lengths; on the masked path where the batch is masked), the step's fixed cost paid
        once and each row after the first its per-request term, as a batch on the grid pays
        them. Used past the grid, where the equivalent request cannot be priced: an overloaded
        CPU run's 8-row batches of ~3,000 tokens took 14x what the extrapolated equivalent
        request predicted, and about this (each row costs what it computes).

        The fixed cost is the grid's one-token step on the rows' column, ``T(a, 1)``: every
        grid point pays it once (the weights read, the step's own overhead). Counted once a
        row, as this did before 2026-12-07, it priced a RAG burst's eight rows of 150-700 new
        tokens 9-10% above the engine's time, timed again apart from the runs
        (``benchmarks/run_batches.py``, docs/validation.md, run AJ)."""
        longest_cached, longest_new = max(cached_tokens), max(new_tokens)
        if self.padding == "left_masked" and masked(cached_tokens, new_tokens):
            longest_cached = max(longest_cached, self._first_masked_column())
        rows = len(new_tokens)
        fixed = min(self.grid.at(longest_cached, 1.0), self.grid.at(longest_cached, longest_new))
        return rows * self.grid.at(longest_cached, longest_new) + (rows - 1) * (
            self._per_request_s(rows) - fixed)

    def _per_request_s(self, rows: int) -> float:
        """What each request after the first adds to a batch of ``rows``: the fitted term, or
        where the profile measured levels by row count, that count's."""
        return (self.per_extra_request_s if self.wide is None
                else self.wide.extra_s(rows, self.per_extra_request_s))

    def describe(self) -> str:
        """One line for people (``ragsim profiles show``)."""
        if self.heldout_median_error is None or self.heldout_max_error is None:
            held = "held-out error not known (no held-out batches: regenerate or remeasure)"
        else:
            held = (f"held-out error median {self.heldout_median_error:.1%}, max "
                    f"{self.heldout_max_error:.1%} over {self.fit.get('heldout_points', '?')} "
                    f"batches")
        fitted = f"{self.per_extra_request_s * 1e3:.3g} ms per extra request"
        term = fitted
        if self.wide is not None:
            levels = ", ".join(f"{e * 1e3:.3g} ms at {r:g} rows" for r, e in
                               zip(self.wide.rows, self.wide.per_extra_request_s, strict=True))
            term = (f"per extra request by row count: {levels} (fitted on random batches: "
                    f"{fitted}, not used)" if self.wide.rows[0] <= 2
                    else f"{fitted} (measured by row count: {levels})")
        wide = ""
        if self.wide is not None and self.wide.seconds is not None and self.padding == "none":
            w = self.wide
            wide = (f"; from {w.rows[0]:g} rows and {w.rows[0] * w.row_new_tokens:g} tokens, "
                    f"the measured levels' time at the batch's tokens ("
                    + ", ".join(f"{s * 1e3:.3g} ms at {r * w.row_new_tokens:g}" for r, s in
                                zip(w.rows, w.seconds, strict=True))
                    + f") + {w.pair_s * 1e9:.3g} ns a query-key pair past theirs")
        return (f"batched prefill: the prefill grid's time for one request with the batch's "
                f"tokens and query-key pairs ({self.padding} padding), + {term}, at least "
                f"the costliest request alone{wide}; {held}")

    def to_dict(self) -> dict:
        out = {"model": BATCH_MODEL, "padding": self.padding,
               "per_extra_request_s": self.per_extra_request_s,
               "heldout_median_error": self.heldout_median_error,
               "heldout_max_error": self.heldout_max_error, "fit": self.fit}
        if self.wide is not None:
            out["wide"] = self.wide.to_dict()
        return out


def batch_features(cached_tokens: Sequence[float], new_tokens: Sequence[float],
                   padding: str = "none") -> tuple[float, float]:
    """(tokens computed, query-key pairs computed) by one batched prefill iteration."""
    if padding == "left_masked" and masked(cached_tokens, new_tokens):
        rows, longest_new = len(new_tokens), max(new_tokens)
        return rows * longest_new, rows * longest_new * (max(cached_tokens) + longest_new)
    if padding in ("left", "left_masked"):
        rows = len(new_tokens)
        longest_new, longest_cached = max(new_tokens), max(cached_tokens)
        return (rows * longest_new,
                rows * longest_new * (longest_cached + longest_new / 2))
    tokens = float(sum(new_tokens))
    pairs = float(sum(b * (a + b / 2) for a, b in zip(cached_tokens, new_tokens, strict=True)))
    return tokens, pairs


def masked(cached_tokens: Sequence[float], new_tokens: Sequence[float]) -> bool:
    """Whether the torch reference engine runs this batch's attention with a mask: when any
    request has a cached prefix or the new segments differ (padding). Only equal uncached rows
    keep the causal fast path."""
    return max(cached_tokens) > 0 or len(set(new_tokens)) > 1


@dataclass(frozen=True)
class Transfers:
    """Host <-> GPU copies of KV blocks: ``latency + bytes / bandwidth``."""

    host_to_device_bytes_per_s: float
    host_to_device_latency_s: float
    device_to_host_bytes_per_s: float
    device_to_host_latency_s: float

    def host_to_device_s(self, n_bytes: float) -> float:
        if n_bytes <= 0:
            return 0.0
        return self.host_to_device_latency_s + n_bytes / self.host_to_device_bytes_per_s

    def device_to_host_s(self, n_bytes: float) -> float:
        if n_bytes <= 0:
            return 0.0
        return self.device_to_host_latency_s + n_bytes / self.device_to_host_bytes_per_s

    def to_dict(self) -> dict:
        return {"host_to_device_bytes_per_s": self.host_to_device_bytes_per_s,
                "host_to_device_latency_s": self.host_to_device_latency_s,
                "device_to_host_bytes_per_s": self.device_to_host_bytes_per_s,
                "device_to_host_latency_s": self.device_to_host_latency_s}


@dataclass
class Profile:
    name: str
    hardware: dict
    model: ModelSpec
    dtype: str
    tensor_parallel: int
    engine: str
    obtained: dict
    kv_capacity_bytes: int
    overhead_s: float
    prefill: BilinearGrid
    batched_prefill: BatchedPrefill
    decode: BilinearGrid
    transfers: Transfers
    blend_selection_s_per_token: float | None = None
    mixed_steps: MixedSteps | None = None
    step_overhead: StepOverhead | None = None
    new_shapes: NewShapes | None = None  # a step's first-time price (``new_shapes.py``)
    idle_start: IdleStart | None = None  # a step after the engine sat idle (``idle_start.py``)
    # a decode step right after a step with prompts (``decode_after_prompt.py``)
    decode_after_prompt: DecodeAfterPrompt | None = None
    # how the engine's decode step lays out its rows (``decode_layout.py``): "none", each row
    # over its own context (a paged engine; the step priced at the rows' mean), or
    # "common_end", one batch padded to a common end (the torch engine; priced there)
    decode_padding: str = "none"
    # what a change of that padded batch costs to write (``batch_copy.py``; None: not measured)
    batch_copy: BatchCopy | None = None

    # -- the questions a simulator asks ----------------------------------------------------
    def prefill_s(self, cached_tokens: float, new_tokens: float) -> float:
        return self.prefill.at(cached_tokens, new_tokens)

    def decode_s(self, batch_size: float, context_tokens: float) -> float:
        return self.decode.at(batch_size, context_tokens)

    def decode_context_tokens(self, mean_context_tokens: float,
                              padded_context_tokens: float | None) -> float:
        """The context a decode step is priced at: its rows' mean or, where the engine pads
        its batch to a common end (``decode_padding``: the torch engine), that end, where it is
        known (``decode_layout.PaddedDecodeBatch``)."""
        if self.decode_padding == "common_end" and padded_context_tokens is not None:
            return padded_context_tokens
        return mean_context_tokens

    def prefill_pass_s(self, cached_tokens: Sequence[float], new_tokens: Sequence[float]
                       ) -> float:
        """A prefill iteration's timed pass: one request from the T(alpha, beta) grid, a
        batch from the batched-prefill model (priced on that grid)."""
        if len(cached_tokens) == 1:
            return self.prefill.at(cached_tokens[0], new_tokens[0])
        return self.batched_prefill.iteration_s(list(cached_tokens), list(new_tokens))

    def prefill_pass_quote_s(self, cached_tokens: Sequence[float],
                             new_tokens: Sequence[float]) -> float:
        """``prefill_pass_s`` asked by a decision about a pass that may never run (a padded
        batcher weighing a join: ``cache/padded_batches.py``): not counted among the grids'
        extrapolations, which say how often a run's priced steps left the measured region."""
        grid = self.prefill
        before = grid.extrapolated_queries
        try:
            return self.prefill_pass_s(cached_tokens, new_tokens)
        finally:
            grid.extrapolated_queries = before

    def idle_start_s(self, idle_s: float) -> float:
        """What a step begun ``idle_s`` seconds after its engine's last step ended pays beyond
        its price (``idle_start``: a cold start; ``inf``: no step before it); 0 for a profile
        without the term."""
        return 0.0 if self.idle_start is None else self.idle_start.seconds(idle_s)

    def batch_copy_s(self, rows: int, row_tokens: float) -> float:
        """What a decode step that changes its padded batch pays to write ``rows`` rows of it,
        ``row_tokens`` in all (``batch_copy``), before its forward pass; 0 for a profile
        without the term."""
        return 0.0 if self.batch_copy is None else self.batch_copy.seconds(rows, row_tokens)

    def step_overhead_s(self, rows: int, prompt_rows: int = 0) -> float:
        """What a step of ``rows`` rows, ``prompt_rows`` of them prompts, spends outside its
        timed pass (sampling, handing each row's token back, a prompt's own work around the
        pass): ``step_overhead``; 0 for a profile without one."""
        return 0.0 if self.step_overhead is None else self.step_overhead.seconds(rows,
                                                                                 prompt_rows)

    def mixed_step_s(self, chunk_cached_tokens: Sequence[float],
                     chunk_new_tokens: Sequence[float], decode_batch_size: int,
                     mean_context_tokens: float) -> float:
        """One mixed step: prompt chunks (each ``new`` tokens over ``cached`` ones) prefilled
        and ``decode_batch_size`` running requests decoded in one pass.

        With measured ``mixed_steps``: the chunks' batched prefill plus the measured increment
        of the decode rows at the step's chunk tokens (``MixedSteps``). Without: additive, the
        chunks' batched prefill plus a decode step, which pays a step's fixed cost and the
        weight reads twice (an upper bound). The step overhead is charged once, for every row
        of the step."""
        if not len(chunk_new_tokens):
            return self.decode.at(decode_batch_size, mean_context_tokens) + \
                self.step_overhead_s(decode_batch_size)
        cached, context = chunk_cached_tokens, mean_context_tokens
        if (self.mixed_steps is not None and decode_batch_size
                and self.batched_prefill.padding == "left_masked"):
            # the torch engine pads every row to the longest cached prefix and the longest new
            # segment, under a mask: the step computes what its increments were measured on
            # (a chunk on a 1-token prefix beside decode rows of C cached tokens, every row
            # padded to C) at C = the longest cached length of its rows. So the chunks are
            # priced on the masked path without their prefixes, and the increment at C carries
            # every row's attention over the padded prefix (the chunk's own included).
            first = self.batched_prefill._first_masked_column()
            context = max(context, max(chunk_cached_tokens))
            cached = [first] * len(chunk_cached_tokens)
        compute = self.prefill_pass_s(cached, chunk_new_tokens)
        if decode_batch_size:
            if self.mixed_steps is None:
                compute += self.decode.at(decode_batch_size, mean_context_tokens)
            else:
                compute += self.mixed_steps.increment_s(decode_batch_size, context,
                                                        sum(chunk_new_tokens))
        return compute + self.step_overhead_s(len(chunk_new_tokens) + decode_batch_size,
                                              len(chunk_new_tokens))

    @property
    def extrapolated_queries(self) -> int:
        mixed = self.mixed_steps.extrapolated_queries if self.mixed_steps else 0
        return self.prefill.extrapolated_queries + self.decode.extrapolated_queries + mixed

    @property
    def kind(self) -> str:
        return str(self.obtained.get("kind", ""))

    @property
    def warnings(self) -> list[str]:
        """Where this profile misses its accuracy targets (``obtained.warnings``)."""
        found = self.obtained.get("warnings", [])
        return [str(w) for w in found] if isinstance(found, list) else [str(found)]

    def scaled_compute(self, factor: float) -> Profile:
        """This profile on a machine ``factor`` times slower at compute: prefill, decode, the
        batch term and the per-iteration overhead scaled, copies unchanged. What a validation
        compares with when a speed probe found the machine slower or faster than when the
        profile was measured (a shared machine drifts)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be a finite number > 0, got {factor}")
        data = self.to_dict()
        for grid in ("prefill", "decode"):
            data[grid]["seconds"] = [[v * factor for v in row] for row in data[grid]["seconds"]]
        data["batched_prefill"]["per_extra_request_s"] *= factor
        if self.batched_prefill.wide is not None:
            wide = data["batched_prefill"]["wide"]
            wide["per_extra_request_s"] = [e * factor for e in wide["per_extra_request_s"]]
            if wide.get("seconds") is not None:
                wide["seconds"] = [s * factor for s in wide["seconds"]]
                wide["pair_s"] = wide["pair_s"] * factor
        data["overhead_s"] *= factor
        if self.mixed_steps is not None:
            data["mixed_steps"] = self.mixed_steps.scaled(factor).to_dict()
        if self.step_overhead is not None:
            data["step_overhead"] = self.step_overhead.scaled(factor).to_dict()
        if self.new_shapes is not None:
            data["new_shapes"] = self.new_shapes.scaled(factor).to_dict()
        if self.idle_start is not None:
            data["idle_start"] = self.idle_start.scaled(factor).to_dict()
        if self.decode_after_prompt is not None:
            data["decode_after_prompt"] = self.decode_after_prompt.scaled(factor).to_dict()
        data["name"] = f"{self.name}@x{factor:.3f}"
        scaled = Profile.from_dict(data, source=f"{self.name} scaled x{factor:.3f}")
        return scaled.warmed(self.new_shapes.warm_step_tokens) if self.new_shapes else scaled

    def warmed(self, step_tokens) -> Profile:
        """This profile pricing an engine that has already run steps of ``step_tokens`` tokens
        (``NewShapes.warmed``: their first-time price is paid); itself without ``new_shapes``."""
        if self.new_shapes is None:
            return self
        return replace(self, new_shapes=self.new_shapes.warmed(step_tokens))

    def scaled_copies(self, factor: float) -> Profile:
        """This profile with host <-> GPU copies ``factor`` times slower (bandwidths divided by
        it, latencies multiplied): what a run's result would be on a slower PCIe path."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be a finite number > 0, got {factor}")
        data = self.to_dict()
        for way in ("host_to_device", "device_to_host"):
            data["transfers"][f"{way}_bytes_per_s"] /= factor
            data["transfers"][f"{way}_latency_s"] *= factor
        data["name"] = f"{self.name}@copy/{factor:g}"
        return Profile.from_dict(data, source=f"{self.name} copies x{factor:g} slower")

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        model = self.model.to_dict()
        model.pop("kv_bytes_per_token", None)
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "hardware": self.hardware,
            "model": model,
            "dtype": self.dtype,
            "tensor_parallel": self.tensor_parallel,
            "engine": self.engine,
            "obtained": self.obtained,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "overhead_s": self.overhead_s,
            "prefill": self.prefill.to_dict(),
            "batched_prefill": self.batched_prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "transfers": self.transfers.to_dict(),
            **({} if self.blend_selection_s_per_token is None
               else {"blend_selection_s_per_token": self.blend_selection_s_per_token}),
            **({} if self.mixed_steps is None else {"mixed_steps": self.mixed_steps.to_dict()}),
            **({} if self.step_overhead is None
               else {"step_overhead": self.step_overhead.to_dict()}),
            **({} if self.new_shapes is None else {"new_shapes": self.new_shapes.to_dict()}),
            **({} if self.idle_start is None else {"idle_start": self.idle_start.to_dict()}),
            **({} if self.decode_after_prompt is None
               else {"decode_after_prompt": self.decode_after_prompt.to_dict()}),
            **({} if self.decode_padding == "none"
               else {"decode_padding": self.decode_padding}),
            **({} if self.batch_copy is None else {"batch_copy": self.batch_copy.to_dict()}),
        }

    def save(self, path: str | Path) -> Path:
        return write_text_atomically(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<profile>") -> Profile:
        if not isinstance(data, dict):
            raise ProfileError("expected a JSON object", file=source)
        if data.get("format") != FORMAT_NAME:
            raise ProfileError(f"expected {FORMAT_NAME!r}, got {data.get('format')!r}",
                               file=source, field="format")
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise ProfileError(f"unsupported version {version!r}; this ragsim reads versions "
                               f"{', '.join(map(str, READABLE_VERSIONS))}: regenerate the file "
                               f"with this ragsim ('profiles derive' or 'profile')",
                               file=source, field="version")
        unknown = sorted(set(data) - set(_TOP_KEYS) - set(_OPTIONAL_KEYS))
        if unknown:
            raise ProfileError(f"unknown key(s) {unknown}", file=source, field=unknown[0])
        for key in _TOP_KEYS:
            if key not in data:
                raise ProfileError("missing", file=source, field=key)
        name = str(data["name"])
        model = _model(data["model"], name, source)
        tp = _number(data, "tensor_parallel", source, integer=True, minimum=1)
        prefill = _grid(data["prefill"], name=name, x_name="cached_tokens",
                        y_name="new_tokens", source=source, field="prefill")
        overhead_s = _number(data, "overhead_s", source)
        cheapest_s = min(min(row) for row in prefill.values)
        if overhead_s > cheapest_s * (1 + 1e-9):
            # the grids are what the simulator reads, and every point of them already pays
            # the overhead (derived: overhead + roofline; measured: wall times): a larger
            # value would change nothing, so it is a mistake, not a setting
            raise ProfileError(
                f"is {overhead_s:.4g} s, more than the cheapest prefill iteration of the grid "
                f"({cheapest_s:.4g} s): it records the fixed cost every grid point already "
                "includes, so it cannot exceed one; change the grids to change costs",
                file=source, field="overhead_s")
        return cls(
            name=name,
            hardware=_object(data, "hardware", source),
            model=model,
            dtype=str(data["dtype"]),
            tensor_parallel=int(tp),
            engine=str(data["engine"]),
            obtained=_object(data, "obtained", source),
            # bytes are summed in 64-bit integers: an exbibyte of KV is past any GPU
            # no KV room: no request could ever run (a profile of a model that does not fit)
            kv_capacity_bytes=int(_number(data, "kv_capacity_bytes", source, integer=True,
                                          minimum=1, maximum=2**60)),
            overhead_s=overhead_s,
            prefill=prefill,
            batched_prefill=_batched(data["batched_prefill"], prefill, int(version), source),
            decode=_grid(data["decode"], name=name, x_name="batch_sizes",
                         y_name="context_tokens", source=source, field="decode"),
            transfers=_transfers(data["transfers"], source),
            blend_selection_s_per_token=(
                None if data.get("blend_selection_s_per_token") is None
                else _number(data, "blend_selection_s_per_token", source)),
            mixed_steps=(None if data.get("mixed_steps") is None
                         else mixed_steps_from_dict(data["mixed_steps"], name=name,
                                                    source=source)),
            step_overhead=(None if data.get("step_overhead") is None
                           else step_overhead_from_dict(data["step_overhead"], source=source)),
            new_shapes=(None if data.get("new_shapes") is None
                        else new_shapes_from_dict(data["new_shapes"], source=source)),
            idle_start=(None if data.get("idle_start") is None
                        else idle_start_from_dict(data["idle_start"], source=source)),
            decode_after_prompt=(
                None if data.get("decode_after_prompt") is None
                else decode_after_prompt_from_dict(data["decode_after_prompt"], source=source)),
            decode_padding=_decode_padding(data, source),
            batch_copy=(None if data.get("batch_copy") is None
                        else batch_copy_from_dict(data["batch_copy"], source=source)),
        )


def _decode_padding(data: dict, source: str) -> str:
    value = data.get("decode_padding", "none")
    if value not in DECODE_PADDINGS:
        raise ProfileError(f"is {value!r}; one of {', '.join(DECODE_PADDINGS)} (how the "
                           "engine's decode step lays out its rows)", file=source,
                           field="decode_padding")
    return value


def _grid(data: object, *, source: str, field: str, **names: str) -> BilinearGrid:
    try:
        return BilinearGrid.from_dict(data, source=source, field=field, **names)
    except OverflowError as exc:  # a JSON integer past a float's range: its checks raise this
        raise ProfileError(f"holds a number past a float's range ({exc})", file=source,
                           field=field) from exc


def _object(data: dict, key: str, source: str) -> dict:
    value = data[key]
    if not isinstance(value, dict):
        raise ProfileError("must be an object", file=source, field=key)
    return value


def _number(data: dict, key: str, source: str, *, integer: bool = False,
            minimum: float = 0.0, maximum: float = math.inf, prefix: str = "") -> float:
    value = data.get(key)
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"must be {kind}, got {value!r}", file=source, field=prefix + key)
    try:
        number = float(value)
    except OverflowError:  # a JSON integer past a float's range
        number = math.inf
    if integer and math.isfinite(number) and not number.is_integer():
        raise ProfileError(f"must be {kind}, got {value!r}", file=source, field=prefix + key)
    if number > maximum:
        raise ProfileError(f"must be <= {maximum:g}, got {value!r}", file=source,
                           field=prefix + key)
    if not math.isfinite(number) or number < minimum:
        raise ProfileError(f"must be finite and >= {minimum:g}, got {value!r}", file=source,
                           field=prefix + key)
    return number


# a model's sizes: positive integers (a string or a list once loaded, sizing KV as text)
_MODEL_SIZES = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
                "intermediate_size", "vocab_size", "num_experts", "experts_per_token")


def _model(data: object, name: str, source: str) -> ModelSpec:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="model")
    for key in _MODEL_SIZES:
        if key in data and not (isinstance(data[key], int) and not isinstance(data[key], bool)
                                and 1 <= data[key] < 2**31):
            raise ProfileError(f"must be a positive integer, got {data[key]!r}", file=source,
                               field=f"model.{key}")
    for key in ("name", "dtype"):
        if key in data and not isinstance(data[key], str):
            raise ProfileError(f"must be a string, got {data[key]!r}", file=source,
                               field=f"model.{key}")
    if data.get("dtype", "fp16") not in DTYPE_BYTES:
        raise ProfileError(f"unknown dtype {data['dtype']!r}; known: {sorted(DTYPE_BYTES)}",
                           file=source, field="model.dtype")
    try:
        return ModelSpec(**{k: v for k, v in data.items() if k != "kv_bytes_per_token"})
    except TypeError as exc:
        raise ProfileError(f"not a model architecture: {exc}", file=source,
                           field="model") from exc


def _batched(data: object, grid: BilinearGrid, version: int, source: str) -> BatchedPrefill:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="batched_prefill")
    p = "batched_prefill."
    expected = "separable" if version == 1 else BATCH_MODEL
    if data.get("model") != expected:
        raise ProfileError(f"unknown model {data.get('model')!r}; version {version} files "
                           f"have {expected!r}", file=source, field=p + "model")
    padding = data.get("padding", "none")
    if padding not in PADDINGS:
        raise ProfileError(f"unknown padding {padding!r}; known: "
                           f"{', '.join(map(repr, PADDINGS))}", file=source, field=p + "padding")
    if version == 1:
        # the rates of the separable model cannot be reused; the grid is the same
        return BatchedPrefill(grid, padding, fit={
            "upgraded_from": "format version 1 (separable model): no fitted per-request "
            "term and no held-out error; regenerate or remeasure the profile for them"})
    fit = data.get("fit", {})
    if not isinstance(fit, dict):
        raise ProfileError("must be an object", file=source, field=p + "fit")
    errors = {}
    for key in ("heldout_median_error", "heldout_max_error"):
        errors[key] = None if data.get(key) is None else _number(data, key, source, prefix=p)
    return BatchedPrefill(
        grid, padding,
        per_extra_request_s=_number(data, "per_extra_request_s", source, prefix=p,
                                    minimum=-math.inf),
        fit=fit, wide=_wide(data.get("wide"), source), **errors)


def _wide(data: object, source: str) -> WideBatches | None:
    if data is None:
        return None
    p = "batched_prefill.wide."
    if not isinstance(data, dict):
        raise ProfileError("must be an object or null", file=source, field=p[:-1])
    rows, extras = data.get("rows"), data.get("per_extra_request_s")
    for key, values in (("rows", rows), ("per_extra_request_s", extras)):
        if not isinstance(values, list) or not values or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in values):
            raise ProfileError("must be a non-empty list of finite numbers >= 0", file=source,
                               field=p + key)
    if len(rows) != len(extras):
        raise ProfileError(f"has {len(extras)} entries but rows has {len(rows)}",
                           file=source, field=p + "per_extra_request_s")
    if rows[0] < 2 or any(b <= a for a, b in pairwise(rows)):
        raise ProfileError("must increase strictly from 2 rows or more", file=source,
                           field=p + "rows")
    heldout = data.get("heldout")
    if heldout is not None and not isinstance(heldout, dict):
        raise ProfileError("must be an object or null", file=source, field=p + "heldout")
    cached = (int(_number(data, "row_cached_tokens", source, prefix=p))
              if "row_cached_tokens" in data else 0)  # optional: files before it had none
    levels = {}
    if data.get("seconds") is not None:  # optional: files before it kept the term alone
        seconds = data["seconds"]
        if not isinstance(seconds, list) or len(seconds) != len(rows) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0 for v in seconds):
            raise ProfileError(f"must be a list of {len(rows)} finite numbers > 0 (one per "
                               "level)", file=source, field=p + "seconds")
        levels = {"seconds": [float(v) for v in seconds],
                  "pair_s": _number(data, "pair_s", source, prefix=p)}
    return WideBatches([float(r) for r in rows], [float(e) for e in extras],
                       int(_number(data, "row_new_tokens", source, prefix=p)), heldout, cached,
                       **levels)


def _transfers(data: object, source: str) -> Transfers:
    if not isinstance(data, dict):
        raise ProfileError("must be an object", file=source, field="transfers")
    p = "transfers."
    bandwidths = {k: _number(data, k, source, prefix=p) for k in (
        "host_to_device_bytes_per_s", "device_to_host_bytes_per_s")}
    for key, value in bandwidths.items():
        if value <= 0:
            raise ProfileError("bandwidth must be > 0", file=source, field=p + key)
    return Transfers(
        host_to_device_bytes_per_s=bandwidths["host_to_device_bytes_per_s"],
        host_to_device_latency_s=_number(data, "host_to_device_latency_s", source, prefix=p),
        device_to_host_bytes_per_s=bandwidths["device_to_host_bytes_per_s"],
        device_to_host_latency_s=_number(data, "device_to_host_latency_s", source, prefix=p),
    )


# --------------------------------------------------------------------------- shipped files
def _data_folder():
    return resources.files("ragsim.profiles") / "data"


def shipped_profile_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in _data_folder().iterdir()
                  if p.name.endswith(".json"))


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (``a10g-mistral-7b``) or a JSON file by path."""
    from ragsim.user_files import parse_json, read_user_text

    path = Path(name_or_path)
    if path.exists() or path.is_symlink():
        source = str(path)
        text = read_user_text(path, what="profile", error=ProfileError)
    elif name_or_path in shipped_profile_names():
        text = (_data_folder() / f"{name_or_path}.json").read_text()
        source = name_or_path
    else:
        raise ProfileError(
            f"no such file, and not a shipped profile; shipped: {shipped_profile_names()}",
            file=name_or_path)
    data = parse_json(text, source=source, error=ProfileError)
    return Profile.from_dict(data, source=source)


class Batches(NamedTuple):
    """Timed batched-prefill iterations: batch i prefilled ``new[i][r]`` tokens on
    ``cached[i][r]`` for each request r and took ``seconds[i]``."""

    cached: list[list[float]]
    new: list[list[float]]
    seconds: list[float]


def pair_price_s(grid: BilinearGrid, new_tokens: float) -> float:
    """What one query-key pair costs, from ``grid``: a request of ``new_tokens`` new tokens
    over its longest measured prefix against none, per pair the prefix adds (each cached token
    adds ``new_tokens`` pairs; over the whole axis, so that one noisy cell moves it little).
    Never below zero."""
    longest = max(float(x) for x in grid.x_axis)
    if longest <= 0 or new_tokens <= 0:
        return 0.0
    return max((grid.at(longest, new_tokens) - grid.at(0.0, new_tokens))
               / (longest * new_tokens), 0.0)


def with_wide_batches(model: BatchedPrefill, rows: Sequence[int], seconds: Sequence[float],
                      row_new_tokens: int, heldout: Batches | None = None, *,
                      row_cached_tokens: int = 0, batches: Batches | None = None
                      ) -> BatchedPrefill:
    """``model`` with the per-request term measured by row count: ``seconds[i]`` the time of
    ``rows[i]`` rows of ``row_new_tokens`` new tokens on ``row_cached_tokens`` cached ones, less
    the grid's price of their tokens and pairs, per extra request (at least zero); judged on
    ``heldout`` batches (their predicted / measured summary in ``wide.heldout``).

    Levels at or below ``FITTED_ROWS`` change the price of the random batches the term was
    fitted on and judged with; ``batches`` (the fitted and the held-out ones, in that order:
    ``(fitted, heldout)``) are then judged again, so the model's errors are those of the model
    as used."""
    before = model.grid.extrapolated_queries
    extras = []
    for n, y in zip(rows, seconds, strict=True):
        base = model.tokens_and_pairs_s([float(row_cached_tokens)] * n,
                                        [float(row_new_tokens)] * n)
        extras.append(max((y - base) / (n - 1), 0.0))
    levels = {}
    if model.padding == "none" and min(rows) > FITTED_ROWS:
        # wide levels on an engine that runs each request over its own tokens (vLLM's plan):
        # such batches priced from the levels' times (``WideBatches.levels_s``)
        levels = {"seconds": [float(y) for y in seconds],
                  "pair_s": pair_price_s(model.grid, float(row_new_tokens))}
    wide = WideBatches([float(n) for n in rows], extras, int(row_new_tokens),
                       row_cached_tokens=int(row_cached_tokens), **levels)
    widened = replace(model, wide=wide)
    if heldout is not None and heldout.seconds:
        summary = ratio_summary([widened.iteration_s(a, b) for a, b in
                                 zip(heldout.cached, heldout.new, strict=True)],
                                heldout.seconds)
        widened = replace(widened, wide=replace(wide, heldout=summary))
    if batches is not None and min(rows) <= FITTED_ROWS:
        widened = _judged_again(widened, *batches)
    model.grid.extrapolated_queries = before  # fitting is not a simulation's lookup
    return widened


def _judged_again(model: BatchedPrefill, fitted: Batches, heldout: Batches) -> BatchedPrefill:
    """``model``'s errors on its fitted and held-out random batches, priced as it prices them
    now (``fit`` keeps what it says the batches were)."""
    def errors(batches: Batches) -> list[float]:
        return relative_errors([model.iteration_s(a, b) for a, b in
                                zip(batches.cached, batches.new, strict=True)], batches.seconds)

    fit_median, fit_max = median_and_max(errors(fitted))
    held_median, held_max = median_and_max(errors(heldout))
    return replace(model, heldout_median_error=held_median, heldout_max_error=held_max,
                   fit={**model.fit, "median_rel_error": fit_median, "max_rel_error": fit_max})


def fit_batched_prefill(grid: BilinearGrid, padding: str, fitted: Batches, heldout: Batches,
                        *, fitted_against: str, heldout_against: str) -> BatchedPrefill:
    """The batch model on ``grid``: its one term fitted to ``fitted``, judged on ``heldout``.

    ``per_extra_request_s`` minimises the relative error of the unclamped model (weighted least
    squares, closed form, then at least zero); its errors, on both sets, are those of the model
    as used.
    """
    before = grid.extrapolated_queries
    base = BatchedPrefill(grid, padding)
    extra = [len(b) - 1 for b in fitted.new]
    gap = [y - base.tokens_and_pairs_s(a, b) for a, b, y in zip(*fitted, strict=True)]
    num = sum(g * k / y**2 for g, k, y in zip(gap, extra, fitted.seconds, strict=True))
    den = sum(k * k / y**2 for k, y in zip(extra, fitted.seconds, strict=True))
    # >= 0: what a request adds beyond its tokens and pairs (its LM head, its row) is work; a
    # negative value would fit the grid's interpolation error, not batching
    model = BatchedPrefill(grid, padding, per_extra_request_s=max(num / den, 0.0) if den else 0.0,
                           fit={"points": len(fitted.seconds), "against": fitted_against,
                                "heldout_points": len(heldout.seconds),
                                "heldout_against": heldout_against})
    judged = _judged_again(model, fitted, heldout)
    grid.extrapolated_queries = before  # fitting is not a simulation's lookup
    return judged
