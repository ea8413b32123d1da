"""Popularity drift: the top-N turnover statistic, its noise correction and the generator fit.

Expected values are worked out by hand (tiny traces) or by a second, set-based implementation
(the property test); the synthetic checks use generator settings whose drift is known.
"""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsim.traces.drift import fit_drift
from ragsim.traces.schema import Trace
from ragsim.traces.stats import (
    leading_documents,
    popularity_drift,
    top_n_turnover,
    trace_stats,
)
from ragsim.traces.synthetic import SyntheticSpec, generate


def trace_of(lists: list[list[int]], gap_s: float = 1.0) -> Trace:
    """A trace whose requests retrieve ``lists`` (documents 0-99, 100 tokens each)."""
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    return Trace(request_id=np.arange(len(lists)), arrival_s=np.arange(len(lists)) * gap_s,
                 query_tokens=np.ones(len(lists), dtype=np.int64),
                 output_tokens=np.ones(len(lists), dtype=np.int64), doc_offsets=offsets,
                 doc_ids=np.array([d for x in lists for d in x], dtype=np.int64),
                 document_ids=np.arange(100), document_tokens=np.full(100, 100),
                 has_history=np.ones(len(lists), dtype=bool))


def test_turnover_of_a_hand_made_sequence():
    # windows of 4, top 2: {1, 2} -> {1, 3} (half gone) -> {4, 5} (all gone): (0.5 + 1) / 2
    keys = np.array([1, 1, 2, 2, 1, 1, 3, 3, 4, 4, 5, 5, 9])  # the partial last window is left out
    assert top_n_turnover(keys, window=4, top_n=2) == pytest.approx(0.75)
    # a tie at the cut goes to the smaller key in both windows: {3, 1} -> {3, 1}, no turnover
    assert top_n_turnover(np.array([1, 2, 3, 3, 2, 1, 3, 3]), window=4, top_n=2) == 0.0
    assert top_n_turnover(np.array([1, 2, 3, 3, 2, 1]), window=4, top_n=2) is None


def test_leading_documents_and_the_rate_per_hour_on_a_hand_made_trace():
    # leading documents 7,7,7,7 | 8,8,8,8 | 9,9,9,9: each window's top 1 is new. Second documents
    # and a request without documents (skipped) must not count.
    lists = [[7, 50 + i] for i in range(4)] + [[]] + [[8, 60 + i] for i in range(4)] \
        + [[9] for _ in range(4)]
    trace = trace_of(lists, gap_s=2.0)
    assert leading_documents(trace).tolist() == [7] * 4 + [8] * 4 + [9] * 4
    d = popularity_drift(trace, window=4, top_n=1)
    assert d["top1_turnover"] == 1.0
    # the shuffled orders keep some of their top; observed 1 corrects to 1 whatever the noise
    assert d["top1_turnover_shuffled"] < 1.0
    assert d["top1_turnover_corrected"] == pytest.approx(1.0)
    # 3 windows over the 12 requests with documents, which arrive over 24 s (one gap of 4 s)
    assert d["top1_turnover_corrected_per_hour"] == pytest.approx(3600 * 3 / 24)


def test_a_prefix_every_request_shares_is_skipped():
    # every request begins with document 0 (a chat service's system prompt, as in Mooncake's
    # conversation trace): the leading document is the one after it. [0] alone has nothing past
    # the shared prefix and is skipped, as is the request without documents.
    lists = [[0, 7, 50]] * 3 + [[0]] + [[]] + [[0, 8]] * 3 + [[0, 9, 51, 52]] * 3
    trace = trace_of(lists, gap_s=2.0)
    assert leading_documents(trace).tolist() == [7] * 3 + [8] * 3 + [9] * 3
    d = popularity_drift(trace, window=3, top_n=1)
    assert d["top1_turnover"] == 1.0
    # 3 windows over the 9 requests with a leading document: arrivals 0-4 s, 10-14 s, 16-20 s
    # (every gap 2 s, the two skipped requests at 6 and 8 s): 20 s from first to last
    assert d["top1_turnover_corrected_per_hour"] == pytest.approx(3600 * 3 / 20)
    # two shared documents are skipped as well; a trace without a shared prefix is unchanged
    assert leading_documents(trace_of([[0, 1, 5], [0, 1, 6], [0, 1, 5, 2]])).tolist() == [5, 6, 5]
    assert leading_documents(trace_of([[3, 1], [4, 1], [3]])).tolist() == [3, 4, 3]


def test_trace_stats_reports_drift_and_none_below_two_windows():
    short = trace_stats(trace_of([[i % 7, 2] for i in range(1500)]))
    assert short["top10_turnover"] is None and short["top10_turnover_corrected"] is None
    assert short["top10_turnover_window_requests"] == 1000


def _set_based_turnover(keys: np.ndarray, window: int, top_n: int) -> float | None:
    """A second implementation: one window at a time, Python sets."""
    def top(chunk):
        ids, counts = np.unique(chunk, return_counts=True)
        return {int(i) for i in ids[np.lexsort((ids, -counts))][:top_n]}

    tops = [top(keys[i * window:(i + 1) * window]) for i in range(len(keys) // window)]
    if len(tops) < 2:
        return None
    return float(np.mean([1 - len(a & b) / len(a) for a, b in pairwise(tops)]))


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(-5, 30), min_size=0, max_size=300),
       window=st.integers(1, 50), top_n=st.integers(1, 12))
def test_turnover_matches_a_set_based_implementation(keys, window, top_n):
    keys = np.array(keys, dtype=np.int64)
    got = top_n_turnover(keys, window, top_n)
    expected = _set_based_turnover(keys, window, top_n)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-12)
        assert 0.0 <= got <= 1.0


def _small(drift: float, seed: int, n_requests: int = 5000) -> Trace:
    return generate(SyntheticSpec("t", n_requests=n_requests, n_documents=2000, top_k=1,
                                  target_top3_share=0.4, drift_per_1k_requests=drift,
                                  seed=seed))


def test_corrected_turnover_is_about_zero_when_stationary_and_rises_with_drift():
    def mean_over_seeds(drift, key="top10_turnover_corrected"):
        return np.mean([popularity_drift(_small(drift, seed))[key] for seed in range(3)])

    # without drift, 1,000 requests still reshuffle their top 10 (noise) ...
    assert mean_over_seeds(0.0, "top10_turnover") > 0.15
    # ... which the shuffled control removes
    assert abs(mean_over_seeds(0.0)) < 0.1
    means = [mean_over_seeds(d) for d in (0.0, 0.3, 0.6, 1.0)]
    assert all(a < b for a, b in pairwise(means)), means
    assert means[-1] > 0.9  # every rank moved every 1,000 requests: the top is replaced


@pytest.mark.parametrize("true_drift", [0.0, 0.5])
def test_the_fit_recovers_the_drift_a_trace_was_generated_with(true_drift):
    # a seed the fit's own generated traces do not use
    fit = fit_drift(_small(true_drift, seed=50, n_requests=8000), grid=(0, 0.25, 0.5, 0.75, 1),
                    seeds=(0, 1, 2))
    assert fit.drift_per_1k_requests == pytest.approx(true_drift, abs=0.15), fit
    assert fit.spec.n_requests == 8000 and fit.spec.top_k == 1


def test_the_fit_refuses_a_trace_shorter_than_two_windows():
    with pytest.raises(ValueError, match="two windows of 1000 requests"):
        fit_drift(trace_of([[1]] * 1999))


def test_measure_drift_script_reads_the_shipped_mooncake_trace_and_prints_every_row(
        tmp_path, mooncake_sample):
    """benchmarks/measure_drift.py with its defaults (RAGPulse, the Mooncake copies in
    tests/data), without the fit: the shuffled real trace shows no drift, the topically ordered
    one a lot, and every row is what ``ragsim trace stats`` says of the same trace (Mooncake's
    imported by the CLI; RAGPulse's retrieval rows are its passages alone)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "measure_drift.py"
    result = subprocess.run([sys.executable, str(script), "--no-fit"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    first_table = result.stdout.split("\n\n")[0]  # the sensitivity table follows
    rows = {line.split(" | ")[0].removeprefix("| "): line.strip("| ").split(" | ")
            for line in first_table.splitlines() if line.startswith("| ") and "---" not in line}
    conversation = "mooncake (mooncake_conversation_trace.jsonl.xz)"
    assert set(rows) == {"trace", "ragpulse", "ragpulse, one clock", conversation,
                         "wiki-trivia-topics", "wiki-trivia",
                         "mooncake (mooncake_synthetic_trace.jsonl.xz)"}
    corrected = {name: float(cells[5]) for name, cells in rows.items() if name != "trace"}
    # each pair's observed turnover, averaged, is the observed column (one decimal each)
    for name, cells in rows.items():
        if name != "trace":
            pairs = [float(v) for v in cells[8].split(", ")]
            assert abs(sum(pairs) / len(pairs) - float(cells[3])) < 0.05 + 1e-9, name
    assert len(rows["ragpulse"][8].split(", ")) == 4  # 5,641 requests with passages: 5 windows
    # the sensitivity table's 1,000 / top 10 cell is the first table's corrected value
    assert "| ragpulse | 1,000 | " in result.stdout
    cell = result.stdout.split("| ragpulse | 1,000 | ")[1].split(" | ")[1]
    assert cell == rows["ragpulse"][5]
    assert abs(corrected["wiki-trivia"]) < 0.15
    assert corrected["wiki-trivia-topics"] > 0.5
    assert rows["mooncake (mooncake_synthetic_trace.jsonl.xz)"][1] == "3,993"
    from typer.testing import CliRunner

    from ragsim.cli import app

    runner = CliRunner()
    imported = runner.invoke(app, ["trace", "import-mooncake", str(mooncake_sample),
                                   str(tmp_path / "mc")])
    assert imported.exit_code == 0, imported.output
    data = Path(__file__).resolve().parent / "data"
    imported = runner.invoke(app, ["trace", "import-mooncake",
                                   str(data / "mooncake_conversation_trace.jsonl.xz"),
                                   str(tmp_path / "conv")])
    assert imported.exit_code == 0, imported.output
    for name, trace in (("wiki-trivia-topics", "wiki-trivia-topics"),
                        ("wiki-trivia", "wiki-trivia"), ("ragpulse", "ragpulse"),
                        (conversation, str(tmp_path / "conv")),
                        ("mooncake (mooncake_synthetic_trace.jsonl.xz)", str(tmp_path / "mc"))):
        stats = runner.invoke(app, ["trace", "stats", trace, "--json"])
        assert stats.exit_code == 0, stats.output
        d = json.loads(stats.stdout)
        assert rows[name][1:2] + rows[name][3:7] == [
            f"{d['requests']:,}", f"{d['top10_turnover']:.3f}",
            f"{d['top10_turnover_shuffled']:.3f}", f"{d['top10_turnover_corrected']:+.3f}",
            f"{d['top10_turnover_corrected_per_hour']:+.2f}"], name
