"""What the torch reference engine holds on a GPU beside its KV pool, and terms that fit it.

The pool (``gpu_kv_bytes``, by default the profile's ``kv_capacity_bytes``: 90% of what the
weights left free when the profile was measured) is what both sides count: cached nodes and the
running requests' reservations. The torch engine also holds, physically, what a paged engine
does not:

* its decode batch, one dense tensor per layer padded to the batch's longest row, with room
  for a quarter more rows and 64 more tokens, growing by a quarter when a row outgrows it
  (``iterations._rebuild``, ``torch_model.GrowingLayer``);
* a prefill batch's cache, padded the same way, and the pass's activations.

On a CPU with a small model these are megabytes. On a GPU with a 7B model they are not: the
first validation on an H200 (Mistral-7B fp16, 300 requests at once, the profile's pool of
112 GiB) ran out of memory when a decode batch of 256 rows padded to 2,275 tokens asked for
1.4 GiB per layer and side (89 GiB in all) beside the pool; it did again with a pool of
32 GiB. So before a torch run on CUDA, :func:`fit_terms` bounds what the engine will hold at the
trace's longest request and, where pool plus batches would not fit the device, lowers the batch
limit and the pool that the user did not set, on both sides of a validation, and says so. A
setting the user gave that cannot fit is refused naming it, before any GPU time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ragsim.errors import RagsimInputError
from ragsim.profiles.decode_layout import decode_buffer_shape, grown_tokens
from ragsim.profiles.models import ModelSpec
from ragsim.units import format_bytes

# CUDA's context, the caching allocator's fragmentation and what the measurement cannot
# foresee: a share of the device's free memory kept out of every term
SLACK_FRACTION, SLACK_MIN_BYTES = 0.05, 2 * 2**30
# a pool that cannot hold this many of the longest requests serves next to nothing: refused
MIN_POOL_REQUESTS = 4


def weight_bytes(spec: ModelSpec) -> int:
    """The model's weights in its dtype (the derived profiles' parameter count)."""
    from ragsim.profiles.derived import parameter_count

    return int(parameter_count(spec) * spec.dtype_bytes)


def decode_batch_bytes(rows: int, longest_tokens: int, spec: ModelSpec) -> int:
    """The dense decode batch's most: ``rows`` running requests padded to the longest, with the
    engine's spare rows and tokens, its buffer grown once (as when that row outgrows it)."""
    buffer_rows, buffer_tokens = decode_buffer_shape(rows, longest_tokens)
    return buffer_rows * grown_tokens(buffer_tokens) * spec.kv_bytes_per_token


def prefill_bytes(rows: int, longest_tokens: int, batched_tokens: int,
                  spec: ModelSpec) -> int:
    """A prefill pass's most: its batch's cache padded to the longest prompt, plus activations
    (hidden states, attention projections and the gated MLP's intermediates of the step's
    tokens, a layer at a time)."""
    cache = rows * longest_tokens * spec.kv_bytes_per_token
    width = 4 * spec.hidden_size + 3 * spec.intermediate_size
    return cache + batched_tokens * width * spec.dtype_bytes


def longest_request_tokens(trace, config) -> int:
    """The longest request's tokens once it has answered: system prompt, documents, query and
    output."""
    total = (config.system_prompt_tokens + trace.doc_tokens_per_request + trace.query_tokens
             + trace.output_tokens)
    return int(total.max()) if len(total) else 1


@dataclass(frozen=True)
class MemoryPlan:
    """The engine's device memory at its most, by part (bytes)."""

    free_bytes: int  # free on the device before the model is built
    weights_bytes: int
    pool_bytes: int
    decode_batch_bytes: int
    prefill_bytes: int
    slack_bytes: int

    @property
    def needed_bytes(self) -> int:
        return (self.weights_bytes + self.pool_bytes + self.decode_batch_bytes
                + self.prefill_bytes + self.slack_bytes)

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.free_bytes

    def describe(self) -> str:
        return (f"weights {format_bytes(self.weights_bytes)} + pool "
                f"{format_bytes(self.pool_bytes)} + padded decode batch "
                f"{format_bytes(self.decode_batch_bytes)} + prefill "
                f"{format_bytes(self.prefill_bytes)} + slack {format_bytes(self.slack_bytes)}"
                f" of {format_bytes(self.free_bytes)} free")


def plan(spec: ModelSpec, config, *, pool_bytes: int, longest_tokens: int,
         free_bytes: int) -> MemoryPlan:
    """The engine's memory at its most for ``config``'s batch limits."""
    return MemoryPlan(
        free_bytes=free_bytes, weights_bytes=weight_bytes(spec), pool_bytes=pool_bytes,
        decode_batch_bytes=decode_batch_bytes(config.max_batch_size, longest_tokens, spec),
        prefill_bytes=prefill_bytes(config.max_prefill_bs, longest_tokens,
                                    config.max_batched_tokens, spec),
        slack_bytes=max(SLACK_MIN_BYTES, int(SLACK_FRACTION * free_bytes)))


def fit_terms(config, spec: ModelSpec, *, profile_pool_bytes: int, longest_tokens: int,
              free_bytes: int, given: Collection[str] = ()
              ) -> tuple[object, dict[str, tuple], MemoryPlan]:
    """``config`` with a pool and a decode batch limit the torch engine can hold on a device
    with ``free_bytes`` free, and what changed (field -> (was, now)).

    What weights, the prefill pass and the slack leave is shared: the padded decode batch gets
    at most half (its limit lowered until it fits), the pool the rest (lowered to it). A pool
    lowered first, alone, would starve admission (the pool holds the running requests'
    reservations too); a batch limit lowered alone would leave the pool idle. A field in
    ``given`` (the user set it) is never changed: if that leaves too little, the error names
    it."""
    pool = config.gpu_kv_bytes or profile_pool_bytes
    current = plan(spec, config, pool_bytes=pool, longest_tokens=longest_tokens,
                   free_bytes=free_bytes)
    if current.fits:
        return config, {}, current
    changed: dict[str, tuple] = {}
    left = free_bytes - current.weights_bytes - current.prefill_bytes - current.slack_bytes
    if "max_batch_size" not in given:
        share = left // 2 if "gpu_kv_bytes" not in given else left - pool
        rows = config.max_batch_size  # the most rows whose batch fits the share (at least 1)
        while rows > 1 and decode_batch_bytes(rows, longest_tokens, spec) > share:
            rows -= 1
        if rows < config.max_batch_size:
            changed["max_batch_size"] = (config.max_batch_size, rows)
            config = config.replace(max_batch_size=rows)
    if "gpu_kv_bytes" not in given:
        room = left - decode_batch_bytes(config.max_batch_size, longest_tokens, spec)
        if 0 < room < pool:
            changed["gpu_kv_bytes"] = (config.gpu_kv_bytes, int(room))
            config = config.replace(gpu_kv_bytes=int(room))
            pool = int(room)
    current = plan(spec, config, pool_bytes=pool, longest_tokens=longest_tokens,
                   free_bytes=free_bytes)
    floor = MIN_POOL_REQUESTS * longest_tokens * spec.kv_bytes_per_token
    if not current.fits or pool < floor:
        settable = [option for name, option in (("gpu_kv_bytes", "--gpu-mem"),
                                                ("max_batch_size", "max_batch_size"))
                    if name in given]
        raise RagsimInputError(
            "the torch engine cannot hold this run on the device at the trace's longest "
            f"request ({longest_tokens:,} tokens): {current.describe()}"
            + (f"; lower {' or '.join(settable)}, or leave it to the engine" if settable
               else "; use a smaller model or a device with more memory"),
            field="--gpu-mem" if "gpu_kv_bytes" in given else "--device")
    return config, changed, current


def device_free_bytes(device: str) -> int | None:
    """Free memory on a CUDA ``device`` now (None on a CPU, whose memory these terms do not
    bound: the small models it serves hold megabytes)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():  # as the engine would say, before it is built
        raise RagsimInputError("CUDA is not available on this machine", field="--device")
    index = torch.device(device).index or 0
    free, _ = torch.cuda.mem_get_info(index)
    return int(free)


def memory_note(changed: dict[str, tuple], memory: MemoryPlan, *, who: str) -> str:
    """One line: what ``fit_terms`` changed and why."""
    parts = []
    for name, (was, now) in changed.items():
        if name == "gpu_kv_bytes":
            parts.append(f"gpu_kv_bytes {'the profile' if was is None else format_bytes(was)}"
                         f" -> {format_bytes(now)}")
        else:
            parts.append(f"{name} {was} -> {now}")
    return (f"--backend torch on the GPU: {who}: {', '.join(parts)} (the engine's decode "
            f"batch is dense, padded to its longest row; at most: {memory.describe()})")


def fit_for_device(config, trace, profile, device: str, *, given: Collection[str] = (),
                   who: str) -> tuple[object, dict[str, tuple], str | None]:
    """``fit_terms`` for a torch run on ``device`` (nothing changes on a CPU): the config, what
    changed and the line saying so (None when nothing did)."""
    free = device_free_bytes(device)
    if free is None:
        return config, {}, None
    fitted, changed, memory = fit_terms(
        config, profile.model, profile_pool_bytes=profile.kv_capacity_bytes,
        longest_tokens=longest_request_tokens(trace, config), free_bytes=free, given=given)
    return fitted, changed, (memory_note(changed, memory, who=who) if changed else None)



# the most the heap is grown by before a run's clock (``grow_heap_before_clock``): a quarter of
# the memory free then, and never more than this
HEAP_GROWTH_LIMIT_BYTES = 4 << 30


def grow_heap_before_clock(model, spec: ModelSpec, trace, config) -> dict:
    """Grow the process's heap, before a run's clock starts, by as much as the run's largest
    decode batch can take (``decode_batch_bytes`` at as many rows as it runs at once and its
    longest request, the engine's memory bound's own figure; at most a quarter of the memory
    free and ``HEAP_GROWTH_LIMIT_BYTES``): allocated, written and freed, so the allocator keeps
    it for the batches to come. Why: a serving engine sets its KV memory up at start (vLLM
    allocates its cache before it serves), while this engine's padded batch grows on demand,
    and on tcmalloc a process's first growth by a gigabyte cost 2.4-2.5 s inside the overload
    point's clock in two sittings of the project's CPU (0.2 s in two others; timed apart: 2.25
    s, then 0.12-0.35 s), which no price holds (docs/validation.md, "Run AX"). Only on a CPU
    (a GPU's caching allocator would keep it reserved from the run). Returns the bytes and
    the seconds it took, for the run's summary."""
    import os
    import time

    if model.device.type != "cpu":
        return {"bytes": 0, "seconds": 0.0}
    wanted = decode_batch_bytes(min(int(config.max_batch_size), trace.n_requests),
                                longest_request_tokens(trace, config), spec) \
        if trace.n_requests else 0
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        free = 0
    grown = int(min(wanted, HEAP_GROWTH_LIMIT_BYTES, free // 4))
    started = time.perf_counter()
    if grown > 0:
        block = model.torch.empty(grown, dtype=model.torch.uint8)
        block.fill_(0)
        del block
    return {"bytes": grown, "seconds": time.perf_counter() - started}
