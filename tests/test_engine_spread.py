"""``validate --repeats``: a point's real run repeated, the errors against the runs' average,
the interval their spread gives, and the diagnosis that names a miss inside that spread; every
expected value below is worked by hand (the t quantile from a table)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ragsim import engine_spread as es
from ragsim import validation as v
from ragsim.cli import app
from ragsim.diagnosis import diagnose

# Student's t, 97.5% quantile, 2 degrees of freedom (printed tables: 4.303)
T_975_2 = 4.302652729911275
# the standard normal's 95% and 90% quantiles (printed tables: 1.6449, 1.2816)
Z_95, Z_90 = 1.6448536269514722, 1.2815515655446004


def _columns(ids, ttft, status=None) -> dict[str, np.ndarray]:
    """Requests arriving at 0 whose TTFT is all prefill, no cache hits."""
    n = len(ids)
    zeros = np.zeros(n)
    return {"request_id": np.asarray(ids), "ttft_s": np.asarray(ttft, float),
            "hit_tokens_gpu": np.zeros(n, int), "hit_tokens_host": np.zeros(n, int),
            "status": np.asarray(status or ["completed"] * n),
            "arrival_s": zeros, "search_start_s": zeros, "search_end_s": zeros,
            "prefill_start_s": zeros, "swap_in_s": zeros,
            "first_token_s": np.asarray(ttft, float)}


CONFIG = SimpleNamespace(system="ragcache", trace="t", arrival="poisson", rate_rps=2.0,
                         profile="p", overlap_swap=False)


def _run(ttft, throughput_rps, status=None, ids=(0, 1, 2, 3)):
    return SimpleNamespace(columns=_columns(list(ids), ttft, status), config=CONFIG,
                           summary={"throughput_rps": throughput_rps, "profile": "p"})


# run A: 1, 2, 4, 5 s; run B: 3, 2, 6 s and request 3 failed; sim: 1.1, 1.8, 4.0, 6.0 s
RUN_A = _run([1.0, 2.0, 4.0, 5.0], 4.0)
RUN_B = _run([3.0, 2.0, 6.0, 9.0], 6.0, status=["completed"] * 3 + ["failed"])
SIM = _run([1.1, 1.8, 4.0, 6.0], 3.0)


def test_the_pooled_join_averages_each_request_over_the_runs_that_all_completed_it():
    pooled, dropped, each = es.pooled_join([RUN_A, RUN_B], SIM.columns)
    assert dropped == [3]  # failed in run B: in neither the average nor any run's frame
    assert pooled["request_id"].tolist() == [0, 1, 2]
    assert pooled["ttft_s_real"].tolist() == pytest.approx([2.0, 2.0, 5.0])
    assert pooled["prefill_s_real"].tolist() == pytest.approx([2.0, 2.0, 5.0])
    assert pooled["ttft_s_sim"].tolist() == pytest.approx([1.1, 1.8, 4.0])
    assert [frame["ttft_s_real"].tolist() for frame in each] == [[1, 2, 4], [3, 2, 6]]
    # the errors on the average: mean 6.9 / 9 - 1; per request -0.45, -0.1, -0.2
    errors = v.ttft_errors(pooled)
    assert errors["ttft_mean_error"] == pytest.approx(6.9 / 9 - 1)
    # p90 of |errors| sorted 0.1, 0.2, 0.45 at rank 1.8: 0.2 + 0.8 * 0.25
    assert errors["ttft_p90_abs_error"] == pytest.approx(0.4)


def test_the_interval_of_the_error_comes_from_the_spread_of_the_real_means():
    # three runs whose mean TTFT is 0.20, 0.22 and 0.24 s; the simulation 0.11 s
    runs = [_run([m, m], rps, ids=(0, 1)) for m, rps in ((0.20, 10.0), (0.22, 11.0),
                                                           (0.24, 12.0))]
    sim = _run([0.11, 0.11], 9.0, ids=(0, 1))
    each = es.pooled_join(runs, sim.columns)[2]
    spread = es.spread(runs, sim, each)
    half = T_975_2 * 0.02 / math.sqrt(3)  # sd 0.02 of the three means
    assert spread["runs"] == 3
    assert spread["real_ttft_mean_s"] == pytest.approx(0.22)
    assert spread["real_ttft_mean_cv"] == pytest.approx(0.02 / 0.22)
    low, high = spread["ttft_mean_error_interval"]
    assert low == pytest.approx(0.11 / (0.22 + half) - 1)
    assert high == pytest.approx(0.11 / (0.22 - half) - 1)
    half_rps = T_975_2 * 1.0 / math.sqrt(3)
    assert spread["throughput_error_interval"] == pytest.approx(
        [9 / (11 + half_rps) - 1, 9 / (11 - half_rps) - 1])
    assert [run["ttft_mean_error"] for run in spread["per_run"]] == pytest.approx(
        [0.11 / 0.20 - 1, 0.11 / 0.22 - 1, 0.11 / 0.24 - 1])
    assert spread["ttft_mean_error_range"] == pytest.approx([0.11 / 0.24 - 1, 0.11 / 0.20 - 1])
    assert spread["sim_within_real_range"] is False


def test_an_interval_reaching_zero_is_unbounded_above():
    runs = [_run([m], 1.0, ids=(0,)) for m in (0.1, 0.2, 0.3)]
    sim = _run([0.2], 1.0, ids=(0,))
    spread = es.spread(runs, sim, es.pooled_join(runs, sim.columns)[2])
    # mean 0.2, sd 0.1: half-width 0.248 > 0.2
    assert spread["ttft_mean_error_interval"][1] == math.inf
    assert spread["sim_within_real_range"] is True


def test_the_p90_floor_of_one_spread_request_is_its_pooled_means_normal_quantile():
    # 1.0, 1.2, 1.4 s: mean 1.2, sd 0.2; the mean of three is off by sd / sqrt(3), so its
    # relative |error| has its 90th percentile at the normal's 95% quantile of that
    sigma = 0.2 / math.sqrt(3) / 1.2
    assert es.p90_abs_error_floor(np.array([[1.0], [1.2], [1.4]])) == pytest.approx(
        Z_95 * sigma, rel=1e-6)
    # beside a request with no spread, half of the requests are at zero: the spread one must
    # reach 80% of its own mass, the normal's 90% quantile
    runs = np.array([[1.0, 2.0], [1.2, 2.0], [1.4, 2.0]])
    assert es.p90_abs_error_floor(runs) == pytest.approx(Z_90 * sigma, rel=1e-6)
    assert es.p90_abs_error_floor(np.array([[1.0, 2.0], [1.0, 2.0]])) == 0.0
    assert math.isnan(es.p90_abs_error_floor(np.array([[1.0, 2.0]])))  # one run: no spread


def test_the_p90_floor_agrees_with_drawing_the_pooled_means_errors():
    """A second way to the same number: draw each request's pooled error many times and take
    the p90 of the |errors| of each draw, as the target's own percentile does."""
    rng = np.random.default_rng(7)
    means = rng.uniform(0.05, 0.5, 300)
    runs = means * (1 + rng.lognormal(-2.0, 0.8, (3, 300)) * rng.choice([-1, 1], (3, 300)))
    pooled, sd = runs.mean(0), runs.std(0, ddof=1)
    draws = rng.normal(0, sd / math.sqrt(3), (4000, 300)) / pooled
    drawn = float(np.median(np.percentile(np.abs(draws), 90, axis=1)))
    assert es.p90_abs_error_floor(runs) == pytest.approx(drawn, rel=0.03)


def test_compare_judges_the_average_and_keeps_each_run():
    report = v.compare(RUN_A, SIM, backend="sim", repeats=[RUN_B])
    assert report["requests"] == 3 and report["requests_dropped"] == 1
    assert report["ttft_mean_error"] == pytest.approx(6.9 / 9 - 1)
    # throughput: the runs' mean, 5 req/s, against the simulation's 3
    assert report["real_throughput_rps"] == pytest.approx(5.0)
    assert report["throughput_error"] == pytest.approx(-0.4)
    repeats = report["repeats"]
    assert repeats["runs"] == 2
    # run A alone on the three requests: 6.9 / 7 - 1; run B: 6.9 / 11 - 1
    assert [r["ttft_mean_error"] for r in repeats["per_run"]] == pytest.approx(
        [6.9 / 7 - 1, 6.9 / 11 - 1])
    assert [r["throughput_error"] for r in repeats["per_run"]] == pytest.approx([-0.25, -0.5])
    row = v.load_row({**report, "load": "50"})
    assert row["real_runs"] == 2 and row["real_throughput_rps"] == pytest.approx(5.0)
    assert row["ttft_mean_error_low"] == pytest.approx(repeats["ttft_mean_error_interval"][0])
    # one run: the report as before, no interval
    single = v.compare(RUN_A, SIM, backend="sim")
    assert "repeats" not in single and single["throughput_error"] == pytest.approx(-0.25)
    assert math.isnan(v.load_row({**single, "load": "50"})["ttft_mean_error_low"])


def test_the_replays_of_the_runs_are_averaged_like_the_runs():
    # each run's replay aligned with its own rows (run B's rows in another order)
    run_b = _run([2.0, 3.0, 6.0, 9.0], 6.0, ids=(1, 0, 2, 3),
                 status=["completed"] * 3 + ["failed"])
    replay_a = np.array([1.0, 2.0, 3.0, 4.0])
    replay_b = np.array([5.0, 7.0, 9.0, 11.0])  # request 1, 0, 2, 3
    pooled = es.pooled_replay([RUN_A, run_b], [replay_a, replay_b], np.array([0, 1, 2]))
    assert pooled.tolist() == pytest.approx([(1 + 7) / 2, (2 + 5) / 2, (3 + 9) / 2])
    assert es.pooled_replay([RUN_A, run_b], [replay_a, None], np.array([0])) is None
    report = v.compare(RUN_A, SIM, backend="sim", replayed_ttft=replay_a, repeats=[run_b],
                       repeats_replayed=[replay_b])
    # real average 2, 2, 5 (9); replayed 4, 3.5, 6 (13.5); sim 6.9
    assert report["cost_model_error"] == pytest.approx(13.5 / 9 - 1)
    assert report["decision_error"] == pytest.approx((6.9 - 13.5) / 9)


def _report_missing_by(error: float, interval: list[float]) -> dict:
    """A load point whose mean TTFT error misses, all in the prefill component."""
    component = {"real_s": 0.1, "sim_s": 0.1 * (1 + error), "error_s": 0.1 * error,
                 "share_of_ttft": error, "assumption": "the grid"}
    return {"checks": [{"metric": "ttft_mean_abs_error", "value": abs(error), "sense": "<=",
                        "target": 0.10, "applies": True, "passed": False}],
            "ttft_mean_error": error, "components": {"prefill": component},
            "arrival": "poisson", "decision_error": None, "cost_model_error": None,
            "repeats": {"runs": 3, "confidence": 0.95, "real_ttft_mean_cv": 0.4,
                        "ttft_mean_error_interval": interval}}


def _report_p90_missing(value: float, floor: float) -> dict:
    report = _report_missing_by(0.02, [-0.05, 0.09])
    report["checks"] = [{"metric": "ttft_p90_abs_error", "value": value, "sense": "<=",
                         "target": 0.25, "applies": True, "passed": False}]
    report["repeats"]["ttft_p90_abs_error_floor"] = floor
    return report


def test_a_p90_miss_is_the_engines_spread_only_where_a_perfect_model_would_miss_too():
    inside = diagnose(_report_p90_missing(0.42, floor=0.31))
    assert inside[0]["cause"] == "engine_spread"
    assert any("p90 |error| of 31.0% against their average" in line
               for line in inside[0]["evidence"])
    # a perfect model would show 14%: the rest of the 42% is the model's
    outside = diagnose(_report_p90_missing(0.42, floor=0.14))
    assert outside[0]["cause"] != "engine_spread"
    assert any("p90 |error| of 14.0%" in line for line in outside[0]["evidence"])


def test_with_replicas_the_p90_miss_is_read_against_the_floor_of_both_sides():
    """The real runs alone leave 14% (the model's own miss, alone), but the replicas' average
    adds its error: 27% of both sides is past the 25% target, so a perfect model simulated so
    would miss too."""
    report = _report_p90_missing(0.42, floor=0.14)
    report["repeats"]["ttft_p90_abs_error_floor_both_sides"] = 0.27
    both = diagnose(report)
    assert both[0]["cause"] == "engine_spread"
    assert any("14.0% against their average" in line and "27.0% simulated as this average"
               in line for line in both[0]["evidence"])
    report["repeats"]["ttft_p90_abs_error_floor_both_sides"] = 0.18
    assert diagnose(report)[0]["cause"] != "engine_spread"


def test_a_miss_inside_the_engines_spread_is_named_so_and_one_outside_is_not():
    inside = diagnose(_report_missing_by(-0.40, [-0.62, 0.05]))
    assert inside[0]["cause"] == "engine_spread"
    assert any("interval is -62.0% to +5.0%" in line for line in inside[0]["evidence"])
    assert "--repeats" in inside[0]["next_fix"]
    # an interval reaching only to -12%: the miss is the model's, the usual cause stands
    outside = diagnose(_report_missing_by(-0.40, [-0.62, -0.12]))
    assert outside[0]["cause"] != "engine_spread"
    assert any("interval is" in line for line in outside[0]["evidence"])
    # above the target on the other side
    assert diagnose(_report_missing_by(0.40, [0.09, 0.7]))[0]["cause"] == "engine_spread"


runner = CliRunner()
PAIR = ["--backend", "sim", "--requests", "30", "--profile", "a10g-mistral-7b",
        "--reference-profile", "l4-mistral-7b"]


def _invoke(*args: str):
    return runner.invoke(app, ["validate", *args], env={"COLUMNS": "200"})


def test_cli_repeats_write_each_real_run_and_a_deterministic_pair_has_no_spread(tmp_path):
    once = _invoke(*PAIR, "--loads", "over,50", "--out", str(tmp_path / "once"), "--json")
    twice = _invoke(*PAIR, "--loads", "over,50", "--repeats", "2", "--out",
                    str(tmp_path / "twice"), "--json")
    assert once.exit_code == 0 and twice.exit_code == 0, twice.output
    rows_once = json.loads(once.stdout)["loads"]
    rows = json.loads(twice.stdout)["loads"]
    assert [row["real_runs"] for row in rows] == [2, 2]
    # the 'real' side is a simulation here: both runs alike, the errors as from one run
    for row, single in zip(rows, rows_once, strict=True):
        assert row["ttft_mean_error"] == pytest.approx(single["ttft_mean_error"])
        assert row["real_ttft_mean_cv"] == 0
        assert row["ttft_p90_abs_error_floor"] == 0  # nor a floor under the p90
        assert row["ttft_mean_error_low"] == pytest.approx(row["ttft_mean_error_high"])
        # each side's own busy share (the reference prices another GPU), as its summary says
        real_summary = json.loads((tmp_path / "twice" / f"load-{row['load']}" / "real"
                                   / "summary.json").read_text())
        assert row["real_gpu_busy_fraction"] == pytest.approx(real_summary["gpu_busy_fraction"])
        assert 0 < row["sim_gpu_busy_fraction"] <= 1
    for load in ("over", "50"):
        assert (tmp_path / "twice" / f"load-{load}" / "real-2" / "summary.json").exists()
        assert not (tmp_path / "once" / f"load-{load}" / "real-2").exists()
    assert pd.read_parquet(tmp_path / "twice" / "loads.parquet")["real_runs"].tolist() == [2, 2]
    text = _invoke(*PAIR, "--repeats", "2", "--out", str(tmp_path / "text"))
    assert text.exit_code == 0, text.output
    assert "real runs: TTFT mean error each" in text.stdout
    assert "the runs' own spread gives a perfect model" in text.stdout
    loads = _invoke(*PAIR, "--loads", "over,50", "--repeats", "2", "--out",
                    str(tmp_path / "loads-text"))
    assert loads.exit_code == 0, loads.output
    assert "a perfect model would show against the runs' average" in loads.stdout
    assert "busy: the engine's share of the run's time spent in steps" in loads.stdout


@pytest.mark.parametrize("value", ["0", "-2"])
def test_cli_refuses_fewer_than_one_real_run(tmp_path, value):
    result = _invoke(*PAIR, "--repeats", value, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "--repeats" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_loads_row_carries_how_busy_the_engine_was_on_each_side():
    """A load named as a share of the burst's capacity can keep the engine busier than its
    name: the row gives the real runs' busy share (their mean, by hand 0.8 and 0.9) beside the
    simulation's; a run that did not report it (a simulated 'real') leaves it out of the mean."""
    def busy(run, share):
        return SimpleNamespace(columns=run.columns, config=run.config,
                               summary={**run.summary, "gpu_busy_fraction": share})

    report = v.compare(busy(RUN_A, 0.8), busy(SIM, 0.95), backend="sim",
                       repeats=[busy(RUN_B, 0.9)])
    row = v.load_row({**report, "load": "90"})
    assert row["real_gpu_busy_fraction"] == pytest.approx(0.85)
    assert row["sim_gpu_busy_fraction"] == pytest.approx(0.95)
    assert [r["gpu_busy_fraction"] for r in report["repeats"]["per_run"]] == [0.8, 0.9]
    partial = v.compare(busy(RUN_A, 0.8), SIM, backend="sim", repeats=[RUN_B])
    assert v.load_row({**partial, "load": "90"})["real_gpu_busy_fraction"] == pytest.approx(0.8)
    single = v.load_row({**v.compare(busy(RUN_A, 0.7), SIM, backend="sim"), "load": "50"})
    assert single["real_gpu_busy_fraction"] == pytest.approx(0.7)
    assert single["sim_gpu_busy_fraction"] is None


LOADS = ["over", "90", "50", "idle"]


@pytest.mark.parametrize(("text", "points", "expected"), [
    ("5", None, {None: 5}),
    (5, LOADS, {None: 5}),
    ("3,90=15,50%=12", LOADS, {None: 3, "90": 15, "50": 12}),
    ("90.0=15, idle=2", LOADS, {None: 1, "90": 15, "idle": 2}),
    ("OVER=4", LOADS, {None: 1, "over": 4}),
])
def test_repeats_by_load_are_read_as_written(text, points, expected):
    assert v.parse_repeats(text, points) == expected


@pytest.mark.parametrize(("text", "points", "says"), [
    ("0", None, "at least 1"),
    ("three", None, "at least 1"),
    ("90=0", LOADS, "at least 1"),
    ("80=3", LOADS, "does not run"),
    ("90=3", None, "give --loads"),
    ("3,4", LOADS, "twice"),
    ("90=2,90%=3", LOADS, "twice"),
    ("", LOADS, "no count"),
])
def test_bad_repeats_name_the_option_and_the_item(text, points, says):
    with pytest.raises(v.RagsimInputError) as error:
        v.parse_repeats(text, points)
    assert says in str(error.value) and error.value.field == "--repeats"


def test_cli_repeats_by_load_run_each_point_as_often_as_named(tmp_path):
    """``--repeats 1,50=3``: the overload point once, the 50% point three times."""
    result = _invoke(*PAIR, "--loads", "over,50", "--repeats", "1,50=3", "--out",
                     str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["loads"]
    assert [(row["load"], row["real_runs"]) for row in rows] == [("over", 1), ("50", 3)]
    assert (tmp_path / "out" / "load-50" / "real-3" / "summary.json").exists()
    assert not (tmp_path / "out" / "load-over" / "real-2").exists()
    refused = _invoke(*PAIR, "--loads", "over,50", "--repeats", "90=3", "--out",
                      str(tmp_path / "refused"))
    assert refused.exit_code == 2 and "--repeats" in refused.stderr, refused.output
    assert not (tmp_path / "refused").exists()


def test_the_floor_of_both_sides_adds_the_replicas_averages_variance():
    """Real runs 1.0 and 1.2 s: mean 1.1, sd 0.1414, the mean of two off by sd / sqrt(2) =
    0.1 s; four replicas with sd 0.2 s: their mean off by 0.1 s; independent, so 0.1414 s
    together, relative 0.1414 / 1.1. Every request alike: the p90 of |N(0, s)| is s x 1.6449
    (printed tables); a request without a replica spread counts the real side's alone."""
    runs = np.array([[1.0, 1.0], [1.2, 1.2]])
    assert es.p90_abs_error_floor(runs) == pytest.approx(Z_95 * 0.1 / 1.1, rel=1e-6)
    both = es.p90_abs_error_floor(runs, np.array([0.2, 0.2]), 4)
    assert both == pytest.approx(Z_95 * math.sqrt(0.02) / 1.1, rel=1e-6)
    assert es.p90_abs_error_floor(runs, np.array([np.nan, np.nan]), 4) == pytest.approx(
        Z_95 * 0.1 / 1.1, rel=1e-6)
    with pytest.raises(ValueError, match="one value per request"):
        es.p90_abs_error_floor(runs, np.array([0.2]), 4)


def test_the_floor_of_both_sides_agrees_with_drawing_both_averages():
    """A second way: draw the real runs' mean and the replicas' mean about each request's
    expectation and take the p90 |error| of the one against the other."""
    rng = np.random.default_rng(11)
    means = rng.uniform(0.05, 0.5, 300)
    real_sd, sim_sd = means * rng.uniform(0.1, 0.6, 300), means * rng.uniform(0.1, 0.6, 300)
    runs = means + real_sd * rng.standard_normal((5, 300))
    pooled, sd = runs.mean(0), runs.std(0, ddof=1)
    real_mean = rng.normal(0, sd / math.sqrt(5), (4000, 300))
    sim_mean = rng.normal(0, sim_sd / math.sqrt(16), (4000, 300))
    drawn = float(np.median(np.percentile(np.abs(sim_mean - real_mean) / pooled, 90, axis=1)))
    assert es.p90_abs_error_floor(runs, sim_sd, 16) == pytest.approx(drawn, rel=0.03)


def test_an_ensembles_floor_counts_its_replicas_spread(tmp_path):
    """The 'real' side is a simulation here (no spread of its own: floor 0), the simulated
    side four noisy replicas: the floor of both sides is the replicas' alone, above zero, and
    each request's spread is kept beside its averaged TTFT."""
    config = tmp_path / "noise.toml"
    config.write_text("[run]\nstep_time_sigma = 0.05\nstep_time_correlation = 0.3\n")
    result = _invoke(*PAIR, "--loads", "over,50", "--repeats", "2", "--sim-replicas", "4",
                     "--config", str(config), "--out", str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    for row in json.loads(result.stdout)["loads"]:
        assert row["ttft_p90_abs_error_floor"] == 0
        assert row["ttft_p90_abs_error_floor_both_sides"] > 0
    sim = pd.read_parquet(tmp_path / "out" / "load-50" / "sim" / "requests.parquet")
    assert (sim["ttft_replica_sd_s"].dropna() > 0).any()
