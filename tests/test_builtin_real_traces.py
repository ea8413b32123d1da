"""The recorded traces shipped with ragsim (``wiki-trivia``, ``wiki-trivia-topics``), the stage
convergence fit the simulator's defaults come from, and what the policies do on real retrieval."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import PACKAGED_TRACES, packaged_trace_dir, resolve_trace, trace_stats
from ragsim.traces.schema import Trace
from ragsim.traces.stats import stage_convergence

GiB = 2**30


@pytest.mark.parametrize("name", PACKAGED_TRACES)
def test_packaged_trace_is_what_its_report_says(name):
    trace = resolve_trace(name)
    report = json.loads((packaged_trace_dir(name) / "build_report.json").read_text())
    assert trace.n_requests == report["questions"]["requests"]
    assert trace.n_documents == report["corpus"]["documents"] == 10_033
    assert trace.stages is not None and trace.stage_times_s is not None
    assert trace.query_text is None and trace.document_text is None  # redacted: licences
    assert report["text_redacted"] is True
    stats = trace_stats(trace)
    assert stats["unique_documents_retrieved"] == report["unique_documents_retrieved"]
    for key, value in report["retrieval_skew"].items():
        assert stats[key] == pytest.approx(value)
    assert stats["stage_equals_final"] == pytest.approx(
        report["staged_search"]["stage_equals_final"], abs=1e-6)
    assert 0.9 < report["staged_search"]["recall_at_k_vs_exact"] < 1.0
    assert (np.diff(trace.arrival_s) >= 0).all()
    # the head keeps every column aligned
    head = resolve_trace(name, n_requests=10)
    assert len(head.stages) == len(head.stage_times_s) == 10


def test_stage_convergence_fit_by_hand():
    # request 0: final at stage 1 (1 trial, 1 success); request 1: at stage 2 (2 trials,
    # 1 success); request 2: only at the last stage 3 (censored: 2 trials, 0 successes)
    final = [[1, 2], [3, 4], [5, 6]]
    stages = [[[1, 2], [1, 2], [1, 2]], [[3, 9], [3, 4], [3, 4]], [[5, 8], [5, 7], [5, 6]]]
    trace = Trace(
        request_id=np.arange(3), arrival_s=np.zeros(3), query_tokens=np.ones(3, np.int64),
        output_tokens=np.ones(3, np.int64), doc_offsets=np.array([0, 2, 4, 6]),
        doc_ids=np.array(final).ravel(), document_ids=np.arange(1, 10),
        document_tokens=np.full(9, 10), stages=pa.array(stages, pa.list_(pa.list_(pa.int64()))),
        stage_times_s=pa.array([[0.1, 0.2, 0.3]] * 3, pa.list_(pa.float64())))
    fit = stage_convergence(trace)
    assert fit["stage_converge_p"] == pytest.approx(2 / 5)
    assert fit["stage_equals_final"] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert fit["search_time_mean_s"] == pytest.approx(0.6)


def test_simulator_default_convergence_is_the_fit_on_wiki_trivia():
    from ragsim.sim.config import SimConfig

    fitted = trace_stats(resolve_trace("wiki-trivia"))["stage_converge_p"]
    assert SimConfig().stage_converge_p == pytest.approx(fitted, abs=0.01)


def _token_hit_rates(trace_name: str, host_gib: int) -> dict[str, float]:
    trace = resolve_trace(trace_name)
    profile = load_profile("a10g-mistral-7b")
    return {policy: run_replay(trace, ReplayConfig(trace=trace_name, policy=policy,
                                                   host_capacity_bytes=host_gib * GiB),
                               profile).summary["token_hit_rate"]
            for policy in ("pgdsf", "lru", "lfu")}


@pytest.mark.parametrize("host_gib", [2, 8])
def test_pgdsf_beats_lru_and_lfu_when_topics_drift(host_gib):
    """On real retrieval whose topics move (questions in their lists' order), PGDSF keeps more
    than LRU and clearly more than LFU, whose old counts pin stale topics."""
    hit = _token_hit_rates("wiki-trivia-topics", host_gib)
    assert hit["pgdsf"] >= hit["lru"], hit
    assert hit["pgdsf"] > 1.1 * hit["lfu"], hit


def test_lfu_wins_on_stationary_real_retrieval():
    """The other side, kept visible: shuffled questions make popularity stationary, where
    counting every retrieval (LFU) is the best estimate of the future (README, findings)."""
    hit = _token_hit_rates("wiki-trivia", 8)
    assert hit["lfu"] > hit["pgdsf"] > hit["lru"], hit
