"""``validate --replay-decisions``: the real run's iterations re-timed at other prices.

Hand-worked timelines check the re-timing (an iteration starts when the one before it ended or
when its last job entered the pool; a request's first token is its last prefill's end, or its
search's end when a kept speculation waited for it). A real run of the torch engine then checks
the replay against the run itself: priced at the measured durations, the replay can only end
each request's first token earlier (it drops the engine's time between iterations), and the
split of a validation's TTFT error adds up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ragsim.decisions import (
    measured_s,
    priced_steps,
    prices_by_step_size,
    replay,
    split_error,
)

PRICES = {"prefill": 0.2, "decode": 0.1}


def price(decision: dict) -> float:
    return PRICES[decision["kind"]]


def prefill(start: float, end: float, *jobs: tuple[int, int]) -> dict:
    return {"kind": "prefill", "start_s": start, "end_s": end,
            "jobs": [(key, request, 0, 100, 0) for key, request in jobs]}


def decode(start: float, end: float) -> dict:
    return {"kind": "decode", "start_s": start, "end_s": end, "size": 1, "context_tokens": 10}


def columns(arrival, search_end, first_token) -> dict:
    return {"arrival_s": np.array(arrival), "search_end_s": np.array(search_end),
            "first_token_s": np.array(first_token)}


def test_iterations_follow_each_other_or_wait_for_their_jobs():
    decisions = [prefill(1.0, 1.5, (10, 0)), decode(1.5, 1.6), prefill(1.6, 2.0, (11, 1))]
    cols = columns([0.9, 1.1], [1.0, 1.2], [1.5, 2.0])
    # job 11 entered the pool at 1.2: its prefill follows the decode (ends 1.3) at 1.3
    ttft = replay(decisions, {10: 1.0, 11: 1.2}, cols, price)
    assert ttft == pytest.approx([1.2 - 0.9, 1.5 - 1.1])
    # entered at 1.4: the replayed engine idles from 1.3 and starts it at 1.4
    ttft = replay(decisions, {10: 1.0, 11: 1.4}, cols, price)
    assert ttft == pytest.approx([1.2 - 0.9, 1.6 - 1.1])


def test_a_kept_speculation_waits_for_its_search_and_a_terminated_one_gives_nothing():
    # request 0: speculative job 10 prefilled (ends 1.3), its search ends at 1.8 and keeps it:
    # first token at the search's end. Request 1: speculative job 11 prefilled and terminated,
    # its final job 12 prefilled later gave the first token (at 2.2)
    decisions = [prefill(1.0, 1.3, (10, 0), (11, 1)), prefill(1.9, 2.2, (12, 1))]
    cols = columns([0.5, 0.6], [1.8, 1.85], [1.8, 2.2])
    ttft = replay(decisions, {10: 1.0, 11: 1.0, 12: 1.85}, cols, price)
    # replayed: 1.0-1.2 (request 0 waits for its search: 1.8); 1.85-2.05 for job 12
    assert ttft == pytest.approx([1.8 - 0.5, 2.05 - 0.6])


def test_a_sequential_run_replays_each_request_from_when_the_one_before_ended():
    """One request at a time, in the real run: request 0 arrives at 0.0, searches until 0.1,
    is prefilled 0.1-0.3 and decoded 0.3-0.4; request 1 arrives at 1.0, searches until 1.1, is
    prefilled 1.1-1.2. At 0.2 s a prefill and 0.1 s a decode the replay keeps up: both TTFTs
    0.3 either way. At 2 s a prefill it does not: request 0's prefill 0.1-2.1, its decode
    2.1-2.2, 1.8 s behind the real run. Open loop, request 1 still arrives at 1.0 and queues
    behind them: prefill 2.2-4.2, TTFT 3.2, queueing the real run never had. Closed loop it
    arrives 1.8 s late (2.8), searches until 2.9 and is prefilled 2.9-4.9: TTFT 2.1, the
    search and its own prefill, as request 0's."""
    decisions = [prefill(0.1, 0.3, (10, 0)), decode(0.3, 0.4), prefill(1.1, 1.2, (11, 1))]
    cols = columns([0.0, 1.0], [0.1, 1.1], [0.3, 1.2])
    entered = {10: 0.1, 11: 1.1}
    for closed_loop in (False, True):
        assert replay(decisions, entered, cols, price, closed_loop=closed_loop) == \
            pytest.approx([0.3, 0.3])
    slow = {"prefill": 2.0, "decode": 0.1}

    def at(d):
        return slow[d["kind"]]

    assert replay(decisions, entered, cols, at) == pytest.approx([2.1, 3.2])
    assert replay(decisions, entered, cols, at, closed_loop=True) == pytest.approx([2.1, 2.1])


def test_a_request_no_prefill_served_keeps_its_real_ttft():
    cols = columns([0.0, 0.0], [0.0, 0.0], [0.3, 0.01])  # request 1: an answer cache hit
    ttft = replay([prefill(0.0, 0.3, (1, 0))], {1: 0.0}, cols, price)
    assert ttft == pytest.approx([0.2, 0.01])


def test_the_split_adds_up_to_the_ttft_mean_error():
    joined = pd.DataFrame({"request_id": [7, 9], "ttft_s_real": [1.0, 3.0],
                           "ttft_s_sim": [0.5, 2.5]})
    split = split_error(joined, np.array([2.0, 0.8]), np.array([9, 7]))  # rows: 9, then 7
    # replayed mean (0.8 + 2.0) / 2 = 1.4 against a real mean of 2.0: -30%; simulated 1.5: -25%
    assert split["cost_model_error"] == pytest.approx(-0.3)
    assert split["decision_error"] == pytest.approx(0.05)
    assert split["cost_model_error"] + split["decision_error"] == pytest.approx(-0.25)


def test_a_real_runs_replay_at_its_measured_durations_gives_it_back_no_later():
    from ragsim.profiles.profile import load_profile
    from ragsim.realrun.harness import RealRun
    from ragsim.serving.config import build_config
    from ragsim.traces import resolve_trace

    profile = load_profile("cpu-mistral-7b-l2-h256")
    trace = resolve_trace("mmlu", n_requests=12)
    config = build_config({"trace": "mmlu", "system": "ragcache", "profile": profile.name,
                           "rate_rps": 20.0, "n_requests": 12})
    run = RealRun(trace, config, profile, speed_probes=False)
    result = run.run()
    kept = result.decisions
    assert kept["iterations"] and {d["kind"] for d in kept["iterations"]} >= {"prefill",
                                                                              "decode"}
    cols = result.columns
    real = cols["first_token_s"] - cols["arrival_s"]
    again = replay(kept["iterations"], kept["submitted_s"], cols, measured_s)
    done = cols["status"] == "completed"
    assert done.all()
    assert (again[done] <= real[done] + 1e-9).all()
    assert (again[done] > 0).all()
    # every request's first token came from a logged prefill (or its search's end)
    served = {j[1] for d in kept["iterations"] if d["kind"] == "prefill" for j in d["jobs"]}
    assert served == set(range(trace.n_requests))


@pytest.fixture(scope="module")
def text_trace(tmp_path_factory):
    """The text trace with 48 requests: a validation of 16 leaves its loop probe 32 of its own,
    whose steps are enough to measure their spread (on the 16 validated ones the spread needs
    8 steps of one kind and size in a run, and CI's and the project's CPU now and then kept
    fewer: ``probes.step_spread`` missing), as ``test_vllm_backend.py``'s probed trace."""
    from text_trace import text_trace_dir

    yield from text_trace_dir(tmp_path_factory, requests=48)


def test_steps_are_grouped_by_their_tokens_against_their_prices():
    """Four hand-made steps: a decode of 3 rows (3 tokens), a prefill of 100 + 200 new tokens
    (300), a mixed step of 5,000 prompt tokens beside 2 decodes (5,002) and one of 900 beside
    100 (1,000): groups 0-64, 256-1,024 (two steps) and 4,096 or more. Prices 0.1 s a step."""
    steps = [{"kind": "decode", "start_s": 0.0, "end_s": 0.05, "size": 3, "context_tokens": 9},
             {"kind": "prefill", "start_s": 1.0, "end_s": 1.2,
              "jobs": [(1, 0, 0, 100, 0), (2, 1, 50, 200, 0)]},
             {"kind": "mixed", "start_s": 2.0, "end_s": 2.5, "size": 2,
              "jobs": [(3, 2, 0, 5000, 0)], "context_tokens": 10},
             {"kind": "mixed", "start_s": 3.0, "end_s": 3.15, "size": 100,
              "jobs": [(4, 3, 0, 900, 0)], "context_tokens": 10}]
    seen = []
    groups = prices_by_step_size(steps, lambda d: seen.append(d["start_s"]) or 0.1)
    assert seen == [0.0, 1.0, 2.0, 3.0]  # priced once each, in the run's order
    by_start = {g["tokens_from"]: g for g in groups}
    assert sorted(by_start) == [0, 256, 4096]
    assert by_start[0]["steps"] == 1 and by_start[0]["tokens_to"] == 64
    assert by_start[256]["steps"] == 2 and by_start[256]["tokens_to"] == 1024
    assert by_start[256]["measured_s"] == pytest.approx(0.2 + 0.15)
    assert by_start[256]["measured_over_priced"] == pytest.approx(0.35 / 0.2)
    assert by_start[4096]["tokens_to"] is None
    assert by_start[4096]["measured_over_priced"] == pytest.approx(5.0)
    assert by_start[4096]["share_of_step_time"] == pytest.approx(0.5 / (0.05 + 0.35 + 0.5))
    # a cold start of 0.01 s a second of idle (0.03 for the first step, which has none before
    # it): the idle times as run, 0.95, 0.8 and 0.5 s before steps 2-4
    cold = prices_by_step_size(steps, lambda d: 0.1,
                               cold_start=lambda idle: 0.03 if idle == float("inf")
                               else 0.01 * idle)
    priced = {g["tokens_from"]: g["priced_s"] for g in cold}
    assert priced == pytest.approx({0: 0.1 + 0.03, 256: 0.2 + 0.0095 + 0.005,
                                    4096: 0.1 + 0.008})


def test_each_step_is_one_row_with_its_shape_and_price():
    """The same four steps, one row each: their rows, tokens and padded end as the run recorded
    them, the measured time and the price with the cold start of the idle time before it."""
    steps = [{"kind": "decode", "start_s": 0.0, "end_s": 0.05, "size": 3, "context_tokens": 9,
              "padded_context_tokens": 12, "jobs": [], "batch_change": "rebuild",
              "batch_copy_s": 0.004, "batch_rows": 3, "batch_row_tokens": 36},
             {"kind": "prefill", "start_s": 1.0, "end_s": 1.2, "size": None,
              "jobs": [(1, 0, 0, 100, 0), (2, 1, 50, 200, 4096)]},
             {"kind": "mixed", "start_s": 2.0, "end_s": 2.5, "size": 2,
              "jobs": [(3, 2, 0, 5000, 0)], "context_tokens": 10}]
    rows = priced_steps(steps, lambda d: 0.1, cold_start=lambda idle: 0.03
                        if idle == float("inf") else 0.01 * idle)
    assert [r["kind"] for r in rows] == ["decode", "prefill", "mixed"]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [(r["prompt_rows"], r["decode_rows"]) for r in rows] == [(0, 3), (2, 0), (1, 2)]
    assert [r["new_tokens"] for r in rows] == [0, 300, 5000]
    assert [r["longest_new_tokens"] for r in rows] == [0, 200, 5000]
    assert [r["longest_cached_tokens"] for r in rows] == [0, 50, 0]
    assert [(r["row_cached_tokens"], r["row_new_tokens"]) for r in rows] == [
        ([], []), ([0, 50], [100, 200]), ([0], [5000])]
    assert [r["step_tokens"] for r in rows] == [3, 300, 5002]
    assert [r["swap_in_bytes"] for r in rows] == [0, 4096, 0]
    assert [r["padded_context_tokens"] for r in rows] == [12, None, None]
    assert [(r["batch_change"], r["batch_copy_s"], r["batch_rows"], r["batch_row_tokens"])
            for r in rows] == [("rebuild", 0.004, 3, 36), (None, None, None, None),
                               (None, None, None, None)]
    assert [r["measured_s"] for r in rows] == pytest.approx([0.05, 0.2, 0.5])
    # idle before each: none before the first, then 0.95 and 0.8 s
    assert [r["cold_start_s"] for r in rows] == pytest.approx([0.03, 0.0095, 0.008])
    assert [r["priced_s"] for r in rows] == pytest.approx([0.13, 0.1095, 0.108])


def test_validate_searches_for_real_and_splits_the_ttft_error(text_trace, tmp_path, capsys,
                                                              monkeypatch):
    """``validate --search-latency trace --replay-decisions`` on a trace built with its text:
    the real run searches the staged faiss index on the search workers (every stage of every
    request, the recorded lists), the search is a component with its own error, and the TTFT
    mean error splits into the cost model's and the decisions' shares, which add up to it."""
    import json

    from typer.testing import CliRunner

    from ragsim.cli import app

    out = tmp_path / "v"
    result = CliRunner().invoke(app, [
        "validate", "--backend", "torch", "--trace", str(text_trace), "--requests", "16",
        "--search-latency", "trace", "--replay-decisions", "--sim-replicas", "2", "--json",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    search = report["real"]["search"]
    assert search["mode"] == "faiss" and report["search_mode"] == "faiss"
    assert search["stages_run"] == 2 * 16 and search["final_lists_differing"] == 0
    assert report["search_mean_error"] is not None and report["search_mean_error"] > -1
    assert report["cost_model_error"] + report["decision_error"] == pytest.approx(
        report["ttft_mean_error"])
    assert report["decisions"]["replayed_ttft_mean_s"] > 0
    # the cost model's share split once more: replayed at the steps' measured durations with
    # the loop the probe measured charged between them (the torch run's clock keeps the time
    # between its steps since 2026-12-07), what is left is the loop's time the fit does not
    # charge; the two parts add up to the share
    split = report["decisions"]
    assert report["sim"]["config"]["engine_loop_step_s"] \
        + report["sim"]["config"]["engine_loop_request_s"] > 0
    assert split["step_price_error"] + split["outside_steps_error"] == pytest.approx(
        report["cost_model_error"])
    # the same steps by size, against their prices: every step the run kept, once
    steps = report["step_prices"]
    assert steps["runs"] == 1 and steps["steps"] == sum(g["steps"] for g in steps["by_tokens"])
    assert steps["steps"] == report["real"]["iterations_prefill"] + \
        report["real"]["iterations_decode"]
    assert 0.3 < steps["measured_over_priced"] < 3.0
    assert sum(g["share_of_step_time"] for g in steps["by_tokens"]) == pytest.approx(1.0)
    # and each step, one row, beside the real run's records: the groups' sums come from them
    table = pd.read_parquet(out / "real/steps.parquet")
    assert len(table) == steps["steps"] and list(table["step"]) == list(range(len(table)))
    assert set(table["kind"]) <= {"prefill", "decode"}
    assert table["measured_s"].sum() == pytest.approx(
        sum(g["measured_s"] for g in steps["by_tokens"]))
    assert table["priced_s"].sum() == pytest.approx(
        sum(g["priced_s"] for g in steps["by_tokens"]))
    assert (table["start_s"].diff().dropna() >= 0).all()
    # each step's passes inside its wall time, and the engine thread's CPU time over it: the
    # thread computed its steps (torch on one thread), never more than the wall time passed
    assert (table["passes_s"] <= table["measured_s"] + 1e-6).all()
    assert (table["engine_cpu_s"] <= table["measured_s"] + 1e-3).all()
    prompts = table[table["kind"] == "prefill"]
    assert (prompts["engine_cpu_s"] / prompts["measured_s"]).median() > 0.3
    assert not (out / "sim/steps.parquet").exists()  # the simulation keeps no real steps
    from ragsim.cli.validate import _print_report

    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "200")  # one row a line (the console reads it when printing)
    _print_report(report)  # as validate prints it without --json
    printed = capsys.readouterr().out
    assert "steps' prices / outside the steps" in printed
    ran = (out / "config.toml").read_text()
    assert 'search_latency = "trace"' in ran
    # the hand-off measured before the runs (said in a note without --json) and added once to
    # each simulated search: recorded stage times plus it, request by request
    handoff = report["sim"]["config"]["search_handoff_s"]
    assert handoff >= 0 and "search_handoff_s" in ran
    # the hand-off probe's value in the report; the simulation was given the probe runs' own
    # searches' lag past their stage times where they measured one (search_lag_in_runs)
    probe = report["probes"]["search_handoff"]
    assert probe["searches"] > 0
    lag = report["probes"]["engine_loop"]["search_lag"]
    assert handoff == (probe["handoff_s"] if lag is None else lag["handoff_s"])
    dispatch = report["sim"]["config"]["search_dispatch_s"]
    assert dispatch == (0.0 if lag is None else lag["dispatch_s"])
    if lag is not None:
        assert lag["searches"] == lag["busy_searches"] + lag["idle_searches"] >= 8
        assert dispatch + handoff == pytest.approx(lag["lag_s"], abs=1e-12)
    # the torch engine's loop, as vLLM's: two probe runs on requests the validation does not
    # judge (here the trace's last: it has few past the 16 judged), their time between the
    # steps of a busy engine fitted a step and a request; the simulation charges the fit
    beside = report["probes"]["engine_loop"]
    assert [r["load"] for r in beside["runs"]] == [0.5, 0.9]
    assert all(r["gaps"] > 0 and r["between_steps_s"] > 0 for r in beside["runs"])
    assert beside["step_s"] >= 0 and beside["request_s"] >= 0 and beside["quiet_intake_s"] == 0
    assert beside["step_s"] + beside["request_s"] > 0
    assert report["sim"]["config"]["engine_loop_step_s"] == beside["step_s"]
    assert report["sim"]["config"]["engine_loop_request_s"] == beside["request_s"]
    # what a search beside the busy engine costs it: its decode steps timed alone and beside
    # the trace's searches (``search_cost``) after the same runs, whose search threads'
    # interpreter time is reported beside; the simulation charges the former
    assert beside["searches"] == 2 * beside["requests"] and beside["interpreter_s"] > 0
    cost = beside["search_cost"]
    assert cost["searches"] > 0 and cost["pairs"] > 0 and cost["alone_step_s"] > 0
    # on the cores the judged runs had: the engine's thread where theirs was
    assert cost["engine_core"]["core"] == report["real"]["engine_core"]["core"]
    assert beside["search_s"] == cost["search_s"] >= 0
    assert report["sim"]["config"]["engine_loop_search_s"] == beside["search_s"]
    # the point's mean error at each end of that figure's interval (the simulation rerun)
    term = report["search_term"]
    assert (term["search_s_low"], term["search_s_high"]) == (cost["search_s_low"],
                                                             cost["search_s_high"])
    assert term["ttft_mean_s"]["as_charged"] == report["sim_ensemble"]["single_run"][
        "ttft_mean_s"]
    assert term["ttft_mean_s"]["low"] <= term["ttft_mean_s"]["high"]
    assert "search term's 95% ends" in printed
    # the same probe runs' steps about their prices: the spread and correlation the
    # simulated replicas drew each step's time with (never the judged runs' steps)
    spread = report["probes"]["step_spread"]
    assert 0 < spread["sigma"] < 1 and 0 <= spread["correlation"] <= 0.95
    assert spread["steps"] >= 8 and len(spread["runs"]) >= 1
    assert report["sim_ensemble"]["step_time_sigma"] == spread["sigma"]
    assert report["sim_ensemble"]["step_time_correlation"] == spread["correlation"]
    # the same probe runs' steps priced the engine's work around its passes: the profile the
    # simulation ran on (written beside the results) carries the overhead they measured, and
    # a prompt's step pays more than the profile's sampling alone
    steps = report["probes"]["engine_steps"]
    assert steps["steps"] > 0 and {g["kind"] for g in steps["by_kind"]} == {"prefill",
                                                                            "decode"}
    priced = report["sim"]["config"]["profile"]
    assert Path(priced) == out / "profile-priced.json"
    from ragsim.profiles.profile import load_profile

    overhead = load_profile(priced).step_overhead
    assert overhead.to_dict() == steps["step_overhead"]
    assert overhead.seconds(1, 1) > steps["profile_step_overhead"]["per_step_s"] \
        + steps["profile_step_overhead"]["per_row_s"]
    from ragsim.traces import resolve_trace

    trace = resolve_trace(str(text_trace), n_requests=16)
    sim = pd.read_parquet(out / "sim/requests.parquet")
    recorded = np.array([sum(trace.stage_times_s[i].as_py()) for i in sim["request_id"]])
    assert (sim["search_end_s"] - sim["search_start_s"]).to_numpy() == pytest.approx(
        recorded + handoff, abs=1e-9)
    # the front end's hand-over comes before each search takes a worker (and waits, if any)
    assert ((sim["search_start_s"] - sim["arrival_s"]).to_numpy() >= dispatch - 1e-9).all()


def test_replay_decisions_needs_a_real_engine(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["validate", "--backend", "sim", "--requests", "5",
                                      "--replay-decisions", "--out", str(tmp_path / "v")])
    assert result.exit_code == 2
    assert "--replay-decisions" in result.output and "--backend sim" in result.output
