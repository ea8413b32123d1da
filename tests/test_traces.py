"""Trace format v1: round trips, importers, built-in generators, and clear errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import shared_trace, token_hit_rates

from ragsim.errors import TraceError
from ragsim.traces import (
    builtin_trace,
    read_jsonl,
    read_mooncake,
    read_trace,
    resolve_trace,
    trace_stats,
    write_jsonl,
    write_trace,
)


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = [
    {"arrival_s": 0.0, "query_tokens": 60, "output_tokens": 32, "doc_ids": [7, 3],
     "doc_tokens": [812, 430]},
    {"arrival_s": 0.5, "query_tokens": 10, "output_tokens": 4, "doc_ids": [3]},
    {"arrival_s": 0.5, "query_tokens": 0, "output_tokens": 1, "doc_ids": [3, 9],
     "doc_tokens": [999, 5]},
]


def test_jsonl_import_first_size_wins_and_mismatch_is_reported(tmp_path):
    trace = read_jsonl(write_lines(tmp_path / "t.jsonl", GOOD))
    assert trace.n_requests == 3
    assert dict(zip(trace.document_ids.tolist(), trace.document_tokens.tolist(), strict=True)) \
        == {3: 430, 7: 812, 9: 5}
    assert trace.info["document_size_mismatches"] == 1
    assert "row 3" in trace.info["first_size_mismatch"]


def test_parquet_and_jsonl_round_trips(tmp_path):
    trace = builtin_trace("mmlu", n_requests=500, seed=3)
    again = read_trace(write_trace(trace, tmp_path / "t"))
    for name in ("request_id", "arrival_s", "query_tokens", "output_tokens", "doc_offsets",
                 "doc_ids", "document_ids", "document_tokens"):
        np.testing.assert_array_equal(getattr(again, name), getattr(trace, name))
    assert again.info == trace.info
    back = read_jsonl(write_jsonl(again, tmp_path / "t.jsonl"))
    np.testing.assert_array_equal(back.doc_ids, trace.doc_ids)
    np.testing.assert_array_equal(back.doc_tokens_flat, trace.doc_tokens_flat)
    np.testing.assert_allclose(back.arrival_s, trace.arrival_s)


def test_optional_columns_survive_a_round_trip(tmp_path):
    trace = builtin_trace("nq", n_requests=3)
    stages = pa.array([[[int(d) for d in trace.docs_of(i)][::-1], list(trace.docs_of(i))]
                       for i in range(3)], pa.list_(pa.list_(pa.int64())))
    trace.stages = stages
    trace.query_text = pa.array(["a?", "b?", "c?"])
    trace.has_history = np.array([False, True, False])
    again = read_trace(write_trace(trace, tmp_path / "t"))
    assert again.stages.to_pylist() == stages.to_pylist()
    assert again.query_text.to_pylist() == ["a?", "b?", "c?"]
    assert again.has_history.tolist() == [False, True, False]


@pytest.mark.parametrize("row,field,bad", [
    (2, "arrival_s", {"arrival_s": -1.0}),
    (2, "arrival_s", {"arrival_s": float("nan")}),
    (3, "arrival_s", {"arrival_s": 0.1}),  # goes backwards after 0.5
    (2, "doc_ids", {"doc_ids": []}),
    (2, "doc_ids", {"doc_ids": [3.5]}),
    (2, "doc_ids", {"doc_ids": ["3"]}),
    (2, "doc_tokens", {"doc_ids": [11], "doc_tokens": [0]}),
    (2, "doc_tokens", {"doc_ids": [11]}),  # first sighting without a size
    (2, "query_tokens", {"query_tokens": -3}),
    (2, "output_tokens", {"output_tokens": 1.5}),
    (2, "colour", {"colour": "red"}),
])
def test_jsonl_errors_name_file_row_and_field(tmp_path, row, field, bad):
    rows = [dict(r) for r in GOOD]
    target = row - 1
    if row == 3:
        rows[1]["arrival_s"] = 0.5
    rows[target] = {**rows[target], **bad}
    path = write_lines(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TraceError) as info:
        read_jsonl(path)
    assert (info.value.file, info.value.row, info.value.field) == (str(path), row, field)
    assert str(path) in str(info.value) and f"row {row}" in str(info.value)


def test_malformed_json_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD[0]) + "\n{not json\n")
    with pytest.raises(TraceError, match="row 2"):
        read_jsonl(path)


def _write_tables(tmp_path, requests: dict, documents: dict, version=b"1"):
    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    meta = {b"ragsim.trace_version": version}
    pq.write_table(pa.table(requests).replace_schema_metadata(meta), d / "requests.parquet")
    pq.write_table(pa.table(documents).replace_schema_metadata(meta), d / "documents.parquet")
    return d


def base_tables():
    requests = {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "query_tokens": [5, 5],
                "output_tokens": [1, 1], "doc_ids": [[1, 2], [2]]}
    documents = {"doc_id": [1, 2], "tokens": [10, 20]}
    return requests, documents


@pytest.mark.parametrize("mutate,file,row,field", [
    (lambda r, d: r.update(arrival_s=[0.0, -1.0]), "requests", 1, "arrival_s"),
    (lambda r, d: r.update(arrival_s=[1.0, 0.0]), "requests", 1, "arrival_s"),
    (lambda r, d: r.update(doc_ids=[[1, 2], []]), "requests", 1, "doc_ids"),
    (lambda r, d: r.update(doc_ids=[[1, 2], [3]]), "requests", 1, "doc_ids"),
    (lambda r, d: r.update(doc_ids=[[1.5], [2.0]]), "requests", None, "doc_ids"),
    (lambda r, d: r.update(request_id=[4, 4]), "requests", 1, "request_id"),
    (lambda r, d: r.update(extra=[1, 2]), "requests", None, "extra"),
    (lambda r, d: r.pop("output_tokens"), "requests", None, "output_tokens"),
    (lambda r, d: d.update(tokens=[10, 0]), "documents", 1, "tokens"),
    (lambda r, d: d.update(doc_id=[2, 2]), "documents", 1, "doc_id"),
])
def test_parquet_errors_name_file_row_and_field(tmp_path, mutate, file, row, field):
    requests, documents = base_tables()
    mutate(requests, documents)
    d = _write_tables(tmp_path, requests, documents)
    with pytest.raises(TraceError) as info:
        read_trace(d)
    assert info.value.file == str(d / f"{file}.parquet")
    assert (info.value.row, info.value.field) == (row, field)


def test_wrong_version_is_refused(tmp_path):
    d = _write_tables(tmp_path, *base_tables(), version=b"2")
    with pytest.raises(TraceError, match="version 2") as info:
        read_trace(d)
    assert info.value.field == "version"


def test_mooncake_import_of_the_shared_sample(mooncake_sample):
    trace = read_mooncake(mooncake_sample)
    lines = [json.loads(x) for x in mooncake_sample.read_text().splitlines() if x.strip()]
    assert trace.n_requests == len(lines)
    # every request's blocks and sizes worked out from the raw rows: 512-token blocks, the last
    # one the rest of input_length; a block met again keeps its first size, a different size
    # counts as a mismatch
    first_size: dict[int, int] = {}
    mismatches = 0
    expected_ids, expected_sizes = [], []
    for line in lines:
        blocks = line["hash_ids"]
        own = [512] * (len(blocks) - 1) + [line["input_length"] - 512 * (len(blocks) - 1)]
        for block, size in zip(blocks, own, strict=True):
            first_size.setdefault(block, size)
            mismatches += first_size[block] != size
            expected_ids.append(block)
            expected_sizes.append(first_size[block])
    assert trace.doc_ids.tolist() == expected_ids
    assert trace.doc_tokens_flat.tolist() == expected_sizes
    assert trace.info.get("document_size_mismatches", 0) == mismatches
    # the first row by hand: 40,160 tokens in 79 blocks, 78 of 512 and the last of 224
    assert len(lines[0]["hash_ids"]) == 79 and lines[0]["input_length"] == 40_160
    assert trace.doc_tokens_flat[:79].tolist() == [512] * 78 + [224]
    assert trace.query_tokens.sum() == 0
    assert trace.arrival_s[-1] == pytest.approx(lines[-1]["timestamp"] / 1000)


def test_mooncake_blocks_and_partial_last_block(tmp_path):
    path = write_lines(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 7, "hash_ids": [0, 1]},
        {"timestamp": 1600, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]},
    ])
    trace = read_mooncake(path)
    assert trace.doc_tokens_flat.tolist() == [512, 512, 76, 512, 512, 512, 512, 76]
    assert trace.info["document_size_mismatches"] == 1  # block 2: 76 first, then 476
    assert trace.arrival_s.tolist() == [0.0, 1.5, 1.6]
    bad = write_lines(tmp_path / "bad.jsonl", [
        {"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [0, 1]}])
    with pytest.raises(TraceError) as info:
        read_mooncake(bad)
    assert (info.value.row, info.value.field) == (1, "input_length")


def test_builtin_traces_are_deterministic_and_calibrated():
    a = builtin_trace("mmlu", seed=7, n_requests=4000)
    b = builtin_trace("mmlu", seed=7, n_requests=4000)
    np.testing.assert_array_equal(a.doc_ids, b.doc_ids)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(builtin_trace("mmlu", seed=8, n_requests=4000).doc_ids, a.doc_ids)
    mmlu = trace_stats(builtin_trace("mmlu"))
    nq = trace_stats(builtin_trace("nq"))
    assert mmlu["top_3pct_share"] == pytest.approx(0.60, abs=0.02)
    assert nq["top_3pct_share"] == pytest.approx(0.30, abs=0.02)
    assert nq["top_3pct_share"] < mmlu["top_3pct_share"]
    assert mmlu["top_k_min"] == mmlu["top_k_max"] == 2
    # every request's documents are distinct
    t = builtin_trace("mmlu", n_requests=2000)
    lists = t.doc_ids.reshape(-1, 2)
    assert (lists[:, 0] != lists[:, 1]).all()


def test_resolve_trace_unknown_name():
    with pytest.raises(TraceError, match="built-in"):
        resolve_trace("no-such-trace")


def test_stats_skew_on_a_hand_made_trace(tmp_path):
    rows = [{"arrival_s": float(i), "query_tokens": 1, "output_tokens": 1,
             "doc_ids": [0] if i < 70 else [i], "doc_tokens": [10]} for i in range(100)]
    stats = trace_stats(read_jsonl(write_lines(tmp_path / "s.jsonl", rows)))
    # 31 distinct documents; the top 1 (ceil of 1% of 31) takes 70 of 100 retrievals
    assert stats["unique_documents_retrieved"] == 31
    assert stats["top_1pct_share"] == pytest.approx(0.70)
    assert stats["top_10pct_share"] == pytest.approx(0.73)


def test_popularity_drift_is_recorded_calibrated_and_changes_what_is_popular():
    from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

    still = shared_trace("mmlu", 20_000, drift_per_1k_requests=0.0)
    slow = shared_trace("mmlu", 20_000, drift_per_1k_requests=0.1)
    moving = shared_trace("mmlu", 20_000, drift_per_1k_requests=0.3)
    default = shared_trace("mmlu", 20_000)
    assert still.info["parameters"]["drift_per_1k_requests"] == 0.0
    assert default.info["parameters"]["drift_per_1k_requests"] == BUILTIN_DRIFT_PER_1K_REQUESTS
    for trace in (default, slow, moving):  # the skew is calibrated with the drift in place
        assert trace_stats(trace)["top_3pct_share"] == pytest.approx(0.60, abs=0.02)

    def top(trace, lo, hi):
        ids, counts = np.unique(trace.doc_ids[2 * lo: 2 * hi], return_counts=True)
        return set(ids[np.argsort(counts)[-50:]])

    # the 50 hottest documents of the first and last 2,000 requests
    overlap = {name: len(top(t, 0, 2000) & top(t, 18_000, 20_000))
               for name, t in (("still", still), ("slow", slow), ("moving", moving))}
    assert overlap["still"] > 35 and overlap["moving"] < 10, overlap
    assert overlap["moving"] < overlap["slow"] < overlap["still"], overlap


@pytest.mark.parametrize("scope", ["lifetime", "admission"])
def test_drift_is_where_frequency_alone_stops_winning(scope):
    """Stationary Zipf is LFU's best case: counting every retrieval is the best estimate of the
    future, and PGDSF's greedy-dual clock spends memory on recency. Under one counting rule
    LFU keeps the most there (replay, 20,000 mmlu requests: 41.5% against PGDSF's 38.3%
    counting over the lifetime, 38.8% against 34.7% from admission). When topics move (0.3
    of the ranks per 1,000 requests), LFU's counts pin stale documents and the aging wins
    (46.1% against 38.2%; 44.6% against 30.6%). PGDSF keeps more than GDSF and LRU on both."""
    still = token_hit_rates("mmlu", n_requests=20_000, drift_per_1k_requests=0.0,
                            frequency_scope=scope)
    moving = token_hit_rates("mmlu", n_requests=20_000, drift_per_1k_requests=0.3,
                             frequency_scope=scope)
    for rate in (still, moving):
        assert rate["pgdsf"] > max(rate["gdsf"], rate["lru"]), rate
    assert still["pgdsf"] < 0.95 * still["lfu"], still
    assert moving["pgdsf"] > 1.15 * moving["lfu"], moving


@pytest.mark.parametrize("scope", ["lifetime", "admission"])
def test_on_drifting_nq_pgdsf_keeps_the_most_under_either_shared_rule(scope):
    """Drift of 30% of the ranks per 1,000 requests (the built-in traces: 78%) on ``nq``, in
    ``replay`` (GPU 4 GiB + host 32 GiB, seeded), every policy counting by the same rule:
    PGDSF keeps the most, above the paper's lower ends (1.02x GDSF, 1.06x LRU and LFU).
    Counting over the lifetime: 14.5% against GDSF 13.9%, LRU 11.4%, LFU 12.9% (1.04x,
    1.28x, 1.13x); from admission: 13.2% against 12.4%, 11.4%, 9.8% (1.06x, 1.16x, 1.36x).
    The 1.17x and 1.49x reported before set PGDSF's lifetime counts against GDSF's and
    LFU's counts from admission."""
    rate = token_hit_rates("nq", n_requests=20_000, drift_per_1k_requests=0.3,
                           frequency_scope=scope)
    assert rate["pgdsf"] > 1.02 * rate["gdsf"], rate
    assert rate["pgdsf"] > 1.06 * rate["lru"], rate
    assert rate["pgdsf"] > 1.06 * rate["lfu"], rate


@pytest.mark.parametrize("scope", ["lifetime", "admission"])
def test_on_long_slowly_moving_traces_lfu_keeps_the_most(scope):
    """The regime map (benchmarks/policy_regimes.py) on 100,000 ``nq`` requests, GPU 4 GiB +
    host 32 GiB, seeded, every policy counting by the same rule: stationary, and with 1% of
    the popularity ranks moving per 1,000 requests, LFU's counts converge and it keeps the
    most (lifetime: 10.0% and 10.2% against PGDSF's 7.3% and 8.6%; from admission: 7.9% and
    7.8% against 4.1% and 5.7%): the GDS clock spends memory on recency that slow traffic
    does not reward. PGDSF keeps more than GDSF and LRU. (PGDSF first at 1% drift, reported
    before, set its lifetime counts against LFU's counts from admission; PGDSF is first when
    topics move fast: test_drift_is_where_frequency_alone_stops_winning.)"""
    host = 32 * 2**30
    for drift in (0.0, 0.01):
        rate = token_hit_rates("nq", n_requests=100_000, drift_per_1k_requests=drift,
                               host_capacity_bytes=host, frequency_scope=scope)
        assert rate["lfu"] > 1.1 * rate["pgdsf"], (drift, rate)
        assert rate["pgdsf"] > max(rate["gdsf"], rate["lru"]), (drift, rate)


@pytest.mark.parametrize("looked_up_first", [False, True])
def test_head_keeps_document_sizes_right_whether_or_not_they_were_looked_up(looked_up_first):
    trace = builtin_trace("nq", n_requests=300)
    if looked_up_first:
        trace.doc_tokens_flat  # noqa: B018 -- fills the cache that head() passes on
    head = trace.head(120)
    end = int(trace.doc_offsets[120])
    # against the whole trace's sizes, looked up independently of head()
    whole = trace.document_tokens[np.searchsorted(trace.document_ids, trace.doc_ids)]
    assert len(head.doc_ids) == end
    assert np.array_equal(head.doc_tokens_flat, whole[:end])


def test_compressed_mooncake_reads_as_the_plain_file_and_a_broken_one_names_itself(
        mooncake_sample, tmp_path):
    """The shipped copy is xz; gzip and bz2 are read the same way, as the plain JSONL is."""
    import bz2
    import gzip

    from conftest import MOONCAKE_SAMPLE_XZ

    plain = read_mooncake(mooncake_sample)
    raw = mooncake_sample.read_bytes()
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "t.jsonl.bz2").write_bytes(bz2.compress(raw))
    for path in (MOONCAKE_SAMPLE_XZ, tmp_path / "t.jsonl.gz", tmp_path / "t.jsonl.bz2"):
        packed = read_mooncake(path)
        assert packed.n_requests == plain.n_requests == len(raw.splitlines())
        assert np.array_equal(packed.doc_ids, plain.doc_ids)
        assert np.array_equal(packed.arrival_s, plain.arrival_s)
    broken = tmp_path / "broken.jsonl.xz"
    broken.write_bytes(MOONCAKE_SAMPLE_XZ.read_bytes()[:5000])
    with pytest.raises(TraceError) as info:
        read_mooncake(broken)
    assert info.value.file == str(broken)


def test_a_generated_trace_is_kept_for_the_next_run_and_cannot_be_changed_by_one():
    """Sweeps run dozens of points on one synthetic trace: it is generated once per process.
    What a run gets must be the same trace every time, and no run may alter the next one's."""
    from ragsim.traces.synthetic import BUILTIN_SPECS, generate

    first = resolve_trace("mmlu", n_requests=300, seed=4)
    first.info["touched"] = True
    with pytest.raises(ValueError):
        first.arrival_s[0] = 99.0
    again = resolve_trace("mmlu", n_requests=300, seed=4)
    assert "touched" not in again.info
    fresh = generate(dataclasses.replace(BUILTIN_SPECS["mmlu"], n_requests=300, seed=4))
    for name in ("arrival_s", "query_tokens", "output_tokens", "doc_offsets", "doc_ids",
                 "document_tokens"):
        assert np.array_equal(getattr(again, name), getattr(fresh, name)), name
    assert not np.array_equal(resolve_trace("mmlu", n_requests=300, seed=5).doc_ids,
                              fresh.doc_ids)
