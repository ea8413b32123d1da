"""The simulator on small hand-computed scenarios, and its invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from helpers import lose_the_end_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragsim.serving.pipeline as pipeline_module
from ragsim.cache.reorder import RequestPool, order_priority
from ragsim.cache.speculation import on_final_result, on_intermediate_stage
from ragsim.errors import ConfigError
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.serving.engine import Engine
from ragsim.serving.summary import WALL_CLOCK_COLUMNS, WALL_CLOCK_FIELDS
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.sim.simulator import Simulation, run_simulation
from ragsim.traces import resolve_trace
from ragsim.traces.io import TraceBuilder

PROFILE = load_profile("a10g-mistral-7b")
KV = PROFILE.model.kv_bytes_per_token
SEARCH_S = 0.05
DOC_TOKENS = {1: 1000, 2: 1000, 3: 600, 4: 400}


def make_trace(rows: list[tuple[float, list[int], int, int]], stages=None):
    """rows: (arrival_s, doc ids, query tokens, output tokens)."""
    b = TraceBuilder("test")
    for i, (t, docs, query, output) in enumerate(rows):
        b.add(i, t, query, output, docs, [DOC_TOKENS[d] for d in docs])
    for lists in stages or []:  # documents seen only in stages belong to the corpus too
        for docs in lists:
            for d in docs:
                b.doc_tokens.setdefault(d, DOC_TOKENS[d])
    trace = b.build({"name": "test"})
    if stages is not None:
        trace = dataclasses.replace(trace, stages=pa.array(stages, pa.list_(pa.list_(pa.int64()))))
    return trace


def quiet(**overrides):
    """ragcache without the parts a scenario does not test."""
    base = dict(system="ragcache", speculate=False, reorder=False, search_s=SEARCH_S,
                search_workers=4, stage_source="none", host_cache_bytes=0, host_replicas=0)
    return build_config({**base, **overrides})


def simulate(trace, config):
    result = run_simulation(trace, config, PROFILE)
    assert result.summary["requests_completed"] + result.summary["requests_failed"] == \
        trace.n_requests
    assert result.summary["requests_pending"] == 0 and not result.summary["interrupted"]
    assert not result.summary["stalled"]
    return result.records, result.summary


def test_one_request_alone_ttft_is_search_plus_prefill():
    trace = make_trace([(0.0, [1, 3], 50, 1)])
    records, summary = simulate(trace, quiet())
    expected = SEARCH_S + PROFILE.prefill_s(0, 1000 + 600 + 50)
    assert records.ttft_s[0] == pytest.approx(expected, rel=1e-12)
    assert records.finish_s[0] == pytest.approx(expected, rel=1e-12)  # one token: done
    assert summary["token_hit_rate"] == 0.0


def test_the_search_dispatch_delays_a_search_without_holding_a_worker():
    """``search_dispatch_s`` (the front end's hand-over) comes before a search takes a worker;
    ``search_handoff_s`` is paid inside the search, on the worker. By hand, one worker, 50 ms
    searches, requests at 0 and 55 ms, 10 ms either way: dispatched, the first searches from
    10 to 60 ms and the second from 65 to 115 ms, never waiting for the worker (the wait
    before each search is its 10 ms of dispatch); handed off, the first holds the worker 0-60
    ms, so the second waits from 55 to 60 ms and searches 60-120 ms. The first's prefill
    begins as its search ends; the second's once both its search and the first's prefill have
    ended (its own documents: no hit)."""
    trace = make_trace([(0.0, [1], 50, 1), (0.055, [3], 50, 1)])
    prefill = [PROFILE.prefill_s(0, 1000 + 50), PROFILE.prefill_s(0, 600 + 50)]
    for field, starts, ends in (("search_dispatch_s", [0.010, 0.065], [0.060, 0.115]),
                                ("search_handoff_s", [0.0, 0.060], [0.060, 0.120])):
        result = run_simulation(trace, quiet(search_workers=1, **{field: 0.010}), PROFILE)
        columns = result.columns
        assert columns["search_start_s"].tolist() == pytest.approx(starts, abs=1e-12), field
        assert columns["search_end_s"].tolist() == pytest.approx(ends, abs=1e-12), field
        first_token = ends[0] + prefill[0]
        second = max(ends[1], first_token) + prefill[1]
        assert columns["ttft_s"].tolist() == pytest.approx(
            [first_token, second - 0.055], abs=1e-9), field


@pytest.mark.parametrize("start_s", [100.0, 1.7e9])
def test_a_trace_whose_clock_starts_late_waits_for_its_first_arrival(start_s):
    """Logged traffic keeps its wall-clock timestamps: the first request arrives at ``start_s``,
    not at t = 0, so each TTFT is search + prefill as when alone, never negative."""
    trace = make_trace([(start_s, [1, 3], 50, 1), (start_s + 100.0, [2], 10, 1)])
    records, summary = simulate(trace, quiet())
    assert records.ttft_s[0] == pytest.approx(SEARCH_S + PROFILE.prefill_s(0, 1000 + 600 + 50),
                                              rel=1e-6)
    assert records.ttft_s[1] == pytest.approx(SEARCH_S + PROFILE.prefill_s(0, 1000 + 10),
                                              rel=1e-6)
    assert records.first_token_s[0] >= start_s
    assert summary["ttft_mean_s"] > 0


def test_decode_adds_iterations_from_the_decode_grid():
    trace = make_trace([(0.0, [1], 10, 4)])
    records, _ = simulate(trace, quiet())
    context = 1000 + 10 + 1
    decode = sum(PROFILE.decode_s(1, context + k) for k in range(3))
    assert records.finish_s[0] - records.first_token_s[0] == pytest.approx(decode, rel=1e-12)
    assert records.tpot_s[0] == pytest.approx(decode / 3, rel=1e-12)


def test_two_requests_sharing_the_first_document():
    trace = make_trace([(0.0, [1, 3], 50, 1), (10.0, [1, 4], 20, 1)])
    records, summary = simulate(trace, quiet())
    assert records.ttft_s[1] == pytest.approx(
        SEARCH_S + PROFILE.prefill_s(1000, 400 + 20), rel=1e-12)
    assert records.hit_tokens_gpu.tolist() == [0, 1000]
    assert summary["token_hit_rate"] == pytest.approx(1000 / (1600 + 1400))


def test_a_host_hit_pays_the_pcie_copy():
    # GPU KV holds one request at a time: [1] is swapped out to host by [2], then hit there
    trace = make_trace([(0.0, [1], 10, 1), (10.0, [2], 10, 1), (20.0, [1], 10, 1)])
    config = quiet(gpu_kv_bytes=1100 * KV, host_cache_bytes=10 * 2**30)
    records, summary = simulate(trace, config)
    copy = PROFILE.transfers.host_to_device_s(1000 * KV)
    assert records.hit_tokens_host.tolist() == [0, 0, 1000]
    assert records.ttft_s[2] == pytest.approx(SEARCH_S + copy + PROFILE.prefill_s(1000, 10),
                                              rel=1e-12)
    overlapped, _ = simulate(trace, config.replace(overlap_swap=True))
    assert overlapped.ttft_s[2] == pytest.approx(
        SEARCH_S + max(copy, PROFILE.prefill_s(1000, 10)), rel=1e-12)
    assert summary["swap_in_bytes"] == 1000 * KV


def test_running_requests_take_gpu_memory_from_the_cache():
    trace = make_trace([(0.0, [1], 10, 1), (10.0, [2], 10, 1), (20.0, [1], 10, 1)])
    records, _ = simulate(trace, quiet(gpu_kv_bytes=1100 * KV))  # no host tier
    assert records.hit_tokens_gpu.tolist() == [0, 0, 0]  # [2] needed the room [1] had
    roomy, _ = simulate(trace, quiet(gpu_kv_bytes=2100 * KV))
    assert roomy.hit_tokens_gpu.tolist() == [0, 0, 1000]


def test_a_request_that_can_never_fit_fails_with_a_reason():
    trace = make_trace([(0.0, [1], 10, 1), (1.0, [3], 10, 1)])
    records, summary = simulate(trace, quiet(gpu_kv_bytes=900 * KV))
    assert records.status.tolist() == ["failed", "completed"]
    assert summary["failed_by_reason"] == {"exceeds-kv-capacity": 1}


def test_reordering_serves_the_most_cached_request_first():
    # Figure 10a: same recomputation, different cached lengths -> longer cached first.
    # [3] warms the cache, a long request [1] occupies the engine, then two wait.
    trace = make_trace([(0.0, [3], 10, 1), (5.0, [1], 2000, 1), (5.01, [2], 10, 1),
                        (5.02, [3, 4], 10, 1)])
    fcfs, _ = simulate(trace, quiet(max_prefill_bs=1))
    reordered, summary = simulate(trace, quiet(max_prefill_bs=1, reorder=True))
    assert fcfs.prefill_start_s[2] < fcfs.prefill_start_s[3]
    assert reordered.prefill_start_s[3] < reordered.prefill_start_s[2]
    assert summary["reordered_decisions"] == 1


def test_request_pool_follows_figure_10_and_its_window():
    # 10a: equal recomputation (2), cached 1 vs 3 -> Q2 first; 10b: equal cached, less compute
    pool = RequestPool(reorder=True, window_s=2.0, start="arrival")
    lengths = {"Q1": (1, 2), "Q2": (3, 2), "Q3": (1, 1)}
    for key in lengths:
        pool.add(key, key, now_s=0.0)
    assert order_priority(3, 2) > order_priority(1, 2)
    assert pool.peek(lengths.get, now_s=1.0)[0] == "Q2"
    pool.take("Q2", now_s=1.0)
    assert pool.peek(lengths.get, now_s=1.5)[0] == "Q3"  # 1/1 beats 1/2
    pool.take("Q3", now_s=1.5)
    pool.add("Q4", "Q4", now_s=1.5)
    lengths["Q4"] = (100, 1)
    assert pool.peek(lengths.get, now_s=1.9)[0] == "Q4"
    # Q1 has waited two seconds: the window serves it before the better-cached Q4
    assert pool.peek(lengths.get, now_s=2.0)[0] == "Q1"
    pool.take("Q1", now_s=2.0)
    assert pool.overdue_served == 1 and pool.reordered == 2
    fcfs = RequestPool(reorder=False)
    for key in ("Q1", "Q2"):
        fcfs.add(key, key, now_s=0.0)
    assert fcfs.peek(lengths.get)[0] == "Q1"


def test_algorithm_2_decisions():
    d = on_intermediate_stage(None, [1, 2], False, pool_size=0, max_prefill_bs=4)
    assert d.changed and d.start_new and not d.terminate_running
    d = on_intermediate_stage([1, 2], [1, 2], True, pool_size=0, max_prefill_bs=4)
    assert not d.changed and not d.start_new
    d = on_intermediate_stage([1, 2], [1, 3], True, pool_size=4, max_prefill_bs=4)
    assert d.changed and d.terminate_running and not d.start_new  # pool too full
    assert on_final_result([1, 3], [1, 3]).keep_speculation
    f = on_final_result([1, 2], [1, 3])
    assert f.terminate_running and f.start_final and not f.keep_speculation
    assert on_final_result(None, [1, 3]).start_final


def test_speculation_that_is_right_hides_the_search():
    trace = make_trace([(0.0, [1], 10, 1)], stages=[[[1], [1]]])
    records, summary = simulate(trace, quiet(speculate=True, stage_source="trace",
                                             search_s=1.0))
    prefill = PROFILE.prefill_s(0, 1010)  # ~0.2 s: done before the search ends at 1 s
    assert prefill < 0.5
    assert records.ttft_s[0] == pytest.approx(1.0, rel=1e-12)  # the token waits for the search
    assert summary["speculation_kept"] == 1 and summary["speculation_wasted_s"] == 0.0
    slow, _ = simulate(trace, quiet(speculate=True, stage_source="trace", search_s=0.2))
    assert slow.ttft_s[0] == pytest.approx(0.1 + prefill, rel=1e-12)  # started at stage 1
    plain, _ = simulate(trace, quiet(speculate=False, stage_source="trace", search_s=0.2))
    assert plain.ttft_s[0] == pytest.approx(0.2 + prefill, rel=1e-12)


def test_speculation_that_is_wrong_is_terminated_and_its_compute_counted():
    trace = make_trace([(0.0, [1], 10, 1)], stages=[[[2], [1]]])
    records, summary = simulate(trace, quiet(speculate=True, stage_source="trace",
                                             search_s=0.2, gpu_kv_bytes=10**12))
    wrong = PROFILE.prefill_s(0, 1010)  # [2], started at 0.1 s, cannot be stopped mid-batch
    right = PROFILE.prefill_s(0, 1010)
    assert records.ttft_s[0] == pytest.approx(0.1 + wrong + right, rel=1e-12)
    assert summary["speculation_kept"] == 0
    assert summary["speculation_wasted_s"] == pytest.approx(wrong, rel=1e-12)
    assert summary["speculation_wasted_tokens"] == 1010


def test_speculation_starts_only_when_the_pool_has_room():
    rows = [(0.0, [1], 3000, 1)] + [(0.01, [2], 10, 1)] * 3 + [(0.02, [3], 10, 1)]
    stages = [[[1], [1]]] * 4 + [[[3], [3]]]
    trace = make_trace(rows, stages=stages)
    config = quiet(speculate=True, stage_source="trace", search_s=0.2, max_prefill_bs=2,
                   search_workers=8)
    records, summary = simulate(trace, config)
    # the long first prefill keeps the others waiting. By hand: request 0's first stage (0.1 s)
    # finds the pool empty and its speculation starts prefilling at once; at 0.11 s requests 1
    # and 2 fill the pool to max_prefill_bs (2), and requests 3 and 4 find it full
    assert records.speculations.tolist() == [1, 1, 1, 0, 0]
    assert summary["speculations_started"] == 3


def test_output_tokens_reserve_kv_memory():
    """A request needs KV for its context and every generated token but the last: 1000 + 10 +
    199 = 1,209 tokens do not fit in 1,100, 1,300 do."""
    trace = make_trace([(0.0, [1], 10, 200)])
    records, summary = simulate(trace, quiet(gpu_kv_bytes=1100 * KV))
    assert records.status.tolist() == ["failed"]
    assert summary["failed_by_reason"] == {"exceeds-kv-capacity": 1}
    records, _ = simulate(trace, quiet(gpu_kv_bytes=1300 * KV))
    assert records.status.tolist() == ["completed"]


def test_block_prefix_cache_reuses_whole_blocks_only():
    """vLLM's automatic prefix caching (16-token blocks): of document 1's 1,000 cached tokens
    the second request reuses 62 whole blocks, 992 tokens, and recomputes the partial block."""
    trace = make_trace([(0.0, [1, 3], 50, 1), (10.0, [1, 4], 20, 1)])
    records, _ = simulate(trace, quiet(prefix_block_tokens=16))
    assert records.hit_tokens_gpu.tolist() == [0, 992]
    assert records.recomputed_tokens.tolist() == [1600, 408]
    assert records.ttft_s[1] == pytest.approx(SEARCH_S + PROFILE.prefill_s(992, 408 + 20),
                                              rel=1e-12)


def test_max_batched_tokens_splits_a_prefill_batch():
    """Two 1,010-token prefills ready together: a 1,500-token budget runs them one after the
    other, a 4,000-token budget in one batch."""
    trace = make_trace([(0.0, [1], 10, 1), (0.0, [2], 10, 1)])
    records, summary = simulate(trace, quiet(max_batched_tokens=1500))
    first = PROFILE.prefill_s(0, 1010)
    assert records.prefill_start_s.tolist() == pytest.approx([SEARCH_S, SEARCH_S + first])
    assert summary["iterations_prefill"] == 2
    together, summary = simulate(trace, quiet(max_batched_tokens=4000))
    assert together.prefill_start_s.tolist() == pytest.approx([SEARCH_S, SEARCH_S])
    assert summary["iterations_prefill"] == 1


def test_a_retry_waits_its_timeout_and_generates_only_what_is_missing():
    """By hand: the GPU fails at 1 s, mid-decode, and is back at 1.1 s; the retry waits its 1 s
    timeout, prefills the context plus the g tokens already generated (the cache died with the
    GPU) and decodes the 200 - g tokens still missing."""
    trace = make_trace([(0.0, [1], 10, 200)])
    config = quiet(fail_gpu_at_s=(1.0,), gpu_recovery_s=0.1, retry_timeout_s=1.0)
    records, summary = simulate(trace, config)
    t, generated = SEARCH_S + PROFILE.prefill_s(0, 1010), 1
    while t + PROFILE.decode_s(1, 1010 + generated) < 1.0:
        t += PROFILE.decode_s(1, 1010 + generated)
        generated += 1
    context = 1000 + 10 + generated
    finish = 2.0 + PROFILE.prefill_s(0, context) + sum(
        PROFILE.decode_s(1, context + 1 + k) for k in range(200 - generated - 1))
    assert 1 < generated < 200 and summary["retries"] == 1
    assert records.finish_s[0] == pytest.approx(finish, rel=1e-12)


def test_gpu_failure_mid_run_retries_and_nothing_is_lost():
    trace = make_trace([(0.0, [1], 10, 200), (0.5, [3], 10, 200)])
    config = quiet(fail_gpu_at_s=(1.0,), gpu_recovery_s=2.0, retry_timeout_s=0.5)
    records, summary = simulate(trace, config)
    assert records.status.tolist() == ["completed", "completed"]
    assert summary["gpu_failures"] == 1 and summary["retries"] == 2
    assert (records.finish_s > 3.0).all()  # finished after the recovery
    assert records.first_token_s[0] < 1.0  # the first token was already out: TTFT kept
    assert records.attempts.tolist() == [2, 2]
    gave_up, summary = simulate(trace, config.replace(max_retries=0))
    assert gave_up.status.tolist() == ["failed", "failed"]
    assert summary["failed_by_reason"] == {"gpu-failure-retries-exhausted": 2}


def test_gpu_failure_keeps_host_copies_for_recovery():
    trace = make_trace([(0.0, [1], 10, 1), (10.0, [2], 10, 1), (30.0, [1], 10, 1)])
    config = quiet(gpu_kv_bytes=1100 * KV, host_cache_bytes=10 * 2**30,
                   fail_gpu_at_s=(20.0,))
    records, summary = simulate(trace, config)
    assert records.hit_tokens_host.tolist() == [0, 0, 1000]  # [1] survived in host memory
    assert summary["gpu_failure_lost_bytes"] == 1000 * KV  # [2] was only in GPU


def test_replay_and_run_agree_when_run_serves_one_request_at_a_time():
    base = resolve_trace("mmlu", n_requests=400)
    trace = dataclasses.replace(base, query_tokens=np.zeros(400, np.int64),
                                output_tokens=np.ones(400, np.int64),
                                arrival_s=np.arange(400, dtype=float) * 100.0)
    gpu, host = 40_000 * KV, 120_000 * KV
    for policy in ("pgdsf", "lru", "lfu"):
        run = run_simulation(trace, quiet(policy=policy, gpu_kv_bytes=gpu, host_cache_bytes=host,
                                          max_batch_size=1, max_prefill_bs=1), PROFILE)
        replay = run_replay(trace, ReplayConfig(trace="mmlu", policy=policy,
                                                kv_bytes_per_token=KV, gpu_capacity_bytes=gpu,
                                                host_capacity_bytes=host), PROFILE)
        for column in ("hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens"):
            assert run.columns[column].tolist() == replay.columns[column].tolist(), policy
        assert run.summary["token_hit_rate"] > 0.2


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_FIELDS}


def _modelled(records):
    """The per-request records without what was measured of this process (wall time)."""
    return records.drop(columns=list(WALL_CLOCK_COLUMNS))


def test_same_seed_same_result_and_another_seed_differs():
    """Seeded failures at a rate (200 per hour over ~200 s: several) included."""
    trace = resolve_trace("mmlu", n_requests=300)
    config = build_config({"rate_rps": 1.5, "seed": 3, "gpu_failure_rate_per_h": 200.0})
    a = run_simulation(trace, config, PROFILE)
    b = run_simulation(trace, config, PROFILE)
    assert a.summary["gpu_failures"] > 1 and a.summary["retries"] > 0
    assert _comparable(a.summary) == _comparable(b.summary)
    assert _modelled(a.records).equals(_modelled(b.records))
    c = run_simulation(trace, config.replace(seed=4), PROFILE)
    assert c.summary["ttft_mean_s"] != a.summary["ttft_mean_s"]
    assert c.summary["gpu_failures"] != a.summary["gpu_failures"] or \
        c.summary["retries"] != a.summary["retries"]


rows = st.lists(st.tuples(st.floats(0, 3), st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1,
                                                      max_size=3, unique=True),
                          st.integers(0, 300), st.integers(0, 40)), min_size=1, max_size=25)
knobs = st.fixed_dictionaries({
    "system": st.sampled_from(["vllm", "vllm-apc", "sglang", "ragcache"]),
    "policy": st.sampled_from(["pgdsf", "gdsf", "lru", "lfu", "fifo"]),
    "gpu_kv_bytes": st.integers(1500, 6000).map(lambda t: t * KV),
    "host_cache_bytes": st.sampled_from([0, 3000 * KV]),
    "max_prefill_bs": st.integers(1, 4),
    "max_batch_size": st.integers(1, 8),
    # mixed steps with a budget small enough to chunk prompts (documents of 400-1,000 tokens)
    "scheduler": st.sampled_from(["prefill-first", "mixed"]),
    "max_batched_tokens": st.sampled_from([16384, 700]),
    "reorder": st.booleans(),
    "speculate": st.booleans(),
    "reorder_window_s": st.sampled_from([0.0, 0.05, 0.5, 5.0]),
    "reorder_window_start": st.sampled_from(["head", "arrival"]),
    "batch_kv_sharing": st.booleans(),
    "fail_gpu_at_s": st.lists(st.floats(0, 5), max_size=2).map(tuple),
    "max_retries": st.integers(0, 2),
    "host_replicas": st.sampled_from([0, 2]),
    # slow searches and late-converging stages make wrong speculations (terminated, parked,
    # confirmed) common; a failure rate interleaves failures with them
    "search_s": st.sampled_from([0.1, 1.0]),
    "stage_converge_p": st.sampled_from([0.3, 0.72]),
    "gpu_failure_rate_per_h": st.sampled_from([0.0, 2000.0]),
})


class CapacityWatchedEngine(Engine):
    """The engine, checking the tree's capacities whenever a request takes memory."""

    def _start(self, job):
        super()._start(job)
        tree = self.tree
        assert tree.gpu_used_bytes <= tree.gpu_capacity_bytes
        assert tree.host_used_bytes <= tree.host_capacity_bytes
        assert tree.pinned_gpu_bytes + tree.reserved_gpu_bytes <= tree.gpu_capacity_bytes


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows, knobs)
def test_every_arrival_ends_exactly_once_capacity_holds_and_it_is_deterministic(rows, knobs):
    rows = sorted(rows, key=lambda r: r[0])
    trace = make_trace(rows)
    config = build_config({**knobs, "stage_source": "synthetic",
                           "retry_timeout_s": 0.2, "gpu_recovery_s": 0.5,
                           "replicate_every_s": 0.5})
    with pytest.MonkeyPatch.context() as patch:  # the pipeline builds a watched engine
        patch.setattr(pipeline_module, "Engine", CapacityWatchedEngine)
        sim = Simulation(trace, config, PROFILE)
    assert type(sim.engine) is CapacityWatchedEngine
    result = sim.run()
    status = result.columns["status"]
    assert set(status) <= {"completed", "failed"}
    assert (status == "completed").sum() + (status == "failed").sum() == trace.n_requests
    done = status == "completed"
    assert (result.columns["first_token_s"][done] >= result.columns["search_end_s"][done]).all()
    assert (result.columns["finish_s"][done] >= result.columns["first_token_s"][done]).all()
    sim.tree.check_invariants()
    assert sim.tree.reserved_gpu_bytes == 0
    assert sim.tree.pinned_gpu_bytes == sim.tree.root.size_bytes
    again = run_simulation(trace, config, PROFILE)  # same seed: the same run, event for event
    assert _modelled(again.records).equals(_modelled(result.records))
    assert _comparable(again.summary) == _comparable(result.summary)


def test_bad_configuration_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="policy"):
        build_config({"policy": "belady"})
    with pytest.raises(ConfigError, match="max_prefill_bs"):
        build_config({"max_prefill_bs": 0})
    with pytest.raises(ConfigError, match="unknown system"):
        build_config({"system": "tgi"})
    bad = tmp_path / "bad.toml"
    bad.write_text('[run]\nsearch_s = "fast"\n')
    from ragsim.serving.config import load_config_file

    with pytest.raises(ConfigError, match=r"bad.toml.*search_s"):
        build_config({}, base=load_config_file(bad), source=str(bad))
    bad.write_text('[run]\nhost_mem = "8GiB"\n')
    with pytest.raises(ConfigError, match="host_mem"):
        build_config({}, base=load_config_file(bad), source=str(bad))


def test_host_replicas_turn_a_post_failure_recompute_into_a_host_hit():
    trace = make_trace([(0.0, [1], 10, 1), (30.0, [1], 10, 1)])
    base = dict(host_cache_bytes=10 * 2**30, fail_gpu_at_s=(20.0,), gpu_recovery_s=1.0)
    without, _ = simulate(trace, quiet(**base))
    assert without.hit_tokens_host[1] == 0 and without.recomputed_tokens[1] == 1000
    with_replicas, summary = simulate(trace, quiet(**base, host_replicas=4,
                                                   replicate_every_s=5.0))
    assert with_replicas.hit_tokens_host[1] == 1000
    assert summary["replica_bytes"] == 1000 * KV
    assert with_replicas.ttft_s[1] < without.ttft_s[1]


def test_an_interrupted_run_keeps_what_finished():
    """Ctrl-C (KeyboardInterrupt) mid-run: the requests that ended keep their records, the
    others are "pending", and the summary says the run was cut short."""
    trace = resolve_trace("mmlu", n_requests=3000)

    def stop_at_1000(ended: int, now_s: float) -> None:
        if ended >= 1000:
            raise KeyboardInterrupt

    result = run_simulation(trace, build_config({"rate_rps": 2.0}), PROFILE, stop_at_1000)
    s, records = result.summary, result.records
    assert s["interrupted"]
    ended = s["requests_completed"] + s["requests_failed"]
    assert ended == 1000 and s["requests_pending"] == 2000
    assert (records.status == "pending").sum() == 2000
    done = records[records.status == "completed"]
    assert done.ttft_s.notna().all() and (done.finish_s <= s["simulated_s"]).all()
    assert s["ttft_mean_s"] == pytest.approx(done.ttft_s.mean())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("background", ["none", "failures", "replicas", "given-and-rate"])
def test_a_request_that_can_never_end_is_reported_as_a_stall_not_a_hang(monkeypatch,
                                                                        background):
    """A request waiting on nothing used to make ``run`` spin forever when a periodic process
    (failures at a rate, host replicas) kept the event queue alive, and crash with SimPy's
    message without one. Either way the run now stops, keeps what ended and names the rest;
    the periodic process acts no more once it is alone (no failure after the stall)."""
    lose_the_end_of(monkeypatch, 1)
    trace = make_trace([(0.0, [1], 10, 5), (1.0, [2], 10, 5), (2.0, [3], 10, 5)])
    extra = {"none": {},
             "failures": dict(gpu_failure_rate_per_h=36.0),  # one every ~100 s, none by 3 s
             "replicas": dict(host_cache_bytes=2**30, host_replicas=2,
                              replicate_every_s=1000.0),
             # a failure given for later must not happen once nothing else can
             "given-and-rate": dict(fail_gpu_at_s=(500.0,), gpu_failure_rate_per_h=3.6,
                                    host_cache_bytes=2**30, host_replicas=2,
                                    replicate_every_s=200.0)}[background]
    s = run_simulation(trace, quiet(**extra), PROFILE).summary
    assert s["stalled"] and not s["interrupted"]
    assert s["requests_completed"] == 2 and s["requests_pending"] == 1
    assert s["pending_request_ids"] == [1]
    assert s["gpu_failures"] == 0 and s["replica_bytes"] == 0
    # when the last request finished, not at a later tick: by hand, its search, the prefill of
    # its 600-token document and 10-token question, and four decode steps
    tokens = DOC_TOKENS[3] + 10
    finished = 2.0 + SEARCH_S + PROFILE.prefill_s(0, tokens) + sum(
        PROFILE.decode_s(1, tokens + 1 + k) for k in range(4))
    assert s["stalled_at_s"] == pytest.approx(finished, rel=1e-12)
    assert s["simulated_s"] == s["stalled_at_s"]


def test_a_runtime_error_inside_the_simulation_is_not_taken_for_a_stall(monkeypatch):
    def broken(self, job):
        raise RuntimeError("a bug of another kind")

    monkeypatch.setattr(Simulation, "finished", broken)
    trace = make_trace([(0.0, [1], 10, 5)])
    with pytest.raises(RuntimeError, match="another kind"):
        run_simulation(trace, quiet(), PROFILE)


def test_a_context_cached_to_the_end_recomputes_its_last_token():
    """No question tokens and document 1 (1,000 tokens) cached: an engine still computes the
    last token for its logits. A token-level cache reuses 999 tokens; vLLM's 16-token blocks
    reuse 992 (62 blocks) and recompute 8. ``replay`` counts the same."""
    trace = make_trace([(0.0, [1], 0, 1), (10.0, [1], 0, 1)])
    records, _ = simulate(trace, quiet(system="sglang"))
    assert records.hit_tokens_gpu.tolist() == [0, 999]
    assert records.recomputed_tokens.tolist() == [1000, 1]
    assert records.ttft_s[1] == pytest.approx(SEARCH_S + PROFILE.prefill_s(999, 1), rel=1e-12)
    blocks, _ = simulate(trace, quiet(system="vllm-apc"))
    assert blocks.hit_tokens_gpu.tolist() == [0, 992]
    assert blocks.ttft_s[1] == pytest.approx(SEARCH_S + PROFILE.prefill_s(992, 8), rel=1e-12)
    replayed = run_replay(trace, ReplayConfig(trace="test", policy="lru", kv_bytes_per_token=KV),
                          PROFILE).columns
    assert replayed["hit_tokens_gpu"].tolist() == [0, 999]
    assert replayed["cached_tokens"].tolist() == [0, 999]


def test_tokens_given_back_come_off_the_end_of_the_cached_prefix():
    """System prompt 5, GPU hits 20, host hits 10 (35 cached), nothing new: one token is
    recomputed from the host hits; with 16-token blocks 32 are reused and the 3 given back
    are host tokens; with 40-token blocks nothing is reused: 10 host, 20 GPU, 5 system."""
    from ragsim.cache.reuse import engine_reuse

    # (the last two fields, position-free hits and their recompute, are 0 without them)
    assert engine_reuse(35, 0, 20, 10, 0) == (34, 1, 20, 9, 1, 0, 0)
    assert engine_reuse(35, 0, 20, 10, 0, block_tokens=16) == (32, 3, 20, 7, 3, 0, 0)
    assert engine_reuse(35, 0, 20, 10, 0, block_tokens=40) == (0, 35, 0, 0, 30, 0, 0)
    assert engine_reuse(35, 7, 20, 10, 4) == (35, 7, 20, 10, 4, 0, 0)  # a question: all reused


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 50), st.integers(0, 100),
                          st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=20),
       st.sampled_from([1, 16]))
def test_the_reuse_rule_per_column_is_the_rule_per_request(rows, block):
    """``replay`` applies the rule to columns, ``run`` to one request: the same numbers."""
    from ragsim.cache.reuse import engine_reuse, engine_reuse_columns

    rows = [(gpu + host + system, new, gpu, host, rec)
            for system, new, gpu, host, rec in rows]
    columns = engine_reuse_columns(*(np.array(c, dtype=np.int64) for c in zip(*rows,
                                                                                strict=True)),
                                   block_tokens=block)
    per_row = [engine_reuse(*row, block_tokens=block) for row in rows]
    assert [list(map(int, c)) for c in columns] == [list(c) for c in zip(*per_row, strict=True)]
