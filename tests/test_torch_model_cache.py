"""The reference engine hands its KV cache to transformers under the name transformers takes.

transformers renamed the forward's ``past_key_values`` to ``cache`` (5.24; the old name stays,
deprecated, until 5.40). Given a name it does not take, a forward swallows it and builds a fresh
cache of its own: every cached token is silently ignored. That happened on a GPU machine with
transformers 5.17: the profile's decodes ran without their context and its prefills failed.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.profiles.torch_model import Row, TorchModel, cache_keyword


@pytest.fixture(scope="module")
def model() -> TorchModel:
    return TorchModel(scaled_down(resolve_model("mistral-7b"), layers=2, hidden=128))


def test_the_keyword_is_one_the_installed_forward_takes(model):
    for forward in (model.model.forward, model.model.model.layers[0].forward):
        assert model.cache_kw in inspect.signature(forward).parameters


def test_each_generation_of_forward_gets_its_own_name():
    def before(input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...

    def after(input_ids=None, cache=None, use_cache=None, **kwargs): ...

    assert cache_keyword(before) == "past_key_values"
    assert cache_keyword(after) == "cache"


def test_decoding_reads_the_cached_context(model):
    """Two tokens decoded after a prefill give the logits of one pass over all of them: the
    decode step attended to the cached prefill (with its cache ignored, it would not)."""
    tokens = [5, 17, 42, 8, 99, 3, 61]
    whole = model.prefill([Row(None, tokens, 0)]).logits
    first = model.prefill([Row(None, tokens[:-1], 0)])
    step = model.decode(first.batch, [tokens[-1]])
    torch.testing.assert_close(step, whole, rtol=1e-4, atol=1e-4)


def test_a_cache_passed_under_a_name_the_model_ignores_is_an_error(model, monkeypatch):
    monkeypatch.setattr(model, "cache_kw", "kv_under_another_name")
    with pytest.raises(RuntimeError, match="did not write into the cache"):
        model.prefill([Row(None, [1, 2, 3], 0)])


def test_a_prefill_over_cached_kv_reads_it(model):
    """The new tokens' pass over a cached prefix gives the logits of one pass over both."""
    tokens = [5, 17, 42, 8, 99, 3, 61]
    whole = model.prefill([Row(None, tokens, 0)]).logits
    prefix = model.prefill([Row(None, tokens[:4], 0)]).new_kv[0]
    rest = model.prefill([Row(prefix, tokens[4:], 4)]).logits
    torch.testing.assert_close(rest, whole, rtol=1e-4, atol=1e-4)


def test_the_floor_lane_installs_the_oldest_transformers_the_extra_allows():
    """.ci/run-floor runs the torch engine's tests on the [profile] extra's lower bound for
    transformers (4.56, the bound until 2026-12-04, crashed in the cache layer: its
    ``lazy_initialization`` took one tensor before 5.0), and .ci/run calls it."""
    import re
    import tomllib
    from pathlib import Path

    from packaging.version import Version

    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["profile"]
    bound = next(re.fullmatch(r"transformers>=([\d.]+)", spec) for spec in extra
                 if spec.startswith("transformers"))
    assert bound, extra
    lane = (root / ".ci" / "run-floor").read_text()
    floor = re.search(r"^TRANSFORMERS_FLOOR=([\d.]+)$", lane, re.M).group(1)
    assert Version(bound.group(1)) == Version(floor), (bound.group(1), floor)
    assert "bash .ci/run-floor" in (root / ".ci" / "run").read_text()
