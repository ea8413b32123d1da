"""``ragsim profile``: measure a device into a profile (format v2) with a real model.

The model is built from its architecture with random weights (transformers, nothing
downloaded): timing does not depend on the weights. T(alpha, beta) is measured by running a
prefill of beta new tokens on top of a real cached prefix of alpha tokens (the prefix is computed
once per alpha and the cache is cropped back after each repetition). Batched prefill runs several
requests with different cached lengths in one forward pass (cached KV and new tokens left-padded,
a 2-D attention mask, per-row positions), decode runs one token for a batch over a cached context,
and transfers copy KV-sized tensors host<->device (pinned memory on CUDA). Every point is warmed
up, repeated, and stored as its median with the spread (min, max).

The prefill grid, the batches the batch model is fitted to, the held-out batches it is judged on
and the held-out single requests are all timed in the same sweeps: each sweep times every one of
them once, so a slow spell of a shared machine lands on all of them alike and the held-out errors
are the model's, not the machine's drift between phases. ``obtained.validation.sweep_speed`` shows
how fast each sweep ran against the typical one. Where their KV does not fit in memory at once
(a large model's full plan on a small GPU), they are timed in consecutive groups, each a mix of
grid rows, batches and held-out points.

Measured medians are made non-decreasing along both grid axes (isotonic regression) before they
are written: the format requires monotone grids; the raw medians and the timed batches stay in
``obtained.raw``. The file records how well the grid and the batch model predict the held-out
points and batches; where they miss the targets of ``ragsim.profiles.heldout`` the profile carries
a warning saying why that happens and what to do (``obtained.warnings``, printed by
``ragsim profile`` and ``ragsim profiles show``).

A run writes ``OUT.partial.json`` after every decode point, transfer size and group of sweeps and
resumes from it when started again with the same settings, so an interrupted profile loses at most
one of them (on a CPU's quick plan the sweeps are one group of about 40 s).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragsim.atomic import write_text_atomically
from ragsim.errors import RagsimInputError
from ragsim.profiles.after_new_shapes import fit_after_new_shapes
from ragsim.profiles.allocator import memory_allocator
from ragsim.profiles.batch_copy import fit_batch_copy
from ragsim.profiles.decode_after_prompt import (
    DECODE_POSITIONS,
    DECODE_SETTLE_STEPS,
    FIRST_DECODE_CONTEXTS,
    FIRST_DECODE_REPEATS,
    FIRST_DECODE_ROWS,
    FIRST_DECODE_STEPS,
    STEADY_FROM,
    first_decode_cells,
    fit_decode_after_prompt,
    positions_row,
)
from ragsim.profiles.grid import BilinearGrid, monotone_along_y, monotone_values
from ragsim.profiles.growth import fit_engine_growth
from ragsim.profiles.heldout import (
    HELDOUT_MAX_TARGET,
    HELDOUT_MEDIAN_TARGET,
    heldout_warning,
    median_and_max,
    relative_errors,
)
from ragsim.profiles.idle_start import fit_idle_start
from ragsim.profiles.models import ModelSpec
from ragsim.profiles.new_shapes import fit_new_shapes
from ragsim.profiles.profile import (
    FITTED_ROWS,
    Batches,
    Profile,
    Transfers,
    fit_batched_prefill,
    with_wide_batches,
)
from ragsim.profiles.steps import (
    ITERATION_MEDIAN_TARGET,
    ITERATION_P90_TARGET,
    MixedSteps,
    fit_step_overhead,
    iteration_warning,
    ratio_summary,
)
from ragsim.profiles.torch_model import (
    LayerKV,
    Row,
    TorchModel,
    decode_step_batch,
    joiners_decode_cache,
)

Progress = Callable[[str, int, int], None]  # (phase, done, total)

# How the grid, batches and held-out points are timed; a partial file of another scheme is not
# resumed. All of them share the same sweeps: when they were timed one phase after another, a
# run saw 5 of its 8 held-out batches 15-39% faster than the grid-priced model predicted, and
# another its reference grid points 1-21% faster in the batch phase than in the grid phase, every
# batch over-predicted (see docs/profiles.md).
SWEEP_TIMING = ("grid, batches and held-out points in the same interleaved sweeps; decode cells "
                "and held-out decode points in the same shuffled rounds, each after "
                f"{DECODE_SETTLE_STEPS} settling steps")
# the reused documents' lengths CacheBlend's selection pass is timed at (a slope over them)
BLEND_SELECTION_TOKENS = (256, 512, 1024)


@dataclass(frozen=True)
class ProfilePlan:
    """What to measure. ``quick`` is small enough for CI on two CPU cores."""

    cached_tokens: list[int]
    new_tokens: list[int]
    batch_sizes: list[int]
    context_tokens: list[int]
    batches: int
    held_out_points: int
    held_out_batches: int
    copy_bytes: list[int]
    warmup: int
    repetitions: int
    # mixed steps (a prompt chunk of k tokens and b decode rows of c tokens in one pass): the
    # decode increment is measured at every k x b x c (``ragsim.profiles.steps.MixedSteps``);
    # empty: not measured, the simulator prices mixed steps additively
    mixed_chunk_tokens: list[int] = field(default_factory=list)
    mixed_batch_sizes: list[int] = field(default_factory=list)
    mixed_context_tokens: list[int] = field(default_factory=list)
    held_out_mixed: int = 0
    held_out_decode: int = 0  # random decode points off the grid, judged on it
    # rows at which the engine's greedy sampling of a step's logits is timed (the per-step
    # overhead outside the timed passes); empty: not measured
    overhead_rows: list[int] = field(default_factory=list)
    # the per-request term by row count (``profile.WideBatches``): batches of that many rows
    # of ``wide_row_tokens`` new tokens on ``wide_row_cached_tokens`` cached ones, and
    # ``held_out_wide`` random ones to judge them; empty: not measured. vLLM: wide batches up
    # to its token budget; the torch engine: every row count up to its batch limit
    # (``with_torch_row_levels``)
    wide_batch_rows: list[int] = field(default_factory=list)
    wide_row_tokens: int = 256
    held_out_wide: int = 0
    wide_row_cached_tokens: int = 0
    # the most prompts a run prefills in one step (its ``max_prefill_bs``), which the torch
    # engine's levels reach; 0: the serving default's (``TORCH_MOST_ROWS``)
    prefill_rows: int = 0

    @classmethod
    def quick(cls) -> ProfilePlan:
        return cls(cached_tokens=[0, 1, 128, 256, 512, 1024, 1536, 2048],
                   new_tokens=[1, 16, 64, 128, 256, 512, 1024, 2048, 3072],
                   batch_sizes=[1, 2, 3, 4, 8, 16], context_tokens=[128, 512, 2048],
                   batches=16,
                   held_out_points=10, held_out_batches=8,
                   copy_bytes=[2**16, 2**20, 2**24], warmup=1, repetitions=7,
                   mixed_chunk_tokens=[64, 512], mixed_batch_sizes=[1, 4],
                   mixed_context_tokens=[128, 1024], held_out_mixed=6, held_out_decode=8,
                   overhead_rows=[1, 4, 16, 64])

    @classmethod
    def full(cls) -> ProfilePlan:
        return cls(cached_tokens=[0, 1, 256, 512, 1024, 2048, 4096, 8192, 16384],
                   new_tokens=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
                   batch_sizes=[1, 2, 3, 4, 8, 16, 32, 64, 128],
                   context_tokens=[128, 512, 1024, 2048, 4096, 8192],
                   batches=60, held_out_points=24, held_out_batches=16,
                   copy_bytes=[2**16, 2**20, 2**24, 2**27], warmup=2, repetitions=7,
                   mixed_chunk_tokens=[64, 512, 2048], mixed_batch_sizes=[1, 4, 16],
                   mixed_context_tokens=[128, 1024, 4096], held_out_mixed=12,
                   held_out_decode=8, overhead_rows=[1, 4, 16, 64, 256])


    def covering(self, *, cached_tokens: int = 0, new_tokens: int = 0, batch_size: int = 0,
                 context_tokens: int = 0, prefill_rows: int = 0) -> ProfilePlan:
        """This plan with its axes reaching what a run will ask for (the longest cached prefix,
        prefill, decode batch and decode context, and the most prompts in one prefill: the
        torch engine's levels by row count), so that no iteration of it is priced by
        extrapolation: past the grid a bilinear price is a straight line through the last two
        measured points, and on a CPU the decode steps of an overloaded run (dozens of
        requests, thousands of tokens) lay far past the quick plan's 16 x 2,048."""

        def reach(axis: list[int], need: int, step: int) -> list[int]:
            if need <= max(axis):
                return list(axis)
            return sorted({*axis, -(-need // step) * step})

        def reach_doubling(axis: list[int], need: int, step: int) -> list[int]:
            # the batch axis gains the doublings on the way too: a decode step's time is not
            # a straight line from 16 rows to 64 on a CPU (2,048-token rows flattened from 32
            # rows on; every vLLM profile priced its held-out batches of 30-59 at 0.90-0.92x)
            reached = reach(axis, need, step)
            doubling = 2 * max(axis)
            while doubling < max(reached):
                reached.append(doubling)
                doubling *= 2
            return sorted(set(reached))

        return replace(self,
                       cached_tokens=reach(self.cached_tokens, cached_tokens, 256),
                       new_tokens=reach(self.new_tokens, new_tokens, 256),
                       batch_sizes=reach_doubling(self.batch_sizes, batch_size, 8),
                       context_tokens=reach(self.context_tokens, context_tokens, 256),
                       prefill_rows=max(self.prefill_rows, prefill_rows))

    def with_mixed_rows_to_decode(self) -> ProfilePlan:
        """This plan with the mixed steps' decode rows reaching its decode axis, fourfold (1,
        4, 16, 64) and its last batch: an engine that takes prompts into the steps of its
        running requests (vLLM) runs steps with as many decode rows as it decodes at once.
        Past the mixed grid an increment is a straight line through its last two batch sizes,
        and from 1 and 4 rows that line priced vLLM's steps with 4-64 decode rows 6-11% under
        their time in every real run at 90% load (docs/profiles.md)."""
        if not self.mixed_batch_sizes:
            return self
        top = max(self.batch_sizes)
        rows = set(self.mixed_batch_sizes)
        fourfold = 4 * max(rows)
        while fourfold < top:
            rows.add(fourfold)
            fourfold *= 4
        rows.add(max(top, max(rows)))
        return replace(self, mixed_batch_sizes=sorted(rows))


@dataclass
class Measurement:
    median_s: float
    min_s: float
    max_s: float


@dataclass
class Timed:
    """One set of interleaved sweeps: each pass's median and spread, and the machine's speed in
    each sweep (median over the passes of time in that sweep / the pass's median; 1.0 is the
    typical sweep, 1.3 one that ran 30% slow), which shows drift within the measurement."""

    passes: list[Measurement]
    sweep_speed: list[float]


@dataclass
class ProfilerState:
    """Everything measured so far (what ``OUT.partial.json`` holds)."""

    settings: dict
    prefill: dict[str, list[float]] = field(default_factory=dict)  # "a,b" -> [med, min, max]
    decode: dict[str, list[float]] = field(default_factory=dict)
    batches: list[dict] = field(default_factory=list)
    copies: dict[str, list[float]] = field(default_factory=dict)
    held_out: list[dict] = field(default_factory=list)
    held_out_batches: list[dict] = field(default_factory=list)
    groups_done: int = 0  # sweep groups measured (``_sweep_groups``)
    # chunk tokens -> [chunk alone, then chunk + b decode rows of c for b, c in plan order],
    # each [median, min, max]
    mixed: dict[str, list[list[float]]] = field(default_factory=dict)
    held_out_mixed: list[dict] = field(default_factory=list)
    held_out_decode: list[dict] = field(default_factory=list)
    # per round of the decode cells and held-out points: key -> [median, min, max]
    decode_rounds: list[dict[str, list[float]]] = field(default_factory=list)
    sampling: dict[str, list[float]] = field(default_factory=dict)  # rows -> [med, min, max]
    wide_batches: list[dict] = field(default_factory=list)
    held_out_wide: list[dict] = field(default_factory=list)
    sweep_speed: list[list[float]] = field(default_factory=list)  # per group, per sweep
    # the first-time price of a step's token count: [size, tokens, first_s, again_s] each
    new_shapes: list[list[float]] = field(default_factory=list)
    # a step after new token counts: [size, k, seconds] each (k = 0: in sweeps of steps run),
    # why repeats were dropped ("": none; None: not measured yet), and how many token counts
    # the engine's cache of built products keeps (None: every count)
    after_new: list[list[float]] = field(default_factory=list)
    after_new_note: str | None = None
    built_capacity_counts: int | None = None
    # a new engine's first steps: [step tokens, first_s, again_s] each, in increasing size
    # (None: not measured yet; []: the engine cannot build a twin)
    engine_growth: list[list[float]] | None = None
    # a step after the engine sat idle: [step tokens, pause_s, seconds] each (pause 0: right
    # after the same step; None: not measured yet)
    idle_start: list[list[float]] | None = None
    # the decode steps after the step that ran their rows' prompts: [rows, prompt tokens,
    # steady_s, then the steps at positions 1..DECODE_POSITIONS] each (None: not measured
    # yet; []: the engine cannot time it)
    first_decode: list[list[float]] | None = None
    # CacheBlend's selection pass per reused token (TorchEngine.blend_selection; None: not
    # measured, or not measurable on this engine)
    blend_selection_s_per_token: float | None = None
    # the engine's padded decode batch built from joiners: [rows, tokens, seconds] each (None:
    # not measured yet; []: the engine keeps no padded batch)
    batch_copy: list[list[float]] | None = None


class TorchEngine:
    """The timed forward passes of a ``TorchModel`` (the reference engine's own forward path).

    Only the timing lives here: every pass is a call of ``TorchModel.forward`` or
    ``TorchModel.decode``, the very methods the reference engine serves requests with.
    """

    # what a batched pass computes: every row left-padded under a 2-D mask (BatchedPrefill)
    padding = "left_masked"
    # how the engine's decode steps lay out their rows: one batch padded to a common end
    # (``decode_layout.PaddedDecodeBatch``, as ``realrun/iterations.py`` runs them)
    decode_padding = "common_end"

    def __init__(self, spec: ModelSpec, device: str, dtype: str, threads: int | None,
                 seed: int) -> None:
        self._attach(TorchModel.build(spec, device, dtype, threads, seed), seed)
        self._built_with = (spec, device, dtype, threads, seed)

    def twin(self) -> TorchEngine | None:
        """A new engine of the same model in this process (as a run builds its own), or None
        for one wrapped around a model built elsewhere (``around``)."""
        built_with = getattr(self, "_built_with", None)
        return None if built_with is None else TorchEngine(*built_with)

    @classmethod
    def around(cls, model: TorchModel, seed: int = 0) -> TorchEngine:
        """Timings of a model already built (a real run's: its speed probes)."""
        engine = cls.__new__(cls)
        engine._attach(model, seed)
        return engine

    def _attach(self, model: TorchModel, seed: int) -> None:
        self.model = model
        self.torch = self.model.torch
        self.device = self.model.device
        self.dtype = self.model.dtype
        self.config = self.model.config
        self.rng = np.random.default_rng(seed)

    def _sync(self) -> None:
        self.model.sync()

    def _tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.config.vocab_size, size=n)

    def _timed(self, fn: Callable[[], None], warmup: int, repetitions: int) -> Measurement:
        times = []
        for i in range(warmup + repetitions):
            self._sync()
            start = time.perf_counter()
            fn()
            self._sync()
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return Measurement(float(np.median(times)), float(min(times)), float(max(times)))

    def _sweeps(self, passes: list[list[Row]], warmup: int, repetitions: int) -> Timed:
        """Time every pass once per sweep; median and spread per pass.

        A pass is timed as the reference engine runs a prefill iteration: ``prepare`` (the
        cached prefixes copied into the batch's cache, the new tokens padded) and ``forward``.
        Timing ``forward`` alone left out the copy of the cached KV, which grows with the cached
        length: the engine's single prefills ran ~14% slower than such a profile predicted."""
        times: list[list[float]] = [[] for _ in passes]
        for sweep in range(warmup + repetitions):
            for k, rows in enumerate(passes):
                self._sync()
                start = time.perf_counter()
                self.model.forward(self.model.prepare(rows))
                self._sync()
                elapsed = time.perf_counter() - start
                if sweep >= warmup:
                    times[k].append(elapsed)
        medians = [float(np.median(t)) for t in times]
        speed = [float(np.median([t[i] / m for t, m in zip(times, medians, strict=True)]))
                 for i in range(repetitions)]
        return Timed([Measurement(m, float(min(t)), float(max(t)))
                      for m, t in zip(medians, times, strict=True)], speed)

    def prefix(self, tokens: int) -> list[LayerKV] | None:
        """A real cached prefix of ``tokens`` tokens (per-layer KV of one row), or None."""
        if not tokens:
            return None
        return self.model.prefill([Row(None, self._tokens(tokens), 0)]).new_kv[0]

    def prefill(self, cached: int, new: int, warmup: int, repetitions: int) -> Measurement:
        return self.prefill_row(cached, [new], warmup, repetitions)[0]

    def prefill_row(self, cached: int, new: list[int], warmup: int, repetitions: int
                    ) -> list[Measurement]:
        """T(cached, b) for every b in ``new`` on one real prefix, in interleaved sweeps."""
        return self.sweeps([([cached], [b]) for b in new], warmup, repetitions).passes

    def prefill_batch(self, cached: list[int], new: list[int], warmup: int,
                      repetitions: int) -> Measurement:
        """Several requests in one forward pass, each on its own real prefix."""
        return self.sweeps([(cached, new)], warmup, repetitions).passes[0]

    def sweeps(self, passes: list[tuple[list[int], list[int]]], warmup: int,
               repetitions: int, mixed: list[bool] | None = None) -> Timed:
        """Every pass (cached lengths, new lengths: one row per request) timed once per sweep.

        ``mixed`` (per pass) marks mixed steps, whose rows after the first are decode rows
        (one new token over their cached context): this engine runs a mixed step as exactly
        such a pass, so it times them like any other.

        Each sweep times every pass once, so a slow spell of a shared machine lands on all of
        them alike instead of inflating the few measured during it: grid points, the batches
        a model is fitted to and the points and batches it is judged on, timed in the same
        sweeps, share the machine's speed. Passes on the same cached length share one real
        prefix (each timing copies it into its own batch, as the engine does).
        """
        prefixes: dict[int, list[LayerKV] | None] = {}

        def prefix(a: int) -> list[LayerKV] | None:
            if a not in prefixes:  # prepare copies a prefix, so rows may share one
                prefixes[a] = self.prefix(a)
            return prefixes[a]

        rows = [[Row(prefix(a), self._tokens(b), a) for a, b in zip(cached, new, strict=True)]
                for cached, new in passes]
        return self._sweeps(rows, warmup, repetitions)

    def decode(self, batch: int, context: int, warmup: int, repetitions: int) -> Measurement:
        """One decode step of ``batch`` requests over ``context`` tokens each."""
        # prepare + forward, not prefill: no copy of the new KV, which may fill the memory
        state = self.model.prepare([Row(None, self._tokens(context), 0) for _ in range(batch)])
        self.model.forward(state)
        ids = self._tokens(batch)

        def run() -> None:
            self.model.decode(state, ids)
            self.model.undo_decode(state)

        return self._timed(run, warmup, repetitions)

    def first_decode(self, rows: int, context: int, repeats: int) -> list[list[float]]:
        """``[rows, context, steady_s, t_1, ..., t_P]`` per repeat, as the reference engine
        runs a batch after its requests' prefill: ``rows`` prompts of ``context`` tokens
        prefilled (untimed), then ``FIRST_DECODE_STEPS`` decode steps timed one by one. The
        first builds the padded batch from the prompts' KV (``joiners_decode_cache``, the
        engine's own rebuild), untimed: the profile prices that write apart (``batch_copy``,
        timed by ``batch_copy``), and runs the forward path on it; the next ones are the decode
        path, as the grid's cells time it; each hands its tokens back (``greedy``), as the
        engine does. ``steady_s`` is the median of the ``STEADY_FROM``-th on, ``t_k`` the k-th
        step (``decode_after_prompt.py``)."""
        model, out = self.model, []
        for _ in range(repeats):
            prefilled = model.prefill([Row(None, self._tokens(context), 0)
                                       for _ in range(rows)])
            ids = model.greedy(prefilled.logits)
            lengths = [context] * rows
            times = []
            cache, _, end = joiners_decode_cache(model, prefilled.new_kv, lengths)
            self._sync()
            start = time.perf_counter()
            batch = decode_step_batch(model, cache, lengths, end, ids)
            ids = model.greedy(model.forward(batch))
            self._sync()
            times.append(time.perf_counter() - start)
            for _ in range(FIRST_DECODE_STEPS - 1):
                start = time.perf_counter()
                ids = model.greedy(model.decode(batch, ids))
                self._sync()
                times.append(time.perf_counter() - start)
            del prefilled, batch, cache
            out.append(positions_row(rows, context, times))
        return out

    def batch_copy(self, rows: int, tokens: int, repeats: int) -> list[list[float]]:
        """``[rows, tokens, seconds]`` per repeat (after one untimed): the engine's padded
        decode batch built from ``rows`` joiners of ``tokens`` tokens each
        (``joiners_decode_cache``, as the engine's rebuild calls it), the write a changed
        batch pays before its forward pass (``batch_copy.py``). The joiners share one prompt's
        KV: the write reads each row's own, so where it comes from does not matter."""
        model = self.model
        kv = model.prefill([Row(None, self._tokens(tokens), 0)]).new_kv[0]
        kvs, lengths = [kv] * rows, [tokens] * rows
        out = []
        for i in range(repeats + 1):
            self._sync()
            start = time.perf_counter()
            built = joiners_decode_cache(model, kvs, lengths)
            self._sync()
            seconds = time.perf_counter() - start
            del built
            if i:
                out.append([float(rows), float(tokens), seconds])
        return out

    def sample(self, rows: int, warmup: int, repetitions: int) -> Measurement:
        """The engine's greedy sampling of a step's logits for ``rows`` rows
        (``TorchModel.greedy``: each row's argmax over the vocabulary, handed back to
        Python), which the timed passes leave out."""
        logits = self.torch.randn(rows, self.config.vocab_size, device=self.device,
                                  dtype=self.dtype)
        return self._timed(lambda: self.model.greedy(logits), warmup, repetitions)

    def copy(self, n_bytes: int, to_device: bool, warmup: int,
             repetitions: int) -> Measurement:
        """Host->device (or back) copy of a KV-sized buffer; on a CPU, a memory copy."""
        torch = self.torch
        n = max(1, n_bytes // 2)
        host = torch.empty(n, dtype=torch.float16)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = torch.empty(n, dtype=torch.float16, device=self.device)
        src, dst = (host, dev) if to_device else (dev, host)

        def run() -> None:
            dst.copy_(src, non_blocking=self.device.type == "cuda")

        return self._timed(run, warmup, repetitions)

    def blend_selection(self, plan: ProfilePlan) -> float | None:
        """CacheBlend's selection pass per reused token on this model (the profile's
        ``blend_selection_s_per_token``; ``torch_blend.blend_selection_s_per_token``, the code
        the engine's blended prefill runs), over documents of the lengths in
        ``BLEND_SELECTION_TOKENS`` the plan's prefill axis reaches (its longest if none), the
        best of the plan's repetitions each. None for a one-layer model: the selection reads
        layer 1, which it does not have."""
        from ragsim.profiles.torch_blend import blend_selection_s_per_token

        if self.model.num_layers < 2:
            return None
        longest = max(plan.new_tokens)
        lengths = [n for n in BLEND_SELECTION_TOKENS if n <= longest] or [longest]
        return blend_selection_s_per_token(self.model, context_tokens=lengths,
                                           repeats=max(plan.repetitions, 1))

    def free_memory_bytes(self) -> int:
        """Memory a KV cache may use here: 90% of free GPU memory, a quarter of host RAM."""
        if self.device.type == "cuda":
            free, _ = self.torch.cuda.mem_get_info(self.device)
            return int(free * 0.9)
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return self.torch.cuda.get_device_name(self.device)
        return platform.processor() or platform.machine()

    def engine_name(self) -> str:
        """What was timed, as the profile's ``engine`` field names it."""
        import transformers

        return f"transformers {transformers.__version__} (torch {self.torch.__version__})"

    def libraries(self) -> dict[str, str]:
        import transformers

        return {"torch": self.torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()}


class TimingEngine(Protocol):
    """What ``run_profile`` times: ``TorchEngine`` (the reference engine's forward passes) or
    another engine's steps (vLLM's, ``ragsim.realrun.vllm.profile.VllmTimer``)."""

    device: Any  # a torch device (its ``type``: "cpu" or "cuda")
    padding: str  # what its batched prefills compute (``BatchedPrefill.padding``)
    decode_padding: str  # how its decode steps lay out their rows (``Profile.decode_padding``)

    def sweeps(self, passes: list[tuple[list[int], list[int]]], warmup: int,
               repetitions: int, mixed: list[bool] | None = None) -> Timed:
        """Each pass timed once per sweep; ``mixed[i]``: pass i is a mixed step (its first row
        a prompt chunk, the others running requests that decode one token over their cached
        context), which an engine with a scheduler runs as such."""
        ...

    def decode(self, batch: int, context: int, warmup: int, repetitions: int
               ) -> Measurement: ...

    def copy(self, n_bytes: int, to_device: bool, warmup: int, repetitions: int
             ) -> Measurement: ...

    def free_memory_bytes(self) -> int: ...

    def device_name(self) -> str: ...

    def engine_name(self) -> str: ...

    def libraries(self) -> dict[str, str]: ...


def _key(*values: int) -> str:
    return ",".join(str(v) for v in values)


def _fit_copy(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """latency + bytes / bandwidth, least squares with both terms >= 0."""
    from ragsim.profiles.fitting import relative_nnls

    design = np.column_stack([np.ones(len(sizes)), np.asarray(sizes, dtype=np.float64)])
    coef, _ = relative_nnls(design, seconds)
    latency, per_byte = float(coef[0]), float(coef[1])
    return latency, 1.0 / per_byte if per_byte > 0 else float("inf")


SWEEPS_PHASE = "prefill grid, batches, held-out points"
# the units whose passes (all but a level's first, its chunk alone) are mixed steps
MIXED_KINDS = ("mixed_level", "held_out_mixed")


# The torch engine's prefill batches by row count (``profile.WideBatches``): every count from 2
# to its batch limit (the plan's ``prefill_rows``, by default ``SimConfig.max_prefill_bs``'s
# 8), on rows shaped as a RAG prompt with
# its documents cached (the masked path the runs' batches take: their longest rows had ~100-140
# new tokens on ~500-800 cached). On this project's CPU, 2-3 rows took 3.2-4.3 ms a request over
# their tokens and pairs, 4-8 rows 0.1-1.0 ms: one term fitted on 2-4 rows cannot price both.
TORCH_MOST_ROWS = 8
TORCH_ROW_NEW_TOKENS = 128
TORCH_ROW_CACHED_TOKENS = 512
TORCH_HELD_OUT_ROWS = 6


def with_torch_row_levels(plan: ProfilePlan) -> ProfilePlan:
    """``plan`` measuring the torch engine's batches at each row count it runs (a plan that
    names its own levels keeps them). The rows stay on the plan's grid, so that each level's
    tokens and pairs are priced where the grid was measured: at most the grid's new tokens in
    the widest level, cached lengths the grid has."""
    if plan.wide_batch_rows:
        return plan
    levels = list(range(2, max(plan.prefill_rows or TORCH_MOST_ROWS, 2) + 1))
    row_new = min(TORCH_ROW_NEW_TOKENS, max(plan.new_tokens) // levels[-1])
    if row_new < 1:
        return plan
    row_cached = max((a for a in plan.cached_tokens if a <= TORCH_ROW_CACHED_TOKENS), default=0)
    return replace(plan, wide_batch_rows=levels, wide_row_tokens=row_new,
                   wide_row_cached_tokens=row_cached,
                   held_out_wide=plan.held_out_wide or TORCH_HELD_OUT_ROWS)


def _time_cells(rows: list[list[float]], cells: list[tuple[int, int]],
                measure: Callable[[int, int], list[list[float]]], phase: str,
                report: Progress, save: Callable[[], None]) -> None:
    """Each (a, b) cell not in ``rows`` yet (a row's first two numbers: a resumed profile
    keeps what it measured) timed by ``measure``, its rows appended and saved; the phase's
    progress reported after each cell."""
    done = {(int(row[0]), int(row[1])) for row in rows}
    for i, (a, b) in enumerate(cells):
        if (a, b) not in done:
            rows += measure(a, b)
            save()
        report(phase, i + 1, len(cells))


def _starting(report: Progress, phase: str, total: int) -> None:
    """Say a phase has begun before its first (possibly minute-long) step: a display that
    heard of a phase only when a step ended showed nothing for over a minute of a quick
    profile. A phase with nothing to measure is not shown."""
    if total:
        report(phase, 0, total)


def run_profile(spec: ModelSpec, *, name: str, device: str, dtype: str, plan: ProfilePlan,
                out: Path, threads: int | None = 1, seed: int = 0,
                kv_capacity_bytes: int | None = None, label: str = "",
                progress: Progress | None = None, engine: TimingEngine | None = None,
                whole_cached: Callable[[int], int] | None = None) -> Profile:
    """Measure everything in ``plan`` and write the profile to ``out`` (resuming if possible).

    ``engine`` times the passes (default: a ``TorchEngine`` of ``spec`` on ``device``);
    ``whole_cached`` maps a cached length to the one the engine can hold cached (vLLM: whole
    blocks), applied to the grid's cached axis and to every batch and held-out point, so the
    profile describes what the engine can do."""
    if whole_cached is not None:
        plan = replace(plan, cached_tokens=sorted({whole_cached(a)
                                                   for a in plan.cached_tokens}))
    if engine is None:
        plan = with_torch_row_levels(plan)
    engine = engine or TorchEngine(spec, device, dtype, threads, seed)
    settings = {"model": asdict(spec), "device": device, "dtype": dtype, "plan": asdict(plan),
                "threads": threads, "seed": seed, "timing": SWEEP_TIMING,
                "engine": engine.engine_name()}
    partial = out.with_name(out.name + ".partial.json")
    state = ProfilerState(settings=settings)
    if partial.exists():
        saved = json.loads(partial.read_text())
        if saved.get("settings") == settings:
            state = ProfilerState(**saved)

    def save() -> None:
        write_text_atomically(partial, json.dumps(asdict(state)))

    report = progress or (lambda phase, done, total: None)
    w, r = plan.warmup, plan.repetitions
    if kv_capacity_bytes is None:
        kv_capacity_bytes = engine.free_memory_bytes()
    plan = fit_plan_to_memory(plan, spec, kv_capacity_bytes)
    if plan.mixed_chunk_tokens and (len(plan.mixed_batch_sizes) < 2
                                    or len(plan.mixed_context_tokens) < 2):
        raise RagsimInputError("mixed steps need two or more batch sizes and contexts (a "
                               "bilinear grid at each chunk size)", field="plan")

    cells = [(bs, ctx) for bs in plan.batch_sizes for ctx in plan.context_tokens]
    held_out = _held_out_decode_points(plan, seed)
    _decode_rounds(engine, cells, held_out, plan, seed, state, save, report)

    _starting(report, "transfers", len(plan.copy_bytes))
    for i, n_bytes in enumerate(plan.copy_bytes):
        for direction in ("h2d", "d2h"):
            if _key(n_bytes) + direction not in state.copies:
                m = engine.copy(n_bytes, direction == "h2d", w, r)
                state.copies[_key(n_bytes) + direction] = [m.median_s, m.min_s, m.max_s]
                save()
        report("transfers", i + 1, len(plan.copy_bytes))
    sample = getattr(engine, "sample", None)  # vLLM's timed step() already samples
    overhead_rows = plan.overhead_rows if sample is not None else []
    _starting(report, "step overhead", len(overhead_rows))
    for i, rows in enumerate(overhead_rows):
        if _key(rows) not in state.sampling:
            m = sample(rows, w, r)
            state.sampling[_key(rows)] = [m.median_s, m.min_s, m.max_s]
            save()
        report("step overhead", i + 1, len(overhead_rows))

    units = _sweep_units(plan, seed)
    if whole_cached is not None:
        units = [replace(u, passes=[([whole_cached(a) for a in cached], new)
                                    for cached, new in u.passes]) for u in units]
    groups = _sweep_groups(units, spec.kv_bytes_per_token, kv_capacity_bytes // 2)
    _starting(report, SWEEPS_PHASE, len(groups))
    for g, group in enumerate(groups):
        if g >= state.groups_done:
            passes = [pass_ for unit in group for pass_ in unit.passes]
            mixed = [unit.kind in MIXED_KINDS and len(new) > 1
                     for unit in group for _, new in unit.passes]
            timed = engine.sweeps(passes, w, r, mixed=mixed)
            found = iter(timed.passes)
            for unit in group:
                measured = [next(found) for _ in unit.passes]
                if unit.kind == "mixed_level":  # in the unit's order: chunk alone, then b x c
                    state.mixed[_key(unit.passes[0][1][0])] = [
                        [m.median_s, m.min_s, m.max_s] for m in measured]
                    continue
                for (cached, new), m in zip(unit.passes, measured, strict=True):
                    _record(state, unit.kind, cached, new, m)
            state.sweep_speed.append(timed.sweep_speed)
            state.groups_done = g + 1
            save()
        report(SWEEPS_PHASE, g + 1, len(groups))

    counts = new_shape_counts(plan, units)
    _starting(report, NEW_SHAPES_PHASE, 1)
    if not state.new_shapes:
        first, again = _first_and_again(engine, [tokens for _, tokens in counts])
        state.new_shapes = [[size, tokens, f, a] for (size, tokens), f, a
                            in zip(counts, first, again, strict=True)]
        save()
    report(NEW_SHAPES_PHASE, 1, 1)

    _starting(report, AFTER_NEW_PHASE, 1)
    if not state.after_new and state.after_new_note is None:
        state.after_new, note = _after_new_counts(engine, plan, units,
                                                  {int(t) for _, t, _, _ in state.new_shapes})
        state.after_new_note = note or ""
        built = getattr(engine, "built_shapes", lambda: None)()
        state.built_capacity_counts = None if built is None else built[1]
        save()
    report(AFTER_NEW_PHASE, 1, 1)

    _starting(report, IDLE_PHASE, 1)
    if state.idle_start is None:
        state.idle_start = _idle_starts(engine, plan, seed)
        save()
    report(IDLE_PHASE, 1, 1)

    # a decode step right after the prompts' step, against the steady ones the grid times
    first_decode = getattr(engine, "first_decode", None)
    first_cells = first_decode_cells(plan.context_tokens)
    _starting(report, FIRST_DECODE_PHASE, len(first_cells))
    if state.first_decode is None:
        state.first_decode = []
    if first_decode is not None:
        _time_cells(state.first_decode, first_cells,
                    lambda rows, context: first_decode(rows, context, FIRST_DECODE_REPEATS),
                    FIRST_DECODE_PHASE, report, save)

    # the write a changed padded decode batch pays (the torch engine's; none for a paged one)
    time_batch_copy = getattr(engine, "batch_copy", None)
    copy_cells = batch_copy_cells(plan, spec.kv_bytes_per_token, kv_capacity_bytes) \
        if time_batch_copy is not None else []
    _starting(report, BATCH_COPY_PHASE, len(copy_cells))
    if state.batch_copy is None:
        state.batch_copy = []
    _time_cells(state.batch_copy, copy_cells,
                lambda rows, tokens: time_batch_copy(rows, tokens, BATCH_COPY_REPEATS),
                BATCH_COPY_PHASE, report, save)

    # the last phase that steps an engine of vLLM's: the twin it builds, once freed, takes
    # the process's distributed state down with it, and the profile's engine cannot step after
    _starting(report, GROWTH_PHASE, 1)
    if state.engine_growth is None:
        state.engine_growth = _engine_growth(engine, plan)
        save()
    report(GROWTH_PHASE, 1, 1)

    # an engine that runs blended prefills (the torch engine) times their selection pass
    measure_selection = getattr(engine, "blend_selection", None)
    if measure_selection is not None and state.blend_selection_s_per_token is None:
        _starting(report, "blend selection pass", 1)
        state.blend_selection_s_per_token = measure_selection(plan)
        save()
        report("blend selection pass", 1, 1)

    profile = _assemble(spec, name, device, dtype, plan, state, engine, kv_capacity_bytes,
                        label, threads)
    profile.save(out)
    partial.unlink(missing_ok=True)
    return profile


NEW_SHAPES_PHASE = "first time of a step's token count"
NEW_SHAPE_SIZES = 5  # step sizes the first-time price is measured at (geometric)
NEW_SHAPE_COUNTS = 3  # fresh token counts a size
NEW_SHAPE_AGAIN = 3  # the same pass again, this many times (their median)


def new_shape_counts(plan: ProfilePlan, units: list[SweepUnit]) -> list[tuple[int, int]]:
    """(size, token count) pairs whose prefill the first-time measurement runs: at sizes
    spread geometrically over the plan's new tokens, token counts the profile's own steps did
    not run (the sweeps' passes, decode batches, prefixes computed): odd ones near the size,
    where the plan's are round."""
    ran = {sum(new) for unit in units for _, new in unit.passes}
    ran |= set(plan.batch_sizes) | {a + 1 for a in plan.cached_tokens} | set(plan.new_tokens)
    low, top = max(min(plan.new_tokens), 8), max(plan.new_tokens)
    sizes = sorted({int(np.rint(x)) for x in np.geomspace(low, max(top, low), NEW_SHAPE_SIZES)})
    pairs = []
    for size in sizes:
        tokens = size | 1
        for _ in range(NEW_SHAPE_COUNTS):
            while tokens in ran:
                tokens += 2
            pairs.append((size, tokens))
            ran.add(tokens)
    return pairs


def _first_and_again(engine: TimingEngine, counts: list[int]
                     ) -> tuple[list[float], list[float]]:
    """Prefills of each of ``counts`` new tokens (no cached prefix), timed the first time the
    engine runs that many, then the median of ``NEW_SHAPE_AGAIN`` more; both in interleaved
    sweeps, as the grid is timed (each pass after a different one: run back to back, a pass
    repeated at once ran faster still, and the extra came out larger than a run pays)."""
    passes = [([0], [tokens]) for tokens in counts]
    first = engine.sweeps(passes, 0, 1).passes
    again = engine.sweeps(passes, 0, NEW_SHAPE_AGAIN).passes
    return [m.median_s for m in first], [m.median_s for m in again]


AFTER_NEW_PHASE = "a step after new token counts"
AFTER_NEW_SIZES = 2  # step sizes, geometric from a sixth of the plan's largest to it
AFTER_NEW_COUNTS = (8, 24)  # fresh counts before the timed step (measured: none after 4)
AFTER_NEW_REPEATS = 2
# the fresh counts' size: small prefills, as a moderate load runs between its bursts
# (``benchmarks/cold_steps.py`` measured the effect after prefills of 150 tokens)
AFTER_NEW_FRESH_TOKENS = 150


def after_new_sizes(plan: ProfilePlan) -> list[int]:
    """The step sizes a step after new counts is timed at: geometric from a sixth of the
    plan's largest new tokens to it (on vLLM's CPU engine a step of 256 tokens measured no
    extra, one of 887 and more 2-2.7x)."""
    top = max(plan.new_tokens)
    return sorted({int(np.rint(x)) for x in np.geomspace(max(top / 6, 1), top,
                                                         AFTER_NEW_SIZES)})


def _after_new_counts(engine: TimingEngine, plan: ProfilePlan, units: list[SweepUnit],
                      measured: set[int]) -> tuple[list[list[float]], str | None]:
    """[size, k, seconds] rows: each size's steady time (k = 0, the median of sweeps over the
    sizes, as the grid is timed, after a warm-up sweep), then per repeat, size and k the step
    right after k prefills of token counts the engine had not run (from
    ``AFTER_NEW_FRESH_TOKENS`` up, skipping every count the profile ran) that follow the same
    step run untimed, each in one sweep in that order; and why repeats were dropped, if they
    were.

    Where the engine keeps its built products in a bounded cache (``built_shapes``), the
    extra exists only while that cache grows (once full, a new count's products reuse the
    memory of the ones they push out: ``benchmarks/shape_cache.py``), so only as many repeats
    are timed as fit in what the cache has left; none, if not one fits."""
    ran = {sum(new) for unit in units for _, new in unit.passes} | measured
    ran |= set(plan.batch_sizes) | {a + 1 for a in plan.cached_tokens} | set(plan.new_tokens)
    sizes = after_new_sizes(plan)
    ran |= set(sizes)
    repeats, note = AFTER_NEW_REPEATS, None
    per_repeat = len(sizes) * sum(AFTER_NEW_COUNTS)
    built = getattr(engine, "built_shapes", lambda: None)()
    if built is not None:
        done, capacity = built
        room = capacity - done - len(sizes)
        repeats = min(repeats, max(room, 0) // per_repeat)
        if repeats < AFTER_NEW_REPEATS:
            note = (f"{repeats} of {AFTER_NEW_REPEATS} repeats: the engine had built {done} of "
                    f"the {capacity} token counts its cache keeps, and a repeat builds "
                    f"{per_repeat}")
    if not repeats:
        return [], note
    fresh_tokens = AFTER_NEW_FRESH_TOKENS

    def fresh() -> int:
        nonlocal fresh_tokens
        while fresh_tokens in ran:
            fresh_tokens += 1
        ran.add(fresh_tokens)
        return fresh_tokens

    steady = engine.sweeps([([0], [z]) for z in sizes], 1, NEW_SHAPE_AGAIN).passes
    rows = [[float(z), 0.0, m.median_s] for z, m in zip(sizes, steady, strict=True)]
    for _ in range(repeats):
        for z in sizes:
            for k in AFTER_NEW_COUNTS:
                # the step once untimed, so that exactly k fresh counts precede the timed one
                # since a step as big (``FreshCountsSince``)
                passes = [([0], [z]), *[([0], [fresh()]) for _ in range(k)], ([0], [z])]
                rows.append([float(z), float(k), engine.sweeps(passes, 0, 1).passes[-1].median_s])
    return rows, note


GROWTH_PHASE = "a new engine's first steps"
# the rows a growth step is cut into: vLLM's wide batches' rows (``ProfilePlan.wide_row_tokens``
# by default), kept apart from the plan so that the torch engine's levels by row count, on
# shorter rows, leave its growth steps as they were measured before them
GROWTH_ROW_TOKENS = 256
GROWTH_SIZES = 4  # step sizes, geometric from GROWTH_SMALLEST to the plan's largest step
GROWTH_SMALLEST = 256
GROWTH_AGAIN = 2


def growth_sizes(plan: ProfilePlan) -> list[int]:
    """The step sizes a new engine's first steps are timed at: geometric from 256 tokens (the
    plan's largest step, if smaller) to the plan's largest step (its longest prefill or its
    widest batch)."""
    top = max(max(plan.new_tokens), max(plan.wide_batch_rows, default=0) * plan.wide_row_tokens)
    low = min(GROWTH_SMALLEST, top)
    return sorted({int(np.rint(x)) for x in np.geomspace(low, top, GROWTH_SIZES)})


def _engine_growth(engine: TimingEngine, plan: ProfilePlan) -> list[list[float]]:
    """[step tokens, first_s, again_s] rows, sizes increasing, timed on a twin of ``engine``
    built now, while ``engine`` still holds its memory (so the twin's first steps take theirs
    from the system, as a new process's do: ``ragsim/profiles/growth.py``):
    each size's first step on it (rows of at most ``GROWTH_ROW_TOKENS`` new tokens, uncached),
    then the median of ``GROWTH_AGAIN`` more; after the run's warm-up (prompts of 40 and 24
    tokens in one step, as the harnesses warm their engines). [] where the engine cannot
    build a twin."""
    make = getattr(engine, "twin", None)
    twin = make() if make is not None else None
    if twin is None:
        return []
    twin.sweeps([([0, 0], [40, 24])], 0, 1)
    rows_out = []
    for tokens in growth_sizes(plan):
        rows = -(-tokens // GROWTH_ROW_TOKENS)
        new = [tokens // rows + (1 if i < tokens % rows else 0) for i in range(rows)]
        first = twin.sweeps([([0] * rows, new)], 0, 1).passes[0].median_s
        again = twin.sweeps([([0] * rows, new)], 0, GROWTH_AGAIN).passes[0].median_s
        rows_out.append([float(tokens), first, again])
    return rows_out  # the twin goes with this frame


BATCH_COPY_PHASE = "a changed decode batch's write"
BATCH_COPY_ROWS = (1, 4, 16, 64)  # the joiners' counts, up to the plan's largest decode batch
BATCH_COPY_REPEATS = 3


def batch_copy_cells(plan: ProfilePlan, kv_bytes_per_token: int, kv_capacity_bytes: int
                     ) -> list[tuple[int, int]]:
    """(rows, tokens) the engine's batch write is timed at: ``BATCH_COPY_ROWS`` up to the
    plan's largest decode batch, by each of its decode contexts, where twice the KV of one
    more row than the batch holds fits in half the memory (the batch's buffer keeps room for a
    quarter more rows and 64 more tokens, and the joiners' prompt is held beside it): from 1
    row to thousands of times more row-tokens, as the term has a latency, a row's and a
    row-token's part (``batch_copy.py``)."""
    most = max(plan.batch_sizes)
    rows = sorted({r for r in BATCH_COPY_ROWS if r <= most} | {most})
    return [(r, int(t)) for r in rows for t in plan.context_tokens
            if 2 * (r + 1) * int(t) * kv_bytes_per_token <= kv_capacity_bytes // 2]


IDLE_PHASE = "a step after the engine sat idle"
FIRST_DECODE_PHASE = "a decode step right after its prompts' step"
IDLE_PAUSES_S = (0.003, 0.01, 0.03, 0.1)  # measured: the extra grows up to about 30 ms
IDLE_REPEATS = 5
IDLE_SMALLEST = 32


def idle_sizes(plan: ProfilePlan) -> list[int]:
    """The prefill sizes a step after a pause is timed at: the plan's smallest new tokens of at
    least ``IDLE_SMALLEST`` and the middle one of those (the extra is about the same number of
    milliseconds at every size: ``ragsim/profiles/idle_start.py``), token counts the grid ran."""
    sizes = [t for t in sorted(plan.new_tokens) if t >= IDLE_SMALLEST] or [max(plan.new_tokens)]
    return sorted({sizes[0], sizes[len(sizes) // 2]})


def _idle_starts(engine: TimingEngine, plan: ProfilePlan, seed: int) -> list[list[float]]:
    """[step tokens, pause_s, seconds] rows: per size, pause (0 and ``IDLE_PAUSES_S``) and
    repeat, in an order shuffled with ``seed``, a prefill of the size (no cached prefix) timed
    right after the same prefill run untimed and then ``pause_s`` of sleep: the engine idle,
    as between a moderate load's requests."""
    import random

    sizes = idle_sizes(plan)
    order = [(z, pause) for z in sizes for pause in (0.0, *IDLE_PAUSES_S)
             for _ in range(IDLE_REPEATS)]
    random.Random(seed).shuffle(order)
    for z in sizes:  # each size run before any timing: no step here is its count's first
        engine.sweeps([([0], [z])], 0, 1)
    rows = []
    for z, pause in order:
        engine.sweeps([([0], [z])], 0, 1)
        if pause:
            time.sleep(pause)
        rows.append([float(z), pause, engine.sweeps([([0], [z])], 0, 1).passes[0].median_s])
    return rows


def fit_plan_to_memory(plan: ProfilePlan, spec: ModelSpec, kv_capacity_bytes: int
                       ) -> ProfilePlan:
    """Drop decode batch sizes whose KV (batch x longest context) would not fit in memory.

    A 7B model's full decode grid on one GPU reaches batch 128 x 8k context, far more KV than
    any GPU holds; measuring it would only run out of memory.
    """
    budget_tokens = kv_capacity_bytes // spec.kv_bytes_per_token
    longest = max(plan.context_tokens)
    batches = [b for b in plan.batch_sizes if b * longest <= budget_tokens]
    if len(batches) < 2:
        raise RagsimInputError(
            f"only {budget_tokens:,} tokens of KV fit; the decode grid needs two batch sizes "
            f"at {longest:,} tokens of context", field="--device")
    return ProfilePlan(**{**asdict(plan), "batch_sizes": batches})


def _held_out_flags(total: int, held_out: int) -> list[bool]:
    """Which of ``total`` batches are held out: ``held_out`` of them, spread evenly (every
    third of the quick plan's 24), so both kinds share every sweep group."""
    return [(i + 1) * held_out // total > i * held_out // total for i in range(total)]


@dataclass(frozen=True)
class SweepUnit:
    """What is timed together and recorded as one thing: a grid row (its passes share a prefix),
    a fitted or held-out batch, or a held-out single request."""

    # "grid", "batch", "held_out_batch", "held_out_point", "mixed_level", "held_out_mixed",
    # "wide_batch" or "held_out_wide"
    kind: str
    passes: list[tuple[list[int], list[int]]]

    def kv_tokens(self) -> int:
        """Tokens of KV its prepared passes hold at once (a grid row shares one prefix)."""
        return max(len(new) * (max(cached) + max(new)) for cached, new in self.passes)


def _sweep_units(plan: ProfilePlan, seed: int) -> list[SweepUnit]:
    """The grid rows, the random batches (held-out ones spread among the fitted ones) and the
    held-out single requests, mixed evenly so that any group of them holds every kind."""
    grid = [SweepUnit("grid", [([a], [b]) for b in plan.new_tokens])
            for a in plan.cached_tokens]
    batch_rng = np.random.default_rng(seed + 7)
    wanted = [_random_batch(batch_rng, plan) for _ in range(plan.batches + plan.held_out_batches)]
    batches = [SweepUnit("held_out_batch" if held else "batch", [batch])
               for batch, held in zip(wanted, _held_out_flags(len(wanted),
                                                              plan.held_out_batches),
                                      strict=True)]
    held_rng = np.random.default_rng(seed + 11)
    points = []
    for _ in range(plan.held_out_points):
        a = int(held_rng.integers(1, max(plan.cached_tokens) + 1))
        b = int(held_rng.integers(plan.new_tokens[1], max(plan.new_tokens) + 1))
        points.append(SweepUnit("held_out_point", [([a], [b])]))
    kinds = [k for k in (grid, batches, points, *_mixed_units(plan, seed),
                         *_wide_units(plan, seed)) if k]
    # each unit at its fractional place in its own list, then all merged in that order
    place = sorted((((i + 0.5) / len(k), j, i) for j, k in enumerate(kinds) for i in range(len(k))))
    return [kinds[j][i] for _, j, i in place]


def _no_increment(plan: ProfilePlan, name: str) -> MixedSteps:
    """Mixed steps whose decode rows add nothing: a profile with them prices a mixed step as
    its chunks' batched prefill on the grid (on a padding engine, on its masked path), the
    baseline each measured step's increment is taken over."""
    batches = [float(b) for b in plan.mixed_batch_sizes]
    contexts = [float(c) for c in plan.mixed_context_tokens]
    zero = [[0.0] * len(contexts) for _ in batches]
    return MixedSteps([float(k) for k in plan.mixed_chunk_tokens],
                      [BilinearGrid(name, "batch_sizes", "context_tokens", batches, contexts,
                                    [list(row) for row in zero])
                       for _ in plan.mixed_chunk_tokens])


def _chunk_cached_tokens(plan: ProfilePlan) -> int:
    """The cached tokens under the prompt chunk of a mixed-step measurement: the fewest the
    grid measured above zero (a torch step with decode rows runs its masked attention path, on
    which the grid's columns with cached tokens were measured; on vLLM, the fewest whole
    blocks the grid has)."""
    return min((a for a in plan.cached_tokens if a > 0), default=0)


def _mixed_units(plan: ProfilePlan, seed: int) -> tuple[list[SweepUnit], list[SweepUnit]]:
    """Per chunk size, one unit: the chunk alone and the chunk with every b x c of decode rows
    (a decode row: one new token over c cached ones); and the held-out mixed steps (random
    chunk, cached tokens under it, batch and context within the plan's ranges)."""
    chunks = plan.mixed_chunk_tokens
    if not chunks:
        return [], []
    a = _chunk_cached_tokens(plan)
    levels = [SweepUnit("mixed_level", [([a], [k])] + [
        ([a] + [c] * b, [k] + [1] * b)
        for b in plan.mixed_batch_sizes for c in plan.mixed_context_tokens]) for k in chunks]
    rng = np.random.default_rng(seed + 13)
    held = []
    for _ in range(plan.held_out_mixed):
        k = int(rng.integers(chunks[0], chunks[-1] + 1))
        # batch sizes spread evenly in log over the axis, so that a plan reaching 64 rows
        # judges steps of a few rows as often as steps of dozens
        b = round(math.exp(rng.uniform(0.0, math.log(max(plan.mixed_batch_sizes)))))
        c = int(rng.integers(min(plan.mixed_context_tokens),
                             max(plan.mixed_context_tokens) + 1))
        cached = int(rng.choice([x for x in plan.cached_tokens if x <= 4 * max(chunks)]))
        held.append(SweepUnit("held_out_mixed", [([cached] + [c] * b, [k] + [1] * b)]))
    return levels, held


def _wide_units(plan: ProfilePlan, seed: int) -> tuple[list[SweepUnit], list[SweepUnit]]:
    """The batches by row count (each level's rows of ``wide_row_tokens`` new tokens on
    ``wide_row_cached_tokens`` cached ones) and the held-out ones: rows between the first and
    the last level, each of a quarter to twice ``wide_row_tokens`` new tokens (64 to 512 at
    256) over a cached length of the grid up to 512, within the last level's tokens."""
    if not plan.wide_batch_rows:
        return [], []
    k, c = plan.wide_row_tokens, plan.wide_row_cached_tokens
    levels = [SweepUnit("wide_batch", [([c] * n, [k] * n)]) for n in plan.wide_batch_rows]
    rng = np.random.default_rng(seed + 19)
    budget = max(plan.wide_batch_rows) * k
    cached_choices = [a for a in plan.cached_tokens if a <= 512] or [0]
    held = []
    for _ in range(plan.held_out_wide):
        n = int(rng.integers(min(plan.wide_batch_rows), max(plan.wide_batch_rows) + 1))
        new = [int(b) for b in rng.integers(k // 4, 2 * k + 1, size=n)]
        while sum(new) > budget:
            new.pop()
        cached = [int(rng.choice(cached_choices)) for _ in new]
        held.append(SweepUnit("held_out_wide", [(cached, new)]))
    return levels, held


DECODE_ROUNDS = 3  # rounds over the decode cells and held-out points (median per cell)


def _decode_rounds(engine: TimingEngine, cells: list[tuple[int, int]],
                   held_out: list[tuple[int, int]], plan: ProfilePlan, seed: int,
                   state: ProfilerState, save: Callable[[], None], report: Progress) -> None:
    """The decode grid's cells and the held-out decode points, each timed once a round
    (``warmup`` + ``repetitions`` steps, their median) in ``DECODE_ROUNDS`` rounds, every
    round in its own shuffled order: a cell is the median of its rounds' medians. Why: timed
    once each, one after another, a vLLM profile's 1-row cells came out 15% below the same
    process's later steps of one row (3.3-3.6 against 3.9-4.2 ms, run C) and its held-out
    points were predicted 0.90x (the torch engine's 0.94x); the same block of steps timed
    again in one process moved by up to 24%. In the same rounds, grid and held-out points
    share the machine's speed and the process's state, as the prefill sweeps do."""
    # the grid prices a batch's steady steps: its cells settle past the positions after the
    # prompts' step that ``decode_after_prompt`` charges, and are timed from there
    w, r = max(plan.warmup, DECODE_SETTLE_STEPS), plan.repetitions
    keys = [_key(bs, ctx) for bs, ctx in cells] + [f"held_out_{i}" for i in range(len(held_out))]
    shapes = dict(zip(keys, cells + held_out, strict=True))
    total = DECODE_ROUNDS * len(keys)
    _starting(report, "decode", total)
    if all(_key(bs, ctx) in state.decode for bs, ctx in cells) \
            and len(state.held_out_decode) == len(held_out):  # resumed after the rounds
        report("decode", total, total)
        return
    # the decode grid is the process's first timing: each cell run once untimed first.
    # Timed cold, a new process's first pass over the cells ran 1.02-1.44x its second (1 row:
    # 8.2 against 5.7 ms; one thread, 2026-12-04; not in every process:
    # benchmarks/decode_rows.py cold), later cells least, and two profiles priced a 1-row step
    # 5.5 and 7.5 ms while their prefills agreed within 1%
    for bs, ctx in cells:
        engine.decode(bs, ctx, w, 1)
    rng = np.random.default_rng(seed + 29)
    for round_ in range(DECODE_ROUNDS):
        order = [keys[i] for i in rng.permutation(len(keys))]  # drawn even when resumed
        if round_ == len(state.decode_rounds):
            state.decode_rounds.append({})
        timed = state.decode_rounds[round_]
        for key in order:
            if key not in timed:
                m = engine.decode(*shapes[key], w, r)
                timed[key] = [m.median_s, m.min_s, m.max_s]
                save()
            report("decode", round_ * len(keys) + len(timed), total)
    for key, (bs, ctx) in shapes.items():
        rounds = [timed[key] for timed in state.decode_rounds]
        median = float(np.median([t[0] for t in rounds]))
        low, high = min(t[1] for t in rounds), max(t[2] for t in rounds)
        if key.startswith("held_out_"):
            state.held_out_decode.append({"batch": bs, "context": ctx, "seconds": median,
                                          "min_s": low, "max_s": high})
        else:
            state.decode[key] = [median, low, high]
    save()


def _held_out_decode_points(plan: ProfilePlan, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed + 17)
    return [(int(rng.integers(1, max(plan.batch_sizes) + 1)),
             int(rng.integers(min(plan.context_tokens), max(plan.context_tokens) + 1)))
            for _ in range(plan.held_out_decode)]


def _sweep_groups(units: list[SweepUnit], kv_bytes_per_token: int, budget_bytes: int
                  ) -> list[list[SweepUnit]]:
    """Consecutive units whose prepared KV fits in ``budget_bytes`` together: each group is
    timed in its own sweeps. A CPU's quick plan is one group, so everything shares the same
    sweeps; a 7B model's full plan on a small GPU may need several."""
    groups: list[list[SweepUnit]] = [[]]
    used = 0
    for unit in units:
        size = unit.kv_tokens() * kv_bytes_per_token
        if groups[-1] and used + size > budget_bytes:
            groups.append([])
            used = 0
        groups[-1].append(unit)
        used += size
    return groups


def _record(state: ProfilerState, kind: str, cached: list[int], new: list[int],
            m: Measurement) -> None:
    spread = {"seconds": m.median_s, "min_s": m.min_s, "max_s": m.max_s}
    if kind == "grid":
        state.prefill[_key(cached[0], new[0])] = [m.median_s, m.min_s, m.max_s]
    elif kind == "held_out_mixed":
        state.held_out_mixed.append({"cached": cached, "new": new, **spread})
    elif kind == "held_out_point":
        state.held_out.append({"cached": cached[0], "new": new[0], **spread})
    elif kind == "wide_batch":
        state.wide_batches.append({"rows": len(new), "new": new[0], "cached": cached[0],
                                   **spread})
    elif kind == "held_out_wide":
        state.held_out_wide.append({"cached": cached, "new": new, **spread})
    else:
        target = state.held_out_batches if kind == "held_out_batch" else state.batches
        target.append({"cached": cached, "new": new, **spread})


def _batches(timed: list[dict]) -> Batches:
    return Batches([b["cached"] for b in timed], [b["new"] for b in timed],
                   [b["seconds"] for b in timed])


def _random_batch(rng: np.random.Generator, plan: ProfilePlan) -> tuple[list[int], list[int]]:
    """2-4 requests on cached lengths of the grid. The engine pads every row to the longest new
    segment, and the batch model prices that many tokens on the grid: rows x longest stays
    within the grid's new tokens, so the model is judged where the grid was measured (up to half
    the grid, the quick plan's batches were priced by extrapolation)."""
    rows = int(rng.integers(2, FITTED_ROWS + 1))
    cached = [int(rng.choice(plan.cached_tokens)) for _ in range(rows)]
    most = max(plan.new_tokens[-1] // rows, plan.new_tokens[1])
    new = [int(rng.integers(plan.new_tokens[1], most + 1)) for _ in range(rows)]
    return cached, new


def _assemble(spec: ModelSpec, name: str, device: str, dtype: str, plan: ProfilePlan,
              state: ProfilerState, engine: TimingEngine, kv_capacity_bytes: int | None,
              label: str, threads: int | None) -> Profile:
    raw_prefill = [[state.prefill[_key(a, b)][0] for b in plan.new_tokens]
                   for a in plan.cached_tokens]
    raw_decode = [[state.decode[_key(bs, c)][0] for c in plan.context_tokens]
                  for bs in plan.batch_sizes]
    prefill = BilinearGrid(name, "cached_tokens", "new_tokens",
                           [float(a) for a in plan.cached_tokens],
                           [float(b) for b in plan.new_tokens], monotone_values(raw_prefill))
    # non-decreasing in context, as measured in batch size: on a CPU a step of 4 rows ran
    # faster than one of 3 (``grid.BilinearGrid.monotone_x``)
    decode = BilinearGrid(name, "batch_sizes", "context_tokens",
                          [float(b) for b in plan.batch_sizes],
                          [float(c) for c in plan.context_tokens], monotone_along_y(raw_decode),
                          monotone_x=False)
    batched = fit_batched_prefill(
        prefill, engine.padding, _batches(state.batches), _batches(state.held_out_batches),
        fitted_against=f"{len(state.batches)} measured batches of 2-{FITTED_ROWS} requests, "
                       f"timed in the grid's sweeps",
        heldout_against=f"{len(state.held_out_batches)} other measured batches of "
                        f"2-{FITTED_ROWS} requests, timed in the same sweeps")
    if state.wide_batches:
        wide = sorted(state.wide_batches, key=lambda w: w["rows"])
        batched = with_wide_batches(batched, [w["rows"] for w in wide],
                                    [w["seconds"] for w in wide], plan.wide_row_tokens,
                                    _batches(state.held_out_wide),
                                    row_cached_tokens=plan.wide_row_cached_tokens,
                                    batches=(_batches(state.batches),
                                             _batches(state.held_out_batches)))
    held_errors = relative_errors([prefill.at(h["cached"], h["new"]) for h in state.held_out],
                                  [h["seconds"] for h in state.held_out])
    prefill_median, prefill_max = median_and_max(held_errors)
    warnings = [w for w in (
        heldout_warning("prefill points", prefill_median, prefill_max, measured=True,
                        threads=threads),
        heldout_warning("batches", batched.heldout_median_error, batched.heldout_max_error,
                        measured=True, threads=threads)) if w]
    copies = {}
    for direction in ("h2d", "d2h"):
        sizes = plan.copy_bytes
        seconds = [state.copies[_key(n) + direction][0] for n in sizes]
        copies[direction] = _fit_copy(sizes, seconds)
    if kv_capacity_bytes is None:
        kv_capacity_bytes = engine.free_memory_bytes()
    return _with_step_terms(Profile(
        name=name,
        hardware={"name": device, "device": engine.device_name(), "gpus": 1,
                  "memory_bytes_per_gpu": None, "host_link": None,
                  "interconnect_bytes_per_s": None},
        model=spec,
        dtype=dtype,
        tensor_parallel=1,
        engine=engine.engine_name(),
        obtained={
            "kind": "measured",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "device": engine.device_name(),
            "device_type": engine.device.type,
            "label": label,
            "libraries": engine.libraries(),
            "allocator": memory_allocator(),  # tcmalloc or glibc: timings differ (allocator.py)
            "threads": threads,
            "warmup": plan.warmup,
            "repetitions": plan.repetitions,
            "statistic": "median of the repetitions (the grid, the batches and the held-out "
                         "points in the same interleaved sweeps); "
                         "grids made non-decreasing by isotonic regression along each axis "
                         "(raw medians and min/max spread below)",
            "timing": SWEEP_TIMING,
            "raw": {"prefill": state.prefill, "decode": state.decode,
                    "copies": state.copies, "batches": state.batches,
                    "held_out_batches": state.held_out_batches,
                    **({"wide_batches": state.wide_batches,
                        "held_out_wide": state.held_out_wide} if state.wide_batches else {})},
            "validation": {
                "held_out_prefill": [{**h, "predicted": prefill.at(h["cached"], h["new"])}
                                     for h in state.held_out],
                "held_out_prefill_points": len(held_errors),
                "held_out_prefill_median_rel_error": prefill_median,
                "held_out_prefill_max_rel_error": prefill_max,
                "sweep_speed": state.sweep_speed,
                "held_out_batches": len(state.held_out_batches),
                "held_out_batch_median_rel_error": batched.heldout_median_error,
                "held_out_batch_max_rel_error": batched.heldout_max_error,
                "targets": {"median_rel_error": HELDOUT_MEDIAN_TARGET,
                            "max_rel_error": HELDOUT_MAX_TARGET},
            },
            **({"warnings": warnings} if warnings else {}),
        },
        kv_capacity_bytes=int(kv_capacity_bytes),
        overhead_s=float(prefill.values[0][0]),
        prefill=prefill,
        batched_prefill=batched,
        decode=decode,
        decode_padding=engine.decode_padding,
        transfers=Transfers(host_to_device_bytes_per_s=copies["h2d"][1],
                            host_to_device_latency_s=copies["h2d"][0],
                            device_to_host_bytes_per_s=copies["d2h"][1],
                            device_to_host_latency_s=copies["d2h"][0]),
        blend_selection_s_per_token=state.blend_selection_s_per_token,
        batch_copy=fit_batch_copy(state.batch_copy) if state.batch_copy else None,
    ), plan, state, threads)


def _with_step_terms(profile: Profile, plan: ProfilePlan, state: ProfilerState,
                     threads: int | None) -> Profile:
    """The profile with what the plan measured of whole steps: the mixed-step increments and
    the step overhead, and the per-iteration predicted / measured distribution on every
    held-out kind (``obtained.validation.iteration_ratios``; a warning where one misses
    ``ITERATION_MEDIAN_TARGET`` / ``ITERATION_P90_TARGET``)."""
    validation = profile.obtained["validation"]
    ratios: dict[str, dict] = {}
    if state.held_out:
        ratios["prefill_points"] = ratio_summary(
            [profile.prefill.at(h["cached"], h["new"]) for h in state.held_out],
            [h["seconds"] for h in state.held_out])
    if state.held_out_batches:
        ratios["batches"] = ratio_summary(
            [profile.batched_prefill.iteration_s(b["cached"], b["new"])
             for b in state.held_out_batches], [b["seconds"] for b in state.held_out_batches])
    if profile.batched_prefill.wide is not None and profile.batched_prefill.wide.heldout:
        ratios["wide_batches"] = profile.batched_prefill.wide.heldout
    if state.held_out_decode:
        ratios["decode_points"] = ratio_summary(
            [profile.decode.at(d["batch"], d["context"]) for d in state.held_out_decode],
            [d["seconds"] for d in state.held_out_decode])
        validation["held_out_decode"] = [
            {**d, "predicted": profile.decode.at(d["batch"], d["context"])}
            for d in state.held_out_decode]
    mixed = None
    if state.mixed:
        batches, contexts = plan.mixed_batch_sizes, plan.mixed_context_tokens
        chunk_cached = _chunk_cached_tokens(plan)
        unpriced = replace(profile, mixed_steps=_no_increment(plan, profile.name))
        levels = []
        for k in plan.mixed_chunk_tokens:
            times = state.mixed[_key(k)]
            # each cell less what the simulator charges that step without an increment (the
            # chunk's price on the grid): the priced step is then the measured one at every
            # cell. The chunk timed alone in the level is kept in the raw times, not used: it
            # ran 1-2 ms over its grid price in every vLLM profile of runs E-M (the pass after
            # another unit's), which made every increment at 64 tokens 0 and priced the
            # held-out mixed steps 0.91-0.97x their time (docs/profiles.md)
            base = [unpriced.mixed_step_s([chunk_cached], [k], int(b), float(c))
                    for b in batches for c in contexts]
            increments = np.maximum(np.array([t[0] for t in times[1:]]) - np.array(base), 0.0)
            levels.append(BilinearGrid(
                profile.name, "batch_sizes", "context_tokens",
                [float(b) for b in batches], [float(c) for c in contexts],
                monotone_values(increments.reshape(len(batches), len(contexts)).tolist())))
        fit = {"chunk_cached_tokens": chunk_cached,
               "statistic": "median step with the chunk and the decode rows less the price of "
                            "that step without the increment (the chunk's batched prefill on "
                            "the grid), timed in the grid's sweeps; clipped at 0 and made "
                            "non-decreasing by isotonic regression (the chunk timed alone is "
                            "the first raw time of each level)",
               "raw": state.mixed}
        mixed = MixedSteps([float(k) for k in plan.mixed_chunk_tokens], levels, None, fit)
        if state.held_out_mixed:
            priced = replace(profile, mixed_steps=mixed)
            predicted = [priced.mixed_step_s(h["cached"][:1], h["new"][:1],
                                             len(h["new"]) - 1, float(np.mean(h["cached"][1:])))
                         for h in state.held_out_mixed]
            summary = ratio_summary(predicted, [h["seconds"] for h in state.held_out_mixed])
            mixed = replace(mixed, heldout=summary)
            ratios["mixed_steps"] = summary
            validation["held_out_mixed"] = [{**h, "predicted": p}
                                            for h, p in zip(state.held_out_mixed, predicted,
                                                            strict=True)]
    overhead = None
    if state.sampling:
        rows = [int(k) for k in state.sampling]
        overhead = fit_step_overhead(
            rows, [state.sampling[_key(r)][0] for r in rows],
            against=f"the engine's greedy sampling timed at {len(rows)} row counts")
        profile.obtained["raw"]["sampling"] = state.sampling
    validation["iteration_ratios"] = ratios
    validation["iteration_targets"] = {"median_ratio_within": ITERATION_MEDIAN_TARGET,
                                       "p90_abs_error": ITERATION_P90_TARGET}
    missed = [w for w in (iteration_warning(kind, s, threads=threads)
                          for kind, s in ratios.items()) if w]
    if missed:
        profile.obtained["warnings"] = [*profile.obtained.get("warnings", []), *missed]
    shapes = None
    if state.new_shapes:
        shapes = fit_new_shapes([(int(z), int(t), f, a) for z, t, f, a in state.new_shapes],
                                against=f"{len(state.new_shapes)} prefills of token counts the "
                                        "profile had not run, each then run again")
        profile.obtained["raw"]["new_shapes"] = state.new_shapes
    if shapes is not None:
        shapes = replace(shapes, built_capacity_counts=state.built_capacity_counts)
    if shapes is not None and state.after_new:
        steady = {int(z): t for z, k, t in state.after_new if k == 0}
        timed = [(int(z), int(k), t) for z, k, t in state.after_new if k > 0]
        shapes = replace(shapes, after=fit_after_new_shapes(
            steady, timed, against=f"a prefill of {len(steady)} sizes, each right after "
                                   f"{list(AFTER_NEW_COUNTS)} prefills of "
                                   f"{AFTER_NEW_FRESH_TOKENS}+ tokens the engine had not run"))
        profile.obtained["raw"]["after_new_counts"] = state.after_new
    if shapes is not None and state.engine_growth:
        shapes = replace(shapes, growth=fit_engine_growth(
            [(int(t), f, a) for t, f, a in state.engine_growth],
            against=f"a new engine's first step of {len(state.engine_growth)} sizes against "
                    f"its median of {GROWTH_AGAIN} more, built while the profile's own engine "
                    "held its memory"))
        profile.obtained["raw"]["engine_growth"] = state.engine_growth
    idle = None
    if state.idle_start:
        idle = fit_idle_start([(int(z), p, t) for z, p, t in state.idle_start],
                              against=f"prefills of {idle_sizes(plan)} tokens, each timed "
                                      f"{IDLE_REPEATS} times after pauses of "
                                      f"{[p * 1e3 for p in IDLE_PAUSES_S]} ms and without one")
        profile.obtained["raw"]["idle_start"] = state.idle_start
    after_prompt = None
    if state.first_decode:
        after_prompt = fit_decode_after_prompt(
            state.first_decode,
            against=f"{len(state.first_decode)} timings of the first {DECODE_POSITIONS} "
                    f"decode steps of {list(FIRST_DECODE_ROWS)} rows after the step of their "
                    f"prompts of {FIRST_DECODE_CONTEXTS} tokens (within the decode axis), "
                    f"against the median of their {STEADY_FROM}th-{FIRST_DECODE_STEPS}th")
        profile.obtained["raw"]["first_decode"] = state.first_decode
    if state.after_new_note:
        profile.obtained["warnings"] = [*profile.obtained.get("warnings", []),
                                        f"a step after new token counts: {state.after_new_note}"]
    return replace(profile, mixed_steps=mixed, step_overhead=overhead, new_shapes=shapes,
                   idle_start=idle, decode_after_prompt=after_prompt)
