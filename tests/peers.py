"""Helpers that run libCacheSim (the real C library, via its Python wheel) on our sequences."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

INT64_MAX = 2**63 - 1


def write_oracle_general(path: Path, keys: np.ndarray, sizes: np.ndarray) -> Path:
    """libCacheSim's oracleGeneral binary format: <uint32 time, uint64 id, uint32 size,
    int64 next_access_vtime> per request, next access = index of the next request for the id."""
    keys = np.asarray(keys, dtype=np.int64)
    n = len(keys)
    next_access = np.full(n, INT64_MAX, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        k = int(keys[i])
        if k in last:
            next_access[i] = last[k]
        last[k] = i
    record = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    assert record.itemsize == struct.calcsize("<IQIq")
    arr = np.empty(n, dtype=record)
    arr["t"] = np.arange(n, dtype=np.uint32)
    arr["id"] = keys.astype(np.uint64)
    arr["size"] = np.asarray(sizes, dtype=np.uint32)
    arr["next"] = next_access
    arr.tofile(path)
    return path


def libcachesim_miss_ratio(policy: str, capacity_bytes: int, trace_path: Path) -> float:
    import libcachesim as lcs

    reader = lcs.TraceReader(str(trace_path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache_cls = {"lru": lcs.LRU, "lfu": lcs.LFU, "gdsf": lcs.GDSF, "fifo": lcs.FIFO,
                 "belady": lcs.Belady}[policy]
    cache = cache_cls(capacity_bytes)
    object_miss_ratio, _ = cache.process_trace(reader)
    return object_miss_ratio


def vllm_prefix_cache_hits(prompts: list[list[int]], usable_blocks: int,
                           block_size: int = 16) -> list[int]:
    """vLLM's own KV-cache manager (v1, automatic prefix caching, LRU over free blocks) serving
    ``prompts`` one at a time, each finished and freed before the next: the tokens each found
    cached. -1 where vLLM could not allocate the prompt at all.

    The manager is plain Python over block ids; no GPU, no model. It is driven as vLLM's
    scheduler drives it for a prompt prefilled in one step: ``allocate_slots`` caches the full
    blocks, ``free`` hands them back tail first. Each prompt generates one token (computed by
    its prefill), so decoding adds no blocks. vLLM keeps one block aside (its null block), so
    it gets ``usable_blocks + 1``. One prompt a step: the same-step driver below with steps of
    one."""
    return vllm_same_step_prefix_cache_hits([[tokens] for tokens in prompts], usable_blocks,
                                            block_size)


def vllm_same_step_prefix_cache_hits(steps: list[list[list[int]]], usable_blocks: int,
                                     block_size: int = 16) -> list[int]:
    """As ``vllm_prefix_cache_hits``, but the prompts of each inner list are scheduled in one
    step, as vLLM's scheduler admits waiting requests in one pass: each gets
    ``get_computed_blocks`` then ``allocate_slots`` in turn, and ``allocate_slots`` caches the
    full blocks the step will compute before the next request looks (vLLM v1's
    ``KVCacheManager.allocate_slots`` -> ``coordinator.cache_blocks``), so a later request of the
    step hits blocks an earlier one is computing. The step's requests are freed after it."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                             dtype=torch.float16)
    config = KVCacheConfig(num_blocks=usable_blocks + 1, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    manager = KVCacheManager(config, max_model_len=1 << 24, scheduler_block_size=block_size,
                             hash_block_size=block_size, enable_caching=True)
    hasher = get_request_block_hasher(block_size, sha256)
    hits = []
    n = 0
    for step in steps:
        running = []
        for tokens in step:
            request = Request(str(n), tokens, SamplingParams(max_tokens=1), None,
                              block_hasher=hasher)
            n += 1
            blocks, cached, _ = manager.get_computed_blocks(request)
            if manager.allocate_slots(request, len(tokens) - cached, cached, blocks) is None:
                hits.append(-1)
                continue
            running.append(request)
            hits.append(cached)
        for request in running:
            request.num_computed_tokens = request.num_tokens
            manager.free(request)
    return hits
