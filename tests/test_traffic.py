"""What traffic offers a cache (ragsim.traces.traffic): prefix and order-free reuse, the system
prompt's share of it, sessions and the diurnal pattern, by hand and against the replay."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace, trace_stats
from ragsim.traces.schema import Trace
from ragsim.traces.traffic import (
    diurnal_stats,
    prefix_hit_depths,
    retrieved_only,
    reuse_stats,
    seen_before,
    session_stats,
    system_prompt_mask,
)

BASE = 1000  # system-prompt segments are documents 1000 and up in these hand-made traces


def hand_trace(lists, tokens, sessions=None, arrival_s=None, prompt=True) -> Trace:
    n = len(lists)
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in lists]))).astype(np.int64)
    ids = sorted(tokens)
    return Trace(
        request_id=np.arange(n), arrival_s=np.asarray(arrival_s if arrival_s is not None
                                                      else np.arange(n), dtype=float),
        query_tokens=np.full(n, 5, np.int64), output_tokens=np.ones(n, np.int64),
        doc_offsets=offsets, doc_ids=np.array([d for x in lists for d in x], np.int64),
        document_ids=np.array(ids, np.int64),
        document_tokens=np.array([tokens[d] for d in ids], np.int64),
        session_id=None if sessions is None else pa.array(sessions, pa.string()),
        info={"system_prompt_doc_id_base": BASE} if prompt else {})


# system prompt S (1000, 100 tokens) then a varying segment (1001 or 1002, 50 tokens), then
# passages 1 (10), 2 (20), 3 (30)
TOKENS = {1000: 100, 1001: 50, 1002: 50, 1: 10, 2: 20, 3: 30}
LISTS = [
    [1000, 1001, 1, 2],   # r0: nothing seen
    [1000, 1002, 1, 2],   # r1: prefix hits S only (100); order-free S, 1, 2 (130)
    [1000, 1001, 1, 3],   # r2: prefix S, 1001, 1 (160); order-free S, 1001, 1 (160)
    [1000, 1002, 2, 2],   # r3: prefix S, 1002 (150); order-free S, 1002, 2, 2 (190)
    [1000, 1001, 1, 2],   # r4: prefix all (180); order-free all (180)
]


def test_prefix_depths_and_seen_before_by_hand():
    trace = hand_trace(LISTS, TOKENS)
    assert prefix_hit_depths(trace.doc_offsets, trace.doc_ids).tolist() == [0, 1, 3, 2, 4]
    assert seen_before(trace.doc_offsets, trace.doc_ids).tolist() == [
        False, False, False, False,
        True, False, True, True,
        True, True, True, False,
        True, True, True, True,  # the second 2 of r3 was seen in r0 (and in r3 itself)
        True, True, True, True]
    # within groups: r0, r2 in group 0; r1, r3, r4 in group 1
    groups = np.array([0, 1, 0, 1, 1])
    assert prefix_hit_depths(trace.doc_offsets, trace.doc_ids, groups).tolist() == [
        0, 0, 3, 2, 1]
    # r4 (group 1, after r1 and r3): 1000, 1 and 2 were there, 1001 only in group 0
    assert seen_before(trace.doc_offsets, trace.doc_ids, groups).tolist()[16:] == [
        True, False, True, True]


def test_seen_before_within_groups_by_hand():
    trace = hand_trace([[1, 2], [1], [2, 3], [3]], {1: 1, 2: 1, 3: 1}, prompt=False)
    groups = np.array([0, 1, 0, 1])
    # r1's 1 is new in group 1; r2's 2 was in r0 (group 0), its 3 new; r3's 3 was only in r2
    # (group 0): new in group 1
    assert seen_before(trace.doc_offsets, trace.doc_ids, groups).tolist() == [
        False, False, False, True, False, False]
    assert seen_before(trace.doc_offsets, trace.doc_ids).tolist() == [
        False, False, True, True, False, True]


def test_reuse_shares_by_hand():
    trace = hand_trace(LISTS, TOKENS)
    stats = reuse_stats(trace, system_prompt_mask(trace))
    path = 5 * 100 + 5 * 50 + (30 + 30 + 40 + 40 + 30)  # 920 tokens
    assert stats["prefix_reuse_share"] == pytest.approx((100 + 160 + 150 + 180) / path)
    assert stats["order_free_reuse_share"] == pytest.approx((130 + 160 + 190 + 180) / path)
    assert stats["system_prompt_tokens_share"] == pytest.approx(750 / path)
    passages = 170
    # prefix: r2's passage 1 (10), r4's 1 and 2 (30); order-free: r1 30, r2 10, r3 40, r4 30
    assert stats["prefix_reuse_passage_share"] == pytest.approx(40 / passages)
    assert stats["order_free_reuse_passage_share"] == pytest.approx(110 / passages)
    # prompt cut to S: [S,1,2] [S,1,2] [S,1,3] [S,2,2] [S,1,2]: passages hit 0, 30, 10, 0
    # (no earlier path has 2 after S), 30
    assert stats["prefix_reuse_passage_share_first_segment"] == pytest.approx(70 / passages)
    # no prompt: [1,2] [1,2] [1,3] [2,2] [1,2]: the same passages hit
    assert stats["prefix_reuse_passage_share_no_system_prompt"] == pytest.approx(70 / passages)


def test_sessions_by_hand():
    sessions = ["a", "b", "a", "b", "b"]
    trace = hand_trace(LISTS, TOKENS, sessions=sessions)
    stats = session_stats(trace, system_prompt_mask(trace))
    assert stats["sessions"] == 2 and stats["requests_per_session_max"] == 3
    assert stats["requests_per_session_mean"] == pytest.approx(2.5)
    assert stats["single_request_session_share"] == 0.0
    # within a session: r2 after r0 hits S, 1001, 1 (160); r3 after r1 hits S, 1002 (150);
    # r4 after r1, r3 hits S only (100): 1001 is new in session b
    assert stats["prefix_reuse_share_within_session"] == pytest.approx(410 / 920)
    # order-free within: r2: S, 1001, 1 (160); r3: S, 1002, 2, 2 (190); r4: S, 1, 2 (130)
    assert stats["order_free_reuse_share_within_session"] == pytest.approx(480 / 920)
    assert session_stats(hand_trace(LISTS, TOKENS)) == {}


def test_retrieval_rows_describe_the_passages_alone():
    trace = hand_trace(LISTS, TOKENS)
    passages = retrieved_only(trace, system_prompt_mask(trace))
    assert passages.docs_of(3).tolist() == [2, 2]
    assert passages.document_ids.tolist() == [1, 2, 3]
    stats = trace_stats(trace)
    assert stats["retrievals"] == 10 and stats["documents_in_table"] == 3
    assert stats["doc_tokens_retrieved"] == 170 and stats["path_tokens_total"] == 920
    assert stats["system_prompt_distinct_by_position"] == [1, 2]


def test_diurnal_pattern_by_hand():
    # clock origin at noon: requests at 0 s (12:00), 3,600 s (13:00) twice, 13 h (01:00 the
    # next day) and 25 h (13:00 the next day)
    hour = 3600.0
    trace = hand_trace([[1]] * 5, {1: 1}, arrival_s=[0, hour, hour, 13 * hour, 25 * hour],
                       prompt=False)
    trace.info = {"clock_origin_hour": 12}
    stats = diurnal_stats(trace)
    shares = stats["arrivals_by_hour_of_day"]
    assert shares[12] == 0.2 and shares[13] == 0.6 and shares[1] == 0.2
    assert stats["busiest_hour_of_day"] == 13
    assert stats["busiest_to_quietest_hour"] is None  # hours without requests
    assert stats["requests_by_day"] == [3, 2]  # from midnight: 12:00, 13:00 x2 | 01:00, 13:00
    assert diurnal_stats(hand_trace([[1]] * 2, {1: 1}, prompt=False)) == {}


@pytest.mark.parametrize("name,n", [("ragpulse", None), ("mmlu", 3000), ("wiki-trivia", None)])
def test_prefix_reuse_is_the_replay_at_unlimited_memory(name, n):
    """Two implementations of one quantity: the trie over the trace's paths and the knowledge
    tree with room for everything (the engine's one-token rule never applies here: every
    request has query tokens)."""
    trace = resolve_trace(name, n_requests=n)
    assert (trace.query_tokens > 0).all()
    config = ReplayConfig(trace=name, policy="lru", gpu_capacity_bytes=2**50,
                          host_capacity_bytes=2**50)
    summary = run_replay(trace, config).summary
    assert reuse_stats(trace)["prefix_reuse_share"] == pytest.approx(
        summary["token_hit_rate"], abs=1e-12)
