"""Prefill-cost tables (bilinear interpolation, file format) and model KV sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsim.errors import ProfileError, RagsimInputError
from ragsim.profiles.costs import PrefillCostTable, load_cost_table, shipped_table_names
from ragsim.profiles.derived import SHIPPED_DERIVED
from ragsim.profiles.models import BUILTIN_MODELS, resolve_model
from ragsim.units import parse_bytes


def small_table() -> PrefillCostTable:
    return PrefillCostTable("t", [0.0, 100.0, 300.0], [1.0, 11.0],
                            [[1.0, 2.0], [3.0, 5.0], [4.0, 9.0]])


def test_grid_points_are_exact_and_interior_points_bilinear():
    t = small_table()
    for i, a in enumerate(t.cached_tokens):
        for j, b in enumerate(t.new_tokens):
            assert t.prefill_s_at(a, b) == t.prefill_s[i][j]
    # cell [100, 300] x [1, 11] at (200, 6): along alpha 3.5 and 7.0, then halfway: 5.25
    assert t.prefill_s_at(200, 6) == pytest.approx(5.25)
    # cell [0, 100] x [1, 11] at (25, 3.5): T_b1 = 1.5, T_bh = 2.75 -> 1.5 + 0.25 * 1.25
    assert t.prefill_s_at(25, 3.5) == pytest.approx(1.8125)
    assert t.extrapolated_queries == 0


def test_vectorised_matches_scalar_and_extrapolation_is_counted():
    t = small_table()
    rng = np.random.default_rng(0)
    a = rng.uniform(-50, 400, 200)
    b = rng.uniform(0, 20, 200)
    many = t.prefill_s_many(a, b)
    scalar_table = small_table()
    scalar = [scalar_table.prefill_s_at(x, y) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(many, scalar)
    outside = ((a < 0) | (a > 300) | (b < 1) | (b > 11)).sum()
    assert t.extrapolated_queries == outside == scalar_table.extrapolated_queries > 0


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.pop("prefill_s"), "prefill_s"),
    (lambda d: d.update(cached_tokens=[0, 300, 100]), "cached_tokens"),
    (lambda d: d.update(new_tokens=[1]), "new_tokens"),
    (lambda d: d["prefill_s"][1].__setitem__(0, -1.0), "prefill_s"),
    (lambda d: d["prefill_s"].pop(), "prefill_s"),
    (lambda d: d["prefill_s"][0].__setitem__(1, 0.5), "prefill_s"),  # falls along new_tokens
    (lambda d: d["prefill_s"][2].__setitem__(0, 2.0), "prefill_s"),  # falls along cached
])
def test_malformed_tables_are_refused_with_the_field(tmp_path, mutate, field):
    data = small_table().to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as info:
        load_cost_table(str(path))
    assert info.value.field == field and info.value.file == str(path)


def test_shipped_tables_are_reproduced_by_their_generator():
    assert "a10g-mistral-7b" in shipped_table_names()
    for name, make in SHIPPED_DERIVED.items():
        assert load_cost_table(name).to_dict() == json.loads(json.dumps(make().to_dict()))


def test_a10g_anchor_from_the_paper():
    """About one second to prefill ~4,000 tokens of a 7B model on A10G."""
    t = load_cost_table("a10g-mistral-7b")
    assert 0.8 < t.prefill_s_at(0, 4000) < 1.25
    # a cached prefix makes the same request much cheaper (paper: up to 11.5x)
    assert t.prefill_s_at(0, 4000) / t.prefill_s_at(3600, 400) > 5


def test_kv_bytes_per_token_from_architecture(tmp_path):
    assert BUILTIN_MODELS["mistral-7b"].kv_bytes_per_token == 128 * 1024
    assert BUILTIN_MODELS["llama2-7b"].kv_bytes_per_token == 512 * 1024
    assert BUILTIN_MODELS["llama2-70b"].kv_bytes_per_token == 320 * 1024
    assert BUILTIN_MODELS["llama2-7b"].with_dtype("fp32").kv_bytes_per_token == 1024 * 1024
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 256, "torch_dtype": "float32"}
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    spec = resolve_model(str(path))
    assert spec.kv_bytes_per_token == 2 * 2 * 2 * 64 * 4
    path.write_text(json.dumps({**config, "num_hidden_layers": "two"}))
    with pytest.raises(RagsimInputError) as info:
        resolve_model(str(path))
    assert info.value.field == "num_hidden_layers"
    with pytest.raises(RagsimInputError, match="unknown model"):
        resolve_model("gpt-17")


@pytest.mark.parametrize("text,expected", [("4GiB", 4 * 2**30), ("512MiB", 512 * 2**20),
                                           ("1.5GB", 1_500_000_000), ("0", 0),
                                           ("100", 100), ("2g", 2 * 2**30)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1GiB", "4 parsecs", "GiB", ""])
def test_parse_bytes_refuses(text):
    with pytest.raises(RagsimInputError):
        parse_bytes(text)
