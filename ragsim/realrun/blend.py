"""Position-independent document KV reuse on the torch engine (CacheBlend- and EPIC-style).

The prefix cache (``TorchIterations``) reuses a document's KV only behind the same ordered
prefix, because a document's KV depends on everything before it. The systems this module
computes for real reuse a document's KV at *any* position and repair it by recomputing a few
of its tokens:

* **Keeping.** A document's KV is kept at its own positions (``PlacedKV``: the per-layer
  keys/values and the position ``p0`` of its first token when it was computed; the keys carry
  RoPE rotations for ``p0, p0+1, ...``). ``standalone_kv`` computes it alone (behind an
  optional prefix); ``placed_from`` cuts it from a prefill that computed it.
* **Moving.** Reused at position ``p1``, its keys are rotated by the offset ``p1 - p0``
  with the model's own RoPE frequencies (``ragsim.profiles.torch_blend.shift_keys``: exact,
  to float rounding, against computing the keys there); values carry no position and are
  not changed.
* **Blending** (``blended_prefill``): a context is assembled from the exact prefix's KV (the
  tree's hit path, computed in place), the moved documents' KV, and everything else computed
  fresh; then chosen tokens of each reused document are recomputed over the assembled
  context, so their KV sees the documents before them:

  - ``select="first"`` (EPIC's LegoLink): the first ``recompute_tokens`` tokens of each
    reused document are computed at every layer beside the new tokens.
  - ``select="deviation"`` (CacheBlend, as LMCache ships it, ``blend_check_layers=[1]``):
    a *selection pass* (``torch_blend.selection_pass``) computes every token after the
    prefix through layers ``0 .. check_layer - 1`` over the assembled context, then each
    reused token's keys and values on ``check_layer``, and its KV deviation from its moved KV
    (squared L2 of keys plus values, the paper's definition; LMCache's code uses keys only).
    Per reused document the ``recompute_tokens`` tokens of highest deviation are chosen
    (ties: the earlier token); from ``check_layer`` on only the new tokens and the chosen
    ones are computed, over the assembled context. Below ``check_layer`` every token's KV is
    the fresh one (it was computed anyway); from it on an unchosen token keeps its moved KV.
    The check layer is 1 by default: layer 0's KV depends on a token and its position only,
    so a moved document deviates there by zero. CacheBlend narrows its selection gradually
    over a few layers; LMCache and this module select once.

  The last token of the context is always computed (its logits give the first output token);
  if a reused document ends the context, its last token counts as recomputed: in place of the
  document's lowest-ranked choice (EPIC's K-th token, CacheBlend's least deviating chosen one)
  when it has any, so the document recomputes exactly its count, else as its one recomputed
  token (the policy core's ``engine_reuse`` counts the same: one token only when nothing else
  is computed). How many
  tokens of each document are recomputed is the caller's (the policy core's ``ReuseRule``
  rounds ``blend:R`` up per document, ``epic:K`` is ``min(K, tokens)``); this module takes
  the count per document, so the rule exists once.

* **Adapter** (``prefill_request``): what the real run would call for one request: its token
  ids, the exact prefix's KV, its documents' spans, the store's ``PlacedKV`` by document id
  and a rule with ``kind`` and ``recompute_tokens(tokens)`` (the core's ``ReuseRule``).
  Documents not in the store are computed as new tokens; the result carries each document's
  KV as a ``PlacedKV`` to keep.

``torch_blend.blend_selection_s_per_token`` measures what the selection pass costs per
reused token it passes over (the profile term of that name), with the same code.

What this computes is exact as arithmetic (tests/test_blend_torch.py): recomputing every
token gives the full prefill, a document reused where and behind what it was computed gives
the prefix cache's KV. What blending does to answer *quality* needs trained weights, which
this engine's random-weight models do not have (docs/model.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ragsim.profiles.torch_blend import (
    ScatterCache,
    highest,
    rope_inv_freq,
    run_layers,
    selection_pass,
    shift_keys,
)
from ragsim.profiles.torch_model import Row, TorchModel, copy_chunks, tokens_of
from ragsim.realrun.engine import NodeKV, kv_tokens

SELECTIONS = ("deviation", "first")


@dataclass
class PlacedKV:
    """A document's KV as computed, and where: ``kv`` per layer (keys, values), each
    ``[kv_heads, tokens, head_dim]``; ``position`` the position of its first token then."""

    kv: NodeKV
    position: int

    @property
    def tokens(self) -> int:
        return kv_tokens(self.kv)


@dataclass
class ReusedDocument:
    """A stored document placed at ``start`` in a context; ``recompute_tokens`` of its tokens
    are recomputed (``blended_prefill`` chooses which)."""

    start: int
    kv: PlacedKV
    recompute_tokens: int = 0

    @property
    def end(self) -> int:
        return self.start + self.kv.tokens


@dataclass
class BlendResult:
    """A blended prefill's outcome.

    ``kv``: the whole context's KV per layer (``[kv_heads, tokens, head_dim]``), as a decode
    would read it; ``logits``: the last token's (``[vocab]``); ``computed``: the positions
    computed at the last layer (new tokens and recomputed ones, sorted); ``recomputed``: per
    reused document the positions of its recomputed tokens; ``selection_tokens``: the reused
    tokens the selection pass computed beyond what a prefill computes anyway (0 without one);
    ``deviations``: per reused document its tokens' KV deviation on the check layer
    (``select="deviation"`` only)."""

    kv: NodeKV
    logits: Any
    computed: Any
    recomputed: list[list[int]]
    selection_tokens: int = 0
    deviations: list[Any] = field(default_factory=list)

    @property
    def recomputed_tokens(self) -> int:
        return sum(len(r) for r in self.recomputed)


# ---------------------------------------------------------------------------------- moving
def moved(placed: PlacedKV, position: int, inv_freq: Any) -> NodeKV:
    """A stored document's KV at ``position``: keys rotated, values as they are."""
    offset = position - placed.position
    return [(shift_keys(k, offset, inv_freq), v) for k, v in placed.kv]


# ---------------------------------------------------------------------------------- keeping
def standalone_kv(model: TorchModel, token_ids: Sequence[int] | Any, *, position: int = 0,
                  prefix_kv: NodeKV | None = None) -> PlacedKV:
    """A document's KV computed alone (behind ``prefix_kv``, if given, whose tokens must end
    at ``position``): CacheBlend's and EPIC's way of filling their store."""
    if prefix_kv is not None and tokens_of(prefix_kv[0][0]) != position:
        raise ValueError(f"the prefix holds {tokens_of(prefix_kv[0][0])} tokens; the document "
                         f"starts at {position}")
    out = model.prefill([Row(prefix_kv, token_ids, position)])
    return PlacedKV(out.new_kv[0], position)


def placed_from(kv: NodeKV, start: int, tokens: int) -> PlacedKV:
    """The KV of the document at ``start`` (``tokens`` long) cut from a context's KV (a
    prefill's or a blended prefill's), copied so the store keeps no whole context alive."""
    return PlacedKV([(k[:, start:start + tokens].clone(), v[:, start:start + tokens].clone())
                     for k, v in kv], start)


# ---------------------------------------------------------------------------------- blending
def _check(model: TorchModel, total: int, prefix: int, reused: Sequence[ReusedDocument],
           select: str, check_layer: int) -> None:
    if select not in SELECTIONS:
        raise ValueError(f"select must be one of {SELECTIONS}, got {select!r}")
    if select == "deviation" and not 1 <= check_layer < model.num_layers:
        raise ValueError(f"check_layer must lie in [1, {model.num_layers - 1}] (layer 0's KV "
                         f"does not depend on the context), got {check_layer}")
    if prefix >= total:
        raise ValueError(f"the prefix holds {prefix} of the context's {total} tokens: the last "
                         "token must be computed")
    at = prefix
    for doc in sorted(reused, key=lambda d: d.start):
        if len(doc.kv.kv) != model.num_layers:
            raise ValueError(f"a document's KV has {len(doc.kv.kv)} layers, the model "
                             f"{model.num_layers}")
        if doc.start < at or doc.end > total:
            raise ValueError(f"a reused document at [{doc.start}, {doc.end}) overlaps the "
                             f"prefix or another document, or leaves the context of {total}")
        if not 0 <= doc.recompute_tokens <= doc.kv.tokens:
            raise ValueError(f"recompute_tokens {doc.recompute_tokens} of a document of "
                             f"{doc.kv.tokens}")
        at = doc.end


def blended_prefill(model: TorchModel, token_ids: Sequence[int] | Any, *,
                    prefix_kv: NodeKV | None = None,
                    reused: Sequence[ReusedDocument] = (),
                    select: Literal["deviation", "first"] = "deviation",
                    check_layer: int = 1) -> BlendResult:
    """One request's prefill reusing documents' KV at any position (see the module docstring).

    ``token_ids``: the whole context (prefix included); ``prefix_kv``: the exact prefix's KV,
    per layer (keys, values), each a tensor or chunks along the token axis (``Row.cached``'s
    format), covering ``token_ids[:a]``; ``reused``: documents whose stored KV is placed in the
    context, not overlapping each other or the prefix. Every other token after the prefix is
    computed."""
    torch = model.torch
    ids = model.token_tensor(token_ids)
    total = int(ids.shape[0])
    prefix = 0 if prefix_kv is None else tokens_of(prefix_kv[0][0])
    reused = sorted(reused, key=lambda d: d.start)
    _check(model, total, prefix, reused, select, check_layer)
    device, dtype = model.device, model.dtype
    layers = model.num_layers
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    inner = model.model.model
    inv_freq = rope_inv_freq(model)
    with torch.no_grad():
        # zeros, not empty: a masked-out key's value is multiplied by a zero weight, and
        # uninitialised memory may hold NaN
        keys = [torch.zeros(heads, total, dim, device=device, dtype=dtype)
                for _ in range(layers)]
        values = [torch.zeros_like(k) for k in keys]
        for layer in range(layers):
            if prefix:
                copy_chunks(keys[layer][:, :prefix], prefix_kv[layer][0])
                copy_chunks(values[layer][:, :prefix], prefix_kv[layer][1])
            for doc in reused:
                k, v = doc.kv.kv[layer]
                keys[layer][:, doc.start:doc.end] = shift_keys(
                    k.to(device, dtype), doc.start - doc.kv.position, inv_freq)
                values[layer][:, doc.start:doc.end] = v.to(device, dtype)
        is_reused = torch.zeros(total, dtype=torch.bool, device=device)
        for doc in reused:
            is_reused[doc.start:doc.end] = True
        cache = ScatterCache(keys, values)
        selection_tokens = 0
        deviations: list[Any] = []
        if select == "first":
            chosen = [list(range(d.start, d.start + d.recompute_tokens)) for d in reused]
            hidden, first_layer = None, 0
        else:
            hidden, deviations = selection_pass(model, ids, prefix, cache,
                                                [(d.start, d.end) for d in reused], check_layer)
            selection_tokens = sum(d.kv.tokens for d in reused)
            chosen = [[d.start + i for i in highest(deviation, d.recompute_tokens)]
                      for d, deviation in zip(reused, deviations, strict=True)]
            first_layer = check_layer
        compute = ~is_reused
        compute[:prefix] = False
        for picked in chosen:
            compute[picked] = True
        last_forced = bool(not compute[total - 1])
        compute[total - 1] = True  # its logits give the first output token
        if last_forced:
            for k, (doc, picked) in enumerate(zip(reused, chosen, strict=True)):
                if doc.start <= total - 1 < doc.end:
                    if picked:  # it takes the place of the document's lowest-ranked choice
                        compute[picked.pop(_lowest_ranked(picked, doc.start, deviations, k))
                                ] = False
                    picked.append(total - 1)
        computed = torch.nonzero(compute).flatten()
        if hidden is None:
            hidden = inner.embed_tokens(ids[computed][None])
        else:  # the selection pass's hidden states of the tokens computed on
            hidden = hidden[:, computed - prefix]
        hidden = run_layers(model, hidden, computed, range(first_layer, layers), cache)
        last = inner.norm(hidden[:, -1:])
        logits = model.model.lm_head(last)[0, -1]
    return BlendResult(kv=list(zip(keys, values, strict=True)), logits=logits,
                       computed=computed, recomputed=chosen,
                       selection_tokens=selection_tokens, deviations=deviations)


def _lowest_ranked(picked: list[int], start: int, deviations: list, k: int) -> int:
    """Where in ``picked`` (sorted positions of document ``k``, placed at ``start``) its
    lowest-ranked choice is: the least deviating (ties: the later token) under CacheBlend's
    selection, the last under EPIC's (its first tokens)."""
    if not deviations:
        return len(picked) - 1
    deviation = deviations[k]
    return min(range(len(picked)), key=lambda i: (float(deviation[picked[i] - start]), -i))


# ---------------------------------------------------------------------------------- adapter
class RecomputeRule(Protocol):
    """What ``prefill_request`` needs of a reuse rule (the policy core's ``ReuseRule``)."""

    kind: str

    def recompute_tokens(self, tokens: int) -> int: ...


_SELECT_OF_KIND = {"blend": "deviation", "epic": "first"}


@dataclass
class RequestPrefill:
    """``prefill_request``'s outcome: the blended prefill and every document's KV to keep."""

    result: BlendResult
    reused_ids: list[Hashable]  # the documents found in the store, in context order
    documents: dict[Hashable, PlacedKV]  # each document's KV as this context holds it


def prefill_request(model: TorchModel, token_ids: Sequence[int] | Any, *,
                    prefix_kv: NodeKV | None,
                    documents: Sequence[tuple[Hashable, int, int]],
                    stored: Mapping[Hashable, PlacedKV],
                    rule: RecomputeRule, check_layer: int = 1) -> RequestPrefill:
    """One request's prefill with position-free reuse: ``documents`` are (document id, start,
    tokens) in the context (those inside the exact prefix are taken from ``prefix_kv``);
    a later document found in ``stored`` is moved into place with ``rule.recompute_tokens``
    of its tokens recomputed, any other is computed. A ``prefix`` rule reuses nothing
    position-free (an ordinary prefill over ``prefix_kv``)."""
    prefix = 0 if prefix_kv is None else tokens_of(prefix_kv[0][0])
    reused, reused_ids = [], []
    if rule.kind != "prefix":
        for doc_id, start, tokens in documents:
            placed = stored.get(doc_id)
            if start < prefix or placed is None:
                continue
            if placed.tokens != tokens:
                raise ValueError(f"document {doc_id!r}: {tokens} tokens in the context, "
                                 f"{placed.tokens} stored")
            reused.append(ReusedDocument(start, placed, rule.recompute_tokens(tokens)))
            reused_ids.append(doc_id)
    result = blended_prefill(model, token_ids, prefix_kv=prefix_kv, reused=reused,
                             select=_SELECT_OF_KIND.get(rule.kind, "first"),
                             check_layer=check_layer)
    kept = {doc_id: placed_from(result.kv, start, tokens)
            for doc_id, start, tokens in documents}
    return RequestPrefill(result, reused_ids, kept)
