"""The engine's serving loop (``serving.engine_loop``): the simulation and the replay of a real
run charge it by one rule, and the probe's fit (``realrun.vllm.loop``) reads it off two runs.

Expected values are worked by hand: the replay's timeline step by step, a sequential simulation
where each request pays the loop once (and its decode steps once each), and the 2x2 system the
probe's two runs make.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ragsim.decisions import replay
from ragsim.profiles.profile import load_profile
from ragsim.realrun.probe_runs import fit_engine_loop, probe_rows
from ragsim.serving.config import build_config
from ragsim.serving.engine_loop import EngineLoop
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace


def test_a_step_pays_the_gap_after_a_step_and_each_new_requests_intake():
    loop = EngineLoop(step_s=0.001, request_s=0.002)
    assert loop.seconds(False, 0) == 0
    assert loop.seconds(True, 0) == pytest.approx(0.001)
    assert loop.seconds(True, 3) == pytest.approx(0.007)
    assert EngineLoop.of(build_config({})) is None  # the default costs nothing
    assert EngineLoop.of(build_config({"engine_loop_request_s": 0.002})) == EngineLoop(0, 0.002)


def test_a_request_pays_its_searchs_interpreter_time_only_beside_a_busy_engine():
    """A step begun as the one before it ended: each new request's search ran while the
    engine was busy and pays ``search_s`` with its intake; after the engine idled it pays
    none. A replay at measured durations charges the rest of the loop only (the search's
    time is inside the measured steps)."""
    loop = EngineLoop(step_s=0.001, request_s=0.002, search_s=0.0005)
    assert loop.seconds(True, 3) == pytest.approx(0.001 + 3 * (0.002 + 0.0005))
    assert loop.seconds(False, 3) == pytest.approx(3 * 0.002)
    assert loop.without_search() == EngineLoop(0.001, 0.002)
    assert EngineLoop(search_s=0.0005).without_search() is None
    assert EngineLoop.of(build_config({"engine_loop_search_s": 0.0005})) == EngineLoop(
        0, 0, 0.0005)


# Step A [1.0, 1.5] takes job 10's first chunk; step B right after takes job 10 again and job
# 11 for the first time; step C, after the engine idled, job 12; priced at 0.5, 0.3 and 0.2 s
def _step(start, end, *jobs, completing=()):
    return {"kind": "mixed", "start_s": start, "end_s": end, "size": 0,
            "context_tokens": 0.0, "completing": list(completing),
            "jobs": [(key, request, computed, 50, 0) for key, request, computed in jobs]}


THREE_STEPS = [_step(1.0, 1.5, (10, 0, 0)),
               _step(1.5, 1.8, (10, 0, 50), (11, 1, 0), completing=(10, 11)),
               _step(3.0, 3.2, (12, 2, 0), completing=(12,))]
THREE_ENTERED = {10: 1.0, 11: 1.3, 12: 3.0}
THREE_COLUMNS = {"arrival_s": np.array([0.9, 1.2, 2.9]),
                 "search_end_s": np.array([1.0, 1.3, 3.0]),
                 "first_token_s": np.array([1.8, 1.8, 3.2])}


def _replay_three(loop: EngineLoop | None) -> np.ndarray:
    prices = iter([0.5, 0.3, 0.2])
    return replay(THREE_STEPS, THREE_ENTERED, THREE_COLUMNS, lambda d: next(prices), loop=loop)


def test_the_replay_charges_the_loop_by_the_simulations_rule():
    """The three steps with a loop of 0.01 s a step and 0.1 s a request:
    A: 1.0 + 0.5 + 0.1 (10's intake; no step before it) = 1.6;
    B: begins at 1.6 (right after A): 1.6 + 0.3 + 0.01 + 0.1 (11's intake only) = 2.01;
    C: job 12 entered at 3.0, after B ended: 3.0 + 0.2 + 0.1 = 3.3 (no gap charge)."""
    ttft = _replay_three(EngineLoop(step_s=0.01, request_s=0.1))
    assert ttft == pytest.approx([2.01 - 0.9, 2.01 - 1.2, 3.3 - 2.9])
    # without a loop: 1.5, 1.8, 3.2
    assert _replay_three(None) == pytest.approx([1.8 - 0.9, 1.8 - 1.2, 3.2 - 2.9])


def test_the_replay_charges_a_search_beside_a_busy_engine_by_the_same_rule():
    """The three steps with a search term of 0.05 s as well: A (no step before it) and C
    (after the engine idled) pay none; B's new job 11 pays it: B ends at 2.01 + 0.05."""
    ttft = _replay_three(EngineLoop(step_s=0.01, request_s=0.1, search_s=0.05))
    assert ttft == pytest.approx([2.06 - 0.9, 2.06 - 1.2, 3.3 - 2.9])


def _sequential(**loop) -> pd.DataFrame:
    trace = resolve_trace("mmlu", n_requests=12, seed=3)
    config = build_config({"trace": "mmlu", "system": "vllm-apc", "arrival": "sequential",
                           "speculate": False, "seed": 3, **loop})
    result = run_simulation(trace, config, load_profile(config.profile))
    return pd.DataFrame({k: result.columns[k] for k in ("request_id", "ttft_s", "e2e_s")})


def test_a_sequential_simulation_pays_each_requests_intake_once_and_each_decode_step_its_gap():
    """One request at a time: its prefill begins after its search, with the engine idle, so
    it pays the request's intake and no gap; each of its decode steps follows a step and pays
    the gap. By hand: TTFT + request_s; e2e + request_s + (output tokens - 1) x step_s."""
    trace = resolve_trace("mmlu", n_requests=12, seed=3)
    base = _sequential()
    intake = _sequential(engine_loop_request_s=0.004)
    assert (intake["ttft_s"] - base["ttft_s"]).to_numpy() == pytest.approx(np.full(12, 0.004))
    gap = _sequential(engine_loop_step_s=0.0005)
    decodes = np.maximum(trace.output_tokens.astype(int) - 1, 0)
    assert (gap["ttft_s"] - base["ttft_s"]).to_numpy() == pytest.approx(np.zeros(12))
    assert (gap["e2e_s"] - base["e2e_s"]).to_numpy() == pytest.approx(decodes * 0.0005)


def test_a_sequential_simulation_pays_no_search_term_and_a_burst_pays_it_per_later_request():
    """One request at a time: every search runs while the engine sits idle, so the search
    term changes nothing. A burst with no search (every request in the pool at once): the
    first step begins on an idle engine and takes its requests free of it; every later
    request's first chunk is in a step right after another and pays it once, and no
    decision changes, so the run ends (n - those in the first step) x search_s later."""
    base = _sequential()
    searched = _sequential(engine_loop_search_s=0.004)
    assert searched["ttft_s"].to_numpy() == pytest.approx(base["ttft_s"].to_numpy())
    trace = resolve_trace("mmlu", n_requests=40, seed=3)

    def burst(**loop):
        config = build_config({"trace": "mmlu", "system": "vllm-apc", "arrival": "poisson",
                               "rate_rps": 1e9, "retrieval": "off", "scheduler": "mixed",
                               "seed": 3, **loop})
        return run_simulation(trace, config, load_profile(config.profile))

    plain, charged = burst(), burst(engine_loop_search_s=0.003)
    starts = plain.columns["prefill_start_s"]
    first_step = int((starts == starts.min()).sum())
    assert 0 < first_step < 40
    assert charged.summary["simulated_s"] - plain.summary["simulated_s"] == pytest.approx(
        (40 - first_step) * 0.003, rel=1e-9)


def test_the_probes_two_runs_give_the_step_and_the_request_by_hand():
    # 100 gaps, 0.1 s, 200 requests; 300 gaps, 0.2 s, 250 requests:
    # 100a + 200b = 0.1 and 300a + 250b = 0.2 -> b = 0.1 / 350, a = 0.001 - 2b
    step_s, request_s = fit_engine_loop([(100, 0.1, 200), (300, 0.2, 250)])
    assert request_s == pytest.approx(0.1 / 350)
    assert step_s == pytest.approx(0.001 - 2 * 0.1 / 350)
    # runs that would make a step a refund: it is 0, and the requests carry the time
    step_s, request_s = fit_engine_loop([(100, 0.1, 100), (100, 0.3, 300)])
    assert step_s == 0 and request_s == pytest.approx(0.001)
    assert fit_engine_loop([]) == (0.0, 0.0)


def test_the_probe_runs_requests_the_validation_does_not_serve_where_there_are_some():
    assert probe_rows(1300, 300, 120) == (range(300, 420), True)
    assert probe_rows(350, 300, 120) == (range(230, 350), False)
    assert probe_rows(50, 50, 120) == (range(0, 50), False)
    # by default as many as the validation serves, within 16 and 120
    assert probe_rows(1300, 300) == (range(300, 420), True)
    assert probe_rows(1300, 40) == (range(40, 80), True)
    assert probe_rows(1300, 10) == (range(10, 26), True)


def test_the_search_tiers_time_is_summed_over_the_probe_runs_before_it_is_divided():
    """Per search over every probe run (not the mean of each run's mean): 3 ms over 20
    searches and 1 ms over 10 are 4 ms over 30; a run that searched no real index adds
    nothing, and none at all is 0. The probe runs' loads are shares of the capacity."""
    from ragsim.realrun.probe_runs import interpreter_per_search, probe_configs
    from ragsim.serving.config import SimConfig

    runs = [{"search": {"interpreter_s_total": 0.003, "searches_run": 20}},
            {"search": {"interpreter_s_total": 0.001, "searches_run": 10}}, {"search": None}]
    assert interpreter_per_search(runs) == (pytest.approx(0.004 / 30), 30)
    assert interpreter_per_search([{}]) == (0.0, 0)
    configs = probe_configs(SimConfig(n_requests=300), 40.0)
    assert [(share, c.arrival, c.rate_rps, c.n_requests) for share, c in configs] == [
        (0.5, "poisson", 20.0, None), (0.9, "poisson", 36.0, None)]


def _prefill(start_s, rows, outside_s, passes_s=0.01):
    return {"kind": "prefill", "start_s": start_s, "end_s": start_s + passes_s + outside_s,
            "passes_s": passes_s, "swap_copy_s": 0.0, "jobs": [(i, 0, 0, 10, 0)
                                                                 for i in range(rows)]}


def _decode(start_s, rows, outside_s, write=None, passes_s=0.004):
    d = {"kind": "decode", "start_s": start_s, "size": rows, "passes_s": passes_s}
    copy_s = 0.0
    if write is not None:  # (rows written, row-tokens, seconds)
        copy_s = write[2]
        d.update(batch_change="rebuild", batch_copy_s=copy_s, batch_rows=write[0],
                 batch_row_tokens=write[1])
    d["end_s"] = start_s + passes_s + copy_s + outside_s
    return d


def test_the_steps_time_around_their_passes_is_fitted_by_hand():
    """Probe runs' steps built by hand from four terms: 0.02 ms a step, 0.08 ms a row, 0.2 ms
    more for a step with prompts, 0.05 ms a prompt more. So a one-prompt step spends 0.35 ms
    outside its pass, a two-prompt one 0.48, a one-row decode step 0.10, two rows 0.18; a
    batch's write costs 0.25 ms + 0.1 ms a row + 1 us a row-token (one row of 128 tokens:
    0.478 ms; two of 256: 0.962; four of 512: 2.698). The fit gives the terms back, and the
    writes' total against the profile's price for them."""
    from ragsim.realrun.probe_runs import outside_passes_s, step_costs_in_runs

    profile = load_profile("cpu-mistral-7b-l2-h256")
    write = [(1, 128, 0.000478), (2, 512, 0.000962), (4, 2048, 0.002698)]
    steps = [_prefill(0.0, 1, 0.00035), _prefill(1.0, 2, 0.00048), _decode(2.0, 1, 0.00010),
             _decode(3.0, 2, 0.00018), _prefill(4.0, 1, 0.00035),
             _decode(5.0, 1, 0.00010, write[0]), _decode(6.0, 2, 0.00018, write[1]),
             _decode(7.0, 4, 0.00034, write[2])]
    assert outside_passes_s(steps[5]) == pytest.approx(0.00010, abs=1e-12)
    report, overhead, copy = step_costs_in_runs([steps[:4], steps[4:]], profile)
    assert overhead.per_step_s == pytest.approx(0.00002, abs=1e-9)
    assert overhead.per_row_s == pytest.approx(0.00008, abs=1e-9)
    assert overhead.prompt_step_s == pytest.approx(0.0002, abs=1e-9)
    assert overhead.prompt_row_s == pytest.approx(0.00005, abs=1e-9)
    assert copy.latency_s == pytest.approx(0.00025, abs=1e-9)
    assert copy.s_per_row == pytest.approx(0.0001, abs=1e-9)
    assert copy.s_per_row_token == pytest.approx(1e-6, rel=1e-6)
    assert report["steps"] == 8 and report["writes"] == 3
    assert report["writes_measured_s"] == pytest.approx(0.004138, rel=1e-9)
    assert report["writes_profile_priced_s"] == pytest.approx(
        sum(profile.batch_copy_s(r, t) for r, t, _ in write), rel=1e-12)
    # the decode steps of one row: two, with 0.10 ms outside each
    one = next(g for g in report["by_kind"] if (g["kind"], g["rows"]) == ("decode", 1))
    assert one["steps"] == 2 and one["outside_mean_s"] == pytest.approx(0.0001, abs=1e-12)
    # runs that kept no steps measure nothing
    assert step_costs_in_runs([None, []], profile) is None


def _probe_columns(bases: list[float]) -> dict[str, np.ndarray]:
    """One probe run's requests, by hand, three per base time (all stage times 1 ms): one
    arriving at an idle engine (its search ends 1.3 ms after arrival: a lag of 0.3 ms), one 50
    ms later while the first is in the engine and no search is in flight (ends 2.2 ms after:
    a lag of 1.2 ms), and one 0.5 ms after that while the second's search holds a worker
    (ends 10 ms after the second's arrival: a lag of 8.5 ms)."""
    rows = []
    for b in bases:
        rows += [(b, b + 0.0001, b + 0.0013, b + 0.1),
                 (b + 0.05, b + 0.0502, b + 0.0522, b + 0.2),
                 (b + 0.0505, b + 0.0510, b + 0.060, b + 0.3)]
    arrival, start, end, finish = (np.array(c) for c in zip(*rows, strict=True))
    return {"arrival_s": arrival, "search_start_s": start, "search_end_s": end,
            "finish_s": finish}


def test_a_searchs_lag_past_its_stage_times_is_read_off_the_probe_runs():
    """By hand: on one worker, the third search of each base waited for the pool (left out,
    the simulation queues it apart); the others took 0.3 ms (engine idle) and 1.2 ms (busy)
    past their 1 ms of stages: (8 x 0.3 + 8 x 1.2) / 16 = 0.75 ms. On two workers the third
    is free to start and counts (busy): (8 x 0.3 + 8 x 1.2 + 8 x 8.5) / 24 = 3.333 ms. Fewer
    than eight searches measure nothing. Of the lag, the search's start less its arrival is
    the front end's hand-over (0.1 ms idle, 0.2 ms busy, 0.5 ms for the third): on one worker
    (8 x 0.1 + 8 x 0.2) / 16 = 0.15 ms, the rest (0.6 ms) the worker's hand-off; on two
    (8 x 0.1 + 8 x 0.2 + 8 x 0.5) / 24 = 0.2667 ms."""
    from ragsim.realrun.probe_runs import search_lag_in_runs

    runs = [_probe_columns([0.0, 1.0, 2.0, 3.0]), _probe_columns([10.0, 11.0, 12.0, 13.0])]
    stage_s = np.full(12, 0.001)
    one = search_lag_in_runs(runs, stage_s, workers=1)
    assert (one["searches"], one["busy_searches"], one["idle_searches"]) == (16, 8, 8)
    assert one["lag_s"] == pytest.approx(0.00075)
    assert one["idle_mean_lag_s"] == pytest.approx(0.0003)
    assert one["busy_mean_lag_s"] == pytest.approx(0.0012)
    assert one["dispatch_s"] == pytest.approx(0.00015)
    assert one["handoff_s"] == pytest.approx(0.0006)
    two = search_lag_in_runs(runs, stage_s, workers=2)
    assert (two["busy_searches"], two["idle_searches"]) == (16, 8)
    assert two["lag_s"] == pytest.approx(0.080 / 24)
    assert two["median_lag_s"] == pytest.approx(0.0012)
    assert two["dispatch_s"] == pytest.approx(0.0064 / 24)
    assert two["handoff_s"] == pytest.approx((0.080 - 0.0064) / 24)
    assert search_lag_in_runs([{k: v[:6] for k, v in runs[0].items()}], stage_s[:6],
                              workers=1) is None  # 4 searches
    # a request not finished is in the engine to the run's end: the first run's three later
    # idle searches count as busy (1 + 4 idle, 7 + 4 busy)
    unfinished = _probe_columns([0.0, 1.0, 2.0, 3.0])
    unfinished["finish_s"][0] = np.nan
    later = search_lag_in_runs([unfinished, runs[1]], stage_s, workers=1)
    assert (later["busy_searches"], later["idle_searches"]) == (11, 5)
    assert later["busy_mean_lag_s"] == pytest.approx((4 * 1.2 + 3 * 0.3 + 4 * 1.2) / 11e3)
