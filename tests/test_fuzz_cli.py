"""Fuzzing the command line end to end: odd configurations, traces and profiles, run by
``ragsim run`` in-process, each case under a timer. Whatever the input, the command ends in
bounded time with exit code 0 or 2 and no traceback; when it runs (0), its result agrees with
its trace: every request accounted for (completed + failed + pending = requests, pending only
when the run was stopped), no TTFT below zero.

test_fuzz_readers.py fuzzes the readers alone; this drives what they feed (the configuration's
checks, the simulator, the writing of results) with what got through. The examples are few so
the default suite stays fast (about 10 s); RAGSIM_FUZZ_EXAMPLES=300 searches harder. On the
code before issue 32's fixes it failed on nested JSON and TOML (RecursionError tracebacks), and
on a fleet given a trace whose clock starts late (a negative TTFT).
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from helpers import scratch_dir
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.profile import load_profile

EXAMPLES = int(os.environ.get("RAGSIM_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
CASE_LIMIT_S = 30  # a case that runs longer hangs (they take a fraction of a second)
runner = CliRunner()

BIG = st.sampled_from([2**63, 2**64 + 5, -(2**63) - 1, 10**30, -(10**30)])
SCALARS = st.one_of(st.integers(-3, 64), st.floats(-1, 10), BIG,
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=4))
# a value nested 100,000 deep (valid JSON and TOML, which Python's parsers recursed on): drawn
# as a marker, written as raw text in its place
DEEP_MARK = "__deep__"
DEEP_TEXT = "[" * 100_000 + "]" * 100_000


def with_deep(text: str) -> str:
    return text.replace(f'"{DEEP_MARK}"', DEEP_TEXT)


WORDS = st.sampled_from(["lru", "pgdsf", "fifo", "mixed", "prefill-first", "poisson", "gamma",
                         "trace", "sequential", "on", "off", "auto", "fixed", "window",
                         "lifetime", "head", "arrival", "synthetic", "none", "1GiB", "0",
                         "64MiB", "vllm", "sglang", "ragcache", "vllm-apc", "hash",
                         "round-robin", "least-loaded", "kv-aware"])
VALUES = st.one_of(SCALARS, WORDS, st.lists(SCALARS, max_size=3), st.just(DEEP_MARK))
# every setting a config may hold, but where the input comes from (fuzzed on their own)
FIELDS = sorted({
    "system", "n_requests", "top_k", "seed", "arrival", "rate_rps", "cv", "cache", "policy",
    "frequency_scope", "frequency_window_s", "host_cache_bytes", "gpu_kv_bytes",
    "max_cached_depth", "prefix_block_tokens", "system_prompt_tokens", "reorder",
    "reorder_window_s", "reorder_window_start", "reorder_scan", "max_batch_size",
    "max_prefill_bs", "max_batched_tokens", "search_workers", "search_s", "search_stages",
    "stage_source", "stage_converge_p", "stage_keeps_d1_p", "stage_other_found_p",
    "search_latency", "search_time_scale", "retrieval", "speculate", "overlap_swap",
    "batch_kv_sharing", "scheduler", "fail_gpu_at_s", "gpu_failure_rate_per_h",
    "host_replicas", "replicate_every_s", "gpu_recovery_s", "retry_timeout_s", "max_retries",
    "answer_cache", "answer_distance", "answer_l1_size", "answer_ttl_s", "instances",
    "answer_routing", "replicas", "router", "colour"})


class Hang(Exception):
    """The case ran past CASE_LIMIT_S."""


@contextmanager
def time_limit(seconds: int):
    """Raise Hang in this (main) thread after ``seconds`` of wall time: the simulator is pure
    Python, so the alarm interrupts whatever loop it is in."""
    def on_alarm(signum, frame):
        raise Hang(f"no end after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def good_rows(n: int = 8) -> list[dict]:
    return [{"arrival_s": 0.5 * i, "query_tokens": 20, "output_tokens": 3,
             "doc_ids": [i % 3, 7], "doc_tokens": [120, 60]} for i in range(n)]


def write_jsonl(rows: list, folder: Path) -> Path:
    path = folder / "trace.jsonl"
    path.write_text(with_deep("".join(json.dumps(r) + "\n" for r in rows)))
    return path


def run_and_check(args: list[str]) -> None:
    """``ragsim run ARGS --json --out DIR``: exit 0 or 2, never a traceback or a hang; a run
    that ends agrees with its trace."""
    out = scratch_dir("ragsim-fuzz-cli-") / "out"
    with time_limit(CASE_LIMIT_S):
        result = runner.invoke(app, ["run", *args, "--json", "--out", str(out)])
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error: "), result.output
        return
    assert result.exit_code == 0 and result.exception is None, (result.exception,
                                                                result.output)
    summary = json.loads(result.stdout)
    ended = summary["requests_completed"] + summary["requests_failed"]
    assert ended + summary["requests_pending"] == summary["requests"]
    stopped = summary["interrupted"] or summary["stalled"] or summary.get("no_progress")
    assert summary["requests_pending"] == 0 or stopped, summary
    for name in ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s"):
        assert summary[name] is None or summary[name] >= 0, (name, summary[name])
    records = pd.read_parquet(out / "requests.parquet")
    assert len(records) == summary["requests"]
    ttft = records["ttft_s"].dropna()
    assert (ttft >= 0).all(), ttft[ttft < 0]


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> Path:
    return write_jsonl(good_rows(), tmp_path_factory.mktemp("trace"))


# --------------------------------------------------------------------------- configurations
@st.composite
def configs(draw) -> dict:
    run = {key: draw(VALUES) for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4,
                                                       unique=True))}
    data: dict = {"run": run}
    top = draw(st.sampled_from(["plain", "header", "odd-version", "odd-key", "no-run"]))
    if top == "header":
        data.update({"format": "ragsim.config", "version": 1})
    elif top == "odd-version":
        data["version"] = draw(SCALARS)
    elif top == "odd-key":
        data[draw(st.sampled_from(["seed", "colour", "runs"]))] = draw(SCALARS)
    elif top == "no-run":
        data = {"seed": 1}
    return data


def _toml(data: dict) -> str | None:
    """TOML of ``data``, or None where TOML cannot say it (NaN is fine; None is not)."""
    try:
        return tomli_w.dumps(data)
    except (TypeError, ValueError):
        return None


@FUZZ
@given(data=configs())
def test_odd_configurations_end_cleanly(good_trace, data):
    text = _toml(data)
    if text is None:
        return
    config = scratch_dir("ragsim-fuzz-cli-") / "config.toml"
    config.write_text(with_deep(text))
    run_and_check(["--config", str(config), "--trace", str(good_trace), "--requests", "8"])


# --------------------------------------------------------------------------- traces
ROW_JUNK = st.one_of(SCALARS, st.none(), st.lists(st.one_of(SCALARS, st.none()), max_size=3),
                     st.just([[[[1]]]]), st.just(-1), st.just(10**400), st.just(DEEP_MARK))


@st.composite
def traces(draw) -> list:
    rows = good_rows(draw(st.integers(1, 8)))
    start_s = draw(st.sampled_from([0.0, 100.0, 1.7e9]))  # logged wall-clock timestamps
    for row in rows:
        row["arrival_s"] += start_s
    for _ in range(draw(st.integers(0, 3))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        key = draw(st.sampled_from(sorted(row)))
        action = draw(st.sampled_from(["junk", "drop", "in-list", "big-time", "twice"]))
        if action == "drop":
            row.pop(key)
        elif action == "in-list" and isinstance(row[key], list):
            row[key] = [*row[key][:-1], draw(ROW_JUNK)]
        elif action == "big-time":
            row["arrival_s"] = draw(st.sampled_from([1e9, 1.7e9, 1e300, 0.0]))
        elif action == "twice":  # a document listed twice: legitimate, counted
            row["doc_ids"], row["doc_tokens"] = [5, 5], [40, 40]
        else:
            row[key] = draw(ROW_JUNK)
    return rows


# one engine, or a fleet whose router decides ahead (round-robin) or at each arrival
FLEETS = st.sampled_from([[], ["--replicas", "2", "--router", "round-robin"],
                          ["--replicas", "2", "--router", "least-loaded"],
                          ["--replicas", "3", "--router", "kv-aware"]])


@FUZZ
@given(rows=traces(), arrival=st.sampled_from(["trace", "poisson", "sequential"]),
       fleet=FLEETS)
@example(rows=[{**row, "arrival_s": row["arrival_s"] + 100.0} for row in good_rows()],
         arrival="trace", fleet=["--replicas", "2", "--router", "least-loaded"])
def test_odd_jsonl_traces_end_cleanly(rows, arrival, fleet):
    """A fleet too, on a trace whose clock starts late (before issue 32's fleet fix its first
    request was served at t = 0: a TTFT of -100 s)."""
    folder = scratch_dir("ragsim-fuzz-cli-")
    path = write_jsonl(rows, folder)
    run_and_check(["--trace", str(path), "--arrival", arrival, *fleet,
                   *(["--rate", "2"] if arrival == "poisson" else [])])


# --------------------------------------------------------------------------- profiles
SHIPPED = load_profile("a10g-mistral-7b").to_dict()


@st.composite
def profiles(draw) -> dict:
    data = copy.deepcopy(SHIPPED)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(data)))
        target = data[key]
        if isinstance(target, dict) and target and draw(st.booleans()):
            inner = draw(st.sampled_from(sorted(target)))
            if isinstance(target[inner], list) and target[inner] and draw(st.booleans()):
                values = target[inner]
                i = draw(st.integers(0, len(values) - 1))
                values[i] = draw(st.one_of(ROW_JUNK, st.just(float("nan"))))
            else:
                target[inner] = draw(ROW_JUNK)
        else:
            data[key] = draw(st.one_of(ROW_JUNK, st.floats(0, 1e300)))
    return data


@FUZZ
@given(data=profiles())
def test_odd_profiles_end_cleanly(good_trace, data):
    path = scratch_dir("ragsim-fuzz-cli-") / "profile.json"
    path.write_text(with_deep(json.dumps(data)))
    run_and_check(["--profile", str(path), "--trace", str(good_trace)])


def test_the_timer_stops_a_hang():
    """The per-case timer can fail a test: a loop that never ends is cut off as a Hang."""
    with pytest.raises(Hang), time_limit(1):
        while True:
            math.sqrt(2.0)

