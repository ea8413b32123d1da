"""Skew analysis: exact curves on a hand-made trace, agreement with the stats table, and the
``trace stats --plot`` command on built-in, imported and empty traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.errors import RagsimInputError
from ragsim.figures import check_plot_path
from ragsim.traces import builtin_trace, read_jsonl, read_trace, retrieval_skew, write_trace
from ragsim.traces.plots import plot_skew
from ragsim.traces.schema import Trace
from ragsim.traces.skew import (
    cumulative_share_curve,
    document_size_cdf,
    ranked_retrieval_counts,
    retrieved_document_tokens,
    share_at,
    trace_skew,
)

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Documents 1..4 of 100, 400, 1000 and 400 tokens. Document 1 is in every request: retrieval
# counts 4, 2, 1, 1 (8 retrievals over 4 documents).
TINY = [
    {"arrival_s": 0.0, "query_tokens": 5, "output_tokens": 1, "doc_ids": [1, 2],
     "doc_tokens": [100, 400]},
    {"arrival_s": 1.0, "query_tokens": 5, "output_tokens": 1, "doc_ids": [1, 3],
     "doc_tokens": [100, 1000]},
    {"arrival_s": 2.0, "query_tokens": 5, "output_tokens": 1, "doc_ids": [2, 1]},
    {"arrival_s": 3.0, "query_tokens": 5, "output_tokens": 1, "doc_ids": [1, 4],
     "doc_tokens": [100, 400]},
]


@pytest.fixture
def tiny(tmp_path) -> Trace:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY))
    return read_jsonl(path)


def test_cumulative_share_curve_of_a_tiny_trace(tiny):
    assert ranked_retrieval_counts(tiny.doc_ids).tolist() == [4, 2, 1, 1]
    rank_fraction, share = cumulative_share_curve(tiny.doc_ids)
    np.testing.assert_allclose(rank_fraction, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(share, [4 / 8, 6 / 8, 7 / 8, 1.0])
    # the top x% is ceil(x * 4) documents, at least one
    assert share_at(share, 0.03) == pytest.approx(0.5)
    assert share_at(share, 0.5) == pytest.approx(0.75)
    assert share_at(share, 0.51) == pytest.approx(0.875)
    assert share_at(share, 1.0) == pytest.approx(1.0)


def test_share_at_rounds_before_taking_the_ceiling():
    # 0.07 * 100 is 7.000000000000001 in floating point; the top 7% of 100 is 7 documents
    share = np.arange(1, 101) / 100
    assert share_at(share, 0.07) == pytest.approx(0.07)
    assert share_at(np.zeros(0), 0.03) == 0.0


def test_size_cdf_counts_each_retrieved_document_once(tiny):
    # document 1 is retrieved 4 times but is one document of 100 tokens
    assert sorted(retrieved_document_tokens(tiny).tolist()) == [100, 400, 400, 1000]
    sizes, cdf = document_size_cdf(tiny)
    assert sizes.tolist() == [100, 400, 1000]
    np.testing.assert_allclose(cdf, [0.25, 0.75, 1.0])
    skew = trace_skew(tiny, "tiny")
    assert skew.median_doc_tokens == 400.0
    assert skew.top_3pct_share == pytest.approx(0.5)


def test_size_cdf_leaves_out_documents_nobody_retrieved(tiny):
    # the first two requests retrieve documents 1, 2, 3; document 4 stays in the table
    first_two = tiny.head(2)
    assert first_two.n_documents == 4
    sizes, cdf = document_size_cdf(first_two)
    assert sizes.tolist() == [100, 400, 1000]
    np.testing.assert_allclose(cdf, [1 / 3, 2 / 3, 1.0])
    _, share = cumulative_share_curve(first_two.doc_ids)
    np.testing.assert_allclose(share, [2 / 4, 3 / 4, 1.0])


def test_mmlu_curve_is_monotone_and_reaches_its_calibrated_skew():
    """(retrieval_skew reads its numbers off this curve, so they cannot disagree; what can go
    wrong is the curve itself and the generator's calibration.)"""
    trace = builtin_trace("mmlu", n_requests=2000)
    rank_fraction, share = cumulative_share_curve(trace.doc_ids)
    assert len(share) == len(np.unique(trace.doc_ids))
    assert np.all(np.diff(share) >= 0) and share[-1] == 1.0 and rank_fraction[-1] == 1.0
    assert retrieval_skew(trace.doc_ids)["top_3pct_share"] == pytest.approx(0.60, abs=0.03)


def empty_retrieval_trace() -> Trace:
    """Three multi-turn requests that retrieve nothing (valid only with has_history)."""
    return Trace(request_id=np.arange(3), arrival_s=np.array([0.0, 1.0, 2.0]),
                 query_tokens=np.array([5, 5, 5]), output_tokens=np.array([1, 1, 1]),
                 doc_offsets=np.zeros(4, dtype=np.int64), doc_ids=np.zeros(0, dtype=np.int64),
                 document_ids=np.array([1]), document_tokens=np.array([10]),
                 has_history=np.array([True, True, True]))


def test_plot_skips_a_trace_without_retrievals(tmp_path, tiny):
    empty = trace_skew(empty_retrieval_trace(), "empty")
    assert not empty.has_retrievals and empty.top_3pct_share == 0.0
    notes = plot_skew([trace_skew(tiny, "tiny"), empty], tmp_path / "s.svg")
    assert notes == ["empty: no retrievals, left out of the plot"]
    svg = (tmp_path / "s.svg").read_text()
    assert "tiny (top 3%: 50%)" in svg and "empty" not in svg
    assert plot_skew([empty], tmp_path / "only_empty.png") == notes
    assert (tmp_path / "only_empty.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_plot_output_is_deterministic(tmp_path, tiny, suffix):
    skews = [trace_skew(tiny, "tiny")]
    plot_skew(skews, tmp_path / f"a.{suffix}")
    plot_skew(skews, tmp_path / f"b.{suffix}")
    a, b = (tmp_path / f"a.{suffix}").read_bytes(), (tmp_path / f"b.{suffix}").read_bytes()
    assert len(a) > 1000 and a == b


def test_check_plot_path():
    assert check_plot_path("x.PDF").suffix == ".PDF"
    with pytest.raises(RagsimInputError) as info:
        check_plot_path("skew.gif")
    assert info.value.field == "--plot"


def test_cli_plots_builtin_and_mooncake_traces(tmp_path, mooncake_sample):
    result = runner.invoke(app, ["trace", "import-mooncake", str(mooncake_sample),
                                 str(tmp_path / "mc")])
    assert result.exit_code == 0, result.output
    assert read_trace(tmp_path / "mc").info["block_tokens"] == 512
    plot = tmp_path / "skew.png"
    result = runner.invoke(app, ["trace", "stats", "mmlu", "nq", str(tmp_path / "mc"),
                                 "--requests", "2000", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert plot.read_bytes().startswith(PNG_MAGIC) and plot.stat().st_size > 10_000
    # one table, a column per trace
    assert "mmlu" in result.stdout and "nq" in result.stdout and "top_3pct_share" in \
        result.stdout


def test_cli_json_of_several_traces_is_keyed_by_name():
    result = runner.invoke(app, ["trace", "stats", "mmlu", "nq", "--requests", "2000",
                                 "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert list(stats) == ["mmlu", "nq"]
    assert stats["mmlu"]["requests"] == stats["nq"]["requests"] == 2000
    assert stats["mmlu"]["top_3pct_share"] > stats["nq"]["top_3pct_share"]
    # one trace keeps the flat object of before
    one = json.loads(runner.invoke(app, ["trace", "stats", "nq", "--requests", "2000",
                                         "--json"]).stdout)
    assert one == stats["nq"]


def test_cli_plots_a_trace_without_retrievals_with_a_note(tmp_path):
    write_trace(empty_retrieval_trace(), tmp_path / "empty")
    plot = tmp_path / "skew.svg"
    result = runner.invoke(app, ["trace", "stats", str(tmp_path / "empty"), "mmlu",
                                 "--requests", "500", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "empty: no retrievals, left out of the plot" in " ".join(result.output.split())
    assert "mmlu (top 3%" in plot.read_text()


def test_cli_bad_plot_suffix_is_one_clear_line_before_any_work(tmp_path):
    plot = tmp_path / "skew.gif"
    result = runner.invoke(app, ["trace", "stats", "mmlu", "--plot", str(plot)])
    assert result.exit_code == 2
    assert "'--plot'" in result.output and ".png, .svg, .pdf" in result.output
    assert "Traceback" not in result.output and not plot.exists()


def test_cli_refuses_a_trace_given_twice():
    result = runner.invoke(app, ["trace", "stats", "mmlu", "nq", "mmlu"])
    assert result.exit_code == 2
    assert "mmlu given more than once" in result.output
