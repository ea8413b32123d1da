"""The torch engine's device memory beside its pool, and the terms that make a GPU run fit.

The first validation on an H200 (Mistral-7B fp16, ragcache, 300 requests at once) ran out of
memory twice: a decode batch of 256 rows padded to 2,275 tokens asked for 1.39 GiB per layer and
side, beside a pool of 112 GiB and then of 32 GiB. These tests hold the arithmetic to numbers
taken from elsewhere (the model's published size, that allocation) and the fitting to its
promises.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsim.errors import RagsimInputError
from ragsim.profiles.models import resolve_model
from ragsim.profiles.profile import load_profile
from ragsim.realrun.memory import (
    decode_batch_bytes,
    fit_for_device,
    fit_terms,
    plan,
    weight_bytes,
)
from ragsim.serving.config import SimConfig

GiB = 2**30
MISTRAL = resolve_model("mistral-7b")


def test_weights_are_mistral_7b_s_published_size():
    # Mistral-7B-v0.1 has 7,241,732,096 parameters (its model card; 7.24B), two bytes each;
    # the count leaves out the norms (266,240 of them)
    assert weight_bytes(MISTRAL) == pytest.approx(7_241_732_096 * 2, rel=1e-4)


def test_the_decode_batch_bound_covers_the_allocation_that_ran_out():
    """256 running rows (buffer of 320) padded to 2,275 tokens: 320 x 8 KV heads x 2,275 x 128
    x 2 bytes = 1.39 GiB per layer and side, 64 of them; the bound at that longest row (its
    buffer's 64 spare tokens taken off) holds all of them, and its growth by a quarter."""
    per_tensor = 320 * 8 * 2_275 * 128 * 2
    assert per_tensor / GiB == pytest.approx(1.389, abs=1e-3)
    bound = decode_batch_bytes(256, 2_275 - 64, MISTRAL)
    assert bound >= 64 * per_tensor
    assert bound <= 1.3 * 64 * per_tensor  # the growth's quarter, not more


def test_a_run_that_fits_is_left_alone():
    config = SimConfig()
    fitted, changed, memory = fit_terms(config, MISTRAL, profile_pool_bytes=20 * GiB,
                                        longest_tokens=1_000, free_bytes=139 * GiB)
    assert fitted is config and changed == {} and memory.fits


def test_the_h200_run_gets_a_batch_limit_and_a_pool_that_fit():
    config = SimConfig()
    fitted, changed, memory = fit_terms(config, MISTRAL, profile_pool_bytes=112 * GiB,
                                        longest_tokens=5_000, free_bytes=139 * GiB)
    assert set(changed) == {"max_batch_size", "gpu_kv_bytes"}
    assert fitted.max_batch_size < 256 and fitted.gpu_kv_bytes < 112 * GiB
    assert memory.fits and memory.needed_bytes <= 139 * GiB
    # the batch got at most half of what weights, prefill and slack left; the pool the rest
    left = 139 * GiB - memory.weights_bytes - memory.prefill_bytes - memory.slack_bytes
    assert memory.decode_batch_bytes <= left // 2
    assert memory.pool_bytes + memory.decode_batch_bytes <= left
    # one row more would not have fitted the batch's half
    assert decode_batch_bytes(fitted.max_batch_size + 1, 5_000, MISTRAL) > left // 2


def test_a_pool_the_user_set_is_kept_and_the_batch_limit_takes_the_rest():
    config = SimConfig().replace(gpu_kv_bytes=32 * GiB)
    fitted, changed, memory = fit_terms(config, MISTRAL, profile_pool_bytes=112 * GiB,
                                        longest_tokens=5_000, free_bytes=139 * GiB,
                                        given={"gpu_kv_bytes"})
    assert fitted.gpu_kv_bytes == 32 * GiB and set(changed) == {"max_batch_size"}
    assert memory.fits


def test_a_pool_the_user_set_too_large_is_refused_naming_it():
    config = SimConfig().replace(gpu_kv_bytes=130 * GiB)
    with pytest.raises(RagsimInputError, match="--gpu-mem") as caught:
        fit_terms(config, MISTRAL, profile_pool_bytes=112 * GiB, longest_tokens=5_000,
                  free_bytes=139 * GiB, given={"gpu_kv_bytes"})
    assert caught.value.field == "--gpu-mem"


def test_a_device_too_small_for_the_model_is_refused():
    with pytest.raises(RagsimInputError, match="cannot hold"):
        fit_terms(SimConfig(), MISTRAL, profile_pool_bytes=8 * GiB, longest_tokens=5_000,
                  free_bytes=16 * GiB)


def test_a_cpu_run_is_not_bounded():
    config = SimConfig()
    profile = dataclasses.make_dataclass("P", ["model", "kv_capacity_bytes"])(MISTRAL, GiB)
    assert fit_for_device(config, None, profile, "cpu", who="the run") == (config, {}, None)


@settings(max_examples=200, deadline=None)
@given(free_gib=st.integers(20, 200), pool_gib=st.integers(1, 180),
       longest=st.integers(16, 16_000), batch=st.integers(1, 512),
       keep_pool=st.booleans(), keep_batch=st.booleans())
def test_what_fit_terms_returns_fits_and_keeps_what_the_user_set(
        free_gib, pool_gib, longest, batch, keep_pool, keep_batch):
    config = SimConfig().replace(max_batch_size=batch,
                                 gpu_kv_bytes=pool_gib * GiB if keep_pool else None)
    given_fields = {name for name, keep in (("gpu_kv_bytes", keep_pool),
                                            ("max_batch_size", keep_batch)) if keep}
    try:
        fitted, changed, memory = fit_terms(config, MISTRAL, profile_pool_bytes=pool_gib * GiB,
                                            longest_tokens=longest, free_bytes=free_gib * GiB,
                                            given=given_fields)
    except RagsimInputError:
        return
    assert memory.fits
    assert memory == plan(MISTRAL, fitted, pool_bytes=fitted.gpu_kv_bytes or pool_gib * GiB,
                          longest_tokens=longest, free_bytes=free_gib * GiB)
    assert not given_fields & set(changed)
    assert fitted.max_batch_size <= batch
    assert (fitted.gpu_kv_bytes or pool_gib * GiB) <= pool_gib * GiB


# ------------------------------------------------------------------- wired into run and validate
# No GPU here: the device's free memory is what the test says, and a run that got past the fit
# would fail building its model on "cuda" (torch has no CUDA), which the fit must come before.
def _free(monkeypatch, n_bytes: int) -> None:
    import ragsim.realrun.memory as memory

    monkeypatch.setattr(memory, "device_free_bytes",
                        lambda device: n_bytes if device.startswith("cuda") else None)


def test_a_torch_run_on_a_gpu_too_small_is_refused_before_its_model_is_built(monkeypatch):
    import ragsim

    _free(monkeypatch, 16 * GiB)
    with pytest.raises(RagsimInputError, match="cannot hold this run"):
        ragsim.simulate(backend="torch", device="cuda", profile="h200-torch-mistral-7b",
                        requests=20)


def test_validate_on_a_gpu_sets_the_terms_on_both_sides_and_says_so(monkeypatch, tmp_path):
    from ragsim.api.validation import setup_validation

    _free(monkeypatch, 139 * GiB)
    notes = []
    # the engine loop given: its probe runs would need the GPU this machine lacks (the sizing
    # comes before them)
    config = tmp_path / "loop.toml"
    config.write_text("[run]\nengine_loop_step_s = 0.0\nengine_loop_request_s = 0.0\n")
    setup = setup_validation(tmp_path / "v", backend="torch", device="cuda",
                             profile="h200-torch-mistral-7b", requests=300, config=config,
                             on_note=lambda text, warning=False: notes.append(text))
    assert setup.config.max_batch_size < 256
    assert setup.config.gpu_kv_bytes < load_profile("h200-torch-mistral-7b").kv_capacity_bytes
    assert {"max_batch_size", "gpu_kv_bytes"} <= set(setup.terms)
    assert any("padded to its longest row" in note for note in notes)


def test_validate_refuses_a_pool_the_user_set_that_the_gpu_cannot_hold(monkeypatch, tmp_path):
    from ragsim.api.validation import setup_validation

    _free(monkeypatch, 139 * GiB)
    with pytest.raises(RagsimInputError, match="--gpu-mem"):
        setup_validation(tmp_path / "v", backend="torch", device="cuda",
                         profile="h200-torch-mistral-7b", requests=300, gpu_mem="130GiB")


def test_a_gpu_run_without_cuda_says_so_before_anything_is_sized():
    """No CUDA here: the fit must not reach torch.cuda (whose own error is an assertion about
    torch's build), but say what the engine would."""
    import torch

    import ragsim

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RagsimInputError, match="CUDA is not available") as caught:
        ragsim.simulate(backend="torch", device="cuda", profile="h200-torch-mistral-7b",
                        requests=5)
    assert caught.value.field == "--device"


def test_the_longest_request_counts_its_documents_query_output_and_system_prompt():
    """By hand: request 0 retrieves documents of 10 and 20 tokens (query 7, output 3: 40),
    request 1 one of 5 tokens (query 50, output 9: 64); with a 100-token system prompt, 164."""
    from ragsim.realrun.memory import longest_request_tokens
    from ragsim.traces.io import TraceBuilder

    builder = TraceBuilder("by-hand")
    builder.add(0, 0.0, 7, 3, [1, 2], [10, 20])
    builder.add(1, 1.0, 50, 9, [3], [5])
    trace = builder.build({"name": "by-hand"})
    assert trace.doc_tokens_per_request.tolist() == [30, 5]
    assert longest_request_tokens(trace, SimConfig()) == 64
    assert longest_request_tokens(trace, SimConfig().replace(system_prompt_tokens=100)) == 164
