"""One transformer forward path, shared by the profiler and the reference engine.

The profiler times these calls and the reference engine (``ragsim.realrun.engine``) serves
requests with them, so a profile measured here describes the engine that runs here. The model
is a Llama-architecture network built from a ``ModelSpec`` with random weights (nothing is
downloaded; timing and KV exactness do not depend on the weights).

A forward pass takes rows, each a cached prefix (real per-layer K/V tensors, or none), the new
token ids and the position of the first new token. Rows with different cached or new lengths
share one pass: cached KV and new tokens are left-padded, a 2-D attention mask hides the
padding, and every row gets its own ``position_ids`` (without them the model numbers the tokens
of a padded row from the padded start and the output is silently wrong). Where no row needs
padding the mask is left out, so the attention kernel keeps its causal fast path.

Tensor layout of one layer's K or V for one row: ``[kv_heads, tokens, head_dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragsim.errors import RagsimInputError
from ragsim.profiles.decode_layout import decode_buffer_shape, grown_tokens
from ragsim.profiles.models import ModelSpec
from ragsim.profiles.new_shapes import StepSizesRun

LayerKV = tuple[Any, Any]  # (keys, values), each [kv_heads, tokens, head_dim]


@dataclass
class Row:
    """One request's part of a forward pass.

    ``cached`` holds one (keys, values) pair per layer for the tokens already computed, or is
    None; keys and values are each a tensor or a sequence of tensors, chunks along the token
    axis in order (a prefix made of several stored nodes is copied into the batch chunk by
    chunk, never concatenated first). ``start`` is the position of the first new token (the
    cached length, unless the caller knows better).
    """

    cached: list[LayerKV] | None
    token_ids: Sequence[int] | Any
    start: int


@dataclass
class Batch:
    """Inputs of one padded forward pass and the cache it fills (see ``TorchModel.prepare``)."""

    ids: Any  # [rows, longest_new]
    mask: Any | None  # [rows, cached + new (+ decoded)] of 0/1, None when nothing is padded
    positions: Any  # [rows, longest_new]
    cache: Any  # a DynamicCache holding the padded cached KV (possibly empty)
    cached_lengths: list[int]
    new_lengths: list[int]
    next_positions: Any  # [rows, 1]: position of each row's next token
    fills: list | None = None  # lazy: per layer, copies its cached KV in (``forward`` calls)

    @property
    def rows(self) -> int:
        return len(self.new_lengths)


@dataclass
class Prefilled:
    """What ``TorchModel.prefill`` returns: last-token logits and the new tokens' KV per row."""

    logits: Any  # [rows, vocab]
    new_kv: list[list[LayerKV]]  # row -> layer -> (keys, values) of that row's new tokens
    batch: Batch  # to continue with ``decode``


def _growing_layer_class():
    """``GrowingLayer``, defined on first use (transformers is imported lazily)."""
    global _GROWING_LAYER
    if _GROWING_LAYER is not None:
        return _GROWING_LAYER
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A cache layer that appends in place into a buffer with room to spare.

        transformers' ``DynamicLayer`` concatenates the whole cache with every new token, so a
        decode step of ``n`` requests over ``c`` tokens copied ``n * c`` tokens of KV per layer
        (measured here: 179 ms for a step of 32 requests over 2,048 tokens, 77 ms appending in
        place). A serving engine writes a new token's KV where it belongs and copies nothing;
        this layer does the same, except when its buffer is full (it then grows by a quarter,
        so copies stay a small constant per token). ``keys``/``values`` are views of the
        buffer's filled part.
        """

        def lazy_initialization(self, key_states, value_states) -> None:
            super().lazy_initialization(key_states, value_states)
            self._keys_buffer = self._values_buffer = None
            self._length = 0

        def adopt(self, keys, values, length: int) -> None:
            """Take ``keys``/``values`` (``[rows, heads, capacity, dim]`` buffers whose first
            ``length`` tokens are the cache) as this layer's buffers, without copying: the
            caller allocated them with room for what comes next and fills them, now or later
            (a lazy prefill fills each layer as the pass reaches it)."""
            if not self.is_initialized:
                self.lazy_initialization(keys, values)
            self._keys_buffer, self._values_buffer = keys, values
            self._length = length
            self._view()

        def _reserve(self, tokens: int) -> None:
            kb = self._keys_buffer
            if kb is not None and kb.shape[-2] >= tokens:
                return
            import torch

            shape = list(self.keys.shape if kb is None else kb.shape)
            shape[-2] = tokens
            keys = torch.empty(shape, dtype=self.keys.dtype, device=self.keys.device)
            values = torch.empty_like(keys)
            if kb is not None and self._length:
                keys[..., :self._length, :] = kb[..., :self._length, :]
                values[..., :self._length, :] = self._values_buffer[..., :self._length, :]
            self._keys_buffer, self._values_buffer = keys, values

        def _view(self) -> None:
            self.keys = self._keys_buffer[..., :self._length, :]
            self.values = self._values_buffer[..., :self._length, :]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            buffer = self._keys_buffer
            if buffer is not None and buffer.shape[0] != key_states.shape[0]:
                raise ValueError("a GrowingLayer keeps its rows; rebuild the cache instead")
            need = self._length + int(key_states.shape[-2])
            if buffer is None:
                self.keys, self.values = key_states, value_states  # shape and dtype to copy
                self._reserve(need)
            elif need > buffer.shape[-2]:
                self._reserve(max(need, grown_tokens(buffer.shape[-2])))
            self._keys_buffer[..., self._length:need, :] = key_states
            self._values_buffer[..., self._length:need, :] = value_states
            self._length = need
            self._view()
            return self.keys, self.values

        def release(self) -> None:
            """Drop this layer's tensors (a discarded batch's memory, freed before the rest of
            a rebuild allocates)."""
            self.keys = self.values = None
            self._keys_buffer = self._values_buffer = None

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative number of tokens")
            if tokens_to_remove == 0 or not self.is_initialized or self._keys_buffer is None:
                return
            self._length = max(self._length + tokens_to_remove, 0)
            self._view()

    _GROWING_LAYER = GrowingLayer
    return GrowingLayer


_GROWING_LAYER = None


def cache_keyword(forward: Any) -> str:
    """The name under which ``forward`` (a transformers model's or decoder layer's) takes its
    KV cache: ``cache`` from transformers 5.24 on, ``past_key_values`` before. Given the other
    name, a forward swallows it in ``**kwargs`` and runs on a fresh cache of its own: the pass
    silently ignores every cached token (on transformers 5.17 the profile's decodes ran
    without their context, and its prefills failed)."""
    import inspect

    parameters = inspect.signature(forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


# every step token count a ``TorchModel`` of this process has run (a pass: its rows' new
# tokens; a decode step: its rows, as the simulator counts a step). Why:
# what a step pays the first time (the memory it faults in above the process's largest step,
# the kernels chosen for a new size: ``Profile.new_shapes``) stays paid for the process, and a
# validation runs its points in one process after its own profile and probes. On run AA's
# torch points (2026-12-06) every run's first prefill of 2,023 tokens ran at its grid price
# (1.00x, median of fifteen) where the simulation, told nothing, charged it 1.09x for growth.
# ``realrun.vllm.shapes`` keeps vLLM's engines' counts the same way.
_STEPS_RUN = StepSizesRun()


def step_tokens_run() -> tuple[int, ...]:
    """Every step token count a ``TorchModel`` of this process has run so far, each once, in
    the order of their last run (the least recently run first)."""
    return _STEPS_RUN.counts()


class TorchModel:
    """A model with random weights and its forward calls: prefill over cached KV, decode."""

    def __init__(self, spec: ModelSpec, device: str = "cpu", dtype: str = "fp32",
                 threads: int | None = None, seed: int = 0) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        if threads:
            torch.set_num_threads(threads)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RagsimInputError("CUDA is not available on this machine", field="--device")
        self.torch = torch
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16,
                      "bf16": torch.bfloat16}[dtype]
        self.config = LlamaConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            max_position_embeddings=1 << 17)
        torch.manual_seed(seed)
        # create the weights where they will live, in their final dtype: a 7B model built in
        # fp32 on the host first would need 28 GB of RAM and minutes of random initialisation
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with self.device:
                self.model = LlamaForCausalLM(self.config)
        finally:
            torch.set_default_dtype(previous)
        self.model.eval()
        self.cache_kw = cache_keyword(self.model.forward)

    @classmethod
    def build(cls, spec: ModelSpec, device: str = "cpu", dtype: str = "fp32",
              threads: int | None = None, seed: int = 0) -> TorchModel:
        return cls(spec, device, dtype, threads, seed)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def sync(self) -> None:
        """Wait for queued device work (timing must not stop before the GPU does)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def new_cache(self):
        """An empty KV cache whose layers append in place (``GrowingLayer``)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        layer = _growing_layer_class()
        cache.layers = [layer() for _ in range(self.num_layers)]
        return cache

    def token_tensor(self, token_ids: Sequence[int] | Any):
        return self.torch.as_tensor(token_ids, dtype=self.torch.long, device=self.device)

    def prepare(self, rows: Sequence[Row], *, lazy: bool = False) -> Batch:
        """Pad the rows' cached KV and new tokens to the left into one batch's inputs.

        With ``lazy`` each layer's cached KV is copied into the batch only when ``forward``
        reaches that layer (``batch.fills``), so a caller may still be copying a later layer's
        KV to the device while earlier layers compute (``--overlap-swap``)."""
        torch, device = self.torch, self.device
        cached = [0 if r.cached is None else tokens_of(r.cached[0][0]) for r in rows]
        new_ids = [self.token_tensor(r.token_ids) for r in rows]
        new = [int(t.shape[0]) for t in new_ids]
        if min(new) < 1:
            raise ValueError("every row needs at least one new token")
        n, longest_cached, longest_new = len(rows), max(cached), max(new)
        cache = self.new_cache()
        fills = []
        if longest_cached:
            heads, dim = self.config.num_key_value_heads, self.config.head_dim
            full = all(c == longest_cached for c in cached)
            end = longest_cached
            for layer in range(self.num_layers):
                # one copy of every cached token into the batch's cache, padding zeroed; the
                # cache keeps these buffers, with room for the new tokens (appended in place)
                shape = (n, heads, longest_cached + longest_new, dim)
                keys = torch.empty(shape, device=device, dtype=self.dtype)
                values = torch.empty_like(keys)
                if not full:
                    keys[:, :, :end].zero_()
                    values[:, :, :end].zero_()

                def fill(layer=layer, keys=keys, values=values) -> None:
                    for i, (r, a) in enumerate(zip(rows, cached, strict=True)):
                        if a:
                            copy_chunks(keys[i, :, end - a:end], r.cached[layer][0])
                            copy_chunks(values[i, :, end - a:end], r.cached[layer][1])

                if lazy:  # filled when the pass reaches the layer
                    fills.append(fill)
                else:
                    fill()
                cache.layers[layer].adopt(keys, values, end)
        ids = torch.zeros(n, longest_new, dtype=torch.long, device=device)
        positions = torch.zeros(n, longest_new, dtype=torch.long, device=device)
        padded = len(set(cached)) > 1 or len(set(new)) > 1
        mask = (torch.zeros(n, longest_cached + longest_new, dtype=torch.long, device=device)
                if padded else None)
        for i, (r, a, b) in enumerate(zip(rows, cached, new, strict=True)):
            ids[i, longest_new - b:] = new_ids[i]
            positions[i, longest_new - b:] = torch.arange(r.start, r.start + b, device=device)
            if mask is not None:
                mask[i, longest_cached - a: longest_cached] = 1
                mask[i, longest_cached + longest_new - b:] = 1
        return Batch(ids=ids, mask=mask, positions=positions, cache=cache,
                     cached_lengths=cached, new_lengths=new,
                     next_positions=positions[:, -1:] + 1, fills=fills or None)

    def forward(self, batch: Batch, before_layer: Any = None):
        """The timed pass: run the new tokens over the cached KV; returns last-token logits.

        The new tokens' KV is appended to ``batch.cache`` (``undo_forward`` takes it off again).
        A lazy batch's layers are filled as the pass reaches them, each after
        ``before_layer(layer)`` (which may wait for that layer's KV to arrive on the device).
        """
        hooks = []
        if batch.fills is not None or before_layer is not None:
            fills = batch.fills

            def at_layer(layer: int) -> Any:
                def hook(_module, _args) -> None:
                    if before_layer is not None:
                        before_layer(layer)
                    if fills is not None:
                        fills[layer]()
                return hook

            hooks = [block.register_forward_pre_hook(at_layer(layer))
                     for layer, block in enumerate(self.model.model.layers)]
            batch.fills = None  # filled once: a later pass over this batch reads them
        try:
            with self.torch.no_grad():
                out = self.model(input_ids=batch.ids, attention_mask=batch.mask,
                                 position_ids=batch.positions, use_cache=True,
                                 logits_to_keep=1, **{self.cache_kw: batch.cache})
        finally:
            for hook in hooks:
                hook.remove()
        if not batch.cache.layers[0].is_initialized:
            raise RuntimeError(f"the model did not write into the cache passed as "
                               f"{self.cache_kw!r}: its forward takes the cache by another "
                               "name (cache_keyword)")
        _STEPS_RUN.note(sum(batch.new_lengths))
        return out.logits[:, -1, :]

    def new_kv(self, batch: Batch) -> list[list[LayerKV]]:
        """Copies of each row's new tokens' KV, per layer, right after ``forward``."""
        result: list[list[LayerKV]] = []
        for i, b in enumerate(batch.new_lengths):
            row = []
            for layer in batch.cache.layers[:self.num_layers]:
                end = layer.keys.shape[-2]  # the new tokens are the last ones
                row.append((layer.keys[i, :, end - b:end].clone(),
                            layer.values[i, :, end - b:end].clone()))
            result.append(row)
        return result

    def prefill(self, rows: Sequence[Row]) -> Prefilled:
        """One forward pass over ``rows``: last-token logits and each row's new KV."""
        batch = self.prepare(rows)
        logits = self.forward(batch)
        return Prefilled(logits=logits, new_kv=self.new_kv(batch), batch=batch)

    def decode(self, batch: Batch, token_ids: Sequence[int] | Any):
        """One decode step: a token per row on top of everything in ``batch.cache``."""
        torch = self.torch
        ids = self.token_tensor(token_ids).reshape(batch.rows, 1)
        if batch.mask is not None:
            batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=batch.mask,
                             position_ids=batch.next_positions, use_cache=True,
                             logits_to_keep=1, **{self.cache_kw: batch.cache})
        batch.next_positions = batch.next_positions + 1
        _STEPS_RUN.note(batch.rows)
        return out.logits[:, -1, :]

    @staticmethod
    def greedy(logits: Any) -> list[int]:
        """Each row's next token (greedy), handed back to Python: what the reference engine
        does with a step's logits (``ragsim profile`` times it as the per-step overhead)."""
        return logits.argmax(dim=-1).tolist()

    def undo_forward(self, batch: Batch) -> None:
        """Take the new tokens' KV off the cache again, so ``forward`` can be timed repeatedly."""
        batch.cache.crop(-max(batch.new_lengths))

    def undo_decode(self, batch: Batch) -> None:
        """Take the last decode step back (cache, mask and positions)."""
        batch.cache.crop(-1)
        if batch.mask is not None:
            batch.mask = batch.mask[:, :-1]
        batch.next_positions = batch.next_positions - 1


def tokens_of(kv: Any) -> int:
    """Tokens in one layer's keys (or values): a tensor, or chunks along the token axis."""
    if isinstance(kv, list | tuple):
        return sum(int(chunk.shape[-2]) for chunk in kv)
    return int(kv.shape[-2])


def copy_chunks(dst: Any, src: Any) -> None:
    """Copy ``src`` (a tensor, or chunks along the token axis) into ``dst`` in order."""
    if not isinstance(src, list | tuple):
        dst.copy_(src)
        return
    at = 0
    for chunk in src:
        n = int(chunk.shape[-2])
        dst[:, at:at + n].copy_(chunk)
        at += n


def decode_step_batch(model: TorchModel, cache: Any, lengths: list[int], end: int,
                      next_tokens: list[int]) -> Batch:
    """A decode step's inputs for rows whose KV (``lengths`` tokens each, left-padded) ends at
    ``end`` in ``cache``: each row's next token at its own position, and a mask of its own
    tokens and the new one when the rows differ."""
    torch, device = model.torch, model.device
    n = len(lengths)
    sizes = torch.tensor(lengths, device=device).reshape(n, 1)
    mask = None
    if len(set(lengths)) > 1 or lengths[0] != end:
        span = torch.arange(end + 1, device=device).reshape(1, -1)
        mask = (span >= end - sizes).to(torch.long)
    return Batch(ids=model.token_tensor(next_tokens).reshape(n, 1), mask=mask,
                 positions=sizes, cache=cache, cached_lengths=lengths, new_lengths=[1] * n,
                 next_positions=sizes + 1)


def decode_buffer(model: TorchModel, rows: int, tokens: int) -> Any:
    """One layer's keys (or values) of a padded decode batch: ``rows`` rows of ``tokens``,
    written by the caller (each row's KV where it belongs, zeros only in its padding)."""
    config = model.config
    return model.torch.empty(rows, config.num_key_value_heads, tokens, config.head_dim,
                             device=model.device, dtype=model.dtype)


def write_joiner(buffer: Any, row: int, end: int, length: int, kv: Any) -> None:
    """A joining request's row of a padded decode buffer: zeros over its padding, its KV
    (``length`` tokens: a tensor or chunks) up to the batch's common ``end``."""
    buffer[row, :, :end - length].zero_()
    copy_chunks(buffer[row, :, end - length:end], kv)


def joiners_decode_cache(model: TorchModel, kvs: Sequence[list[LayerKV]], lengths: list[int]
                         ) -> tuple[Any, list[list[Any]], int]:
    """A new padded decode batch of joining requests only (the engine's first batch, or a
    rebuild where no row of the last step stays): each request's KV (``kvs[i]``, per layer,
    ``lengths[i]`` tokens) copied into a buffer of ``decode_buffer_shape`` rows and tokens,
    left-padded to the longest. Returns the cache adopting the rows, the buffers per layer
    (keys, values) and the common end. The engine builds these batches with it
    (``realrun/iterations.py``), and the profiler times its first step after a prompt on it
    (``TorchEngine.first_decode``)."""
    n, longest = len(lengths), max(lengths)
    rows, buffer_tokens = decode_buffer_shape(n, longest)
    cache = model.new_cache()
    storage = []
    for layer in range(model.num_layers):
        pair = []
        for side in (0, 1):
            buffer = decode_buffer(model, rows, buffer_tokens)
            for row in range(n):
                write_joiner(buffer, row, longest, lengths[row], kvs[row][layer][side])
            pair.append(buffer)
        storage.append(pair)
        cache.layers[layer].adopt(pair[0][:n], pair[1][:n], longest)
    return cache, storage, longest
