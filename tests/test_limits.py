"""Runs that would never end are refused up front or stopped by the watchdog, with a reason.

Found by a reliability probe: ``replicate_every_s = 0.001`` with a month-long search ticked for
hours without a line; a GPU that fails faster than it recovers, a failure rate of 1e9 an hour,
a search of 1e300 s and a million answer-cache instances hung or ran out of memory.
"""

from __future__ import annotations

import pytest
from test_bad_inputs import one_error_line
from typer.testing import CliRunner

from ragsim import limits
from ragsim.cli import app
from ragsim.errors import ConfigError
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

runner = CliRunner()

# a request waits 2.5 million s (inside the 30-day bound) while replicas tick every millisecond:
# 2.5 billion ticks with no request moving
LIVELOCK = {"replicate_every_s": 0.001, "search_s": 2.5e6}


def test_the_watchdog_stops_a_run_that_only_ticks_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "NO_PROGRESS_WALL_S", 0.3)
    trace = resolve_trace("mmlu", n_requests=3)
    result = run_simulation(trace, build_config({**LIVELOCK, "n_requests": 3}),
                            load_profile("a10g-mistral-7b"))
    summary = result.summary
    assert summary["stalled"] and summary["no_progress"]
    assert "replicate_every_s" in summary["no_progress"]
    # nothing lost: every request is accounted for, none ended (all wait on the search)
    assert summary["requests_pending"] + summary["requests_completed"] == 3
    assert summary["simulated_s"] < 2.5e6


def test_the_cli_exits_2_with_the_watchdogs_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "NO_PROGRESS_WALL_S", 0.3)
    config = tmp_path / "livelock.toml"
    config.write_text('format = "ragsim.config"\nversion = 1\n[run]\nreplicate_every_s = 0.001\n'
                      'search_s = 2500000.0\nn_requests = 3\n')
    result = runner.invoke(app, ["run", "--config", str(config), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "no progress" in result.output and "Traceback" not in result.output
    assert (tmp_path / "o" / "requests.parquet").exists()  # what ended (nothing) is kept


def test_a_run_that_ends_is_never_stopped_by_the_watchdog(monkeypatch):
    """Seeded failures make long idle stretches of wake-ups; a run that ends is not touched."""
    monkeypatch.setattr(limits, "NO_PROGRESS_WALL_S", 0.0)
    trace = resolve_trace("mmlu", n_requests=200)
    result = run_simulation(trace, build_config({"rate_rps": 1.5, "gpu_failure_rate_per_h": 200.0}),
                            load_profile("a10g-mistral-7b"))
    assert result.summary["no_progress"] is None
    assert result.summary["requests_pending"] == 0


@pytest.mark.parametrize(("field", "value", "says"), [
    ("replicate_every_s", 1e-6, ">= 0.001"),
    ("search_s", 1e300, "30 days"),
    ("gpu_recovery_s", 1e9, "30 days"),
    ("retry_timeout_s", 1e12, "30 days"),
    ("gpu_failure_rate_per_h", 1e9, "once a second"),
    ("max_retries", 10**9, "<= 1000"),
    ("instances", 10**6, "<= 1024"),
])
def test_values_past_the_bounds_are_refused_naming_the_field(field, value, says):
    with pytest.raises(ConfigError) as raised:
        build_config({field: value})
    assert field in str(raised.value) and says in str(raised.value)


def test_a_search_scaled_past_a_month_is_refused():
    with pytest.raises(ConfigError, match="search_time_scale"):
        build_config({"search_s": 1000.0, "search_time_scale": 1e4})


def test_memory_problem_says_how_much_is_needed(monkeypatch):
    monkeypatch.setattr(limits, "physical_memory_bytes", lambda: 8 * 2**30)
    assert limits.memory_problem(1000, limits.RUN_BYTES_PER_REQUEST) is None
    problem = limits.memory_problem(10**9, limits.RUN_BYTES_PER_REQUEST)
    assert problem is not None and "1,000,000,000 requests" in problem and "1,863 GiB" in problem


@pytest.mark.parametrize("command", [["run"], ["replay"], ["trace", "generate", "mmlu", "OUT"]],
                         ids=["run", "replay", "trace-generate"])
def test_a_billion_requests_are_refused_before_allocating(monkeypatch, tmp_path, command):
    """Past this machine's memory (16 GiB here, whatever the machine running the test has) a
    run, a replay and a generated trace are one line naming --requests, not a MemoryError
    after minutes; nothing is written."""
    monkeypatch.setattr(limits, "physical_memory_bytes", lambda: 16 * 2**30)
    out = tmp_path / "out"
    command = [str(out) if part == "OUT" else part for part in command]
    line = one_error_line(runner.invoke(app, [*command, "--requests", "1000000000"]))
    assert "field '--requests'" in line and "1,000,000,000 requests" in line
    assert not out.exists()


def test_a_gpu_that_never_recovers_is_stopped_naming_the_flags(monkeypatch):
    """Failing about once a second and down a day each time, the GPU serves nothing and the
    run only ticks through failures: the watchdog stops it, naming the flags to change."""
    monkeypatch.setattr(limits, "NO_PROGRESS_WALL_S", 0.3)
    result = runner.invoke(app, ["run", "--requests", "3", "--gpu-failure-rate", "3600",
                                 "--gpu-recovery", "86400", "--max-retries", "1000", "--json"])
    line = one_error_line(result)
    assert "no progress" in line
    assert "--gpu-failure-rate" in line and "--gpu-recovery" in line
