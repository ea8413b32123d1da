"""A cost profile of vLLM itself: its steps timed, in the profiler's format.

``VllmTimer`` has the timing interface of the profiler's ``TorchEngine`` (``sweeps``,
``decode``, ``copy``, ``free_memory_bytes``, ``device_name``), each measurement being whole
``step()`` calls of vLLM's in-process engine on the profile's model, so the simulator's tables
describe vLLM (its scheduler, paged attention, prefix-cache lookups), not transformers:

* **prefill over a cached prefix**: the prefix (``cached`` tokens, whole blocks) is computed
  once by a request of its own and left in vLLM's prefix cache; each timing adds requests of
  that prefix plus fresh random new tokens (so only the prefix hits), and times them from
  their ``add_request`` (vLLM's own work on a new request, which a run pays too) through the
  steps until every row has its first token. A batch (several rows) is added at once: vLLM
  schedules them in one step when they fit ``max_num_batched_tokens``.
* **decode**: ``batch`` requests of ``context`` tokens are prefilled, then single steps (one
  token for each) are timed.
* **mixed steps** (a prompt chunk beside running requests): ``b`` requests of ``c`` tokens
  (each on a cached prefix of its own, so setting them up costs one short step) are prefilled
  until each has its first token, so that they run; then a prompt of ``k`` new tokens over a
  cached prefix is added and the one step in which vLLM's scheduler decodes the running
  requests and prefills the prompt is timed (a timing in which the prompt does not get its
  first token, or a running request does not decode, is refused); the running requests are
  then aborted. The chunk alone is timed as any prefill, in the same sweeps, so the profile's
  increment (``MixedSteps``) is what the running requests add to vLLM's step.
* **wide batches**: 8 to 64 prompts in one step (up to the token budget), as vLLM takes every
  waiting prompt at load; a request added to such a batch costs more than in a batch of two to
  four (``profile.WideBatches``).
* **copies**: vLLM on a CPU has no host tier, so a host->host copy of a KV-sized buffer (what
  the torch profiler measures on a CPU too).

Prefix lengths are rounded down to whole blocks: vLLM caches nothing else.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragsim.profiles.decode_after_prompt import (
    DECODE_SETTLE_STEPS,
    FIRST_DECODE_STEPS,
    positions_row,
)
from ragsim.profiles.models import ModelSpec
from ragsim.realrun.vllm.engine import EngineSettings, build_engine, greedy, release_engines

# wide batches on vLLM: 8 to 64 rows of 256 tokens (64 x 256: ragsim's default token budget,
# 16,384), and four held-out ones
WIDE_ROWS = [8, 16, 32, 64]
HELD_OUT_WIDE = 4
# tokens a mixed step's running request may generate: its first, those it decodes while the
# other running requests are set up (one step when their prefixes are cached; a few where vLLM
# evicted some, 64 rows of 1,024 tokens spread over the token budget), and the timed step's,
# with room to spare; it is aborted after the timed step
MIXED_DECODE_TOKENS = 32


class VllmTimer:
    """vLLM's steps, timed the way the profiler's ``TorchEngine`` times forward passes."""

    # vLLM's kernels run each request over its own tokens: nothing is padded (BatchedPrefill)
    padding = "none"
    decode_padding = "none"  # nor in a decode step (paged KV): ``Profile.decode_padding``

    def __init__(self, llm, settings: EngineSettings, vocab_size: int, seed: int = 0) -> None:
        """Time steps of ``llm``, an engine built with ``settings`` (prefix caching on for
        prefills over a cached prefix)."""
        import torch

        self.torch = torch
        self.device = torch.device("cpu")
        self.llm = llm
        self.settings = settings
        self.block = settings.block_tokens
        self.vocab = vocab_size
        self.rng = np.random.default_rng(seed)
        self._prefixes: dict[int, list[int]] = {}
        self._n = 0
        self.spec: ModelSpec | None = None  # the model, where the timer built the engine

    @classmethod
    def build(cls, spec: ModelSpec, *, block_tokens: int, kv_cache_bytes: int,
              max_model_len: int, max_batched_tokens: int, max_num_seqs: int = 256,
              seed: int = 0, threads: int | None = None) -> VllmTimer:
        """A timer on an engine of its own, prefix caching on, on ``threads`` CPU threads
        (None: torch's default)."""
        settings = EngineSettings(
            prefix_caching=True, block_tokens=block_tokens, kv_cache_bytes=kv_cache_bytes,
            max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens,
            max_model_len=max_model_len, seed=seed, threads=threads)
        llm, folder = build_engine(spec, settings)
        timer = cls(llm, settings, spec.vocab_size, seed)
        timer.spec = spec
        timer._folder = folder  # the model's configuration lives as long as the timer
        return timer

    # ------------------------------------------------------------------ helpers
    def _tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, self.vocab, size=n).tolist()

    def _add(self, prompt: list[int], max_tokens: int) -> str:
        self._n += 1
        key = f"p{self._n}"
        self.llm.add_request(key, {"prompt_token_ids": prompt}, greedy(max_tokens))
        return key

    def _drain(self, cached: dict[str, int] | None = None) -> None:
        """Step until no request is left; with ``cached`` (request -> the prefix it must hit),
        refuse a timing whose prefix was not reused (evicted: the timing would be wrong)."""
        while self.llm.has_unfinished_requests():
            for out in self.llm.step():
                if cached and out.request_id in cached \
                        and out.num_cached_tokens < cached[out.request_id]:
                    raise RuntimeError(f"a profiled prefix of {cached[out.request_id]} tokens "
                                       f"was not reused ({out.num_cached_tokens} were): give "
                                       "vLLM more KV memory")

    def prefix(self, tokens: int, slot: int = 0) -> list[int]:
        """The token ids of a prefix of ``tokens`` (rounded down to whole blocks) that sits in
        vLLM's prefix cache: computed once by a request of its own. Prefixes of another
        ``slot`` hold other tokens (a mixed step's running requests each read their own KV,
        as distinct requests do)."""
        whole = tokens // self.block * self.block
        if (whole, slot) not in self._prefixes:
            ids = self._tokens(whole)
            if whole:
                self._add([*ids, *self._tokens(1)], 1)  # the last prompt token is never cached
                self._drain()
            self._prefixes[whole, slot] = ids
        return self._prefixes[whole, slot]

    def _pass(self, cached: list[int], new: list[int]) -> float:
        """One timed prefill: rows of (cached prefix, fresh new tokens) handed to vLLM at
        once, until each has its first token. The time starts before they are handed over:
        vLLM's own work on a new request (``add_request``: checking and converting its input,
        hashing its blocks; ~0.35 ms a request on two cores, 6% of a 6 ms prefill) runs on the
        engine's thread before the request can be scheduled, and a run pays it per request;
        left out, idle TTFTs were predicted short by it."""
        prefixes = [self.prefix(a) for a in cached]
        prompts = [[*prefix, *self._tokens(max(b, 1))]
                   for prefix, b in zip(prefixes, new, strict=True)]
        started = time.perf_counter()
        expected = {self._add(prompt, 1): len(prefix)
                    for prompt, prefix in zip(prompts, prefixes, strict=True)}
        self._drain(expected)
        return time.perf_counter() - started

    def _until_first_tokens(self, requests: int) -> dict[str, int]:
        """Step until ``requests`` requests (those just added) have their first token; returns
        the tokens each request stepped has so far."""
        tokens: dict[str, int] = {}
        while sum(1 for n in tokens.values() if n) < requests:
            if not self.llm.has_unfinished_requests():
                raise RuntimeError(f"{requests} requests added to a profiled step finished "
                                   "or left before all had their first token")
            for out in self.llm.step():
                tokens[out.request_id] = len(out.outputs[0].token_ids) if out.outputs else 0
        return tokens

    def _mixed(self, cached: list[int], new: list[int]) -> float:
        """One timed mixed step of the profile's plan: ``cached[0]`` cached and ``new[0]`` new
        tokens of a prompt prefilled in the step in which requests of ``cached[1:]`` tokens
        decode (``mixed_step`` with one prompt)."""
        return self.mixed_step([(cached[0], new[0])], cached[1:])

    def mixed_step(self, prompts: list[tuple[int, int]], contexts: list[int],
                   decode_tokens: int = MIXED_DECODE_TOKENS) -> float:
        """One step timed as a run takes it: requests of ``contexts`` tokens running (each on
        a cached prefix of its own, ``decode_tokens`` tokens allowed, aborted after), then
        ``prompts`` (cached, new tokens each; prompt ``k`` on a prefix of its own) handed over,
        and the one step in which vLLM's scheduler prefills them all and decodes the running
        requests timed from the hand-over (their ``add_request``, as a prefill alone is
        timed: ``_pass``). A step in which a prompt does not get its first token over its
        whole cached prefix, or a running request does not decode, is refused: it is not the
        step asked for."""
        llm, running = self.llm, []
        # every prefix before any request runs: one not made yet is made by a request of its
        # own, stepped to its end with whatever else the engine holds
        held = [self.prefix(context, slot) for slot, context in enumerate(contexts, 1)]
        prefixes = [self.prefix(a, -k) for k, (a, _) in enumerate(prompts)]
        for ids, context in zip(held, contexts, strict=True):
            fresh = self._tokens(max(context - len(ids), 1))
            running.append(self._add([*ids, *fresh], decode_tokens))
        # their prompts (mostly cached); where vLLM evicted some, the first to have a token
        # decode while the rest are set up, so the timed step must add one token to each
        before = self._until_first_tokens(len(running))
        handed = [[*prefix, *self._tokens(max(b, 1))]
                  for prefix, (_, b) in zip(prefixes, prompts, strict=True)]
        started = time.perf_counter()
        chunks = [self._add(prompt, 1) for prompt in handed]
        outputs = {out.request_id: out for out in llm.step()}
        took = time.perf_counter() - started
        llm.abort_request(running)  # the engine left empty, whether the step is kept or not
        self._drain()
        for chunk, prefix, (_, b) in zip(chunks, prefixes, prompts, strict=True):
            got = outputs.get(chunk)
            if got is None or not got.outputs or not got.outputs[0].token_ids \
                    or got.num_cached_tokens < len(prefix):
                raise RuntimeError(f"a profiled mixed step did not prefill its prompt of {b} "
                                   f"new tokens over {len(prefix)} cached ones in one step: "
                                   "give vLLM a larger token budget or more KV memory")
        decoded = [key for key in running if key in outputs and
                   len(outputs[key].outputs[0].token_ids) == before.get(key, 0) + 1]
        if len(decoded) < len(running):
            raise RuntimeError(f"only {len(decoded)} of a profiled mixed step's "
                               f"{len(running)} running requests decoded in it")
        return took

    # ------------------------------------------------------------------ the interface
    def sweeps(self, passes: list[tuple[list[int], list[int]]], warmup: int,
               repetitions: int, mixed: list[bool] | None = None):
        """Every pass timed once per sweep (the profiler's ``TorchEngine.sweeps``); a pass
        flagged in ``mixed`` is a mixed step (``_mixed``), its rows after the first the
        running requests' contexts."""
        from ragsim.profiles.profiler import Measurement, Timed

        mixed = mixed or [False] * len(passes)
        for (cached, _), is_mixed in zip(passes, mixed, strict=True):
            # prefixes first: their own prefills are not timed
            for slot, a in enumerate(cached):
                self.prefix(a, slot if is_mixed else 0)
        times: list[list[float]] = [[] for _ in passes]
        for sweep in range(warmup + repetitions):
            for k, (cached, new) in enumerate(passes):
                took = self._mixed(cached, new) if mixed[k] else self._pass(cached, new)
                if sweep >= warmup:
                    times[k].append(took)
        medians = [float(np.median(t)) for t in times]
        speed = [float(np.median([t[i] / m for t, m in zip(times, medians, strict=True)]))
                 for i in range(repetitions)]
        return Timed([Measurement(m, float(min(t)), float(max(t)))
                      for m, t in zip(medians, times, strict=True)], speed)

    def decode(self, batch: int, context: int, warmup: int, repetitions: int):
        """One decode step of ``batch`` requests of ``context`` tokens each."""
        from ragsim.profiles.profiler import Measurement

        steps = warmup + repetitions
        for _ in range(batch):
            self._add(self._tokens(context), steps + 2)
        llm = self.llm
        self._until_first_tokens(batch)  # prefill steps, maybe mixed with decode
        times = []
        for i in range(steps):
            started = time.perf_counter()
            llm.step()
            if i >= warmup:
                times.append(time.perf_counter() - started)
        self._drain()
        return Measurement(float(np.median(times)), float(min(times)), float(max(times)))

    def first_decode(self, rows: int, context: int, repeats: int) -> list[list[float]]:
        """``[rows, context, steady_s, t_1, ..., t_P]`` per repeat: ``rows`` requests of
        ``context`` fresh tokens added together and stepped to their first tokens (their
        prompts' steps), then their next ``FIRST_DECODE_STEPS`` steps timed one by one
        (``positions_row``: the steps at positions 1..P after the prompts' step, and the median
        of the steady ones, as the decode grid's cells time them after their settling steps).
        ``decode_after_prompt.py`` says why."""
        llm, out = self.llm, []
        for _ in range(repeats):
            for _ in range(rows):
                self._add(self._tokens(context), FIRST_DECODE_STEPS + 2)
            self._until_first_tokens(rows)
            times = []
            for _ in range(FIRST_DECODE_STEPS):
                started = time.perf_counter()
                llm.step()
                times.append(time.perf_counter() - started)
            self._drain()
            out.append(positions_row(rows, context, times))
        return out

    def copy(self, n_bytes: int, to_device: bool, warmup: int, repetitions: int):
        """A host->host copy of a KV-sized buffer (vLLM on a CPU has no other tier)."""
        from ragsim.profiles.profiler import Measurement

        torch = self.torch
        n = max(1, n_bytes // 2)
        src, dst = torch.empty(n, dtype=torch.float16), torch.empty(n, dtype=torch.float16)
        times = []
        for i in range(warmup + repetitions):
            started = time.perf_counter()
            dst.copy_(src)
            if i >= warmup:
                times.append(time.perf_counter() - started)
        return Measurement(float(np.median(times)), float(min(times)), float(max(times)))

    def free_memory_bytes(self) -> int:
        return self.settings.kv_cache_bytes

    def device_name(self) -> str:
        return platform.processor() or platform.machine()

    def engine_name(self) -> str:
        import vllm

        threads = int(self.torch.get_num_threads())
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        return (f"vLLM {vllm.__version__} (in-process engine, block {self.block}, prefix "
                f"caching on; {threads} OMP threads, bound: {bind})")

    def twin(self) -> VllmTimer | None:
        """A new engine with this one's settings in this process (as each run builds its
        own), or None for a timer around an engine built elsewhere."""
        if self.spec is None:
            return None
        s = self.settings
        return VllmTimer.build(self.spec, block_tokens=s.block_tokens,
                               kv_cache_bytes=s.kv_cache_bytes, max_model_len=s.max_model_len,
                               max_batched_tokens=s.max_batched_tokens,
                               max_num_seqs=s.max_num_seqs, seed=s.seed, threads=s.threads)

    def built_shapes(self) -> tuple[int, int] | None:
        """(token counts this process has built, how many stay built): vLLM's CPU linear
        layers run oneDNN matrix products built per token count and kept in oneDNN's
        process-wide primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024 by default),
        one per distinct linear-layer weight shape a count runs through (``shape_cache``);
        None where vLLM has no oneDNN products."""
        from vllm import _custom_ops as ops

        from ragsim.realrun.vllm.shapes import step_tokens_run

        if self.spec is None or not getattr(ops, "_supports_onednn", False):
            return None
        return len(step_tokens_run()), shape_cache_counts(self.spec)

    def libraries(self) -> dict[str, str]:
        import vllm

        return {"vllm": vllm.__version__, "torch": self.torch.__version__,
                "python": platform.python_version()}


ONEDNN_DEFAULT_CACHE_CAPACITY = 1024  # oneDNN's documented default (primitives)


def shape_cache_counts(spec: ModelSpec) -> int:
    """How many token counts oneDNN's primitive cache keeps built for ``spec``: its capacity
    (``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` or the default) over the distinct weight shapes of
    one decoder layer's linear layers (query/key/value, output, gate/up, down: every layer has
    the same, so they share primitives). Mistral-like models: 4, so 256 counts, as measured
    (``benchmarks/shape_cache.py``)."""
    capacity = int(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                  ONEDNN_DEFAULT_CACHE_CAPACITY))
    attention = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    shapes = {(spec.hidden_size, attention), (spec.num_attention_heads * spec.head_dim,
                                              spec.hidden_size),
              (spec.hidden_size, 2 * spec.intermediate_size),
              (spec.intermediate_size, spec.hidden_size)}
    return max(1, capacity // len(shapes))


def profile_vllm(spec: ModelSpec, *, name: str, plan, out: Path, block_tokens: int,
                 kv_cache_bytes: int, seed: int = 0, label: str = "",
                 progress: Callable[[str, int, int], None] | None = None,
                 threads: int | None = None):
    """Measure ``plan`` on vLLM and write the profile to ``out``: the profiler's own loop
    (``run_profile``: grid, batches, held-out points, interleaved sweeps, assembly, resuming
    from ``OUT.partial.json``) with ``VllmTimer`` as its timing engine and cached lengths
    rounded down to whole blocks, so the profile has the format, fits and checks of any
    other. ``threads``: the engine's CPU threads (None: torch's default, every core); the
    profile records the count it ran with (``obtained.threads``), which the runs priced by it
    take (``harness.engine_settings``)."""
    from dataclasses import replace

    from ragsim.profiles.profiler import run_profile

    # a timed step() samples and hands its tokens back already: no step overhead of its own;
    # vLLM takes every waiting prompt into a step up to its token budget: wide batches
    # measured; and it prefills beside every request it decodes: mixed steps with as many
    # decode rows as the decode grid has
    plan = replace(plan.with_mixed_rows_to_decode(), overhead_rows=[],
                   wide_batch_rows=plan.wide_batch_rows or WIDE_ROWS,
                   held_out_wide=plan.held_out_wide or HELD_OUT_WIDE)

    def whole(tokens: int) -> int:
        return tokens // block_tokens * block_tokens

    longest = whole(max(plan.cached_tokens)) + max(plan.new_tokens) + 8
    # a decode cell's requests: its context, the settling steps, the timed ones; the steps
    # after a prompts' step likewise (``decode_after_prompt``)
    settle = max(plan.warmup, DECODE_SETTLE_STEPS)
    longest = max(longest, max(plan.context_tokens) + settle + plan.repetitions + 8,
                  max(plan.context_tokens) + FIRST_DECODE_STEPS + 8,
                  max(plan.mixed_context_tokens, default=0) + MIXED_DECODE_TOKENS + 1)
    max_len = -(-longest // block_tokens) * block_tokens
    budget = max(4 * max_len, 8192, max(plan.wide_batch_rows) * plan.wide_row_tokens)
    timer = VllmTimer.build(spec, block_tokens=block_tokens, kv_cache_bytes=kv_cache_bytes,
                            max_model_len=max_len, max_batched_tokens=budget, seed=seed,
                            threads=threads)
    measured = run_profile(spec, name=name, device="cpu", dtype=spec.dtype, plan=plan,
                           out=out, threads=int(timer.torch.get_num_threads()), seed=seed,
                           kv_capacity_bytes=kv_cache_bytes, label=label, progress=progress,
                           engine=timer, whole_cached=whole)
    del timer
    release_engines()  # the timer's engine and its twin, dropped: their memory back
    return measured
