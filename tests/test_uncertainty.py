"""Uncertainty as output (issue 26): intervals over seeds and ranges under repricing.

Expected values come from elsewhere: the intervals from separate single-seed runs and a
Student-t quantile read from a table (t(0.975, 2) = 4.303), the ranges from what a repricing
must do (slower compute cannot make a loaded run faster; a run without a host tier copies
nothing, so slower copies change nothing).
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import ragsim
from ragsim.api.uncertainty import ratio_range, student_t_interval
from ragsim.cli import app

T_975_2DF = 4.30265  # a t table's 0.975 quantile, 2 degrees of freedom (5 places)
RUN = dict(trace="mmlu", requests=150, rate=2.0)


def test_student_t_interval_by_hand():
    low, high = student_t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1
    half = T_975_2DF / math.sqrt(3)
    assert (low, high) == pytest.approx((2 - half, 2 + half), rel=1e-5)
    with pytest.raises(ValueError):
        student_t_interval([1.0])


def test_seeds_interval_equals_one_run_per_seed():
    run = ragsim.simulate(seed=4, seeds=3, **RUN)
    s = run.summary
    singles = [ragsim.simulate(seed=k, **RUN).summary["ttft_mean_s"] for k in (4, 5, 6)]
    mean = sum(singles) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in singles) / 2)
    half = T_975_2DF * sd / math.sqrt(3)
    assert s["seeds"] == [4, 5, 6]
    assert s["mean"]["ttft_mean_s"] == pytest.approx(mean, rel=1e-12)
    assert s["ci95"]["ttft_mean_s"] == pytest.approx([mean - half, mean + half], rel=1e-5)
    assert s["ttft_mean_s"] == singles[0]  # the run returned is the first seed's
    assert len(run.requests) == 150


def test_sensitivity_ranges_follow_what_repricing_must_do():
    s = ragsim.simulate(sensitivity=True, system="ragcache", **RUN).summary
    by = s["sensitivity_by_perturbation"]["ttft_mean_s"]
    assert by["compute x1.2"] > by["as profiled"] > by["compute x0.8"]
    low, high = s["sensitivity"]["ttft_mean_s"]
    assert low == min(by.values()) and high == max(by.values())
    names = [p["name"] for p in s["sensitivity_perturbations"]]
    assert {"compute x0.8", "compute x1.2", "copy bandwidth /2"} <= set(names)
    # without a host tier nothing is copied: half the bandwidth changes nothing
    g = ragsim.simulate(sensitivity=True, system="sglang", **RUN).summary
    by = g["sensitivity_by_perturbation"]["ttft_mean_s"]
    assert by["copy bandwidth /2"] == by["as profiled"]


def test_a_ratio_spanning_more_than_twice_is_unstable():
    steady = ratio_range([2.0, 2.2, 1.9], [1.0, 1.0, 1.0])
    assert steady["range"] == [1.9, 2.2] and not steady["unstable"]
    knife = ratio_range([2.0, 30.0], [1.0, 2.0])  # 2x and 15x
    assert knife["range"] == [2.0, 15.0] and knife["unstable"]


def test_cli_seeds_json_has_ci95_and_sensitivity():
    result = CliRunner().invoke(app, ["run", "--trace", "mmlu", "--requests", "100", "--rate",
                                      "2", "--seeds", "2", "--sensitivity", "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    low, high = s["ci95"]["throughput_rps"]
    assert low <= s["mean"]["throughput_rps"] <= high
    assert set(s["sensitivity"]) >= {"ttft_mean_s", "throughput_rps", "token_hit_rate"}
    assert isinstance(s["sensitivity_unstable"], list)
    bad = CliRunner().invoke(app, ["run", "--requests", "10", "--seeds", "0"])
    assert bad.exit_code == 2 and "--seeds" in bad.output
