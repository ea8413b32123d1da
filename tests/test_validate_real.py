"""A small validation on this machine's CPU: the real engine against the simulation.

``ragsim validate --backend torch --sequential`` on a small trace (200 requests of three short
documents and four output tokens, tight GPU and host memories so that nodes are swapped out,
back in and dropped), with a profile measured minutes earlier in this session (``quick_profile``).

* **Hit agreement is exact**: one request at a time, the real run and the simulation make the
  same cache decisions (the policy core's, not timing's), so every request's cached tokens per
  tier must be equal: 1.0, no margin.
* **Raw TTFT errors within the targets plus a stated noise margin.** The targets are 10%
  (mean) and 25% (p90 of per-request |error|). The errors checked are the raw ones (the
  simulation priced by the profile as measured); the machine-speed probe is printed beside them
  and only decides whether something is measured again, never what passes: a run during which
  the machine's speed moved by more than 10% (at most ``ATTEMPTS`` runs), and a profile the
  machine no longer runs at (steady, but more than ``STALE_PROFILE`` from it: the profile was
  measured under a neighbour's load that has since gone, or the other way round), which is
  measured afresh once and shared with the tests after it. CI's run of 2026-12-06 met one: the
  session's profile measured some ten minutes before, vllm steady at x0.76-0.81 of it, raw mean
  error +27.4%, iterations predicted 1.25x their time; at rest (2026-12-07 00:51) the three read
  x0.90-0.94 and +2.6%, +5.9%, +6.4%; with the session's profile made stale by hand (its
  compute priced 1.4x) sglang re-measured it and read +4.1%, and vllm after it, on the fresh
  one, +6.4%. The margins
  (``MEAN_MARGIN``, ``P90_MARGIN``) were measured on this project's shared 2-core machine with
  other engineers' jobs running (2026-12-02 17:23-17:32 UTC, load average 2.4 rising to 5.6;
  the machine 1.3-1.7x slower than when the profile was measured minutes before, each system's
  first two attempts unsteady): raw mean errors ragcache -23.1%, sglang -18.7%, vllm -24.5%,
  p90 |errors| 37.4%, 28.5%, 32.9%, iterations predicted 0.56-0.62 of their measured time. So
  the bounds (25% mean, 50% p90) hold under such a load with little room; a heavier load can
  fail the test, and then says more about the neighbours than about the model (rerun at
  rest). A machine at rest should meet the targets themselves; the margins are what a busy neighbour
  adds, not what the model is allowed to miss. The test fails when the model is wrong (a
  prefill priced at half its cost, a pipeline that forgets the search: errors of 50% and more).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch  # noqa: F401 - [profile] is in [dev]: missing is a broken set-up, not a skip
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.traces.io import TraceBuilder, write_trace

pytestmark = pytest.mark.slow  # minutes of real time: CI runs them (pytest -m slow)

TARGET_MEAN_ABS_ERROR = 0.10
TARGET_P90_ABS_ERROR = 0.25
# margins on top of the targets for the raw errors on a shared machine (measured: the module
# docstring): the mean's for a neighbour's load, the p90's also for per-request jitter (a
# request whose prefill met a slow millisecond)
MEAN_MARGIN = 0.15
P90_MARGIN = 0.25
ATTEMPTS = 3
# the machine's steady speed against the profile beyond which the profile is measured again:
# at rest the probe reads x0.90-0.94 (module docstring), a stale profile x0.76-0.81
STALE_PROFILE = 0.15
REQUESTS = 200


def small_trace(n: int = REQUESTS, seed: int = 5, documents: int = 40):
    """Zipf-like retrieval of 3 of 40 documents (40-300 tokens), queries of 8-40 tokens, four
    output tokens: prefills inside the quick profile's grid, decode short, a run of seconds."""
    rng = np.random.default_rng(seed)
    sizes = {d: int(rng.integers(40, 301)) for d in range(documents)}
    weights = 1.0 / np.arange(1, documents + 1) ** 0.9
    weights /= weights.sum()
    b = TraceBuilder("validation-small")
    for i in range(n):
        docs = [int(d) for d in rng.choice(documents, size=3, replace=False, p=weights)]
        b.add(i, 0.0, int(rng.integers(8, 41)), 4, docs, [sizes[d] for d in docs])
    return b.build({"name": "validation-small"})


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return write_trace(small_trace(), tmp_path_factory.mktemp("trace") / "small")


@pytest.mark.parametrize("system", ["ragcache", "sglang", "vllm"])
def validate_once(quick_profile, trace_dir, out, system) -> dict:
    result = CliRunner().invoke(app, [
        "validate", "--backend", "torch", "--sequential", "--trace", str(trace_dir),
        "--system", system, "--requests", str(REQUESTS), "--profile", str(quick_profile),
        "--gpu-mem", "4MiB", "--host-mem", "2MiB", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == json.loads((out / "validation.json").read_text())
    return report


@pytest.fixture(scope="module")
def current_profile(quick_profile, tmp_path_factory) -> dict:
    """The profile the validations run on: the session's, until one finds the machine no
    longer runs at it and measures it afresh (``fresh``: how many times); the tests after it
    start from the fresh one."""
    return {"path": quick_profile, "fresh": 0, "factory": tmp_path_factory}


def stale(speed: dict | None) -> bool:
    return bool(speed and speed["steady"] and abs(speed["factor"] - 1) > STALE_PROFILE)


@pytest.mark.timeout(1500)  # the session's profile, a fresh one and up to three runs
@pytest.mark.parametrize("system", ["ragcache", "sglang", "vllm"])
def test_sequential_validation_on_this_cpu(current_profile, trace_dir, tmp_path, system):
    from conftest import measure_quick_profile

    remeasured = False
    for attempt in range(ATTEMPTS):
        report = validate_once(current_profile["path"], trace_dir, tmp_path / f"try{attempt}",
                               system)
        assert report["requests"] == REQUESTS and report["requests_dropped"] == 0
        assert report["backend"] == "torch" and report["real"]["backend"] == "torch"
        assert report["hit_agreement"] == 1.0  # every attempt: decisions never depend on time
        speed = report["machine_speed"]
        if stale(speed) and not remeasured and attempt + 1 < ATTEMPTS:
            remeasured = True
            current_profile["fresh"] += 1
            current_profile["path"] = measure_quick_profile(
                current_profile["factory"].mktemp("fresh_profile") / "cpu.json")
            continue
        if speed["steady"]:
            break
    if system != "vllm":  # vllm: no cache; the others must have reused and moved KV
        assert report["real"]["token_hit_rate"] > 0
        moves = report["real"]["engine_moves"]
        assert moves.get("swap_out", 0) > 0 and moves.get("swap_in", 0) > 0
    said = {"attempts": attempt + 1, "profile_remeasured": remeasured,
            "machine_speed": report["machine_speed"],
            "raw": (report["ttft_mean_error"], report["ttft_p90_abs_error"]),
            "iteration_time_ratio": report["iteration_time_ratio"]}
    print(f"{system}: raw TTFT mean error {report['ttft_mean_error']:+.1%}, p90 |error| "
          f"{report['ttft_p90_abs_error']:.1%} ({said})")
    assert abs(report["ttft_mean_error"]) <= TARGET_MEAN_ABS_ERROR + MEAN_MARGIN, said
    assert report["ttft_p90_abs_error"] <= TARGET_P90_ABS_ERROR + P90_MARGIN, said
    assert 0.5 < report["iteration_time_ratio"] < 2.0
    # the policy core's decision time per request (the paper: < 1 ms)
    assert report["real"]["decision_p50_ms"] < 1.0


def test_sigterm_keeps_and_compares_what_ended(tmp_path):
    """A validation stopped by SIGTERM mid-run compares and writes the requests that ended in
    both runs, says so, and exits with 143. The real run of 600 mmlu requests takes about three
    minutes here; setting it up (imports, the model, a warm-up pass) about five seconds: the
    signal comes at 30 s, well inside the run on a machine several times slower or faster."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cut"
    # the engine loop given, so that no probe runs come first (the next test stops those)
    loop = tmp_path / "loop.toml"
    loop.write_text("[run]\nengine_loop_step_s = 0.0\nengine_loop_request_s = 0.0\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "ragsim", "validate", "--backend", "torch", "--sequential",
         "--trace", "mmlu", "--requests", "600", "--config", str(loop), "--out", str(out),
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    # wait until the real run is serving (its progress is not printed with --json: poll for
    # the model's start by time), then stop it
    time.sleep(30)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=max(deadline - time.monotonic(), 10))
    assert process.returncode == 143, stderr
    report = json.loads((out / "validation.json").read_text())
    assert report["interrupted"] is True
    assert 0 < report["requests"] < 600
    assert report["hit_agreement"] == 1.0
    assert "terminated" in stderr


def test_sigterm_while_the_probe_runs_serve_exits_as_during_the_runs(tmp_path):
    """SIGTERM while validate's probe runs measure the engine's loop (before any judged run):
    the stop is not swallowed by the probe run it cut short (which keeps what ended, as a run
    does) but exits 143 and says so; nothing was compared. The probe runs of 120 mmlu requests
    take minutes here; the signal comes at 20 s."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "probing"
    process = subprocess.Popen(
        [sys.executable, "-m", "ragsim", "validate", "--backend", "torch", "--sequential",
         "--trace", "mmlu", "--requests", "600", "--out", str(out), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(20)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "terminated" in stderr and "before this comparison ended" in stderr
    assert not (out / "validation.json").exists()


def test_repeated_real_runs_are_averaged_and_their_spread_measured(quick_profile, trace_dir,
                                                                   tmp_path):
    """``--repeats 2`` on the real engine: two runs of the same sequential point, each on a
    fresh engine; the report's errors are against their per-request average (the average of
    the two runs' own records, read back from their folders) and it keeps each run's own."""
    out = tmp_path / "twice"
    result = CliRunner().invoke(app, [
        "validate", "--backend", "torch", "--sequential", "--trace", str(trace_dir),
        "--system", "ragcache", "--requests", "60", "--profile", str(quick_profile),
        "--gpu-mem", "4MiB", "--host-mem", "2MiB", "--repeats", "2", "--out", str(out),
        "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    import pandas as pd

    runs = [pd.read_parquet(out / name / "requests.parquet").set_index("request_id")
            for name in ("real", "real-2")]
    ttft = [run.loc[run["status"] == "completed", "ttft_s"] for run in runs]
    sim = pd.read_parquet(out / "sim" / "requests.parquet").set_index("request_id")["ttft_s"]
    # two real runs never take the same microseconds: the spread is measured, not assumed
    assert not np.allclose(ttft[0].to_numpy(), ttft[1].to_numpy(), rtol=0, atol=1e-9)
    average = (ttft[0] + ttft[1]) / 2
    assert report["ttft_mean_error"] == pytest.approx(sim.loc[average.index].mean()
                                                      / average.mean() - 1)
    repeats = report["repeats"]
    assert repeats["runs"] == 2 and repeats["real_ttft_mean_cv"] > 0
    assert [run["ttft_mean_error"] for run in repeats["per_run"]] == pytest.approx(
        [sim.loc[t.index].mean() / t.mean() - 1 for t in ttft])
    # each run's page faults and heap growth, as its own summary gave them
    summaries = [json.loads((out / name / "summary.json").read_text())
                 for name in ("real", "real-2")]
    for run, summary in zip(repeats["per_run"], summaries, strict=True):
        assert run["minor_page_faults_while_serving"] == summary[
            "minor_page_faults_while_serving"] >= 0
        assert run["heap_grown_before_clock_s"] == summary["heap_grown_before_clock_s"] >= 0
    assert report["hit_agreement"] == 1.0  # sequential: every run decides as the policy core
