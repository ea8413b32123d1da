"""The simulator's modelling decisions (docs/model.md), each on a hand-worked scenario: the
host->GPU copy as its own TTFT component, hits a request's own speculation paid for, the
reordering window in seconds, and which requests of one prefill batch see each other's KV."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim import KV, PROFILE, SEARCH_S, make_trace, quiet, simulate

COMPONENTS = ("ttft_search_wait_mean_s", "ttft_search_mean_s", "ttft_queue_mean_s",
              "ttft_swap_in_mean_s", "ttft_prefill_mean_s")


def test_the_host_to_gpu_copy_is_its_own_ttft_component():
    # GPU KV holds one request at a time: [1] goes to host when [2] runs, then hits there
    trace = make_trace([(0.0, [1], 10, 1), (10.0, [2], 10, 1), (20.0, [1], 10, 1)])
    config = quiet(gpu_kv_bytes=1100 * KV, host_cache_bytes=10 * 2**30)
    records, summary = simulate(trace, config)
    copy = PROFILE.transfers.host_to_device_s(1000 * KV)
    assert copy > 0
    assert records.swap_in_s.tolist() == pytest.approx([0.0, 0.0, copy], rel=1e-12)
    assert summary["ttft_swap_in_mean_s"] == pytest.approx(copy / 3, rel=1e-12)
    prefills = [PROFILE.prefill_s(0, 1010), PROFILE.prefill_s(0, 1010),
                PROFILE.prefill_s(1000, 10)]
    assert summary["ttft_prefill_mean_s"] == pytest.approx(sum(prefills) / 3, rel=1e-9)
    assert sum(summary[c] for c in COMPONENTS) == pytest.approx(summary["ttft_mean_s"],
                                                                rel=1e-12)
    # overlapped with compute, only what the prefill does not hide is left
    _, overlapped = simulate(trace, config.replace(overlap_swap=True))
    hidden = max(copy - PROFILE.prefill_s(1000, 10), 0.0)
    assert overlapped["ttft_swap_in_mean_s"] == pytest.approx(hidden / 3, abs=1e-15)
    assert sum(overlapped[c] for c in COMPONENTS) == pytest.approx(
        overlapped["ttft_mean_s"], rel=1e-12)


def test_a_request_batched_with_a_host_hit_waits_for_its_copy():
    # [1] pushes [3] to host (1,500 tokens of GPU KV); [3, 4] and [4] arrive together and
    # share one prefill batch: both get their first token after the copy and the compute
    trace = make_trace([(0.0, [3], 10, 1), (5.0, [1], 10, 1), (10.0, [3, 4], 10, 1),
                        (10.0, [4], 10, 1)])
    config = quiet(gpu_kv_bytes=1500 * KV, host_cache_bytes=10 * 2**30)
    records, _ = simulate(trace, config)
    assert records.hit_tokens_host.tolist() == [0, 0, 600, 0]
    copy = PROFILE.transfers.host_to_device_s(600 * KV)
    assert records.swap_in_s.tolist()[2:] == pytest.approx([copy, copy], rel=1e-12)
    assert records.prefill_start_s[2] == records.prefill_start_s[3] == 10.0 + SEARCH_S


def test_hits_paid_for_by_the_requests_own_speculation_are_counted_apart():
    # request 0 speculates on [1, 4] at stage 1, its search ends with [1, 3]: the final job
    # finds document 1 cached, but only because its own wasted speculation computed it
    trace = make_trace([(0.0, [1, 3], 10, 1), (10.0, [1, 3], 10, 1)],
                       stages=[[[1, 4], [1, 3]], [[1, 3], [1, 3]]])
    config = quiet(speculate=True, stage_source="trace", search_s=0.2, gpu_kv_bytes=10**12)
    records, summary = simulate(trace, config)
    assert records.speculation_kept.tolist() == [False, True]
    assert records.cached_tokens.tolist() == [1000, 1600]  # what the engine reused
    assert records.speculative_self_hit_tokens.tolist() == [1000, 0]
    # request 1's documents were computed by request 0 (document 1 by its speculation, but
    # for request 1 that is another request's work): cross-request reuse
    assert records.hit_tokens_gpu.tolist() == [0, 1600]
    assert summary["token_hit_rate"] == pytest.approx(1600 / 3200)
    assert summary["speculative_self_hit_tokens"] == 1000
    assert summary["speculative_self_hit_rate"] == pytest.approx(1000 / 3200)
    assert summary["request_hit_rate"] == 0.5


def test_own_speculation_hits_reused_in_part_are_split_by_the_reuse_rule():
    """A 16-token block cache gives back the partial block at the end of the prefix: 1000
    tokens of document 1 (own) then 600 of document 3 (another request's) reuse 1,600 // 16 *
    16 = 1,600 tokens; with document 3 own and the cut in it, only whole blocks of it count."""
    from ragsim.cache.reuse import own_hit_tokens

    assert own_hit_tokens([1000, 600], [True, False], 1600, 1600, 0) == (1000, 0)
    assert own_hit_tokens([1000, 600], [False, True], 1592, 1600, 0) == (592, 0)
    # GPU hits first, then host: [1000 GPU][600 host], 8 host tokens given back
    assert own_hit_tokens([1000, 600], [False, True], 1000, 1000, 592) == (0, 592)
    assert own_hit_tokens([1000, 600], [True, True], 1000, 1000, 592) == (1000, 592)
    assert own_hit_tokens([1000, 600], [True, False], 400, 1000, 0) == (400, 0)


def test_requests_of_one_prefill_batch_see_each_others_kv_only_where_the_engine_does():
    # [1, 3] and [1, 4] are prefilled in one batch; document 1 is computed by the first
    trace = make_trace([(0.0, [1, 3], 10, 1), (0.0, [1, 4], 10, 1), (10.0, [1], 10, 1)])
    after, _ = simulate(trace, quiet())  # SGLang, RAGCache: inserted after the prefill
    assert after.prefill_start_s[0] == after.prefill_start_s[1]
    assert after.hit_tokens_gpu.tolist() == [0, 0, 1000]
    assert after.recomputed_tokens.tolist() == [1600, 1400, 0]
    batch_s = PROFILE.batched_prefill.iteration_s([0, 0], [1610, 1410])
    assert after.ttft_s[1] == pytest.approx(SEARCH_S + batch_s, rel=1e-12)
    shared, _ = simulate(trace, quiet(batch_kv_sharing=True))  # vLLM v1
    assert shared.hit_tokens_gpu.tolist() == [0, 1000, 1000]
    batch_s = PROFILE.batched_prefill.iteration_s([0, 1000], [1610, 410])
    assert shared.ttft_s[1] == pytest.approx(SEARCH_S + batch_s, rel=1e-12)
    from ragsim.serving.config import build_config
    assert build_config({"system": "vllm-apc"}).batch_kv_sharing
    assert not build_config({"system": "sglang"}).batch_kv_sharing
    assert not build_config({"system": "ragcache"}).batch_kv_sharing


def test_the_window_is_seconds_and_starts_when_a_request_is_the_oldest():
    """Three requests wait from t=0 with a 2 s window; the engine is busy until t=5, so all
    three are past the paper's literal bound. Counted from arrival every decision is then
    forced (FCFS); counted from when a request became the oldest, only Q1 is forced at t=5,
    and Q3 (better cached) goes before Q2, whose window starts when Q1 leaves."""
    from ragsim.cache.reorder import RequestPool

    lengths = {"Q1": (0, 10), "Q2": (0, 10), "Q3": (9, 1)}
    served = {}
    for start in ("arrival", "head"):
        pool = RequestPool(reorder=True, window_s=2.0, start=start)
        for key in lengths:
            pool.add(key, key, now_s=0.0)
        order = [pool.take(pool.peek(lengths.get, now_s=5.0)[0], now_s=5.0) for _ in range(3)]
        served[start] = (order, pool.overdue_served)
    assert served["arrival"] == (["Q1", "Q2", "Q3"], 3)
    assert served["head"] == (["Q1", "Q3", "Q2"], 1)
    # Q2 is the oldest from t=5: it is passed over until t=7, then forced
    pool = RequestPool(reorder=True, window_s=2.0)
    for key in ("Q2", "Q3"):
        pool.add(key, key, now_s=5.0)
    assert pool.peek(lengths.get, now_s=6.9)[0] == "Q3"
    assert pool.peek(lengths.get, now_s=7.0)[0] == "Q2"
    # a request that leaves the pool without a decision (a terminated speculation) hands the
    # head to the next one from that moment
    pool.discard("Q2", now_s=6.0)
    assert pool.window_started_s("Q3") == 6.0


def test_the_reorder_ablation_script_prints_what_ragsim_run_gives_for_its_cells(tmp_path):
    """Every table and row, and cells of both tables against ``ragsim run`` with the same
    settings (the window from arrival through a config file: it has no flag). A 0.05 s window,
    so the window forces decisions and its two starts differ even on 100 requests."""
    from test_benchmark_scripts import cli_json, run_script

    out = run_script("reorder_ablation.py", "--quick", "--requests", "100", "--window", "0.05")
    paper, sweep = out.split("\n2. ")
    labels = ["no reorder", "reorder (window from head)", "reorder (window from arrival)"]
    table = {}  # (trace, label) -> cells of section 1
    for line in paper.splitlines():
        for name in ("mmlu", "nq"):
            if line.startswith(f"{name} at "):
                trace = name
        for label in labels:
            if line.strip().startswith(label):
                table[trace, label] = line.strip()[len(label):].split()
    assert "mmlu at 2.5 req/s" in paper and "nq at 1.4 req/s" in paper
    assert list(table) == [(t, label) for t in ("mmlu", "nq") for label in labels]
    mmlu_part, nq_part = sweep.split("\nnq\n")
    rows = {(trace, r.split()[0]): r.split() for trace, part in
            (("mmlu", mmlu_part), ("nq", nq_part))
            for r in part.splitlines() if r.strip()[:1].isdigit()}
    assert list(rows) == [("mmlu", "2.5"), ("mmlu", "3.5"), ("mmlu", "5.0"),
                          ("nq", "1.4"), ("nq", "2.5"), ("nq", "4.0")]
    from_arrival = tmp_path / "arrival.toml"
    from_arrival.write_text('[run]\nreorder_window_start = "arrival"\n')

    def run(trace: str, rate: str, variant: str) -> dict:
        flags = {"off": ["--no-reorder"], "head": ["--reorder", "--reorder-window", "0.05"],
                 "arrival": ["--reorder", "--reorder-window", "0.05",
                             "--config", str(from_arrival)]}[variant]
        s = cli_json("run", "--trace", trace, "--requests", "100", "--seed", "0", "--rate",
                     rate, "--system", "ragcache", *flags)
        decisions = max(s["scheduler_decisions"], 1)
        s["reorder"] = s["reordered_decisions"] / decisions
        s["forced"] = s["window_forced_decisions"] / decisions
        return s

    mmlu = {v: run("mmlu", "2.5", v) for v in ("off", "head", "arrival")}
    assert mmlu["arrival"]["config"]["reorder_window_start"] == "arrival"
    for variant, label in zip(mmlu, labels, strict=True):
        s = mmlu[variant]
        gain = [] if variant == "off" else [f"{mmlu['off']['ttft_mean_s'] / s['ttft_mean_s']:.2f}x"]
        assert table["mmlu", label] == [
            f"{s['ttft_mean_s']:.2f}", f"{s['ttft_p99_s']:.2f}", *gain,
            f"{s['token_hit_rate']:.1%}", f"{s['throughput_rps']:.2f}", f"{s['reorder']:.1%}",
            f"{s['forced']:.1%}"], variant
    # nq at 4.0 req/s, where the queue builds and the TTFTs of the variants differ
    off, head, late = (run("nq", "4.0", v) for v in ("off", "head", "arrival"))
    assert rows["nq", "4.0"][1:] == [
        f"{off['ttft_mean_s']:.2f}", f"{head['ttft_mean_s']:.2f}",
        f"{off['ttft_mean_s'] / head['ttft_mean_s']:.2f}x", f"{head['forced']:.1%}",
        f"{late['ttft_mean_s']:.2f}", f"{off['ttft_mean_s'] / late['ttft_mean_s']:.2f}x",
        f"{late['forced']:.1%}"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=0, max_size=6),
       st.integers(0, 6), st.integers(0, 60), st.sampled_from([1, 16]), st.integers(0, 30))
def test_own_hit_tokens_equal_a_token_by_token_count(nodes, n_gpu, system, block, query):
    """Second implementation: lay the prefix out token by token (system prompt, GPU hits,
    host hits), keep what ``engine_reuse`` reuses of it, count the own tokens per tier."""
    from ragsim.cache.reuse import engine_reuse, own_hit_tokens

    n_gpu = min(n_gpu, len(nodes))
    tokens = [t for t, _ in nodes]
    hit_gpu, hit_host = sum(tokens[:n_gpu]), sum(tokens[n_gpu:])
    cached = system + hit_gpu + hit_host
    u = engine_reuse(cached, query, hit_gpu, hit_host, 0, block)
    layout = [("sys", False)] * system
    for j, (t, mine) in enumerate(nodes):
        layout += [("gpu" if j < n_gpu else "host", mine)] * t
    reused = layout[:u.cached_tokens]
    expected = (sum(1 for tier, mine in reused if tier == "gpu" and mine),
                sum(1 for tier, mine in reused if tier == "host" and mine))
    assert sum(1 for tier, _ in reused if tier == "gpu") == u.hit_tokens_gpu
    assert own_hit_tokens(tokens, [m for _, m in nodes], u.hit_tokens_gpu, hit_gpu,
                          u.hit_tokens_host) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "take", "drop"]),
                          st.floats(0, 2, allow_nan=False), st.integers(0, 9)),
                max_size=60),
       st.sampled_from([0.0, 0.5, 2.0]))
def test_the_oldest_request_is_never_passed_over_longer_than_the_window(ops, window):
    """From the log alone (not the pool's state): whenever a decision takes another request,
    the oldest waiting one became the oldest less than the window ago."""
    from ragsim.cache.reorder import RequestPool

    pool = RequestPool(reorder=True, window_s=window)
    waiting: list[int] = []  # arrival order, as the log sees it
    oldest_since = {}
    now, next_key = 0.0, 0
    lengths = {}
    for op, dt, cached in ops:
        now += dt
        if op == "add":
            pool.add(next_key, next_key, now_s=now)
            lengths[next_key] = (cached, 10 - cached)
            if not waiting:
                oldest_since[next_key] = now
            waiting.append(next_key)
            next_key += 1
        elif waiting:
            if op == "take":
                key = pool.peek(lengths.get, now_s=now)[0]
                pool.take(key, now_s=now)
                if key != waiting[0]:
                    assert now - oldest_since[waiting[0]] < window
            else:  # a speculation terminated while waiting
                key = waiting[len(waiting) // 2]
                pool.discard(key, now_s=now)
            was_oldest = key == waiting[0]
            waiting.remove(key)
            if was_oldest and waiting:
                oldest_since[waiting[0]] = max(now, oldest_since.get(waiting[0], now))


def test_reordering_does_not_count_a_batch_mates_documents_as_cached():
    """Doc 2 is cached; P = [2, 3], Q = [2, 3, 4] and R = [2] (700 query tokens) wait while a
    long prefill runs. Priorities: P 1000/610, R 1000/700, Q 1000/1010: P goes first and
    computes doc 3. Q would then look 1600/410, but in SGLang and RAGCache it cannot use doc 3
    before P's prefill ends, so R completes the batch of two and Q hits doc 3 in the next one.
    Where the engine shares a batch's KV (vLLM v1), Q is taken next and hits it at once."""
    rows = [(0.0, [2], 10, 1), (5.0, [1], 3000, 1), (5.01, [2, 3], 10, 1),
            (5.02, [2, 3, 4], 10, 1), (5.03, [2], 700, 1)]
    trace = make_trace(rows)
    config = quiet(reorder=True, max_prefill_bs=2, gpu_kv_bytes=10**12)
    after, _ = simulate(trace, config)
    p, q, r = 2, 3, 4
    assert after.prefill_start_s[p] == after.prefill_start_s[r] < after.prefill_start_s[q]
    assert after.hit_tokens_gpu[q] == 1600
    shared, _ = simulate(trace, config.replace(batch_kv_sharing=True))
    assert shared.prefill_start_s[p] == shared.prefill_start_s[q] < shared.prefill_start_s[r]
    assert shared.hit_tokens_gpu[q] == 1600


def test_an_old_config_with_a_window_in_decisions_is_told_what_replaced_it(tmp_path):
    from ragsim.errors import ConfigError
    from ragsim.serving.config import build_config, load_config_file

    path = tmp_path / "config.toml"
    path.write_text('format = "ragsim.config"\nversion = 1\n[run]\nreorder_window = 32\n')
    with pytest.raises(ConfigError, match="reorder_window_s") as error:
        build_config({}, base=load_config_file(path), source=str(path))
    assert str(path) in str(error.value)
