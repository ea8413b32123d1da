"""The paper's qualitative results on the built-in traces with the derived A10G Mistral-7B profile.

Ratios, not absolute times: the claims are orderings (DESIGN.md, "reproduction targets").
"""

from __future__ import annotations

import pytest

from ragsim.profiles.profile import load_profile
from ragsim.sim.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

PROFILE = load_profile("a10g-mistral-7b")
GiB = 2**30


@pytest.fixture(scope="module")
def mmlu():
    return resolve_trace("mmlu", n_requests=3000)  # as benchmarks/paper_comparison.py


@pytest.mark.parametrize("rate_rps", [0.6, 1.0])
def test_ragcache_beats_sglang_beats_vllm_on_ttft_at_moderate_load(mmlu, rate_rps):
    ttft = {system: run_simulation(mmlu, build_config({"system": system, "rate_rps": rate_rps}),
                                   PROFILE).summary["ttft_mean_s"]
            for system in ("vllm", "sglang", "ragcache")}
    assert ttft["ragcache"] < ttft["sglang"] < ttft["vllm"], ttft
    assert ttft["vllm"] / ttft["ragcache"] > 1.15  # paper: 1.2-4x


def test_pgdsf_hits_at_least_as_often_as_gdsf_and_lru_and_nearly_lfu_across_host_sizes(mmlu):
    """Figure 17 on the stationary synthetic trace: PGDSF >= GDSF and LRU at 8-128 GiB; LFU,
    whose best case stationary popularity is, stays within 2% (README, "Policies")."""
    for host_gib in (8, 32, 128):
        hit = {policy: run_simulation(
            mmlu, build_config({"system": "ragcache", "rate_rps": 0.8, "policy": policy,
                                "host_cache_bytes": host_gib * GiB, "speculate": False}),
            PROFILE).summary["token_hit_rate"] for policy in ("pgdsf", "gdsf", "lru", "lfu")}
        assert hit["pgdsf"] >= max(hit["gdsf"], hit["lru"]), (host_gib, hit)
        # a tie over seeds (benchmarks/policy_seeds.py: 0.98-1.03x on mmlu); this seed sits at
        # 0.986x at 8 GiB, so a change to PGDSF may move it across: check the seed range then
        assert hit["pgdsf"] >= 0.98 * hit["lfu"], (host_gib, hit)
