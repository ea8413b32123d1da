"""What ``--backend vllm`` asks of vLLM's engine and what it refuses: plain logic, no vLLM."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ragsim.errors import RagsimInputError
from ragsim.profiles.profile import load_profile
from ragsim.realrun.vllm.harness import check_config, engine_settings
from ragsim.serving.config import build_config
from ragsim.traces.schema import Trace

PROFILE = "cpu-mistral-7b-l2-h256"


def small_trace() -> Trace:
    # request 0: docs 1 (100) + 2 (50), query 7, output 3 -> 160 tokens of prompt + output
    # request 1: doc 3 (300), query 20, output 40 -> 360; request 2: no documents, 5 + 1
    return Trace(request_id=np.arange(3), arrival_s=np.zeros(3),
                 query_tokens=np.array([7, 20, 5]), output_tokens=np.array([3, 40, 1]),
                 doc_offsets=np.array([0, 2, 3, 3]), doc_ids=np.array([1, 2, 3]),
                 document_ids=np.array([1, 2, 3]), document_tokens=np.array([100, 50, 300]))


def test_engine_arguments_come_from_the_configuration():
    profile = load_profile(PROFILE)
    config = build_config({"system": "vllm-apc", "prefix_block_tokens": 32,
                           "system_prompt_tokens": 10, "gpu_kv_bytes": 2**26,
                           "max_batch_size": 12, "max_batched_tokens": 256})
    s = engine_settings(small_trace(), config, profile, seed=3)
    # longest: request 1, 10 + 300 + 20 + 40 = 370 -> 12 blocks of 32 = 384
    assert s.max_model_len == 384
    assert s.max_batched_tokens == 384  # at least one whole prompt, over the configured 256
    assert (s.prefix_caching, s.block_tokens, s.kv_cache_bytes, s.max_num_seqs, s.seed) == \
        (True, 32, 2**26, 12, 3)
    plain = engine_settings(small_trace(), build_config({"system": "vllm"}), profile, seed=0)
    assert not plain.prefix_caching and plain.block_tokens == 128  # vLLM's CPU default
    assert plain.kv_cache_bytes == profile.kv_capacity_bytes
    assert plain.max_model_len == 384  # 360 in blocks of 128


@pytest.mark.parametrize(("changes", "flag"), [
    ({"system": "ragcache"}, "--speculate"),  # vLLM prefills the final list only
    ({"system": "ragcache", "speculate": False}, "--reorder"),
    ({"system": "ragcache", "speculate": False, "reorder": False, "overlap_swap": True},
     "--overlap-swap"),
    ({"system": "sglang"}, "--system"),
    ({"system": "vllm-apc", "speculate": True}, "--speculate"),
    ({"system": "vllm-apc", "reorder": True}, "--reorder"),
    ({"system": "vllm-apc", "host_cache_bytes": 2**30}, "--host-mem"),
    ({"system": "vllm", "fail_gpu_at_s": [1.0]}, "--fail-gpu-at"),
])
def test_what_vllm_does_not_do_is_refused_naming_the_option(changes, flag):
    with pytest.raises(RagsimInputError) as caught:
        check_config(build_config(changes))
    assert caught.value.field == flag


def test_a_block_vllm_cannot_page_is_refused():
    config = build_config({"system": "vllm-apc", "prefix_block_tokens": 20})
    with pytest.raises(RagsimInputError) as caught:
        engine_settings(small_trace(), config, load_profile(PROFILE), seed=0)
    assert caught.value.field == "--block-tokens"
    check_config(build_config({"system": "vllm-apc"}))  # the preset itself is fine


def test_ragcache_runs_its_tree_as_a_connector_with_a_host_tier():
    config = build_config({"system": "ragcache", "speculate": False, "reorder": False,
                           "prefix_block_tokens": 32})
    check_config(config)  # its host tier and host replicas are the connector's
    with pytest.raises(RagsimInputError, match="--no-speculate --no-reorder"):
        check_config(build_config({"system": "ragcache"}))
    assert config.host_cache_bytes > 0 and config.host_replicas > 0
    s = engine_settings(small_trace(), config, load_profile(PROFILE), seed=0)
    assert s.kv_connector == "RagsimTreeConnector" and s.prefix_caching
    assert engine_settings(small_trace(), build_config({"system": "vllm-apc",
                                                        "prefix_block_tokens": 32}),
                           load_profile(PROFILE), seed=0).kv_connector is None


@pytest.mark.parametrize("scheduler", ["prefill-first", "mixed"])
def test_the_real_side_takes_either_scheduler(scheduler):
    """``validate --backend vllm`` simulates vLLM's steps with the mixed scheduler and gives the
    real side the same configuration: the pipeline vLLM serves under must accept it (its own
    engine gets no work either way)."""
    import simpy

    from ragsim.realrun.vllm.harness import _NoIterations
    from ragsim.serving.pipeline import Pipeline

    config = build_config({"system": "vllm-apc", "prefix_block_tokens": 32,
                           "scheduler": scheduler})
    check_config(config)
    Pipeline(small_trace(), config, load_profile(PROFILE), env=simpy.Environment(),
             iterations=lambda tree: _NoIterations())


def test_the_engine_runs_on_the_threads_its_vllm_profile_was_timed_on():
    """A step's price holds at the thread count it was timed at: a run priced by a vLLM CPU
    profile takes that profile's threads (the shipped one: 1), unless told otherwise; a torch
    profile says nothing about vLLM's threads (torch's default, every core)."""
    config = build_config({"system": "vllm"})
    vllm_profile = load_profile("cpu-vllm-mistral-7b-l2-h256")
    assert vllm_profile.obtained["threads"] == 1 and vllm_profile.engine.startswith("vLLM")
    assert engine_settings(small_trace(), config, vllm_profile, seed=0).threads == 1
    assert engine_settings(small_trace(), config, vllm_profile, seed=0, threads=2).threads == 2
    assert engine_settings(small_trace(), config, load_profile(PROFILE), seed=0).threads is None
    two = dataclasses.replace(vllm_profile, obtained={**vllm_profile.obtained, "threads": 2})
    assert engine_settings(small_trace(), config, two, seed=0).threads == 2
    gpu = dataclasses.replace(vllm_profile, obtained={**vllm_profile.obtained,
                                                      "device_type": "cuda"})
    assert engine_settings(small_trace(), config, gpu, seed=0).threads is None


@pytest.mark.parametrize(("budget", "seqs", "kv_bytes", "tokens"), [
    (16384, 256, 2**30, 16384),  # the budget: 8 prompts of 2,047 tokens and one of 8
    (16384, 3, 2**30, 3 * 2047),  # no more prompts than max_num_seqs
    (16384, 256, 2**23, 2**23 // (2 * 2048)),  # their KV within half the KV memory: 2,048
])
def test_the_warm_up_step_fills_the_runs_token_budget(budget, seqs, kv_bytes, tokens):
    """The prompts of the warm-up's large step (``warm_up_prompts``; a model of 2,048 bytes of
    KV a token, max_model_len 2,048): each within max_model_len less the token it generates,
    together the budget, bounded by max_num_seqs and by half the KV memory; no two share a
    token, so none hits another's cached blocks."""
    from ragsim.realrun.vllm.engine import EngineSettings
    from ragsim.realrun.vllm.harness import warm_up_prompts

    settings = EngineSettings(prefix_caching=True, block_tokens=32, kv_cache_bytes=kv_bytes,
                              max_num_seqs=seqs, max_batched_tokens=budget, max_model_len=2048)
    prompts = warm_up_prompts(settings, 2048)
    assert sum(len(p) for p in prompts) == tokens
    assert len(prompts) <= seqs and all(0 < len(p) <= 2047 for p in prompts)
    assert len({p[0] for p in prompts}) == len(prompts) and all(len(set(p)) == 1 for p in prompts)
