"""The simulator never hangs on idle time, and its figures cover what ran.

Far-future arrivals (Unix-epoch seconds, 1e308) once made the periodic host-replication process
step through the empty time between requests, 10 s at a time, for minutes or forever. These
tests run such traces in a child process with a timeout, so a hang fails the test instead of
stopping the suite; what they compare against is derived apart from the code: a gap's length
must not change what happens after it, and Poisson failure counts follow their rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.serving.pipeline import _tick_at_or_after
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace
from ragsim.traces.io import TraceBuilder

PROFILE = load_profile("a10g-mistral-7b")
HANG_LIMIT_S = 120  # generous for a 2-core machine; the fixed runs take about a second


def burst_trace(starts: list[float], per_burst: int = 6):
    """Bursts of requests (one every 0.5 s) starting at ``starts``; documents recur across
    bursts so the second burst's hits depend on what the cache kept over the gap."""
    b = TraceBuilder("bursts")
    row = 0
    for start in starts:
        for j in range(per_burst):
            docs = [j % 3, 10 + j % 2]
            b.add(row, start + 0.5 * j, 40, 8, docs, [700, 300])
            row += 1
    return b.build({"name": "bursts"})


def run_in_child(arrivals: list[float], **config) -> dict:
    """Simulate a trace with these arrival times in a separate interpreter, killed after
    HANG_LIMIT_S (a hang raises TimeoutExpired)."""
    code = textwrap.dedent(f"""
        import json, sys
        from ragsim.profiles.profile import load_profile
        from ragsim.serving.config import build_config
        from ragsim.serving.pipeline import _tick_at_or_after
        from ragsim.sim.simulator import run_simulation
        from ragsim.traces.io import TraceBuilder
        b = TraceBuilder("far")
        for i, t in enumerate({arrivals!r}):
            b.add(i, t, 30, 4, [i % 2, 5], [500, 200])
        trace = b.build({{}})
        s = run_simulation(trace, build_config({config!r}), load_profile("a10g-mistral-7b"))
        json.dump(s.summary, sys.stdout, default=str)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_LIMIT_S, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("arrivals", [
    [0.0, 1e7, 2e7, 3e7],  # took 6.4 s (1e7 s apart)
    [1.7e9, 1.7e9 + 1.0, 1.7e9 + 2.0],  # Unix-epoch seconds: killed after minutes
    [1e308],  # never finished
], ids=["1e7-apart", "epoch", "1e308"])
def test_far_future_arrivals_finish_with_the_default_system(arrivals):
    summary = run_in_child(arrivals)  # ragcache: host replicas every 10 s
    assert summary["requests_completed"] == len(arrivals)
    assert not summary["stalled"]
    # 1e308 s is representable, but durations vanish next to it: the summary says so
    coarse = [w for w in summary["warnings"] if "float64" in w]
    assert bool(coarse) == (max(arrivals) > 1e10)


def test_far_future_arrivals_finish_with_rate_failures():
    summary = run_in_child([0.0, 1e7, 2e7, 3e7], gpu_failure_rate_per_h=3600.0,
                           gpu_recovery_s=2.0)
    assert summary["requests_completed"] + summary["requests_failed"] == 4
    # one failure a second for 3e7 s: a Poisson count, counted even where not simulated
    expected = summary["simulated_s"]
    assert abs(summary["gpu_failures"] - expected) < 6 * np.sqrt(expected)


@pytest.mark.parametrize("extra", [
    {},
    {"fail_gpu_at_s": [40.0]},  # a failure inside the gap, 37 s after the first burst
    {"gpu_failure_rate_per_h": 20.0, "gpu_recovery_s": 1.0},
], ids=["replicas", "given-failure", "rate-failures"])
def test_a_gap_changes_nothing_after_it(extra):
    """The same two bursts, 1,000 s or 1e9 s apart (whole replica periods either way, so the
    ticks fall at the same places relative to the second burst): the second burst sees the same
    cache, so its requests get the same hits and times, measured from its start. With rate
    failures the long gap has its own failures; the seeded clock restarts a recovery time
    before the second burst, so only the failures' count differs."""
    config = build_config({"host_replicas": 4, "replicate_every_s": 1.0, "search_s": 0.01,
                           "speculate": False, **extra})
    results = {}
    for gap in (1000.0, 1e9):
        trace = burst_trace([0.0, gap])
        results[gap] = run_simulation(trace, config, PROFILE).records
    short, long = results[1000.0], results[1e9]
    second = slice(6, 12)
    for column in ("hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens", "status"):
        assert list(short[column][second]) == list(long[column][second]), column
    if "gpu_failure_rate_per_h" in extra:
        return  # the failures near the second burst are drawn apart: times may differ
    for column in ("ttft_s", "e2e_s"):
        np.testing.assert_allclose(short[column][second], long[column][second], rtol=1e-6)
    assert list(short["hit_tokens_host"][:6]) == list(long["hit_tokens_host"][:6])


def test_gaps_do_not_change_replica_copies():
    """Replicas taken after the first burst, while the system idles, are the same however
    long it idles: bytes copied to host are those of a short gap."""
    config = build_config({"host_replicas": 4, "replicate_every_s": 1.0, "speculate": False})
    copied = {gap: run_simulation(burst_trace([0.0, gap]), config, PROFILE).summary[
        "replica_bytes"] for gap in (1000.0, 1e9)}
    assert copied[1000.0] == copied[1e9] > 0


def test_an_interrupted_run_rates_what_ran():
    """Ctrl-C after 1,000 of 3,000 requests ended: the simulation speed counts those 1,000 (it
    counted all 3,000, three times too fast)."""
    trace = resolve_trace("mmlu", n_requests=3000)

    def ctrl_c(ended: int, now: float) -> None:
        if ended >= 1000:
            raise KeyboardInterrupt

    result = run_simulation(trace, build_config({"n_requests": 3000}), PROFILE, ctrl_c)
    s = result.summary
    assert s["interrupted"]
    ended = int((result.records["status"] != "pending").sum())
    assert ended == 1000 < s["requests"]
    assert s["sim_requests_per_wall_s"] * s["elapsed_s"] == pytest.approx(ended)
    # throughput counts completions over the time they took, not the requests never run
    finished = result.records["finish_s"][result.records["status"] == "completed"]
    span = finished.max() - result.records["arrival_s"].min()
    assert s["throughput_rps"] == pytest.approx(s["requests_completed"] / span)


@settings(max_examples=200, deadline=None)
@given(tick=st.floats(0, 1e6), every=st.floats(0.01, 100), ahead=st.floats(0, 9e3))
def test_ticks_resume_on_their_grid(tick, every, ahead):
    """After a sleep the next replica tick is the first of tick, tick + every, ... (summed one
    period at a time, as the ticking loop sums them) at or after the wake-up (up to a million
    periods; past them the test below)."""
    now = tick + ahead
    expected = tick
    while expected < now:
        expected += every
    assert _tick_at_or_after(tick, every, now) == expected


@given(tick=st.floats(0, 1e3), every=st.floats(0.01, 100), now=st.floats(1e12, 1e308))
def test_ticks_after_a_huge_sleep_keep_the_grid_phase(tick, every, now):
    """Past a million periods the phase is kept by a remainder: within one period after now."""
    resumed = _tick_at_or_after(tick, every, now)
    assert now <= resumed <= now + every


# --------------------------------------------------------------------------- warnings
def test_overload_is_said_with_both_rates():
    """mmlu offered at 8 req/s to an A10G that serves about 4: the queue grows for the whole
    trace, and the summary says so with both rates; at 0.5 req/s it says nothing of the kind."""
    trace = resolve_trace("mmlu", n_requests=1500)
    heavy = run_simulation(trace, build_config({"rate_rps": 8.0}), PROFILE).summary
    [line] = [w for w in heavy["warnings"] if w.startswith("overloaded")]
    offered = float(line.split("arrive at ")[1].split(" req/s")[0])
    served = float(line.split("completes ")[1].split(" req/s")[0])
    assert offered == pytest.approx(8.0, rel=0.1)  # Poisson arrivals at the asked rate
    assert served == pytest.approx(heavy["throughput_rps"], rel=1e-3) and served < offered
    light = run_simulation(trace, build_config({"rate_rps": 0.5}), PROFILE).summary
    assert not [w for w in light["warnings"] if w.startswith("overloaded")]


@pytest.fixture(scope="module")
def mooncake_head(mooncake_sample):
    from ragsim.traces import read_mooncake

    return read_mooncake(mooncake_sample).head(150)


def test_a_trace_without_retrieval_gets_no_search_unless_asked(mooncake_head):
    """Mooncake's prefix blocks had synthetic search stages and speculation by default."""
    s = run_simulation(mooncake_head, build_config({}), PROFILE).summary
    assert (s["config"]["retrieval"], s["config"]["speculate"]) == ("off", False)
    assert s["ttft_search_wait_mean_s"] == s["ttft_search_mean_s"] == 0.0
    assert s["speculations_started"] == 0 and s["stage_source"] == "none"
    assert any("no vector search" in w for w in s["warnings"])
    # asking for a search (a search setting, or speculation) models one
    asked = run_simulation(mooncake_head, build_config({"search_s": 0.02}), PROFILE).summary
    assert asked["config"]["retrieval"] == "on" and asked["config"]["speculate"]
    assert asked["ttft_search_mean_s"] == pytest.approx(0.02)
    assert not any("no vector search" in w for w in asked["warnings"])
    assert build_config({"speculate": True}).retrieval == "on"
    assert build_config({"speculate": False}).retrieval == "auto"
    # what a run used reruns the same: retrieval "off" is explicit, so no warning about it
    again = run_simulation(mooncake_head, build_config({}, base=s["config"]), PROFILE).summary
    assert again["config"]["retrieval"] == "off"
    assert not any("no vector search" in w for w in again["warnings"])


def test_extrapolated_costs_are_in_the_warnings(mooncake_head):
    s = run_simulation(mooncake_head, build_config({}), PROFILE).summary
    assert s["cost_extrapolations"] > 0
    assert any(w.startswith(f"{s['cost_extrapolations']:,} cost lookups") for w in s["warnings"])
    quiet = run_simulation(resolve_trace("mmlu", n_requests=200), build_config({}), PROFILE)
    assert quiet.summary["cost_extrapolations"] == 0
    assert not any("cost lookups" in w for w in quiet.summary["warnings"])


def test_a_synthetic_trace_longer_than_its_corpus_was_sized_for_is_noted():
    from ragsim.serving.notices import synthetic_length
    from ragsim.traces.synthetic import SyntheticSpec, builtin_trace

    info = builtin_trace("nq", n_requests=300).info
    assert synthetic_length(info) is None
    longer = {**info, "parameters": {**info["parameters"], "n_requests": 1_000_000}}
    note = synthetic_length(longer)
    assert note is not None and "1,000,000 requests" in note
    assert f"{SyntheticSpec.n_documents:,} documents" in note


def test_the_cli_prints_warnings_on_stderr_and_in_json(tmp_path, mooncake_sample):
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.traces import read_mooncake, write_trace

    folder = write_trace(read_mooncake(mooncake_sample).head(60), tmp_path / "mc")
    result = CliRunner().invoke(app, ["run", "--trace", str(folder), "--json",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["warnings"]
    for line in summary["warnings"]:
        assert line[:40] in " ".join(result.stderr.split())
    # config.toml holds what ran (retrieval decided), so a rerun models the same
    assert 'retrieval = "off"' in (tmp_path / "out" / "config.toml").read_text()
