"""Prefill-cost tables (bilinear interpolation, file format) and model KV sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsim.errors import ProfileError, RagsimInputError
from ragsim.profiles.derived import (
    CALIBRATION,
    all_derived_profiles,
    anchor_report,
    derive_profile,
    parameter_count,
    weight_bytes_read,
)
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.models import BUILTIN_MODELS, resolve_model
from ragsim.profiles.profile import (
    Profile,
    fit_separable,
    load_profile,
    shipped_profile_names,
)
from ragsim.units import parse_bytes


def small_grid() -> BilinearGrid:
    return BilinearGrid("t", "cached_tokens", "new_tokens", [0.0, 100.0, 300.0], [1.0, 11.0],
                        [[1.0, 2.0], [3.0, 5.0], [4.0, 9.0]])


def test_grid_points_are_exact_and_interior_points_bilinear():
    t = small_grid()
    for i, a in enumerate(t.x_axis):
        for j, b in enumerate(t.y_axis):
            assert t.at(a, b) == t.values[i][j]
    # cell [100, 300] x [1, 11] at (200, 6): along alpha 3.5 and 7.0, then halfway: 5.25
    assert t.at(200, 6) == pytest.approx(5.25)
    # cell [0, 100] x [1, 11] at (25, 3.5): T_b1 = 1.5, T_bh = 2.75 -> 1.5 + 0.25 * 1.25
    assert t.at(25, 3.5) == pytest.approx(1.8125)
    assert t.extrapolated_queries == 0


def test_vectorised_matches_scalar_and_extrapolation_is_counted():
    t = small_grid()
    rng = np.random.default_rng(0)
    a = rng.uniform(-50, 400, 200)
    b = rng.uniform(0, 20, 200)
    many = t.many(a, b)
    scalar_grid = small_grid()
    scalar = [scalar_grid.at(x, y) for x, y in zip(a, b, strict=True)]
    np.testing.assert_allclose(many, scalar)
    outside = ((a < 0) | (a > 300) | (b < 1) | (b > 11)).sum()
    assert t.extrapolated_queries == outside == scalar_grid.extrapolated_queries > 0
    assert (many >= 0).all()


def test_interpolation_is_monotone_inside_and_outside_the_grid():
    p = load_profile("a10g-mistral-7b")
    new = np.geomspace(1, 40_000, 300)
    for cached in (0, 300, 5000, 50_000):
        values = p.prefill.many(np.full_like(new, cached), new)
        assert (np.diff(values) >= -1e-12).all()


def _profile_dict() -> dict:
    return json.loads(json.dumps(load_profile("a10g-mistral-7b").to_dict()))


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.pop("decode"), "decode"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["prefill"].update(cached_tokens=[0, 300, 100, 5, 6, 7, 8, 9, 10]),
     "prefill.cached_tokens"),
    (lambda d: d["prefill"].update(new_tokens=[1]), "prefill.new_tokens"),
    (lambda d: d["prefill"]["seconds"][1].__setitem__(0, -1.0), "prefill.seconds"),
    (lambda d: d["prefill"]["seconds"].pop(), "prefill.seconds"),
    (lambda d: d["prefill"]["seconds"][0].__setitem__(5, 0.0), "prefill.seconds"),
    (lambda d: d["decode"]["seconds"][3].__setitem__(0, 0.0), "decode.seconds"),
    (lambda d: d["transfers"].update(host_to_device_bytes_per_s=0), "transfers."
     "host_to_device_bytes_per_s"),
    (lambda d: d["batched_prefill"].update(model="cubic"), "batched_prefill.model"),
    (lambda d: d.update(tensor_parallel=1.5), "tensor_parallel"),
    (lambda d: d.update(overhead_s=-1), "overhead_s"),
])
def test_malformed_profiles_are_refused_with_the_field(tmp_path, mutate, field):
    data = _profile_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert info.value.field == field and info.value.file == str(path)


def test_profile_round_trip(tmp_path):
    p = load_profile("h800-llama2-70b-tp2")
    again = load_profile(str(p.save(tmp_path / "p.json")))
    assert again.to_dict() == p.to_dict()
    assert isinstance(again, Profile) and again.tensor_parallel == 2


def assert_same_profile_data(shipped, derived, where: str) -> None:
    """Same keys, types, lengths and strings; floats equal to 1e-9 relative. The fits go through
    numpy/scipy, whose versions may differ in the last bit (0.007536446305422592 vs ...594 seen on
    a fresh install), which is not a stale file; a regeneration that changed anything real moves
    numbers by far more than 1e-9."""
    if isinstance(derived, dict):
        assert isinstance(shipped, dict) and sorted(shipped) == sorted(derived), where
        for key in derived:
            assert_same_profile_data(shipped[key], derived[key], f"{where}.{key}")
    elif isinstance(derived, list):
        assert isinstance(shipped, list) and len(shipped) == len(derived), where
        for i, (s, d) in enumerate(zip(shipped, derived, strict=True)):
            assert_same_profile_data(s, d, f"{where}[{i}]")
    elif isinstance(derived, float) and not isinstance(shipped, bool):
        assert isinstance(shipped, (int, float)), where
        assert shipped == pytest.approx(derived, rel=1e-9, abs=0.0), where
    else:
        assert type(shipped) is type(derived) and shipped == derived, where


def test_shipped_profiles_are_exactly_what_derive_produces():
    shipped = shipped_profile_names()
    derived = {p.name: p for p in all_derived_profiles()}
    assert sorted(derived) == [n for n in shipped if load_profile(n).kind == "derived"]
    for name, profile in derived.items():
        assert_same_profile_data(load_profile(name).to_dict(),
                                 json.loads(json.dumps(profile.to_dict())), name)
    for gpu in ("a10g", "h800", "a100", "h100", "h200", "l4"):
        assert f"{gpu}-mistral-7b" in shipped
    assert {"h800-llama2-70b-tp2", "h800-mixtral-8x7b-tp2"} <= set(shipped)


def test_derived_profiles_sit_on_the_papers_anchors():
    """RAGCache, A10G: ~1 s for ~4,000 tokens of a 7B model; a host hit up to 3.9x cheaper than
    recomputing (calibrated); a cached prefix far cheaper still (paper: up to 11.5x)."""
    report = anchor_report()
    assert 0.7 < report["mistral_7b_prefill_4000_tokens_s"] < 1.2
    assert report["llama2_7b_host_hit_speedup"] == pytest.approx(3.9, rel=1e-3)
    assert report["llama2_7b_cached_speedup"] > 3.9
    p = load_profile("a10g-mistral-7b")
    assert 0.7 < p.prefill_s(0, 4000) < 1.2
    assert 0 < CALIBRATION.kv_copy_efficiency < 1


def test_derived_profiles_are_physically_sensible():
    for p in (load_profile(n) for n in shipped_profile_names()):
        if p.kind != "derived":
            continue
        weights = parameter_count(p.model) * p.model.dtype_bytes
        assert p.kv_capacity_bytes >= 2 * 2**30, p.name
        assert weights + p.kv_capacity_bytes < p.tensor_parallel * \
            p.hardware["memory_bytes_per_gpu"], p.name
        # decode reads the weights it uses (MoE: the routed experts) at least once
        floor = weight_bytes_read(p.model, 1) / p.tensor_parallel / (
            p.obtained["constants"]["memory_bytes_per_s"])
        assert p.decode_s(1, 128) > floor, p.name
        assert p.decode_s(256, 32768) > p.decode_s(1, 128)
    h100 = load_profile("h100-mistral-7b")
    a10g = load_profile("a10g-mistral-7b")
    assert h100.prefill_s(0, 4000) < a10g.prefill_s(0, 4000) / 4
    # LLaMA2-7B's KV is 4x Mistral's: the same GPU holds 4x fewer tokens of it
    llama = load_profile("a10g-llama2-7b")
    assert llama.kv_capacity_bytes / llama.model.kv_bytes_per_token < \
        a10g.kv_capacity_bytes / a10g.model.kv_bytes_per_token / 3


def test_separable_fit_recovers_known_coefficients():
    rng = np.random.default_rng(1)
    cached, new, seconds = [], [], []
    for _ in range(60):
        n = int(rng.integers(1, 6))
        a = rng.integers(0, 4000, n).tolist()
        b = rng.integers(1, 2000, n).tolist()
        cached.append(a)
        new.append(b)
        seconds.append(0.01 + 2e-4 * sum(b) + 3e-8 * sum(y * (x + y / 2) for x, y in
                                                        zip(a, b, strict=True)))
    model = fit_separable(cached, new, seconds)
    assert model.per_iteration_s == pytest.approx(0.01, rel=1e-6)
    assert model.per_token_s == pytest.approx(2e-4, rel=1e-6)
    assert model.per_pair_s == pytest.approx(3e-8, rel=1e-6)
    assert model.fit["max_rel_error"] < 1e-6
    assert model.iteration_s(cached[0], new[0]) == pytest.approx(seconds[0])


def test_tensor_parallel_profiles_pay_for_their_all_reduces():
    one = derive_profile("h800", "llama2-7b", 1)
    two = derive_profile("h800", "llama2-7b", 2)
    assert two.prefill_s(0, 4000) < one.prefill_s(0, 4000)
    assert two.prefill_s(0, 4000) > one.prefill_s(0, 4000) / 2
    assert BUILTIN_MODELS["llama2-70b"].kv_bytes_per_token == 320 * 1024


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
