"""Traces for the answer cache: ``trace build`` with paraphrased repeats (known answer keys) and
stored query embeddings; the ``query_embedding`` column read back and checked (file, row,
field); the simulator using stored embeddings; runs without the answer cache unchanged by it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.errors import TraceError
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import read_trace, resolve_trace
from ragsim.traces.io import write_trace
from ragsim.traces.schema import embedding_column
from tests.test_trace_build import Built, data, options  # noqa: F401  (data: a fixture)


def _key(answer: str) -> str:
    """The build's answer key, worked out here: whitespace collapsed, case-folded."""
    return " ".join(answer.split()).casefold()


@pytest.fixture(scope="module")
def paraphrased(data):  # noqa: F811
    return Built(data, "paraphrased", options(data, sampling="zipf", zipf_s=1.1, requests=300,
                                              paraphrase_p=0.4, query_embeddings=True))


def test_paraphrased_repeats_keep_their_questions_answer_key(data, paraphrased):  # noqa: F811
    asked = [json.loads(line) for line in data["questions"].read_text().splitlines()]
    key_of = {q["text"]: _key(q["answer"]) for q in asked}
    trace = paraphrased.trace
    texts, keys = trace.query_text.to_pylist(), trace.answer_key.to_pylist()
    rewritten = 0
    for text, key in zip(texts, keys, strict=True):
        if text in key_of:
            assert key == key_of[text]
            continue
        # a rewrite contains its question (templated) and carries that question's key
        sources = [q for q in key_of if q in text]
        assert sources, text
        assert key == key_of[max(sources, key=len)]
        rewritten += 1
    # 300 requests, each rewritten with p = 0.4: far inside 80..160
    assert 80 <= rewritten <= 160
    report = paraphrased.report["questions"]
    assert report["paraphrased"] == rewritten
    assert report["distinct_queries"] == len(set(texts))
    assert report["distinct_asked"] == len(set(keys))
    # the same query text always retrieves the same documents
    docs: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        assert docs.setdefault(text, trace.docs_of(i).tolist()) == trace.docs_of(i).tolist()


def test_stored_embeddings_are_the_query_texts_embeddings(data, paraphrased):  # noqa: F811
    from ragsim.traces.corpus.embedding import Embedder

    trace = paraphrased.trace  # written and read back
    assert trace.query_embedding.dtype == np.float32
    assert trace.query_embedding.shape == (300, 384)
    again = Embedder(cache_dir=data["cache"]).embed(trace.query_text.to_pylist())
    np.testing.assert_allclose(trace.query_embedding, again, atol=1e-6)
    table = pq.read_table(paraphrased.dir / "requests.parquet")
    assert table.schema.field("query_embedding").type == pa.list_(pa.float32())
    assert paraphrased.trace.info["query_embedding"]["dimension"] == 384


def test_paraphrase_needs_text(data):  # noqa: F811
    from ragsim.errors import RagsimInputError

    with pytest.raises(RagsimInputError) as caught:
        options(data, paraphrase_p=0.3, redact_text=True).validate()
    assert caught.value.field == "--paraphrase-p"
    with pytest.raises(RagsimInputError):
        options(data, paraphrase_p=1.5).validate()


def test_sim_uses_the_stored_embeddings(paraphrased):
    """A paraphrase's semantic hit decided from the trace's own vectors: the same run with the
    vectors swapped for orthogonal ones finds no semantic hit at all."""
    profile = load_profile("a10g-mistral-7b")
    config = build_config({"trace": "mmlu", "answer_cache": True, "arrival": "sequential"})
    trace = paraphrased.trace
    hits = run_simulation(trace, config, profile).summary["answer_cache_hits"]
    assert hits["semantic"] > 0
    # one-hot vectors: every pair at cosine distance 1 (requests 300 > 384 dims: all distinct)
    orthogonal = np.eye(384, dtype=np.float32)[: trace.n_requests]
    swapped = dataclasses.replace(trace, query_embedding=orthogonal)
    again = run_simulation(swapped, config, profile).summary["answer_cache_hits"]
    assert again["semantic"] == 0


def test_stored_embeddings_without_text_enable_the_semantic_tier():
    """No query_text (the keys stand for the text): requests 0 and 1 have other keys but the
    same direction, so 1 is a semantic hit (a false one); 2 points elsewhere and misses."""
    base = resolve_trace("mmlu", seed=0, n_requests=3)
    vectors = np.array([[1, 0, 0], [2, 0.01, 0], [0, 1, 0]], dtype=np.float32)
    trace = dataclasses.replace(base, answer_key=pa.array(["k0", "k1", "k2"]),
                                query_embedding=vectors)
    config = build_config({"trace": "mmlu", "answer_cache": True, "arrival": "sequential"})
    result = run_simulation(trace, config, load_profile("a10g-mistral-7b"))
    assert result.columns["answer_tier"].tolist() == ["miss", "semantic", "miss"]
    assert result.columns["answer_false_hit"].tolist() == [False, True, False]


def test_a_guard_without_text_to_compare_is_said_off_and_recorded():
    """Embeddings but no question text: the entity guard has no words, so it is turned off;
    the run says so among its warnings and records the guard it applied (the configuration
    still says what was asked). With text, or with no guard asked, nothing is said."""
    base = resolve_trace("mmlu", seed=0, n_requests=3)
    vectors = np.array([[1, 0, 0], [2, 0.01, 0], [0, 1, 0]], dtype=np.float32)
    trace = dataclasses.replace(base, answer_key=pa.array(["k0", "k1", "k2"]),
                                query_embedding=vectors)
    profile = load_profile("a10g-mistral-7b")
    settings = {"trace": "mmlu", "answer_cache": True, "arrival": "sequential"}
    summary = run_simulation(trace, build_config(settings), profile).summary
    assert summary["config"]["answer_guard"] == "entities"  # asked
    assert summary["answer_cache_guard"] == "none"  # applied
    assert any("false-hit guard (entities) is off" in w for w in summary["warnings"])
    asked_none = run_simulation(trace, build_config({**settings, "answer_guard": "none"}),
                                profile).summary
    assert not any("guard" in w for w in asked_none["warnings"])
    texts = dataclasses.replace(trace, query_text=pa.array(["a b", "a c", "d e"]))
    with_text = run_simulation(texts, build_config(settings), profile).summary
    assert with_text["answer_cache_guard"] == "entities"
    assert not any("guard" in w for w in with_text["warnings"])


def test_embedding_column_changes_nothing_without_the_answer_cache(tmp_path):
    base = resolve_trace("mmlu", seed=0, n_requests=200)
    rng = np.random.default_rng(0)
    with_vectors = dataclasses.replace(
        base, query_embedding=rng.normal(size=(200, 8)).astype(np.float32))
    plain, extra = tmp_path / "plain", tmp_path / "extra"
    write_trace(base, plain)
    write_trace(with_vectors, extra)
    assert read_trace(plain).query_embedding is None
    runs = {}
    for name in ("plain", "extra"):
        out = tmp_path / f"run_{name}"
        res = CliRunner().invoke(app, ["run", "--trace", str(tmp_path / name), "--out",
                                       str(out), "--json"])
        assert res.exit_code == 0, res.output
        runs[name] = out
    a = pq.read_table(runs["plain"] / "requests.parquet").drop_columns(["decision_s"])
    b = pq.read_table(runs["extra"] / "requests.parquet").drop_columns(["decision_s"])
    assert a.equals(b)


def _write_with_column(tmp_path, column: pa.Array):
    base = resolve_trace("mmlu", seed=0, n_requests=4)
    write_trace(base, tmp_path)
    path = tmp_path / "requests.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("query_embedding", column).replace_schema_metadata(
        table.schema.metadata), path)
    return path


@pytest.mark.parametrize(("column", "row", "words"), [
    (pa.array(["a", "b", "c", "d"]), None, "list of numbers"),
    (pa.array([[1.0, 0.0], None, [0.0, 1.0], [1.0, 1.0]]), 1, "missing embedding"),
    (pa.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0]]), 2, "same dimension"),
    (pa.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [float("nan"), 1.0]]), 3, "finite"),
    (pa.array([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]), 1, "all-zero"),
    (pa.array([[1.0, None], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]), 0, "missing number"),
    (pa.array([[1.0, 0.0], [1.0, 0.0], [1e300, 0.0], [1.0, 1.0]]), 2, "float32"),
])
def test_bad_embedding_column_names_file_row_and_field(tmp_path, column, row, words):
    path = _write_with_column(tmp_path, column)
    with pytest.raises(TraceError) as caught:
        read_trace(tmp_path)
    error = caught.value
    assert error.file == str(path) and error.field == "query_embedding" and error.row == row
    assert words in str(error)
    res = CliRunner().invoke(app, ["run", "--trace", str(tmp_path), "--answer-cache"])
    assert res.exit_code == 2


def test_embeddings_round_trip_and_head(tmp_path):
    base = resolve_trace("mmlu", seed=0, n_requests=5)
    vectors = np.arange(1, 16, dtype=np.float32).reshape(5, 3)
    write_trace(dataclasses.replace(base, query_embedding=vectors), tmp_path)
    back = read_trace(tmp_path)
    np.testing.assert_array_equal(back.query_embedding, vectors)
    np.testing.assert_array_equal(back.head(2).query_embedding, vectors[:2])
    # integers and float64 are numbers too (a hand-made trace), read as float32
    _write_with_column(tmp_path / "ints", pa.array([[1, 2], [3, 4], [5, 6], [7, 8]]))
    assert read_trace(tmp_path / "ints").query_embedding.dtype == np.float32
    assert embedding_column(vectors).type == pa.list_(pa.float32())
