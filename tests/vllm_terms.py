"""What the two ``--backend vllm`` test files (run and validate) share: the settings vLLM runs
with, worked out by hand (see either file's docstring), a config file, and a two-request trace
whose second request hits in vLLM's blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragsim.traces.schema import Trace

PROFILE = "cpu-vllm-mistral-7b-l2-h256"
MIXED = {"scheduler": ("prefill-first", "mixed")}
# vLLM takes as many prompts into a step as its token budget and max_num_seqs allow: every
# preset's 8 prompts a step becomes its 256 requests (max_batch_size)
PROMPTS = {"max_prefill_bs": (8, 256)}
# field -> (the preset's value, the value vLLM runs with), by hand
EXPECTED = {
    ("ragcache", "cpu"): {"speculate": (True, False), "reorder": (True, False), **PROMPTS,
                          "prefix_block_tokens": (1, 32), "batch_kv_sharing": (False, True),
                          **MIXED},
    ("ragcache", "cuda"): {"speculate": (True, False), "reorder": (True, False), **PROMPTS,
                           "prefix_block_tokens": (1, 16), "batch_kv_sharing": (False, True),
                           **MIXED},
    ("vllm-apc", "cpu"): {**PROMPTS, "prefix_block_tokens": (16, 32), **MIXED},
    ("vllm-apc", "cuda"): {**PROMPTS, **MIXED},  # its preset's block is vLLM's own on a GPU
    ("vllm", "cpu"): {**PROMPTS, **MIXED},  # no prefix cache: no block, nothing to share
}
# what a ragcache run on a CPU's vLLM records (the right-hand values above)
RAGCACHE_ON_CPU_VLLM = {"speculate": False, "reorder": False, "max_prefill_bs": 256,
                        "prefix_block_tokens": 32, "batch_kv_sharing": True,
                        "scheduler": "mixed"}


def config_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "given.toml"
    path.write_text(f'format = "ragsim.config"\nversion = 1\n[run]\n{body}\n')
    return path


def small_trace() -> Trace:
    # request 0: docs 1 (100) + 2 (50), query 7; request 1: doc 1 again (a hit), query 20
    return Trace(request_id=np.arange(2), arrival_s=np.zeros(2),
                 query_tokens=np.array([7, 20]), output_tokens=np.array([3, 4]),
                 doc_offsets=np.array([0, 2, 3]), doc_ids=np.array([1, 2, 1]),
                 document_ids=np.array([1, 2]), document_tokens=np.array([100, 50]))


def hit_tokens_by_request(columns) -> dict[int, int]:
    """Each request's prefix-cache hit tokens (GPU and host) from a run's records."""
    return dict(zip(columns["request_id"].tolist(),
                    (columns["hit_tokens_gpu"] + columns["hit_tokens_host"]).tolist(),
                    strict=True))
