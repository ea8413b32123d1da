"""The spread of a served engine's steps about their prices (``ragsim.step_spread``), which
``validate --sim-replicas`` draws each simulated step's time with, and the correlated draws
themselves (``serving.step_noise``).

Expected values come from elsewhere: a run's steps made here by a second AR(1) written in the
test (numpy's generator, its own recursion), whose spread and correlation are the values the
estimator must find; small tables' figures worked by hand (one run's, and two runs' median
polish); the draws' correlation taken by
``numpy.corrcoef``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragsim.errors import ConfigError
from ragsim.serving.config import build_config
from ragsim.serving.step_noise import StepTimeNoise
from ragsim.step_spread import MIN_GROUP_STEPS, deviations, served_step_spread


def _ar1(n: int, sigma: float, rho: float, seed: int) -> np.ndarray:
    """A stationary AR(1) of spread ``sigma`` and lag-1 correlation ``rho``, written here."""
    rng = np.random.default_rng(seed)
    e = np.empty(n)
    e[0] = rng.normal(0.0, sigma)
    for t in range(1, n):
        e[t] = rho * e[t - 1] + rng.normal(0.0, sigma * math.sqrt(1 - rho * rho))
    return e


def _steps(e: np.ndarray, seed: int) -> list[dict]:
    """A run's steps: decode steps (4 tokens, priced 5 ms, really 1.2x that) and mixed steps
    (300 tokens, priced 50 ms, really 0.9x) in a random order, each ``exp(e)`` about that."""
    rng = np.random.default_rng(seed)
    rows = []
    for index, dev in enumerate(e):
        decode = rng.random() < 0.6
        priced, bias = (0.005, 1.2) if decode else (0.05, 0.9)
        rows.append({"step": index, "kind": "decode" if decode else "mixed",
                     "step_tokens": 4 if decode else 300, "priced_s": priced,
                     "measured_s": priced * bias * math.exp(dev)})
    return rows


def test_the_spread_and_correlation_of_ar1_steps_are_found_with_the_prices_bias_set_aside():
    """Three runs of 3,000 steps, spread 0.08 and correlation 0.4 about prices that miss
    each group by +20% and -10%: the estimate finds 0.08 and 0.4 (its sd here: about 1.5%
    and 0.01), the groups' bias being the prices' error, not noise."""
    tables = [_steps(_ar1(3000, 0.08, 0.4, seed), seed + 10) for seed in range(3)]
    spread = served_step_spread(tables)
    assert spread["sigma"] == pytest.approx(0.08, rel=0.06)
    assert spread["correlation"] == pytest.approx(0.4, abs=0.04)
    assert spread["steps"] == 9000 and len(spread["runs"]) == 3
    for run in spread["runs"]:
        assert run["sigma"] == pytest.approx(0.08, rel=0.1)
    # independent steps: no correlation to find (clipped at 0 from below)
    flat = served_step_spread([_steps(_ar1(3000, 0.05, 0.0, 7), 8)])
    assert flat["sigma"] == pytest.approx(0.05, rel=0.06)
    assert flat["correlation"] < 0.05


def test_a_small_table_worked_by_hand():
    """Eight decode steps measured at exp(d) x their price, d = -2, -1, 0, 0, 1, 1, 2, 3
    (x 0.01): the group's median is 0.005, so the deviations are d - 0.005; the median
    |deviation| is 0.01 (of 0.025 0.015 0.005 0.005 0.005 0.005 0.015 0.025), sigma
    1.4826 x 0.01. A group of three mixed steps (fewer than MIN_GROUP_STEPS) is left out,
    and a step without a price is NaN."""
    d = [-0.02, -0.01, 0.0, 0.0, 0.01, 0.01, 0.02, 0.03]
    table = [{"kind": "decode", "step_tokens": 2, "priced_s": 0.01,
              "measured_s": 0.01 * math.exp(x)} for x in d]
    table += [{"kind": "mixed", "step_tokens": 500, "priced_s": 0.1, "measured_s": 0.3}] * 3
    table.append({"kind": "decode", "step_tokens": 2, "priced_s": 0.0, "measured_s": 0.01})
    assert MIN_GROUP_STEPS == 8
    r = deviations([table])[0]
    assert r[:8] == pytest.approx(np.array(d) - 0.005)
    assert np.isnan(r[8:]).all()
    spread = served_step_spread([table])
    assert spread["sigma"] == pytest.approx(1.4826 * 0.01, rel=1e-6)
    assert spread["steps"] == 8
    # lag 1 over the 7 consecutive pairs of the kept steps, by hand
    dev = np.array(d) - 0.005
    by_hand = float(np.sum(dev[:-1] * dev[1:]) / np.sum(dev * dev))
    assert spread["correlation"] == pytest.approx(min(max(by_hand, 0.0), 0.95))
    assert served_step_spread([table[8:], None, []]) is None


def test_groups_pool_over_the_runs_with_each_runs_speed_set_aside_worked_by_hand():
    """Two runs of nine steps, decode (2 tokens) and mixed (500 tokens), no group of eight
    in either run, enough over both; the second run's machine slower. ln(measured / price)
    x 100: run one's decodes 0 1 2 3 4 and mixed 20 21 22 23; run two's decodes 10 11 12 13
    and mixed 30 31 32 33 36. Median polish by hand:

    * the groups' medians over both runs, 4 and 30, leave run one -4 -3 -2 -1 0 | -10 -9 -8
      -7 and run two 6 7 8 9 | 0 1 2 3 6; the runs' medians, -4 and 6 (their speeds), leave
      0 1 2 3 4 | -6 -5 -4 -3 and 0 1 2 3 | -6 -5 -4 -3 0;
    * the groups' medians, 2 and -4, leave -2 -1 0 1 2 | -2 -1 0 1 and -2 -1 0 1 | -2 -1 0 1
      4; the runs' medians are 0, and so are the groups' next: settled.

    The 18 |deviations|' median is 1 (x 0.01), sigma 1.4826 x 0.01. Counted within each run
    alone, as the estimator did before, neither run kept a step."""
    def run(decodes, mixed):
        return [{"kind": "decode", "step_tokens": 2, "priced_s": 0.01,
                 "measured_s": 0.01 * math.exp(x / 100)} for x in decodes] + [
            {"kind": "mixed", "step_tokens": 500, "priced_s": 0.1,
             "measured_s": 0.1 * math.exp(x / 100)} for x in mixed]

    first = run([0, 1, 2, 3, 4], [20, 21, 22, 23])
    second = run([10, 11, 12, 13], [30, 31, 32, 33, 36])
    r = deviations([first, second])
    assert r[0] == pytest.approx(np.array([-2, -1, 0, 1, 2, -2, -1, 0, 1]) / 100, abs=1e-12)
    assert r[1] == pytest.approx(np.array([-2, -1, 0, 1, -2, -1, 0, 1, 4]) / 100, abs=1e-12)
    spread = served_step_spread([first, None, second])
    assert spread["sigma"] == pytest.approx(1.4826 * 0.01, rel=1e-6)
    assert spread["steps"] == 18 and [run["steps"] for run in spread["runs"]] == [9, 9]
    # one run alone: no group of eight
    assert served_step_spread([first]) is None and served_step_spread([second]) is None
    # a run keeping fewer than MIN_GROUP_STEPS steps is left out (its offset would be its
    # steps' own median), and the others' deviations stand as they were
    r = deviations([first, second, run([50, 60, 70], [])])
    assert np.isnan(r[2]).all()
    assert r[1] == pytest.approx(np.array([-2, -1, 0, 1, -2, -1, 0, 1, 4]) / 100, abs=1e-12)


def test_correlated_draws_keep_their_spread_and_carry_the_correlation_into_the_next_step():
    noise = StepTimeNoise.of(build_config({"step_time_sigma": 0.1, "step_time_correlation": 0.6,
                                           "seed": 2}))
    logs = np.log(noise.factors(40000))
    assert np.std(logs) == pytest.approx(0.1, rel=0.04)
    assert np.corrcoef(logs[:-1], logs[1:])[0, 1] == pytest.approx(0.6, abs=0.02)
    assert np.corrcoef(logs[:-2], logs[2:])[0, 1] == pytest.approx(0.36, abs=0.03)
    # one stream however it is taken: step by step or a decode run priced ahead
    one = StepTimeNoise(0.1, 2, 0, correlation=0.6)
    many = StepTimeNoise(0.1, 2, 0, correlation=0.6)
    by_step = [one.factor() for _ in range(5)] + one.factors(4) + [one.factor()]
    assert by_step == pytest.approx(many.factors(10), rel=1e-12)


def test_uncorrelated_draws_are_the_generators_normal_draws():
    """Without a correlation the factors are exp of numpy's N(0, sigma) draws from the
    generator the configuration seeds: ensembles validated before the correlation existed
    are drawn again unchanged."""
    noise = StepTimeNoise(0.07, 3, 5)
    expected = np.exp(np.random.default_rng([3, 5, 0]).normal(0.0, 0.07, 6))
    assert [noise.factor() for _ in range(3)] + noise.factors(3) == pytest.approx(
        expected, rel=1e-12)


def test_a_bad_correlation_names_its_field():
    for bad in (-0.1, 0.96, 1.0):
        with pytest.raises(ConfigError) as caught:
            build_config({"step_time_sigma": 0.1, "step_time_correlation": bad})
        assert caught.value.field == "step_time_correlation"
    with pytest.raises(ValueError):
        StepTimeNoise(0.1, 0, 0, correlation=1.0)


def test_a_correlated_run_is_deterministic_and_not_the_uncorrelated_one():
    from ragsim.profiles.profile import load_profile
    from ragsim.sim.simulator import run_simulation
    from ragsim.traces import resolve_trace

    def run(**fields):
        trace = resolve_trace("mmlu", n_requests=40, seed=3)
        config = build_config({"trace": "mmlu", "system": "vllm-apc", "rate_rps": 3.0,
                               "seed": 3, "step_time_sigma": 0.1, **fields})
        return run_simulation(trace, config, load_profile(config.profile)).columns["ttft_s"]

    correlated = run(step_time_correlation=0.5)
    np.testing.assert_array_equal(correlated, run(step_time_correlation=0.5))
    assert not np.array_equal(correlated, run())


def test_validate_takes_a_configurations_correlation_and_reports_it(tmp_path):
    """--backend sim runs no probe: the configuration's spread and correlation are drawn
    with, said in the report and the loads table; the point's config.toml is the noise-free
    run's."""
    import ragsim
    from ragsim.serving.config import load_config_file

    config = tmp_path / "c.toml"
    config.write_text("[run]\nstep_time_sigma = 0.1\nstep_time_correlation = 0.5\n")
    found = ragsim.validate(tmp_path / "v", backend="sim", requests=20, loads="over,50",
                            profile="cpu-mistral-7b-l2-h256", config=str(config),
                            sim_replicas=3)
    for report in found.reports:
        assert report["sim_ensemble"]["step_time_sigma"] == 0.1
        assert report["sim_ensemble"]["step_time_correlation"] == 0.5
        assert "step_spread" not in report["probes"]
    assert [row["step_time_correlation"] for row in found.loads["loads"]] == [0.5, 0.5]
    stored = load_config_file(tmp_path / "v" / "load-50" / "config.toml")
    assert stored["step_time_sigma"] == 0 and stored["step_time_correlation"] == 0
