"""The forward-path pieces of position-free KV reuse, shared by the engine and the profiler.

``ragsim.realrun.blend`` assembles a blended prefill from these; the profiler times the
CacheBlend selection pass with the same code (``blend_selection_s_per_token``), so the profile
term describes the engine that runs here (as ``torch_model`` does for plain prefills).

* ``shift_keys`` moves RoPE-rotated keys by an offset. RoPE rotates each pair of dimensions
  ``(i, i + r/2)`` by ``position x inv_freq[i]``; rotations compose, so rotating keys made at
  ``p0`` by ``(p1 - p0) x inv_freq`` gives the keys at ``p1`` (to float rounding). The
  frequencies are the model's own (``rotary_emb.inv_freq``: rope theta and any static
  scaling, linear, YaRN, Llama-3), the rotated width ``r = 2 x len(inv_freq)`` (a
  partial-rotary model passes the rest through), and YaRN's attention factor, already in the
  stored keys, is not applied twice. A RoPE whose frequencies change with the sequence length
  (``dynamic``, ``longrope``) is refused.
* ``ScatterCache`` + ``run_layers`` run the model's own decoder layers for any subset of a
  context's tokens, each attending to the whole assembled context up to its position: the
  computed tokens' fresh KV is written at their positions, every other position keeps what
  was assembled there.
* ``selection_pass`` is CacheBlend's token selection (LMCache's ``blend_check_layers=[1]``):
  every token after the prefix through the layers below the check layer, then each reused
  token's fresh keys and values on the check layer against its stored ones; the deviation is
  the squared L2 distance of keys plus that of values (the paper's "KV deviation"; LMCache's
  code uses the keys alone). Layer 0's KV is a function of a token and its position only (its
  input is the embedding), so a moved document's deviation there is zero: layer 1 is the
  first that can tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

from ragsim.profiles.torch_model import Row, TorchModel

_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")


def rope_inv_freq(model: TorchModel):
    """The model's RoPE frequencies (one per rotated pair of dimensions); ValueError for a
    RoPE that depends on the sequence length (no fixed rotation moves its keys)."""
    rotary = model.model.model.rotary_emb
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if rope_type in _POSITION_DEPENDENT_ROPE:
        raise ValueError(f"rope type {rope_type!r} changes its frequencies with the sequence "
                         "length: a stored document's keys cannot be moved by a rotation")
    return rotary.inv_freq


def shift_keys(keys: Any, offset: int, inv_freq: Any):
    """``keys`` (``[..., tokens, head_dim]``, RoPE-rotated at some positions) rotated by
    ``offset`` positions more: the keys at positions ``offset`` later. The angle is computed
    in float64 and applied in float32 at least, so moving adds no more rounding than
    computing the keys there would. Llama's convention (halves, ``rotate_half``)."""
    import torch

    if offset == 0:
        return keys
    angle = float(offset) * inv_freq.to(dtype=torch.float64, device=keys.device)
    work = torch.promote_types(keys.dtype, torch.float32)
    cos = torch.cat([angle.cos(), angle.cos()]).to(work)
    sin = torch.cat([angle.sin(), angle.sin()]).to(work)
    width = 2 * int(inv_freq.shape[0])
    rotated = keys[..., :width].to(work)
    half = width // 2
    turned = torch.cat([-rotated[..., half:], rotated[..., :half]], dim=-1)
    result = (rotated * cos + turned * sin).to(keys.dtype)
    if width == keys.shape[-1]:
        return result
    return torch.cat([result, keys[..., width:]], dim=-1)


class ScatterCache:
    """A context's KV, one ``[kv_heads, tokens, head_dim]`` buffer pair per layer, as a
    transformers cache: a decoder layer computing some tokens calls ``update`` with their
    fresh keys and values, which are written at ``positions`` (the rest keeps what was
    assembled there); the layer's attention reads the whole context."""

    def __init__(self, keys: list, values: list) -> None:
        self.keys, self.values = keys, values
        self.positions = None  # positions of the tokens the next layer call computes

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(1, self.positions, key_states[0].to(keys.dtype))
        values.index_copy_(1, self.positions, value_states[0].to(values.dtype))
        return keys[None], values[None]


def run_layers(model: TorchModel, hidden: Any, positions: Any, layers: range,
               cache: ScatterCache):
    """The model's decoder layers ``layers`` for the tokens at ``positions`` (sorted; their
    hidden states ``[1, n, hidden]``), each attending to the context up to its own position."""
    if not len(layers):
        return hidden
    import torch

    inner = model.model.model
    total = int(cache.keys[0].shape[1])
    mask = (torch.arange(total, device=positions.device)[None, :]
            <= positions[:, None])[None, None]
    position_ids = positions[None]
    embeddings = inner.rotary_emb(hidden, position_ids=position_ids)
    cache.positions = positions
    for layer in layers:
        hidden = inner.layers[layer](hidden, attention_mask=mask,
                                     position_embeddings=embeddings,
                                     position_ids=position_ids, use_cache=True,
                                     **{model.cache_kw: cache})
    return hidden


def fresh_kv(model: TorchModel, hidden: Any, positions: Any, layer: int):
    """The keys (RoPE-rotated) and values ``layer`` computes from ``hidden`` (that layer's
    input), each ``[kv_heads, n, head_dim]``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inner = model.model.model
    block = inner.layers[layer]
    attention = block.self_attn
    normed = block.input_layernorm(hidden)
    shape = (*normed.shape[:-1], -1, attention.head_dim)
    k = attention.k_proj(normed).view(shape).transpose(1, 2)
    v = attention.v_proj(normed).view(shape).transpose(1, 2)
    cos, sin = inner.rotary_emb(hidden, position_ids=positions[None])
    _, k = apply_rotary_pos_emb(k, k, cos, sin)
    return k[0], v[0]


def selection_pass(model: TorchModel, ids: Any, prefix: int, cache: ScatterCache,
                   spans: Sequence[tuple[int, int]], check_layer: int = 1):
    """CacheBlend's selection over a context whose KV ``cache`` holds the exact prefix (its
    first ``prefix`` tokens) and the reused documents' moved KV at ``spans`` ([start, end)
    positions): every token after the prefix (``ids[prefix:]``) through layers ``0 ..
    check_layer - 1``, writing its fresh KV there, then each span's KV deviation on
    ``check_layer``. Returns the hidden states entering ``check_layer`` (``[1, n, hidden]``,
    the tokens after the prefix) and per span its tokens' deviations."""
    import torch

    positions = torch.arange(prefix, int(ids.shape[0]), device=ids.device)
    hidden = model.model.model.embed_tokens(ids[prefix:][None])
    hidden = run_layers(model, hidden, positions, range(check_layer), cache)
    keys, values = fresh_kv(model, hidden, positions, check_layer)
    stored_k, stored_v = cache.keys[check_layer], cache.values[check_layer]
    deviations = []
    for start, end in spans:
        lo, hi = start - prefix, end - prefix
        deviations.append((keys[:, lo:hi] - stored_k[:, start:end]).float().pow(2).sum((0, 2))
                          + (values[:, lo:hi] - stored_v[:, start:end]).float().pow(2)
                          .sum((0, 2)))
    return hidden, deviations


def highest(deviation: Any, count: int) -> list[int]:
    """The indices of the ``count`` highest deviations, in order (ties: the earlier token)."""
    import torch

    return sorted(torch.sort(-deviation, stable=True).indices[:count].tolist())


def blend_selection_s_per_token(model: TorchModel, *,
                                context_tokens: Sequence[int] = (256, 512, 1024),
                                repeats: int = 3, check_layer: int = 1,
                                ratio: float = 0.15, seed: int = 0) -> float:
    """Seconds CacheBlend's selection pass takes per reused token it passes over (the
    profile's ``blend_selection_s_per_token``), measured on ``model``.

    For each length ``n``: a context that is one reused document of ``n`` tokens (computed
    alone, so nothing but the pass is timed; its KV is assembled before the clock starts);
    the best of ``repeats`` timings of ``selection_pass`` and the choice of ``ratio`` of its
    tokens. The result is the least-squares slope of time over ``n`` (a fixed cost per pass,
    e.g. kernel launches, stays out of a per-token figure; layer 0's attention makes the
    per-token cost grow slowly with the context, which a slope over these lengths averages).
    One length gives time / n."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    times = []
    for n in context_tokens:
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=generator
                            ).to(model.device)
        stored = model.prefill([Row(None, ids, 0)]).new_kv[0]
        with torch.no_grad():
            cache = ScatterCache([k.clone() for k, _ in stored], [v.clone() for _, v in stored])
        best = float("inf")
        for _ in range(repeats):
            model.sync()
            started = perf_counter()
            with torch.no_grad():
                _, (deviation,) = selection_pass(model, ids, 0, cache, [(0, n)], check_layer)
                highest(deviation, max(1, round(ratio * n)))
            model.sync()
            best = min(best, perf_counter() - started)
        times.append(best)
    if len(times) == 1:
        return times[0] / context_tokens[0]
    xs = [float(n) for n in context_tokens]
    mean_x, mean_y = sum(xs) / len(xs), sum(times) / len(times)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, times, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    return max(slope, 0.0)
