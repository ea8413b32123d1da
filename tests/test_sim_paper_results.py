"""The paper's qualitative results on the built-in traces with the derived A10G Mistral-7B profile.

Ratios, not absolute times: the claims are orderings (DESIGN.md, "reproduction targets").
"""

from __future__ import annotations

import functools

import pytest

from ragsim.profiles.profile import load_profile
from ragsim.sim.config import build_config
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


@pytest.mark.parametrize("trace_name", ["mmlu", "nq"])
def test_pgdsf_hits_at_least_as_often_as_gdsf_and_lfu_across_host_sizes(trace_name):
    """Figure 17 on the built-in traces, the frequency and size half: PGDSF keeps at least as
    much as GDSF and LFU at 8-128 GiB. The traces drift at the rate measured on real retrieval
    (docs/workloads.md); on stationary popularity LFU is the one that can pass PGDSF
    (tests/test_traces.py). Equal terms: every policy counts retrievals over the whole run
    (the default frequency scope); counting from admission the ordering is the same, while
    with counts over a sliding window LFU passes PGDSF on nq at 8 and 32 GiB
    (docs/policies.md, benchmarks/policy_table.py --mode run)."""
    for host_gib, hit in figure17_hit_rates(trace_name).items():
        assert hit["pgdsf"] >= max(hit["gdsf"], hit["lfu"]), (host_gib, hit)


@pytest.mark.xfail(strict=True, reason=(
    "the paper's PGDSF >= LRU does not hold at the measured drift (0.78 of the ranks per 1,000 "
    "requests, docs/workloads.md): LRU keeps 0.3-0.8% more at 32-128 GiB. Strict: a change "
    "that restores the paper's ordering shows up here"))
@pytest.mark.parametrize("trace_name", ["mmlu", "nq"])
def test_pgdsf_hits_at_least_as_often_as_lru_across_host_sizes(trace_name):
    """Figure 17 on the built-in traces, the recency half: PGDSF keeps at least as much as LRU
    at 8-128 GiB. It held while the built-in drift was 0.1, a value chosen because this
    ordering holds there; with popularity moving as fast as measured, recency is worth about
    as much as PGDSF's counts and sizes at the larger host sizes."""
    for host_gib, hit in figure17_hit_rates(trace_name).items():
        assert hit["pgdsf"] >= hit["lru"], (host_gib, hit)
