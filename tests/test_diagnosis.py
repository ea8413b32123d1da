"""``ragsim.diagnosis``: every missed target of a validation gets a cause, its evidence and a next
fix. Each case is a report built by hand whose cause a reviewer would name by reading it; the
expected cause is that reading, not the module's output."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragsim import validation as v
from ragsim.cli import app
from ragsim.diagnosis import CAUSES, diagnose


def _component(real_ms: float, sim_ms: float, ttft_ms: float) -> dict:
    return {"real_s": real_ms / 1e3, "sim_s": sim_ms / 1e3, "error_s": (sim_ms - real_ms) / 1e3,
            "share_of_ttft": (sim_ms - real_ms) / ttft_ms, "assumption": "-"}


def report(*, mean=-0.30, p90=0.40, throughput=0.0, hits=1.0, load="50", components=None,
           cost=None, decisions=None, ratio=None, past=None, speed=None, adjusted=None,
           simulated=False, search_mode="faiss") -> dict:
    """A validation report as ``validation.compare`` writes one, with only what a reading
    needs; the checks are marked by ``validation.checks`` (the targets' own rule)."""
    components = components or {"search": _component(1, 1, 20), "queue": _component(0, 0, 20),
                                 "prefill": _component(19, 13, 20)}
    r = {"load": load, "arrival": "sequential" if load == "idle" else "poisson",
         "ttft_mean_error": mean, "ttft_p90_abs_error": p90,
         "throughput_error": throughput, "hit_agreement": hits, "components": components,
         "dominant_component": v.dominant_component(components),
         "cost_model_error": cost, "decision_error": decisions,
         "iteration_time_ratio": ratio, "beyond_profile_time_share": past,
         "machine_speed": speed, "real_is_simulated": simulated, "search_mode": search_mode,
         "real": {"throughput_rps": 10.0}, "sim": {"throughput_rps": 10.0 * (1 + throughput)}}
    r["checks"] = v.checks(r, sequential=load == "idle", overload=load == "over")
    if adjusted is not None:
        a = {"ttft_mean_error": adjusted, "ttft_p90_abs_error": abs(adjusted),
             "throughput_error": adjusted, "hit_agreement": hits}
        r["speed_adjusted"] = {**a, "checks": v.checks(a, sequential=load == "idle",
                                                       overload=load == "over")}
    return r


def causes(r: dict) -> dict[str, str]:
    return {miss["metric"]: miss["cause"] for miss in diagnose(r)}


def speed(before: float, after: float) -> dict:
    """As ``validation.machine_speed`` reports it (its own function: the steady rule is its)."""
    return v.machine_speed({"speed_ratio_before": before, "speed_ratio_after": after})


def test_nothing_missed_nothing_said():
    assert diagnose(report(mean=0.05, p90=0.2, ratio=0.97)) == []


def test_every_miss_has_a_known_cause_evidence_and_a_next_fix():
    for miss in diagnose(report(load="over", mean=-0.4, p90=0.5, throughput=0.3, ratio=0.8)):
        assert miss["cause"] in CAUSES and miss["meaning"] == CAUSES[miss["cause"]]
        assert miss["evidence"] and miss["next_fix"]
        assert miss["value"] > miss["target"]


def test_hits_that_differ_point_at_the_cache_policy():
    r = report(load="idle", mean=0.0, p90=0.0, hits=0.9)
    assert causes(r) == {"hit_agreement": "cache_hits"}
    assert "10.0% of the requests" in diagnose(r)[0]["evidence"][0]


def test_decisions_that_outweigh_the_cost_model_are_the_cause():
    # +64% mean: decisions +79%, cost model -15% (torch at 50% load, run E): decisions
    r = report(mean=0.64, p90=0.58, cost=-0.15, decisions=0.79, ratio=0.81,
               speed=speed(1.12, 1.09))
    assert causes(r) == {"ttft_mean_abs_error": "decisions", "ttft_p90_abs_error": "decisions"}
    evidence = diagnose(r)[0]["evidence"]
    assert "+79.0%" in evidence[0] and "-15.0%" in evidence[0]
    assert "x1.12 before" in evidence[-1]  # the machine is named beside the cause
    # small decisions (within 10% of the mean) are not the cause, however they compare
    small = report(mean=-0.12, p90=0.3, cost=-0.04, decisions=-0.08, ratio=0.8)
    assert causes(small)["ttft_mean_abs_error"] == "iteration_costs"


def test_the_search_as_the_largest_component():
    # real search 1.8 ms against 0.05 ms on a 15 ms TTFT; prefill right
    parts = {"search": _component(1.8, 0.05, 15), "prefill": _component(13.2, 13.0, 15)}
    real = report(mean=-0.13, p90=0.2, components=parts, ratio=0.98)
    assert causes(real) == {"ttft_mean_abs_error": "search"}
    assert "hand-off" in diagnose(real)[0]["next_fix"]
    modelled = report(mean=-0.13, p90=0.2, components=parts, ratio=0.98,
                      search_mode="modelled")
    assert "ragsim trace build" in diagnose(modelled)[0]["next_fix"]


def test_a_machine_that_moved_is_the_cause_when_its_speed_explains_the_miss():
    # 30% slower than profiled, and at that speed the error is 4%: the machine
    r = report(mean=-0.25, p90=0.3, ratio=0.77, speed=speed(1.30, 1.30), adjusted=-0.04)
    assert causes(r) == {"ttft_mean_abs_error": "machine_speed",
                         "ttft_p90_abs_error": "machine_speed"}
    assert "--profile-now" in diagnose(r)[0]["next_fix"]
    # the same speed, but at that speed still 20% off: the profile's prices, speed beside them
    still = report(mean=-0.45, p90=0.5, ratio=0.6, speed=speed(1.30, 1.30), adjusted=-0.20)
    miss = diagnose(still)[0]
    assert miss["cause"] == "iteration_costs"
    assert any("still missed" in line for line in miss["evidence"])
    # a machine that moved during the run (x1.00 -> x1.25) is material however it averages
    moved = report(mean=-0.2, p90=0.2, ratio=0.85, speed=speed(1.0, 1.25), adjusted=0.02)
    assert causes(moved)["ttft_mean_abs_error"] == "machine_speed"


def test_mispriced_iterations_past_or_within_the_profile():
    past = report(load="over", mean=-0.18, p90=0.8, throughput=0.14, ratio=0.86, past=0.76)
    assert set(causes(past).values()) == {"iteration_costs"}
    assert "extend the profile" in diagnose(past)[0]["next_fix"]
    within = report(mean=-0.22, p90=0.33, ratio=0.78, past=0.05)
    assert "remeasure the profile" in diagnose(within)[0]["next_fix"]


def test_an_engine_whose_steps_are_its_own_is_read_through_the_replay():
    # vLLM: no per-iteration ratio; the replay puts -45% on the cost model
    r = report(mean=-0.57, p90=0.72, cost=-0.45, decisions=-0.12)
    assert causes(r)["ttft_mean_abs_error"] == "iteration_costs"
    assert "harness runs them" in diagnose(r)[0]["next_fix"]
    # the same without a replay: still the cost model, and the replay is suggested
    bare = report(mean=-0.57, p90=0.72)
    assert any("--replay-decisions" in line for line in diagnose(bare)[0]["evidence"])


def test_the_steps_the_prices_miss_most_are_named_with_the_grid():
    """A vLLM point whose real steps were kept: 500 small steps 0.95x their price and 6 large
    ones 1.25x, past a grid of 3,072 new tokens. The gap in seconds is the large steps' (0.5 s
    against 0.1 s), so they are named, past the grid."""
    r = report(mean=-0.40, p90=0.50, cost=-0.10, decisions=-0.30)
    small = {"tokens_from": 0, "tokens_to": 64, "steps": 500, "measured_s": 1.9,
             "priced_s": 2.0, "measured_over_priced": 0.95, "share_of_step_time": 0.487}
    large = {"tokens_from": 4096, "tokens_to": None, "steps": 6, "measured_s": 2.5,
             "priced_s": 2.0, "measured_over_priced": 1.25, "share_of_step_time": 0.513}
    r["step_prices"] = {"runs": 1, "steps": 506, "measured_over_priced": 4.4 / 4.0,
                        "grid_new_tokens": 3072, "by_tokens": [small, large]}
    evidence = diagnose(r)[0]["evidence"]
    assert "the real runs' 506 steps ran 1.10x the simulator's price for them" in evidence
    named = [line for line in evidence if line.startswith("the largest gap")]
    assert named == ["the largest gap: steps of 4,096 or more tokens ran 1.25x their price "
                     "(6 steps, 51% of the step time), past the profile's grid (3,072 new "
                     "tokens a step)"]
    # the same gap in the small steps (0.6 s against 0.5): they are named, inside the grid
    r["step_prices"]["by_tokens"][0] = {**small, "measured_s": 1.4, "priced_s": 2.0,
                                        "measured_over_priced": 0.70}
    named = [line for line in diagnose(r)[0]["evidence"] if line.startswith("the largest")]
    assert named and "steps of 0-64 tokens ran 0.70x" in named[0] and "grid" not in named[0]


def test_the_steps_against_their_prices_run_by_run():
    """Two real runs that kept their steps and one that kept none: the first ran its two steps
    at their prices (3 s against 3 s), the second 1.2x (3.6 s against 3 s). By hand: 1.00 and
    1.20 run by run, 6.6 / 6.0 = 1.10 over both; the run without steps is left out."""
    from ragsim.api.loading import load_profile

    def step(tokens: int, measured: float, priced: float) -> dict:
        return {"step_tokens": tokens, "measured_s": measured, "priced_s": priced}

    first = [step(32, 1.0, 1.0), step(2000, 2.0, 2.0)]
    second = [step(32, 1.2, 1.0), step(2000, 2.4, 2.0)]
    prices = v.step_prices([None, None, None], load_profile("cpu-vllm-mistral-7b-l2-h256"),
                           [first, None, second])
    assert prices["runs"] == 2
    assert prices["by_run_measured_over_priced"] == pytest.approx([1.0, 1.2])
    assert prices["measured_over_priced"] == pytest.approx(1.1)
    # read by the diagnosis as the machine's speed from run to run
    r = report(mean=-0.40, p90=0.50, cost=-0.10, decisions=-0.30)
    r["step_prices"] = prices
    evidence = diagnose(r)[0]["evidence"]
    assert any(line.startswith("run by run, 1.00x to 1.20x") for line in evidence)
    # one run: nothing to say run by run
    r["step_prices"] = {**prices, "by_run_measured_over_priced": [1.2]}
    assert not any(line.startswith("run by run") for line in diagnose(r)[0]["evidence"])


def test_each_runs_error_against_its_machine_speed():
    """Five runs whose steps ran 1.0x to 1.2x their prices and whose mean TTFT errors were 0%
    to -40%: the errors fall on a line in the speed, a correlation of -1.00 by hand. A run
    without its error, or fewer than five runs, give no correlation; runs within 5% of each
    other's speed are not called a moving machine."""
    r = report(mean=-0.20, p90=0.50, cost=-0.10, decisions=-0.10)
    r["step_prices"] = {"runs": 5, "steps": 30, "measured_over_priced": 1.1,
                        "by_run_measured_over_priced": [1.0, 1.05, 1.1, 1.15, 1.2],
                        "grid_new_tokens": 3072,
                        "by_tokens": [{"tokens_from": 0, "tokens_to": 64, "steps": 30,
                                       "measured_s": 3.3, "priced_s": 3.0,
                                       "measured_over_priced": 1.1, "share_of_step_time": 1.0}]}
    r["repeats"] = {"per_run": [{"ttft_mean_error": e} for e in (0.0, -0.1, -0.2, -0.3, -0.4)],
                    "ttft_mean_error_interval": [float("nan")] * 2}  # no spread read here

    def line(report_: dict) -> str:
        (found,) = [x for x in diagnose(report_)[0]["evidence"] if x.startswith("run by run")]
        return found

    assert line(r) == ("run by run, 1.00x to 1.20x (the machine's speed moved from one run to "
                       "the next: the runs' average TTFT mixes those speeds); each run's mean "
                       "TTFT error against the simulation followed its steps' ratio with a "
                       "correlation of -1.00")
    r["repeats"]["per_run"][1]["ttft_mean_error"] = None
    assert "correlation" not in line(r)
    r["step_prices"]["by_run_measured_over_priced"] = [1.0, 1.1, 1.2]
    r["repeats"]["per_run"] = [{"ttft_mean_error": e} for e in (0.0, -0.2, -0.4)]
    assert "correlation" not in line(r)
    # three runs within 2% of each other: a range, no moving machine
    r["step_prices"]["by_run_measured_over_priced"] = [0.90, 0.91, 0.92]
    assert line(r) == "run by run, 0.90x to 0.92x"


def test_a_p90_miss_carries_the_replays_own_p90():
    """The mean's split says the decisions (-30% of -40%); per request the replay of the real
    batches at the simulator's prices misses by 31% at p90 against the simulation's 50%: that
    line is on the p90 miss, and only there."""
    r = report(mean=-0.40, p90=0.50, cost=-0.10, decisions=-0.30)
    r["decisions"] = {"cost_model_error": -0.10, "decision_error": -0.30,
                      "replayed_ttft_p90_abs_error": 0.31}
    by_metric = {miss["metric"]: miss["evidence"] for miss in diagnose(r)}
    line = ("the real runs' own decisions at the simulator's prices: a p90 |error| per request "
            "of 31.0% (the simulation's 50.0%)")
    assert line in by_metric["ttft_p90_abs_error"]
    assert line not in by_metric["ttft_mean_abs_error"]


def test_iterations_priced_right_leave_queueing_copies_or_capacity():
    queue = {"queue": _component(8, 2, 20), "prefill": _component(12, 12, 20)}
    r = report(load="over", mean=-0.3, p90=0.4, throughput=0.2, ratio=0.98, components=queue)
    assert causes(r) == {"ttft_mean_abs_error": "queueing", "ttft_p90_abs_error": "queueing",
                         "throughput_abs_error": "capacity"}
    copies = {"swap_in": _component(6, 1, 20), "prefill": _component(14, 14, 20)}
    assert causes(report(mean=-0.25, p90=0.3, ratio=1.02, components=copies))[
        "ttft_mean_abs_error"] == "host_copies"


def test_a_dry_run_misses_only_by_its_reference_profile():
    r = report(mean=-0.4, p90=0.4, simulated=True)
    assert set(causes(r).values()) == {"reference_profile"}


def test_load_rows_carry_the_causes_and_each_next_fix_once():
    r = report(mean=-0.22, p90=0.33, ratio=0.78)
    columns = v.miss_columns(diagnose(r))
    assert columns["miss_causes"] == ("ttft_mean_abs_error: iteration_costs; "
                                      "ttft_p90_abs_error: iteration_costs")
    assert columns["next_fixes"].count("remeasure the profile") == 1
    assert v.miss_columns([]) == {"miss_causes": None, "next_fixes": None}


def test_validate_prints_and_writes_why_each_target_was_missed(tmp_path):
    """A 'real' side priced on another GPU misses: the report, the loads table and the printed
    output all name the cause (a dry run: its reference profile) and the next fix."""
    runner = CliRunner()
    args = ["validate", "--backend", "sim", "--requests", "20",
            "--reference-profile", "h100-mistral-7b"]
    printed = runner.invoke(app, [*args, "--out", str(tmp_path / "one")],
                            env={"COLUMNS": "200"})
    assert printed.exit_code == 0, printed.output
    assert "missed TTFT mean |error|" in printed.stdout and "reference_profile" in printed.stdout
    written = json.loads((tmp_path / "one/validation.json").read_text())
    assert [m["cause"] for m in written["diagnosis"]] == ["reference_profile"] * 2
    loads = runner.invoke(app, [*args, "--loads", "50,over", "--out", str(tmp_path / "loads"),
                                "--json"])
    assert loads.exit_code == 0, loads.output
    rows = json.loads(loads.stdout)["loads"]
    assert all(row["miss_causes"] and "reference_profile" in row["miss_causes"] for row in rows)


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_every_cause_has_a_next_fix(name):
    from ragsim.diagnosis import _NEXT_FIX

    assert any(key == name or key.startswith(f"{name}_") for key in _NEXT_FIX)


def test_an_engine_on_glibc_malloc_is_told_to_run_on_tcmalloc():
    r = report(mean=-0.4, p90=0.5, cost=-0.35, decisions=-0.05)
    r["real"]["allocator"] = "glibc"
    miss = diagnose(r)[0]
    assert miss["cause"] == "iteration_costs" and "tcmalloc" in miss["next_fix"]
    assert "glibc's malloc" in miss["evidence"][-1]
    r["real"]["allocator"] = "tcmalloc"
    assert "tcmalloc" not in diagnose(r)[0]["next_fix"]


def test_one_request_at_a_time_a_longer_real_queue_is_the_engines_hand_over():
    # vLLM idle (run H): search 0.78 / 0.05 ms, queue 0.84 / 0 ms, prefill 7.88 / 7.09 ms
    parts = {"search": _component(0.78, 0.05, 9.51), "queue": _component(0.84, 0.0, 9.51),
             "prefill": _component(7.88, 7.09, 9.51)}
    idle = report(load="idle", mean=-0.25, p90=0.41, components=parts, cost=-0.17,
                  decisions=-0.08)
    assert set(causes(idle).values()) == {"engine_handover"}
    assert "hand-over term" in diagnose(idle)[0]["next_fix"]
    # under load a longer queue is queueing behind other requests, not the hand-over
    loaded = report(load="50", mean=-0.25, p90=0.41, components=parts, cost=-0.17,
                    decisions=-0.08)
    assert "engine_handover" not in causes(loaded).values()


def test_decisions_at_a_share_of_a_mispriced_capacity_are_the_capacitys():
    # vLLM at 50% (run H): decisions -36%, cost model -47%... and an overload point whose
    # simulated throughput was twice the engine's: the simulation ran the rate at ~25% load
    r = report(mean=-0.8, p90=0.9, cost=-0.30, decisions=-0.50)
    assert causes(r)["ttft_mean_abs_error"] == "decisions"
    r["capacity_error"] = 1.03
    miss = diagnose(r)[0]
    assert miss["cause"] == "capacity" and "overload point's throughput" in miss["next_fix"]
    assert "+103.0% of the engine's throughput" in miss["evidence"][-1]
    r["capacity_error"] = 0.05  # capacity right: the decisions are the decisions
    assert causes(r)["ttft_mean_abs_error"] == "decisions"


def test_time_outside_the_steps_is_named_when_it_outweighs_their_prices():
    """vLLM at 50% load: the cost model's -25% of the mean, of which the replay at the steps'
    measured durations leaves -17% outside the steps and -8% on their prices (about the
    thirds of docs/validation.md, run S): the engine thread's time outside its steps."""
    r = report(mean=-0.29, p90=0.45, cost=-0.25, decisions=-0.04)
    r["decisions"] = {"cost_model_error": -0.25, "step_price_error": -0.08,
                      "outside_steps_error": -0.17}
    miss = diagnose(r)[0]
    assert miss["cause"] == "engine_loop" and "timeline" in miss["next_fix"]
    assert any("-8.0%" in line and "-17.0%" in line for line in miss["evidence"])
    # the steps' prices the larger part: their cost, as before, with the split as evidence
    r["decisions"].update(step_price_error=-0.17, outside_steps_error=-0.08)
    miss = diagnose(r)[0]
    assert miss["cause"] == "iteration_costs"
    assert any("-17.0%" in line for line in miss["evidence"])
    # outside the steps the larger part but immaterial (within 10% of the mean): not named
    r["decisions"].update(step_price_error=-0.05, outside_steps_error=-0.09)
    assert diagnose(r)[0]["cause"] != "engine_loop"


def test_a_kind_of_probe_point_off_by_itself_is_named_though_the_median_is_not():
    """Run L's torch row: the median of the probes ~x1.0, the decode point x0.86-0.89 (the
    profile had timed its small decode cells in a slow minute). The speed is material and the
    evidence says which kind moved; without a kind apart, a steady x1.0 says nothing."""
    probes = {"before": [{"kind": "prefill", "ratio": 1.03}, {"kind": "prefill", "ratio": 1.06},
                         {"kind": "decode", "ratio": 0.89}],
              "after": [{"kind": "prefill", "ratio": 1.0}, {"kind": "prefill", "ratio": 1.02},
                        {"kind": "decode", "ratio": 0.86}]}
    kinds_apart = v.machine_speed({"speed_ratio_before": 1.03, "speed_ratio_after": 1.0,
                                   "speed_probes": probes})
    r = report(mean=0.22, p90=0.5, ratio=1.25, speed=kinds_apart, adjusted=0.20)
    evidence = " ".join(diagnose(r)[0]["evidence"])
    assert "by kind of point, decode x0.87, prefill x1.03" in evidence
    assert "still missed" in evidence  # one scalar cannot price both kinds back
    level = v.machine_speed({"speed_ratio_before": 1.03, "speed_ratio_after": 1.0})
    assert "by kind" not in " ".join(diagnose(report(mean=0.22, p90=0.5, ratio=1.25,
                                                     speed=level, adjusted=0.20))[0]["evidence"])


# a profile's own held-out checks as the profiler writes them (``obtained.validation``):
# run V's wide batches priced 1.72x their measured time, its decode points 0.96x with a wide
# p90 (the shared CPU's noise), its prefill points right
RUN_V_OBTAINED = {"validation": {"iteration_ratios": {
    "prefill_points": {"points": 10, "median_ratio": 0.999, "p90_abs_error": 0.10},
    "wide_batches": {"points": 4, "median_ratio": 1.724, "p90_abs_error": 0.738},
    "decode_points": {"points": 8, "median_ratio": 0.959, "p90_abs_error": 0.242}}}}


def test_a_profiles_held_out_kinds_off_their_targets_and_those_biased():
    from ragsim.profiles.steps import heldout_misses

    # the targets: median within 5% of 1, p90 |error| within 15%
    assert sorted(heldout_misses(RUN_V_OBTAINED)) == ["decode_points", "wide_batches"]
    # biased by more than 10%: the wide batches only
    assert list(heldout_misses(RUN_V_OBTAINED, biased_by=0.10)) == ["wide_batches"]
    assert heldout_misses({}) == {} and heldout_misses(None) == {}


def test_a_profile_its_own_checks_found_biased_is_the_next_fix():
    """vLLM's steps priced through the replay (-45% on the cost model): with the profile's own
    held-out wide batches at 1.72x, the profile is what to fix first, and the evidence says
    which kind; without that, the usual fix."""
    r = report(mean=-0.57, p90=0.72, cost=-0.45, decisions=-0.12)
    r["profile_heldout_misses"] = {"wide_batches": RUN_V_OBTAINED["validation"][
        "iteration_ratios"]["wide_batches"]}
    miss = diagnose(r)[0]
    assert miss["cause"] == "iteration_costs"
    assert miss["next_fix"].startswith("remeasure the profile at rest")
    assert any("wide batches predicted/measured 1.72" in line for line in miss["evidence"])
    r["profile_heldout_misses"] = {}
    assert "harness runs them" in diagnose(r)[0]["next_fix"]


def test_validate_writes_the_profiles_biased_held_out_kinds(tmp_path):
    """A profile whose own held-out wide batches were priced 1.72x: every point's report
    carries that kind (``profile_heldout_misses``), so that its diagnosis can name it."""
    from ragsim.profiles.profile import load_profile

    data = load_profile("a10g-mistral-7b").to_dict()
    data["obtained"] = {**data.get("obtained", {}), **RUN_V_OBTAINED}
    path = tmp_path / "biased.json"
    path.write_text(json.dumps(data))
    done = CliRunner().invoke(app, ["validate", "--backend", "sim", "--requests", "20",
                                    "--profile", str(path), "--out", str(tmp_path / "v")])
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "v/validation.json").read_text())
    assert list(written["profile_heldout_misses"]) == ["wide_batches"]


def _measured_as(tmp_path, wide_ratios):
    """A ``measure`` for ``least_biased_profile``: each call writes (at profile.json) and
    returns a real profile whose held-out wide batches ran at the next of ``wide_ratios``."""
    from ragsim.profiles.profile import Profile, load_profile

    base = load_profile("a10g-mistral-7b").to_dict()
    ratios = iter(wide_ratios)
    calls = []

    def measure():
        ratio = next(ratios)
        data = {**base, "obtained": {**base.get("obtained", {}), "validation": {
            "iteration_ratios": {"wide_batches": {"points": 4, "median_ratio": ratio,
                                                  "p90_abs_error": abs(ratio - 1)}}}}}
        (tmp_path / "profile.json").write_text(json.dumps(data))
        calls.append(ratio)
        return Profile.from_dict(data, source="test")

    return measure, calls


def _wide(path) -> float:
    return json.loads(path.read_text())["obtained"]["validation"]["iteration_ratios"][
        "wide_batches"]["median_ratio"]


@pytest.mark.parametrize(("ratios", "measured", "kept", "aside"), [
    ([1.04], [1.04], 1.04, None),               # unbiased: measured once
    ([1.72, 0.97], [1.72, 0.97], 0.97, 1.72),   # biased, then right: the second kept
    ([1.72, 1.90], [1.72, 1.90], 1.72, 1.90),   # worse again: the first kept
])
def test_validate_measures_a_biased_profile_once_more_and_keeps_the_less_biased(
        tmp_path, ratios, measured, kept, aside):
    from ragsim.api.validation import least_biased_profile

    measure, calls = _measured_as(tmp_path, ratios)
    notes = []
    profile = least_biased_profile(measure, tmp_path / "profile.json",
                                   lambda text, warning=False: notes.append(text))
    assert calls == measured
    assert profile.obtained["validation"]["iteration_ratios"]["wide_batches"][
        "median_ratio"] == kept
    assert _wide(tmp_path / "profile.json") == kept  # the file the report points at
    set_aside = tmp_path / "profile-set-aside.json"
    assert (_wide(set_aside) if set_aside.exists() else None) == aside
    assert len(notes) == (0 if aside is None else 2)
