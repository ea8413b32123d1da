"""What each system preset follows: the engine, its version and the source files read for it.

``ragsim systems --json`` gives this as each preset's ``follows``, so that a reader can check a
preset against the code it claims to model. ``modelled`` says which of the source's rules the
preset reproduces (with the configuration fields that do it) and ``not_modelled`` what it leaves
out or approximates: a comparison is only as good as both lists.

Every preset with a host tier gets the same host memory (``host_cache_bytes``, 192 GiB by
default) and every preset the profile's GPU KV memory, so that a system comparison runs each
system on the same memory; the engines' own defaults differ (HiCache sizes its host pool at twice
the GPU pool, vLLM's connector takes ``cpu_bytes_to_use``).
"""

from __future__ import annotations

SGLANG_HICACHE_COMMIT = "263bc85d64baa38d82ec20f58a61f2982c78075d"

SYSTEM_SOURCES: dict[str, dict] = {
    "vllm": {
        "engine": "vLLM", "version": "0.3 (the paper's baseline)",
        "files": [],
        "modelled": ["continuous batching, no cross-request KV reuse (cache=false)"],
        "not_modelled": ["not read from source: the paper's description of its baseline"],
    },
    "vllm-apc": {
        "engine": "vLLM", "version": "automatic prefix caching (v0.4+)",
        "files": ["vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/block_pool.py"],
        "modelled": ["hits count whole blocks of 16 tokens (prefix_block_tokens=16)",
                     "a block is cached when it is scheduled, so batch mates share it "
                     "(batch_kv_sharing)", "LRU over free blocks (policy=lru)", "no host tier"],
        "not_modelled": ["the scheduler is ragsim's prefill-first, as for the paper's "
                         "baselines (docs/vllm.md measures vLLM's own)"],
    },
    "sglang": {
        "engine": "SGLang", "version": "v0.1 (2024, the paper's era) run FCFS",
        "files": ["python/sglang/srt/managers/router/radix_cache.py"],
        "modelled": ["GPU radix tree over token prefixes: hits at any token (block 1)",
                     "LRU over the tree's leaves", "no host tier", "FCFS (the paper's setup)"],
        "not_modelled": ["its default schedule heuristic was lpm: see sglang-lpm"],
    },
    "sglang-lpm": {
        "engine": "SGLang", "version": "v0.1 (2024, the paper's era)",
        "files": ["python/sglang/srt/managers/router/scheduler.py",
                  "python/sglang/srt/server_args.py"],
        "modelled": ["schedule_heuristic lpm (its default then): the waiting queue sorted by "
                     "-len(prefix_indices), the most cached tokens first (order=lpm)",
                     "no starvation bound (reorder_window_s at its 30-day limit)",
                     "the rest as the sglang preset"],
        "not_modelled": ["a decision scans the oldest reorder_scan (256) requests, not the "
                         "whole queue"],
    },
    "sglang-hicache": {
        "engine": "SGLang", "version": f"main at {SGLANG_HICACHE_COMMIT[:7]} (HiCache)",
        "commit": SGLANG_HICACHE_COMMIT,
        "files": ["python/sglang/srt/mem_cache/hiradix_cache.py",
                  "python/sglang/srt/managers/cache_controller.py",
                  "python/sglang/srt/server_args.py"],
        "modelled": [
            "hicache_write_policy write_through (the default): a node inserted into the "
            "radix tree is written to host at once (write_through_threshold 1; host_write="
            "through)",
            "device eviction (evict): a leaf backed up on host frees its GPU copy "
            "(_evict_backuped); one the host could not take is deleted (_evict_regular)",
            "host eviction (evict_host) takes only the host copies of nodes the GPU has "
            "evicted, leaves first (host_evicts_gpu_copies=false)",
            "radix_eviction_policy lru in both tiers (policy=lru)",
            "load_back: the host part of a matched prefix is loaded back to GPU and keeps its "
            "host copy; layer-wise loading overlaps the prefill's compute (overlap_swap)",
            "schedule_policy fcfs (the default; reorder=false), page_size 1 (block 1)"],
        "not_modelled": [
            "load_back_threshold (10 tokens: below it the host part is recomputed): "
            "documents are hundreds of tokens",
            "write_through_selective and write_back policies (host_write=back is write_back)",
            "the write is asynchronous and locks the node until it completes",
            "hicache_ratio 2.0 sizes the host pool at twice the GPU pool by default: here "
            "every system gets the same host memory"],
    },
    "vllm-offload": {
        "engine": "vLLM", "version": "0.33.0 (v1 engine, OffloadingConnector + CPU backend)",
        "files": ["vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
                  "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py",
                  "vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py",
                  "vllm/v1/kv_offload/cpu/manager.py", "vllm/v1/kv_offload/cpu/spec.py",
                  "vllm/v1/kv_offload/cpu/policies/lru.py"],
        "modelled": [
            "the GPU side is vLLM's prefix cache (as vllm-apc): blocks of 16 tokens, batch "
            "mates share blocks, LRU",
            "a chunk is one GPU block (blocks_per_chunk 1, the default); every full chunk a "
            "step computes is stored to CPU (_build_store_jobs; store_threshold 0: no "
            "filter), so host_write=through",
            "CPU eviction: eviction_policy lru (the default) over chunks not being loaded or "
            "stored, tails of a request before its heads; a CPU copy of a block still in GPU "
            "may be evicted (host_evicts_gpu_copies=true)",
            "a lookup continues the GPU prefix hit in CPU memory (get_num_new_matched_tokens) "
            "and loads the hit chunks to GPU"],
        "not_modelled": [
            "loads are asynchronous: the request waits for its own load while others run; "
            "modelled as a load overlapped with the batch's compute (overlap_swap)",
            "the scheduler is ragsim's prefill-first (as vllm-apc), not vLLM v1's chunked "
            "prefill"],
    },
    "ragcache": {
        "engine": "RAGCache", "version": "the paper (arXiv 2404.12457); no public source",
        "files": [],
        "modelled": ["knowledge tree in GPU + host, copied to host on first GPU eviction "
                     "(host_write=back)", "PGDSF", "cache-aware reordering (order=cache-aware)",
                     "dynamic speculative pipelining", "host replicas of the upper nodes"],
        "not_modelled": ["the reordering window's length (the paper gives none: 1 s)"],
    },
}
