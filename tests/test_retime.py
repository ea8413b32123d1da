"""Re-timed arrivals: rate, burstiness, determinism, order preserved."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ragsim.errors import RagsimInputError
from ragsim.traces import builtin_trace
from ragsim.traces.retime import arrival_times, retime


@pytest.mark.parametrize("process,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_rate_and_coefficient_of_variation(process, cv):
    times = arrival_times(200_000, 2.5, process=process, cv=cv, seed=4)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / 2.5, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_poisson_gaps_are_exponential():
    gaps = np.diff(arrival_times(20_000, 4.0, seed=1))
    assert stats.kstest(gaps, "expon", args=(0, 0.25)).pvalue > 0.001


def test_retime_keeps_requests_and_is_deterministic():
    trace = builtin_trace("mmlu", n_requests=1000)
    a = retime(trace, 3.0, process="gamma", cv=2.0, seed=9)
    b = retime(trace, 3.0, process="gamma", cv=2.0, seed=9)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.doc_ids, trace.doc_ids)
    assert a.info["retimed"] == {"rate_rps": 3.0, "process": "gamma", "cv": 2.0, "seed": 9}
    assert not np.array_equal(retime(trace, 3.0, seed=10).arrival_s, a.arrival_s)


@pytest.mark.parametrize("kwargs,field", [({"rate_rps": 0}, "--rate"),
                                          ({"rate_rps": 1, "process": "weibull"}, "--arrival"),
                                          ({"rate_rps": 1, "process": "gamma", "cv": 0},
                                           "--cv")])
def test_bad_arrival_settings(kwargs, field):
    with pytest.raises(RagsimInputError) as info:
        arrival_times(10, **kwargs)
    assert info.value.field == field


def test_trace_retime_command(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.traces import read_trace

    result = CliRunner().invoke(app, ["trace", "retime", "nq", str(tmp_path / "t"), "--rate",
                                      "2", "--arrival", "gamma", "--cv", "2", "--requests",
                                      "500"])
    assert result.exit_code == 0, result.output
    trace = read_trace(tmp_path / "t")
    assert trace.n_requests == 500 and trace.info["retimed"]["cv"] == 2.0
    bad = CliRunner().invoke(app, ["trace", "retime", "nq", str(tmp_path / "u"), "--rate", "-1"])
    assert bad.exit_code == 2 and "--rate" in bad.output
