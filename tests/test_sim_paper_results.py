"""The paper's qualitative results on the built-in traces with the derived A10G Mistral-7B profile.

Ratios, not absolute times: the claims are orderings (DESIGN.md, "reproduction targets").
"""

from __future__ import annotations

import functools

import pytest

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

PROFILE = load_profile("a10g-mistral-7b")
GiB = 2**30


@pytest.fixture(scope="module")
def mmlu():
    return resolve_trace("mmlu")  # 10,000 requests, as ragsim run and paper_comparison.py


@pytest.mark.parametrize("rate_rps", [0.6, 1.0])
def test_ragcache_beats_sglang_beats_vllm_on_ttft_at_moderate_load(mmlu, rate_rps):
    ttft = {system: run_simulation(mmlu, build_config({"system": system, "rate_rps": rate_rps}),
                                   PROFILE).summary["ttft_mean_s"]
            for system in ("vllm", "sglang", "ragcache")}
    assert ttft["ragcache"] < ttft["sglang"] < ttft["vllm"], ttft
    assert ttft["vllm"] / ttft["ragcache"] > 1.15  # paper: 1.2-4x


@functools.cache
def figure17_hit_rates(trace_name: str) -> dict[int, dict[str, float]]:
    """Token hit rate of each policy at 8, 32 and 128 GiB of host memory on a built-in trace at
    its built-in (measured) drift; computed once for both tests below."""
    trace = resolve_trace(trace_name)
    return {host_gib: {policy: run_simulation(
        trace, build_config({"system": "ragcache", "rate_rps": 0.8, "policy": policy,
                             "host_cache_bytes": host_gib * GiB, "speculate": False}),
        PROFILE).summary["token_hit_rate"] for policy in ("pgdsf", "gdsf", "lru", "lfu")}
        for host_gib in (8, 32, 128)}


@pytest.mark.slow  # ~35 s: replays over host sizes (CI runs it: pytest -m slow)
@pytest.mark.parametrize("trace_name", ["mmlu", "nq"])
def test_pgdsf_hits_at_least_as_often_as_gdsf_and_lfu_across_host_sizes(trace_name):
    """Figure 17 on the built-in traces, the frequency and size half: PGDSF keeps at least as
    much as GDSF and LFU at 8-128 GiB. The traces drift at the rate measured on real RAG traffic
    (docs/workloads.md); on stationary popularity LFU is the one that can pass PGDSF
    (tests/test_traces.py). Equal terms: every policy counts retrievals over the whole run
    (the default frequency scope); counting from admission the ordering is the same, while
    with counts over a sliding window LFU passes PGDSF on nq at 8 and 32 GiB
    (docs/policies.md, benchmarks/policy_table.py --mode run)."""
    for host_gib, hit in figure17_hit_rates(trace_name).items():
        assert hit["pgdsf"] >= max(hit["gdsf"], hit["lfu"]), (host_gib, hit)


@pytest.mark.parametrize("trace_name", ["mmlu", "nq"])
def test_at_the_measured_drift_lru_catches_pgdsf_only_on_mmlu_with_a_large_host(trace_name):
    """Figure 17's recency half (PGDSF >= LRU at 8-128 GiB) at the drift measured on RAGPulse
    (0.51 of the ranks per 1,000 requests, docs/workloads.md): with little host memory PGDSF's
    counts and sizes keep more than recency (8 and 32 GiB, both traces); with room for most of
    mmlu's working set recency keeps at least as much (128 GiB: LRU 0.1 points ahead,
    docs/findings.md), while on nq, whose documents recur less, PGDSF stays ahead. At the
    earlier 0.78 (a proxy's drift) LRU caught up at 32-128 GiB on mmlu and at 128 GiB on nq;
    at 0.1 (a value chosen because the paper's ordering holds there) it never did. A change
    that moves either way fails here."""
    hit = figure17_hit_rates(trace_name)
    for host_gib in (8, 32):
        assert hit[host_gib]["pgdsf"] > hit[host_gib]["lru"], (host_gib, hit[host_gib])
    if trace_name == "mmlu":
        assert hit[128]["lru"] >= hit[128]["pgdsf"], hit[128]
    else:
        assert hit[128]["pgdsf"] > hit[128]["lru"], hit[128]
