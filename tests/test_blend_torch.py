"""Position-free document KV reuse on the torch engine (``ragsim.realrun.blend``) is exact
arithmetic where it must be.

Expected values come from elsewhere: RoPE by hand in float64 from the model's theta, the
model's own full forward (transformers' ``LlamaModel``, through ``TorchModel.prefill``), the
prefix cache's prefill over stored KV, and for a partial recompute a second implementation: a
full-sequence forward whose cache overwrites the reused tokens' KV with documents computed
in place.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from ragsim.profiles.models import ModelSpec
from ragsim.profiles.torch_blend import blend_selection_s_per_token, rope_inv_freq, shift_keys
from ragsim.profiles.torch_model import Row, TorchModel
from ragsim.realrun.blend import (
    PlacedKV,
    ReusedDocument,
    blended_prefill,
    moved,
    placed_from,
    prefill_request,
    standalone_kv,
)

# 3 layers (a check layer and one after it), GQA (4 heads over 2 KV heads), fp32: seconds
TINY = ModelSpec("tiny-blend", 3, 4, 2, 16, 64, 128, 256, "fp32")
# fp32 on this model: recomputing everything matches the full prefill to ~1e-6 (measured
# 0.0: the same kernels); a wrong position or a skipped recompute moves logits by ~1e-1
ATOL = 1e-4
SYSTEM, DOC_A, DOC_B, QUERY = 8, 20, 16, 6  # token counts of the test context


@pytest.fixture(scope="module")
def model() -> TorchModel:
    return TorchModel(TINY, "cpu", "fp32", seed=0)


def token_ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def context() -> dict:
    """system prompt, document A, document B, query: ids and spans."""
    parts = {"system": token_ids(SYSTEM, 1), "a": token_ids(DOC_A, 2), "b": token_ids(DOC_B, 3),
             "query": token_ids(QUERY, 4)}
    ids = torch.cat([parts["system"], parts["a"], parts["b"], parts["query"]])
    return {**parts, "ids": ids, "a_start": SYSTEM, "b_start": SYSTEM + DOC_A}


def full_prefill(model: TorchModel, ids: torch.Tensor):
    """The model's own forward over the whole context, no cache: (KV per layer, logits)."""
    out = model.prefill([Row(None, ids, 0)])
    return out.new_kv[0], out.logits[0]


def prefix_of(kv, tokens: int):
    return [(k[:, :tokens], v[:, :tokens]) for k, v in kv]


def assert_kv_close(got, expected, atol: float = ATOL) -> None:
    assert len(got) == len(expected)
    for layer, ((gk, gv), (ek, ev)) in enumerate(zip(got, expected, strict=True)):
        assert gk.shape == ek.shape, f"layer {layer}"
        assert torch.allclose(gk, ek, atol=atol, rtol=0), f"layer {layer} keys"
        assert torch.allclose(gv, ev, atol=atol, rtol=0), f"layer {layer} values"


def elsewhere(model: TorchModel, context: dict) -> tuple[PlacedKV, PlacedKV]:
    """Documents A and B as a store would hold them from other requests: A computed alone at
    position 0, B behind another system prompt at position 5 (neither where this context puts
    it, nor behind what precedes it here)."""
    a = standalone_kv(model, context["a"], position=0)
    other = model.prefill([Row(None, token_ids(5, 9), 0)]).new_kv[0]
    b = standalone_kv(model, context["b"], position=5, prefix_kv=other)
    return a, b


# ---------------------------------------------------------------------------------- RoPE
def rope_by_hand(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's RoPE in float64 from its definition: pair (i, i + d/2) turned by position x
    theta^(-2i/d)."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    x = x.to(torch.float64)
    first, second = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@pytest.mark.parametrize(("p0", "p1"), [(0, 37), (120, 3), (5, 5), (250, 251), (9, 0)])
def test_moving_keys_equals_rotating_them_at_the_new_positions(model, p0, p1):
    raw = torch.randn(2, 12, TINY.head_dim, generator=torch.Generator().manual_seed(p0 + p1),
                      dtype=torch.float64)
    theta = model.config.rope_parameters["rope_theta"]
    positions = torch.arange(12)
    # stored as the model rotates them (fp32, its own rotary embedding) at p0...
    cos, sin = model.model.model.rotary_emb(raw.float(), (positions + p0)[None])
    _, stored = apply_rotary_pos_emb(raw.float()[None], raw.float()[None], cos, sin)
    got = shift_keys(stored[0], p1 - p0, rope_inv_freq(model))
    expected = rope_by_hand(raw, positions + p1, theta)
    # fp32 angles at positions of ~250 carry ~2e-5 of rounding; one position off is ~1
    assert torch.allclose(got.double(), expected, atol=1e-4, rtol=0)


def test_moving_keys_under_yarn_scaling_applies_its_attention_factor_once():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=256,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                          "factor": 4.0, "original_max_position_embeddings": 64})
    rotary = LlamaRotaryEmbedding(config)
    assert rotary.attention_scaling != 1.0  # the case under test
    raw = torch.randn(1, 2, 10, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(10)[None]

    def at(offset: int) -> torch.Tensor:
        cos, sin = rotary(raw, positions + offset)
        return apply_rotary_pos_emb(raw, raw, cos, sin)[1][0]

    assert torch.allclose(shift_keys(at(3), 90, rotary.inv_freq), at(93), atol=1e-4, rtol=0)


def test_a_partial_rotary_width_turns_only_its_dimensions():
    keys = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    inv_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)  # 8 of 16 turn
    got = shift_keys(keys, 11, inv_freq)
    assert torch.equal(got[..., 8:], keys[..., 8:])
    expected = rope_by_hand(rope_by_hand(keys[..., :8], torch.zeros(7), 10000.0),
                            torch.full((7,), 11), 10000.0)
    assert torch.allclose(got[..., :8].double(), expected, atol=1e-5, rtol=0)


def test_a_rope_that_depends_on_the_sequence_length_is_refused(model):
    rotary = model.model.model.rotary_emb
    saved = rotary.rope_type
    rotary.rope_type = "dynamic"
    try:
        with pytest.raises(ValueError, match="dynamic"):
            rope_inv_freq(model)
    finally:
        rotary.rope_type = saved


def test_a_document_computed_alone_and_moved_equals_it_computed_alone_there(model, context):
    """Real keys: alone, a document's hidden states do not depend on where it starts (RoPE
    scores relative positions), so moved keys must be the keys computed there, values equal."""
    here = standalone_kv(model, context["a"], position=3)
    there = standalone_kv(model, context["a"], position=140)
    assert_kv_close(moved(here, 140, rope_inv_freq(model)), there.kv)
    assert not torch.allclose(here.kv[1][0], there.kv[1][0], atol=1e-2)  # the test can fail


# ---------------------------------------------------------------------------------- blending
@pytest.mark.parametrize("select", ["deviation", "first"])
def test_recomputing_every_reused_token_gives_the_full_prefill(model, context, select):
    """blend:1 (CacheBlend selecting all) and epic:K for K >= the documents' lengths."""
    ids = context["ids"]
    expected_kv, expected_logits = full_prefill(model, ids)
    a, b = elsewhere(model, context)
    result = blended_prefill(
        model, ids, prefix_kv=prefix_of(expected_kv, SYSTEM), select=select,
        reused=[ReusedDocument(context["a_start"], a, DOC_A),
                ReusedDocument(context["b_start"], b, DOC_B)])
    assert_kv_close(result.kv, expected_kv)
    assert torch.allclose(result.logits, expected_logits, atol=ATOL, rtol=0)
    assert result.recomputed_tokens == DOC_A + DOC_B
    assert result.computed.tolist() == list(range(SYSTEM, len(ids)))
    assert result.selection_tokens == (DOC_A + DOC_B if select == "deviation" else 0)


def test_without_recompute_a_moved_document_misses_its_context(model, context):
    """blend:0 at a new position is not the full prefill: the cross-attention the recompute
    restores is real (so the equalities above can fail)."""
    ids = context["ids"]
    expected_kv, expected_logits = full_prefill(model, ids)
    a, b = elsewhere(model, context)
    result = blended_prefill(model, ids, prefix_kv=prefix_of(expected_kv, SYSTEM),
                             reused=[ReusedDocument(context["a_start"], a, 0),
                                     ReusedDocument(context["b_start"], b, 0)])
    assert (result.logits - expected_logits).abs().max() > 1e-2
    assert result.recomputed_tokens == 0


@pytest.mark.parametrize("select", ["deviation", "first"])
def test_a_document_reused_where_it_was_computed_without_recompute_is_the_prefix_cache(
        model, context, select):
    """Request 1 computes system + A + its query; request 2 (another query) reuses A at the
    same position behind the same system prompt: blend:0 / epic:0 must equal the prefix cache
    (the stored system + A KV, the query computed over it)."""
    first_ids = torch.cat([context["system"], context["a"], token_ids(QUERY, 7)])
    first_kv, _ = full_prefill(model, first_ids)
    stored_a = placed_from(first_kv, SYSTEM, DOC_A)
    second_ids = torch.cat([context["system"], context["a"], context["query"]])
    cached = prefix_of(first_kv, SYSTEM + DOC_A)
    prefix_cache = model.prefill([Row(cached, context["query"], SYSTEM + DOC_A)])
    expected_kv = [(torch.cat([k, nk], 1), torch.cat([v, nv], 1))
                   for (k, v), (nk, nv) in zip(cached, prefix_cache.new_kv[0], strict=True)]
    result = blended_prefill(model, second_ids, prefix_kv=prefix_of(first_kv, SYSTEM),
                             reused=[ReusedDocument(SYSTEM, stored_a, 0)], select=select)
    assert_kv_close(result.kv, expected_kv)
    assert torch.allclose(result.logits, prefix_cache.logits[0], atol=ATOL, rtol=0)
    assert result.computed.tolist() == list(range(SYSTEM + DOC_A, len(second_ids)))


class OverridingCache(DynamicCache):
    """A full forward's cache in which, from ``from_layer`` on, the tokens at ``keep`` take the
    given KV instead of their computed one: what a partial recompute means, computed the
    plain way (every token a query, the model's own masks)."""

    def __init__(self, config, keep: list[int], kv, from_layer: int) -> None:
        super().__init__(config=config)
        self.keep, self.kv, self.from_layer = keep, kv, from_layer

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx >= self.from_layer and self.keep:
            key_states, value_states = key_states.clone(), value_states.clone()
            key_states[0][:, self.keep] = self.kv[layer_idx][0][:, self.keep]
            value_states[0][:, self.keep] = self.kv[layer_idx][1][:, self.keep]
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def in_place_kv(model, context) -> list:
    """Per layer, the context's KV with A and B each computed alone at the position this
    context gives them (the moved documents' KV, computed without moving anything)."""
    ids = context["ids"]
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=context["a_start"])
    b = standalone_kv(model, context["b"], position=context["b_start"])
    result = []
    for layer, (k, v) in enumerate(full):
        k, v = k.clone(), v.clone()
        for doc, start in ((a, context["a_start"]), (b, context["b_start"])):
            k[:, start:start + doc.tokens] = doc.kv[layer][0]
            v[:, start:start + doc.tokens] = doc.kv[layer][1]
        result.append((k, v))
    return result


def reference_partial(model, ids, keep: list[int], kv, from_layer: int):
    cache = OverridingCache(model.config, keep, kv, from_layer)
    with torch.no_grad():
        logits = model.model(input_ids=ids[None], use_cache=True,
                             **{model.cache_kw: cache}).logits[0, -1]
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers], logits


@pytest.mark.parametrize(("select", "counts"), [("first", (4, 3)), ("deviation", (4, 3)),
                                                ("first", (0, 16)), ("deviation", (20, 1))])
def test_a_partial_recompute_matches_a_full_forward_that_keeps_the_reused_kv(
        model, context, select, counts):
    """The blended prefill with documents stored alone elsewhere (moved into place) against
    the plain full forward in which every reused, unchosen token's KV is the in-place
    standalone one (from layer 0 for EPIC, from the check layer for CacheBlend)."""
    ids = context["ids"]
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=0)  # both alone: in place is exact
    b = standalone_kv(model, context["b"], position=31)
    result = blended_prefill(
        model, ids, prefix_kv=prefix_of(full, SYSTEM), select=select,
        reused=[ReusedDocument(context["a_start"], a, counts[0]),
                ReusedDocument(context["b_start"], b, counts[1])])
    chosen = {p for picked in result.recomputed for p in picked}
    keep = [p for p in range(SYSTEM, SYSTEM + DOC_A + DOC_B) if p not in chosen]
    expected_kv, expected_logits = reference_partial(
        model, ids, keep, in_place_kv(model, context), 0 if select == "first" else 1)
    assert_kv_close(result.kv, expected_kv)
    assert torch.allclose(result.logits, expected_logits, atol=ATOL, rtol=0)
    if select == "first":
        assert result.recomputed == [list(range(SYSTEM, SYSTEM + counts[0])),
                                     list(range(SYSTEM + DOC_A, SYSTEM + DOC_A + counts[1]))]


def test_cacheblend_chooses_the_tokens_whose_layer_1_kv_deviates_most(model, context):
    """The deviation, derived apart: the full prefill's layer-1 KV against the documents'
    layer-1 KV computed alone in place; the top 5 of each document by it."""
    ids = context["ids"]
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=0)
    b = standalone_kv(model, context["b"], position=2)
    result = blended_prefill(model, ids, prefix_kv=prefix_of(full, SYSTEM),
                             reused=[ReusedDocument(context["a_start"], a, 5),
                                     ReusedDocument(context["b_start"], b, 5)])
    in_place = in_place_kv(model, context)
    for doc, (start, n) in enumerate(((context["a_start"], DOC_A), (context["b_start"], DOC_B))):
        span = slice(start, start + n)
        deviation = ((full[1][0][:, span] - in_place[1][0][:, span]).pow(2).sum((0, 2))
                     + (full[1][1][:, span] - in_place[1][1][:, span]).pow(2).sum((0, 2)))
        assert torch.allclose(result.deviations[doc], deviation, atol=1e-4, rtol=1e-4)
        top = sorted(start + int(i) for i in torch.topk(deviation, 5).indices)
        assert result.recomputed[doc] == top
        assert deviation.max() > 1e-3  # the documents did miss their context


def test_a_reused_document_that_ends_the_context_has_its_last_token_computed(model, context):
    ids = torch.cat([context["system"], context["a"]])
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=SYSTEM)
    result = blended_prefill(model, ids, prefix_kv=prefix_of(full, SYSTEM), select="first",
                             reused=[ReusedDocument(SYSTEM, a, 0)])
    last = SYSTEM + DOC_A - 1
    assert result.computed.tolist() == [last]
    assert result.recomputed == [[last]]
    in_place = [(torch.cat([k[:, :SYSTEM], ak], 1), torch.cat([v[:, :SYSTEM], av], 1))
                for (k, v), (ak, av) in zip(full, a.kv, strict=True)]
    expected_kv, expected_logits = reference_partial(model, ids, list(range(SYSTEM, last)),
                                                     in_place, 0)
    assert_kv_close(result.kv, expected_kv)
    assert torch.allclose(result.logits, expected_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("select", ["first", "deviation"])
def test_a_document_that_ends_the_context_recomputes_its_count_with_its_last_token(
        model, context, select):
    """A reused document ends the context (no query) with 3 tokens to recompute: its last
    token, which must be computed, takes the place of its lowest-ranked choice (EPIC's third
    token; CacheBlend's least deviating chosen one), so it recomputes 3, as the policy core
    counts (``engine_reuse``: one extra token only when nothing else is computed)."""
    ids = torch.cat([context["system"], context["a"]])
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=0)  # computed elsewhere: it deviates
    result = blended_prefill(model, ids, prefix_kv=prefix_of(full, SYSTEM), select=select,
                             reused=[ReusedDocument(SYSTEM, a, 3)])
    last = SYSTEM + DOC_A - 1
    (picked,) = result.recomputed
    assert len(picked) == 3 and picked[-1] == last
    assert result.computed.tolist() == picked
    if select == "first":
        assert picked == [SYSTEM, SYSTEM + 1, last]
    else:  # the two most deviating tokens other than the last, by the pass's own deviations
        deviation = result.deviations[0].clone()
        deviation[DOC_A - 1] = -1.0
        top_two = sorted(torch.sort(-deviation, stable=True).indices[:2].tolist())
        assert picked[:2] == [SYSTEM + i for i in top_two]


@pytest.mark.parametrize("bad", [
    {"reused_at": 4},  # overlaps the prefix
    {"recompute": DOC_A + 1},
    {"select": "random"},
    {"check_layer": 0},
    {"check_layer": 3},
])
def test_inconsistent_inputs_are_refused(model, context, bad):
    ids = context["ids"]
    full, _ = full_prefill(model, ids)
    a = standalone_kv(model, context["a"], position=0)
    with pytest.raises(ValueError):
        blended_prefill(model, ids, prefix_kv=prefix_of(full, SYSTEM),
                        reused=[ReusedDocument(bad.get("reused_at", SYSTEM), a,
                                               bad.get("recompute", 0))],
                        select=bad.get("select", "deviation"),
                        check_layer=bad.get("check_layer", 1))


# ---------------------------------------------------------------------------------- adapter
class Rule(NamedTuple):
    """The two things ``prefill_request`` reads of the policy core's ``ReuseRule``; counts
    written out per kind here (epic: min(K, tokens); blend: all or none in these tests)."""

    kind: str
    first_tokens: int = 0
    everything: bool = False

    def recompute_tokens(self, tokens: int) -> int:
        if self.kind == "epic":
            return min(self.first_tokens, tokens)
        return tokens if self.everything else 0


def test_the_adapter_moves_stored_documents_and_keeps_every_documents_kv(model, context):
    ids = context["ids"]
    expected_kv, expected_logits = full_prefill(model, ids)
    a, _ = elsewhere(model, context)
    documents = [("A", context["a_start"], DOC_A), ("B", context["b_start"], DOC_B)]
    out = prefill_request(model, ids, prefix_kv=prefix_of(expected_kv, SYSTEM),
                          documents=documents, stored={"A": a}, rule=Rule("epic", 1000))
    assert out.reused_ids == ["A"]
    assert torch.allclose(out.result.logits, expected_logits, atol=ATOL, rtol=0)
    assert out.result.recomputed_tokens == DOC_A  # B was not stored: computed as new
    kept = out.documents["B"]
    assert kept.position == context["b_start"] and kept.tokens == DOC_B
    assert_kv_close(kept.kv, [(k[:, SYSTEM + DOC_A:SYSTEM + DOC_A + DOC_B],
                               v[:, SYSTEM + DOC_A:SYSTEM + DOC_A + DOC_B])
                              for k, v in expected_kv])
    prefix = prefill_request(model, ids, prefix_kv=prefix_of(expected_kv, SYSTEM),
                             documents=documents, stored={"A": a}, rule=Rule("prefix"))
    assert prefix.reused_ids == [] and prefix.result.recomputed_tokens == 0
    assert torch.allclose(prefix.result.logits, expected_logits, atol=ATOL, rtol=0)


def test_the_adapter_refuses_a_stored_document_of_another_length(model, context):
    a = standalone_kv(model, context["a"][:-1], position=0)
    with pytest.raises(ValueError, match="19 stored"):
        prefill_request(model, context["ids"], prefix_kv=None,
                        documents=[("A", context["a_start"], DOC_A)], stored={"A": a},
                        rule=Rule("blend", everything=True))


def test_the_selection_pass_is_timed_per_token(model):
    s_per_token = blend_selection_s_per_token(model, context_tokens=(32, 64), repeats=1)
    assert s_per_token >= 0.0 and s_per_token < 1.0  # a number, not a wall-clock claim


def test_the_speed_benchmark_runs_and_computes_what_each_rule_recomputes():
    """benchmarks/blend_speed.py at a tiny size: two documents of 16 tokens and a query of
    32 -- full computes 64 tokens, blend:0.15 32 + 2 x ceil(2.4) = 38, epic:4 32 + 2 x 4 = 40
    (worked by hand); the ratios are printed, never asserted."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "blend_speed.py"
    result = subprocess.run([sys.executable, str(script), "--layers", "2", "--hidden", "128",
                             "--shapes", "2x16", "--first", "4", "--repeats", "1",
                             "--threads", "1", "--selection-tokens", "32,64"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("| 2x16 |"))
    cells = [c.strip() for c in row.strip("| ").split(" | ")]
    assert cells[1:4] == ["64", "38", "40"]
    assert all(c.endswith("x") for c in cells[7:9])
    assert "blend_selection_s_per_token" in result.stdout
    assert "not measured here" in result.stdout
