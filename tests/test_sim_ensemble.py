"""The simulated side as an estimate of each request's expected TTFT: a step's time drawn around
its price (``serving.step_noise``), the spread measured from a profile's repeated timings
(``profiles.repeat_spread``), the replicas averaged per request (``sim_ensemble``) and
``validate --sim-replicas``.

Expected values are worked by hand or come from elsewhere: the expected range of two normal
draws is 2/sqrt(pi) and of seven 2.704 (the d2 constants of control-chart tables); a hand-made
profile's cells give a median log range by hand; a run's averages are recomputed with pandas
from the replicas run one by one; a simulation compared with itself has no error.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ragsim.errors import ConfigError, RagsimInputError
from ragsim.profiles.profile import load_profile
from ragsim.profiles.repeat_spread import expected_range, step_time_sigma
from ragsim.serving.config import build_config
from ragsim.serving.pipeline import RunResult
from ragsim.serving.step_noise import StepTimeNoise
from ragsim.sim.simulator import run_simulation
from ragsim.sim_ensemble import ensemble_result, p90_abs_error_one_run
from ragsim.traces import resolve_trace
from ragsim.validation import run_sim_ensemble

MEASURED = "cpu-mistral-7b-l2-h256"


# ------------------------------------------------------------------ the spread of a profile
def test_the_expected_range_of_normal_draws_is_the_control_chart_constant():
    assert expected_range(2) == pytest.approx(2 / math.sqrt(math.pi), rel=1e-9)
    assert expected_range(7) == pytest.approx(2.704, abs=5e-4)
    assert expected_range(10) == pytest.approx(3.078, abs=5e-4)
    with pytest.raises(ValueError):
        expected_range(1)


def test_a_profiles_step_spread_is_its_cells_median_log_range_over_d2():
    """Three prefill cells ranging x1.1, x1.3, x1.2 and one decode cell x1.5 over 7 repeats:
    the median log range is ln(1.25) (between ln 1.2 and ln 1.3), over 2.704."""
    base = load_profile(MEASURED)
    raw = {"prefill": {"0,1": [1.0, 1.0, 1.1], "0,2": [2.0, 2.0, 2.6], "0,3": [3.0, 3.0, 3.6]},
           "decode": {"1,128": [0.1, 0.1, 0.15]}}
    profile = replace(base, obtained={**base.obtained, "raw": raw, "repetitions": 7})
    by_hand = (math.log(1.2) + math.log(1.3)) / 2 / 2.7044
    assert step_time_sigma(profile) == pytest.approx(by_hand, rel=1e-3)
    # a profile derived from formulas keeps no repeats: no spread to measure
    assert step_time_sigma(load_profile("h100-mistral-7b")) is None
    once = replace(base, obtained={**base.obtained, "raw": raw, "repetitions": 1})
    assert step_time_sigma(once) is None


# ------------------------------------------------------------------ a step's time drawn
def test_the_noise_is_off_by_default_and_its_factors_are_lognormal_about_one():
    assert StepTimeNoise.of(build_config({})) is None
    noise = StepTimeNoise.of(build_config({"step_time_sigma": 0.1, "seed": 2}))
    logs = np.log(noise.factors(20000))
    assert np.std(logs) == pytest.approx(0.1, rel=0.03)  # sd of the estimate: 0.5%
    assert abs(np.median(logs)) < 0.005  # the price stays the median (sd 0.0009)
    with pytest.raises(ValueError):
        StepTimeNoise(0.0, 0, 0)


def test_a_bad_spread_in_a_configuration_names_its_field():
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError) as caught:
            build_config({"step_time_sigma": bad})
        assert caught.value.field == "step_time_sigma"
    with pytest.raises(ConfigError) as caught:
        build_config({"step_noise_seed": -1})
    assert caught.value.field == "step_noise_seed"


def _run(n: int = 40, **fields) -> RunResult:
    trace = resolve_trace("mmlu", n_requests=n, seed=3)
    config = build_config({"trace": "mmlu", "system": "vllm-apc", "rate_rps": 3.0,
                           "seed": 3, **fields})
    return run_simulation(trace, config, load_profile(config.profile))


def test_the_first_step_takes_its_price_times_the_generators_first_draw():
    """One request alone (sequential): its prefill is the run's first step, so with noise it
    takes the noise-free step's time times exp of the first N(0, sigma) draw of the generator
    the configuration seeds (numpy's, seeded by seed, step_noise_seed and the engine's
    stream 0)."""
    clean = _run(1, arrival="sequential")
    noisy = _run(1, arrival="sequential", step_time_sigma=0.2, step_noise_seed=5)
    first = np.random.default_rng([3, 5, 0]).normal(0.0, 0.2)
    step = lambda r: r.columns["first_token_s"][0] - r.columns["prefill_start_s"][0]  # noqa: E731
    assert step(noisy) == pytest.approx(step(clean) * math.exp(first), rel=1e-9)
    assert noisy.columns["prefill_start_s"][0] == clean.columns["prefill_start_s"][0]


def test_noisy_runs_are_deterministic_per_seed_and_differ_only_in_their_steps():
    a = _run(step_time_sigma=0.1, step_noise_seed=1)
    again = _run(step_time_sigma=0.1, step_noise_seed=1)
    other = _run(step_time_sigma=0.1, step_noise_seed=2)
    clean = _run()
    np.testing.assert_array_equal(a.columns["ttft_s"], again.columns["ttft_s"])
    assert not np.array_equal(a.columns["ttft_s"], other.columns["ttft_s"])
    assert not np.array_equal(a.columns["ttft_s"], clean.columns["ttft_s"])
    # the trace, arrivals and searches are the same in every replica
    for name in ("arrival_s", "search_start_s", "search_end_s", "doc_tokens"):
        np.testing.assert_array_equal(a.columns[name], clean.columns[name])
        np.testing.assert_array_equal(other.columns[name], clean.columns[name])


def test_a_fleets_engines_draw_their_own_noise():
    """Each engine of a fleet has its own stream (engine 1's draws are not engine 0's), and a
    noisy fleet is as deterministic as one engine."""
    config = build_config({"step_time_sigma": 0.1, "replicas": 2, "seed": 3})
    engine_0, engine_1 = (StepTimeNoise.of(config, stream=k).factors(50) for k in (0, 1))
    assert engine_0 != engine_1
    assert StepTimeNoise.of(config, stream=1).factors(50) == engine_1
    fleet = _run(replicas=2, step_time_sigma=0.1)
    same = _run(replicas=2, step_time_sigma=0.1)
    np.testing.assert_array_equal(fleet.columns["ttft_s"], same.columns["ttft_s"])
    assert not np.array_equal(fleet.columns["ttft_s"], _run(replicas=2).columns["ttft_s"])
    assert (fleet.columns["status"] == "completed").all()


# ------------------------------------------------------------------ the ensemble
def _result(ttft, status, tokens, throughput) -> RunResult:
    ttft = np.asarray(ttft, float)
    columns = {"request_id": np.arange(len(ttft)), "status": np.asarray(status, object),
               "arrival_s": np.zeros(len(ttft)), "ttft_s": ttft,
               "hit_tokens_gpu": np.asarray(tokens)}
    return RunResult(config=None, columns=columns,
                     summary={"throughput_rps": throughput, "interrupted": False, "name": "x"})


def test_an_ensemble_averages_each_requests_times_over_the_replicas_it_completed_in():
    """Request 2 failed in the second replica: its average is the other two's. Hits and
    status stay the first replica's; the summary's numbers are averaged, its flags kept."""
    runs = [_result([1.0, 2.0, 3.0], ["completed"] * 3, [0, 32, 64], 10.0),
            _result([3.0, 4.0, 9.0], ["completed", "completed", "failed"], [0, 0, 64], 12.0),
            _result([2.0, 3.0, 5.0], ["completed"] * 3, [32, 32, 64], 14.0)]
    ensemble = ensemble_result(runs, 0.05)
    np.testing.assert_allclose(ensemble.columns["ttft_s"], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(ensemble.columns["hit_tokens_gpu"], [0, 32, 64])
    assert list(ensemble.columns["status"]) == ["completed"] * 3
    assert ensemble.summary["throughput_rps"] == pytest.approx(12.0)
    assert ensemble.summary["interrupted"] is False and ensemble.summary["name"] == "x"
    assert ensemble.summary["sim_replicas"] == 3 and ensemble.summary["step_time_sigma"] == 0.05
    with pytest.raises(ValueError):
        ensemble_result([runs[0], _result([1.0, 2.0], ["completed"] * 2, [0, 0], 1.0)], 0.05)


def test_one_run_against_the_others_is_worked_by_hand():
    """Two runs, every request 1 s in one and 2 s in the other: run 1 against run 2 is off by
    50%, run 2 against run 1 by 100%; their mean 75%."""
    assert p90_abs_error_one_run(np.array([[1.0] * 10, [2.0] * 10])) == pytest.approx(0.75)
    assert math.isnan(p90_abs_error_one_run(np.array([[1.0, 2.0]])))


def test_the_ensemble_of_a_point_is_the_per_request_mean_of_its_replicas_run_one_by_one():
    trace = resolve_trace("mmlu", n_requests=40, seed=3)
    config = build_config({"trace": "mmlu", "system": "vllm-apc", "rate_rps": 3.0, "seed": 3})
    profile = load_profile(config.profile)
    ensemble = run_sim_ensemble(trace, config, profile, 4, 0.1)
    frames = [pd.DataFrame({"request_id": r.columns["request_id"], "ttft_s": r.columns["ttft_s"]})
              for r in (_run(step_time_sigma=0.1, step_noise_seed=k) for k in range(4))]
    by_pandas = pd.concat(frames).groupby("request_id")["ttft_s"].mean()
    np.testing.assert_allclose(ensemble.columns["ttft_s"], by_pandas.to_numpy(), rtol=1e-12)
    assert ensemble.summary["ttft_p90_abs_error_one_run"] > 0


# ------------------------------------------------------------------ validate --sim-replicas
def test_validate_compares_the_ensemble_and_keeps_the_noise_free_run_beside_it(tmp_path):
    """--backend sim: the 'real' side is the noise-free simulation itself, so the noise-free
    run's errors are zero by construction, and the ensemble is judged in its place."""
    import ragsim

    found = ragsim.validate(tmp_path / "v", backend="sim", requests=30, loads="over,90",
                            profile=MEASURED, sim_replicas=4)
    for report in found.reports:
        ensemble = report["sim_ensemble"]
        assert ensemble["replicas"] == 4
        assert ensemble["step_time_sigma"] == pytest.approx(
            step_time_sigma(load_profile(MEASURED)))
        assert ensemble["single_run"]["ttft_mean_error"] == 0
        assert ensemble["single_run"]["ttft_p90_abs_error"] == 0
        assert report["sim"]["sim_replicas"] == 4
    rows = found.loads["loads"]
    assert [row["sim_replicas"] for row in rows] == [4, 4]
    assert all(row["single_ttft_mean_error"] == 0 for row in rows)
    joined = pd.read_parquet(tmp_path / "v" / "load-90" / "requests.parquet")
    assert (joined["ttft_s_sim"] != joined["ttft_s_real"]).any()
    # the noise-free run is written beside the average: here it is the 'real' side itself
    noise_free = pd.read_parquet(tmp_path / "v" / "load-90" / "sim-noise-free" /
                                 "requests.parquet").set_index("request_id")
    real = pd.read_parquet(tmp_path / "v" / "load-90" / "real" / "requests.parquet"
                           ).set_index("request_id")
    pd.testing.assert_series_equal(noise_free["ttft_s"], real["ttft_s"])
    assert json.loads((tmp_path / "v" / "load-90" / "sim-noise-free" / "summary.json"
                       ).read_text()).get("sim_replicas") in (None, 1)
    # the point's configuration is the noise-free run's: simulated again, it is that run
    from ragsim.serving.config import load_config_file

    stored = load_config_file(tmp_path / "v" / "load-90" / "config.toml")
    assert stored["step_time_sigma"] == 0 and stored["step_noise_seed"] == 0


def test_validate_takes_a_configurations_spread_and_refuses_a_profile_without_repeats(tmp_path):
    import ragsim

    config = tmp_path / "c.toml"
    config.write_text('[run]\nstep_time_sigma = 0.2\n')
    found = ragsim.validate(tmp_path / "v", backend="sim", requests=20, profile=MEASURED,
                            config=str(config), sim_replicas=3)
    assert found.report["sim_ensemble"]["step_time_sigma"] == 0.2
    assert found.report["sim_ensemble"]["single_run"]["ttft_mean_error"] == 0
    with pytest.raises(RagsimInputError) as caught:
        ragsim.validate(tmp_path / "w", backend="sim", requests=20, profile="h100-mistral-7b",
                        sim_replicas=3)
    assert caught.value.field == "sim_replicas" and "repeated timings" in str(caught.value)
    for bad in (0, 1000, True):
        with pytest.raises(RagsimInputError) as caught:
            ragsim.validate(tmp_path / f"x{bad}", backend="sim", requests=20, sim_replicas=bad)
        assert caught.value.field == "sim_replicas"


def test_the_command_line_prints_the_ensemble_and_the_noise_free_run(tmp_path):
    from ragsim.cli import app

    result = CliRunner().invoke(app, ["validate", "--backend", "sim", "--requests", "20",
                                      "--profile", MEASURED, "--sim-replicas", "3",
                                      "--out", str(tmp_path / "v")],
                                env={"COLUMNS": "300"})  # each table row on one line
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "3 simulations averaged" in text
    assert "the noise-free simulation" in text


def test_resimulate_point_gives_a_stored_points_noise_free_run_and_ensemble_again(tmp_path):
    """benchmarks/resimulate_point.py, on a point validate wrote: its noise-free run against
    the stored real side is the report's single run, and its ensemble the report's own
    errors (the same configuration, profile, replicas and spread)."""
    import subprocess
    import sys
    from pathlib import Path

    import ragsim

    found = ragsim.validate(tmp_path / "v", backend="sim", requests=30, profile=MEASURED,
                            sim_replicas=3, reference_profile="cpu-vllm-mistral-7b-l2-h256")
    report = found.report
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "resimulate_point.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "v"), "--sim-replicas",
                           "3", "--by-run", "--requests-out", str(tmp_path / "requests")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    variants, by_run = done.stdout.split("| real run |")
    rows = [line.split("|") for line in variants.splitlines()
            if line.startswith(f"| {tmp_path / 'v'} |")]
    assert len(rows) == 2
    noise_free, ensemble = ([cell.strip() for cell in row] for row in rows)
    single = report["sim_ensemble"]["single_run"]
    assert noise_free[7] == f"{single['ttft_mean_error']:+.1%}"
    assert noise_free[8] == f"{single['ttft_p90_abs_error']:.1%}"
    assert ensemble[7] == f"{report['ttft_mean_error']:+.1%}"
    assert ensemble[8] == f"{report['ttft_p90_abs_error']:.1%}"
    # --by-run: the one real run against the noise-free simulation is the report's single
    # run; a simulated 'real' side keeps no steps
    (run,) = [[cell.strip() for cell in line.split("|")] for line in by_run.splitlines()
              if line.startswith(f"| {tmp_path / 'v'} |")]
    assert run[2:4] == ["real", "-"]
    assert run[5] == f"{single['ttft_mean_error']:+.1%}"
    assert run[6] == f"{single['ttft_p90_abs_error']:.1%}"
    # --requests-out: each variant's requests, the noise-free one's TTFTs the run's own
    written = sorted(p.name for p in (tmp_path / "requests").iterdir())
    assert len(written) == 2
    (noise_free_name,) = [name for name in written if name.endswith("-noise-free.parquet")]
    noise_free_table = pd.read_parquet(tmp_path / "requests" / noise_free_name)
    assert noise_free_table["ttft_s"].mean() * 1e3 == pytest.approx(float(noise_free[6]),
                                                                   abs=0.051)
