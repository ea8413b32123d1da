"""``ragsim trace build``: a corpus and a question set in, a v1 trace and a build report out.

The pipeline, each step its own module: sources (read and check the inputs) → chunking (the
documents, with token counts from a real tokenizer) → embedding (a real sentence embedder,
cached on disk) → staged faiss search (top-k after each stage, timed) → requests (which question
arrives when). Everything but the measured stage times is a function of the inputs, the options
and the seed.

Which questions arrive, and how often, is an explicit choice (``sampling``), never invented:

* ``once``: each question once, in file order or a seeded shuffle (``order``);
* ``uniform``: drawn with replacement, all equally likely;
* ``zipf``: drawn with replacement, the question at popularity rank r (ranks are a seeded
  shuffle of the questions) with probability proportional to r^-s: users asking popular
  things more.

Arrival times are a Poisson or gamma process at ``rate_rps`` (``ragsim.traces.retime``), or the
questions' own ``arrival_s`` (``arrival="file"``, with ``sampling="once"`` in file order).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ragsim.errors import RagsimInputError
from ragsim.traces.corpus.chunking import Chunking, Documents, make_documents
from ragsim.traces.corpus.embedding import DEFAULT_EMBEDDER, Embedder, default_cache_dir
from ragsim.traces.corpus.search import IndexSpec, StagedIndex, exact_top_k, recall_at_k
from ragsim.traces.corpus.sources import Corpus, Questions, load_corpus, load_questions
from ragsim.traces.corpus.tokenizers import load_tokenizer
from ragsim.traces.paraphrase import TEMPLATES, draw_templates, paraphrase
from ragsim.traces.retime import arrival_times
from ragsim.traces.schema import Trace
from ragsim.traces.stats import retrieval_skew, stage_convergence

SAMPLING_MODES = ("once", "uniform", "zipf")
ORDERS = ("file", "shuffle")
REPORT_FORMAT = "ragsim.trace_build_report"
REPORT_VERSION = 1

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class BuildOptions:
    corpus: str
    questions: str
    top_k: int = 2
    index: IndexSpec = field(default_factory=IndexSpec)
    chunking: Chunking = field(default_factory=Chunking)
    tokenizer: str = "mistral"
    embedder: str = DEFAULT_EMBEDDER
    cache_dir: Path | None = field(default_factory=default_cache_dir)  # None: no cache
    requests: int | None = None  # None: every question once (sampling "once")
    sampling: str = "once"
    order: str = "file"
    zipf_s: float = 1.0
    arrival: str = "poisson"  # poisson, gamma or file
    rate_rps: float = 1.0
    cv: float = 1.0
    output_tokens: str = "answer"  # "answer": the expected answer's tokens; or an integer
    redact_text: bool = False  # keep no question/document text; hash the answer keys
    # the answer cache's workload: a share of requests asked in a templated rewrite of their
    # question (same answer key; embedded and searched as its own query), and each request's
    # query embedding stored in the trace (its semantic tier then embeds nothing at run time)
    paraphrase_p: float = 0.0
    query_embeddings: bool = False
    seed: int = 0

    def validate(self) -> None:
        if self.top_k < 1:
            raise RagsimInputError("must be >= 1", field="--top-k")
        if self.sampling not in SAMPLING_MODES:
            raise RagsimInputError(f"unknown sampling {self.sampling!r}; choose one of "
                                   f"{', '.join(SAMPLING_MODES)}", field="--sampling")
        if self.order not in ORDERS:
            raise RagsimInputError(f"unknown order {self.order!r}; choose one of "
                                   f"{', '.join(ORDERS)}", field="--order")
        if self.sampling == "zipf" and not (np.isfinite(self.zipf_s) and self.zipf_s >= 0):
            raise RagsimInputError(f"must be a number >= 0, got {self.zipf_s}", field="--zipf-s")
        if self.requests is not None and self.requests < 1:
            raise RagsimInputError("must be >= 1", field="--requests")
        if self.sampling != "once" and self.requests is None:
            raise RagsimInputError(f"sampling {self.sampling!r} draws with replacement: say how "
                                   "many requests", field="--requests")
        if self.arrival == "file" and (self.sampling != "once" or self.order != "file"):
            raise RagsimInputError("the questions' own times need each question once, in file "
                                   "order (--sampling once --order file)", field="--arrival")
        if self.arrival not in ("poisson", "gamma", "file"):
            raise RagsimInputError(f"unknown arrival process {self.arrival!r}; choose poisson, "
                                   "gamma or file", field="--arrival")
        if not (np.isfinite(self.paraphrase_p) and 0.0 <= self.paraphrase_p <= 1.0):
            raise RagsimInputError(f"must be a share in [0, 1], got {self.paraphrase_p}",
                                   field="--paraphrase-p")
        if self.paraphrase_p > 0 and self.redact_text:
            raise RagsimInputError("paraphrases need the question text (the answer cache's "
                                   "exact tiers match on it): drop --redact-text",
                                   field="--paraphrase-p")
        if self.output_tokens != "answer":
            try:
                value = int(self.output_tokens)
            except ValueError:
                value = -1
            if value < 1:
                raise RagsimInputError(f"'answer' or a positive integer, got "
                                       f"{self.output_tokens!r}", field="--output-tokens")

    def describe(self) -> dict:
        d = asdict(self)
        d["index"] = self.index.describe()
        d["chunking"] = asdict(self.chunking)
        d["cache_dir"] = None if self.cache_dir is None else "set"  # no machine paths in traces
        return d


@dataclass
class BuildResult:
    trace: Trace
    documents: pa.Table  # doc_id -> the corpus passages it came from
    report: dict


def pick_questions(n_questions: int, options: BuildOptions) -> np.ndarray:
    """Question index of each request, in arrival order."""
    rng = np.random.default_rng([options.seed, 0xA5C])
    n = options.requests if options.requests is not None else n_questions
    if options.sampling == "once":
        if n > n_questions:
            raise RagsimInputError(f"{n} requests but only {n_questions} questions: each is "
                                   "asked once with --sampling once; draw with replacement "
                                   "(--sampling uniform|zipf) for more", field="--requests")
        order = (np.arange(n_questions) if options.order == "file"
                 else rng.permutation(n_questions))
        return order[:n].astype(np.int64)
    if options.sampling == "uniform":
        return rng.integers(0, n_questions, size=n).astype(np.int64)
    ranks_to_question = rng.permutation(n_questions)
    weights = np.arange(1, n_questions + 1, dtype=np.float64) ** -options.zipf_s
    ranks = rng.choice(n_questions, size=n, p=weights / weights.sum())
    return ranks_to_question[ranks].astype(np.int64)


def _size_summary(tokens: np.ndarray) -> dict:
    if len(tokens) == 0:
        return {}
    return {"min": int(tokens.min()), "p50": float(np.median(tokens)),
            "mean": round(float(tokens.mean()), 3), "p90": float(np.percentile(tokens, 90)),
            "max": int(tokens.max()), "total": int(tokens.sum())}


def _answer_key(answer: str | None, redact: bool) -> str | None:
    if answer is None:
        return None
    key = " ".join(answer.split()).casefold()
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest() if redact else key


def _stage_columns(stage_ids: np.ndarray, stage_times_s: np.ndarray
                   ) -> tuple[pa.Array, pa.Array]:
    """Arrow columns from (requests, stages, k) ids padded with -1 and (requests, stages) times,
    built from flat arrays and offsets: a million requests cost arrays, not Python lists."""
    n, n_stages, _ = stage_ids.shape
    valid = stage_ids >= 0
    inner_offsets = np.zeros(n * n_stages + 1, dtype=np.int64)
    np.cumsum(valid.sum(axis=2).ravel(), out=inner_offsets[1:])
    inner = pa.LargeListArray.from_arrays(pa.array(inner_offsets),
                                          pa.array(stage_ids[valid].astype(np.int64)))
    outer_offsets = np.arange(0, n * n_stages + 1, n_stages, dtype=np.int64)
    stages = pa.LargeListArray.from_arrays(pa.array(outer_offsets), inner)
    times = pa.LargeListArray.from_arrays(pa.array(outer_offsets),
                                          pa.array(stage_times_s.ravel().astype(np.float64)))
    return (stages.cast(pa.list_(pa.list_(pa.int64()))), times.cast(pa.list_(pa.float64())))


def build_trace(options: BuildOptions, progress: Progress | None = None) -> BuildResult:
    options.validate()
    started = time.perf_counter()

    def step(phase: str, total: int) -> Callable[[int], None]:
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress(phase, done[0], total)
        if progress is not None:
            progress(phase, 0, total)
        return advance

    corpus: Corpus = load_corpus(options.corpus)
    questions: Questions = load_questions(options.questions)
    if options.arrival == "file" and questions.arrival_s is None:
        raise RagsimInputError("the questions carry no arrival_s", field="--arrival")
    tokenizer = load_tokenizer(options.tokenizer)
    documents: Documents = make_documents(corpus, tokenizer, options.chunking,
                                          step("tokenize corpus", len(corpus.ids)))
    if len(documents) < options.top_k:
        raise RagsimInputError(f"top-k {options.top_k} but only {len(documents)} documents",
                               field="--top-k")
    spec = options.index.resolved(len(documents))
    picked = pick_questions(len(questions.texts), options)
    # a request's query: its question, verbatim (-1) or in a template's rewrite; each distinct
    # query is embedded and searched once
    templates = (draw_templates(len(picked), options.paraphrase_p,
                                np.random.default_rng([options.seed, 0x9A4]))
                 if options.paraphrase_p > 0 else np.full(len(picked), -1, dtype=np.int64))
    variants = picked * (len(TEMPLATES) + 1) + templates + 1
    unique_variants, request_to_unique = np.unique(variants, return_inverse=True)
    unique_questions = unique_variants // (len(TEMPLATES) + 1)
    unique_templates = unique_variants % (len(TEMPLATES) + 1) - 1
    question_texts = [questions.texts[q] if t < 0 else paraphrase(questions.texts[q], int(t))
                      for q, t in zip(unique_questions, unique_templates, strict=True)]

    embedder = Embedder(options.embedder, cache_dir=options.cache_dir)
    embed_started = time.perf_counter()
    doc_vectors = embedder.embed(documents.texts, step("embed documents", len(documents)))
    query_vectors = embedder.embed(question_texts, step("embed questions",
                                                        len(question_texts)))
    embed_s = time.perf_counter() - embed_started

    index = StagedIndex(doc_vectors, spec, seed=options.seed)
    result = index.search(query_vectors, options.top_k,
                          step("staged search", len(question_texts)))
    exact = exact_top_k(doc_vectors, query_vectors, options.top_k)

    # requests: the unique questions' results, repeated as the questions are
    final = result.final_ids[request_to_unique]
    if (final[:, 0] < 0).any():
        row = int(np.flatnonzero(final[:, 0] < 0)[0])
        raise RagsimInputError(f"request {row}: the search found no document; probe more "
                               "lists (--nprobe) or use fewer", field="--nprobe")
    lengths = (final >= 0).sum(axis=1)
    doc_offsets = np.zeros(len(final) + 1, dtype=np.int64)
    np.cumsum(lengths, out=doc_offsets[1:])
    doc_ids = final[final >= 0]
    request_times_s = result.stage_times_s[request_to_unique]
    stages, stage_times = _stage_columns(result.stage_ids[request_to_unique], request_times_s)

    question_tokens = np.array([len(tokenizer.encode(t)) for t in question_texts],
                               dtype=np.int64)
    if options.output_tokens == "answer":
        answers = [questions.answers[q] for q in unique_questions]
        missing = [int(q) for q, a in zip(unique_questions, answers, strict=True) if a is None]
        if missing:
            raise RagsimInputError(f"question {missing[0]} has no answer to size the output "
                                   "by; give --output-tokens N", field="--output-tokens")
        answer_tokens = np.array([max(1, len(tokenizer.encode(a))) for a in answers],
                                 dtype=np.int64)
    else:
        answer_tokens = np.full(len(unique_questions), int(options.output_tokens), np.int64)

    if options.arrival == "file":
        arrival_s = questions.arrival_s[picked]
    else:
        arrival_s = arrival_times(len(picked), options.rate_rps, process=options.arrival,
                                  cv=options.cv, seed=options.seed)
    # text columns built once per distinct question, then repeated as the questions are
    unique_keys = [_answer_key(questions.answers[q], options.redact_text)
                   for q in unique_questions]
    answer_keys = None if all(k is None for k in unique_keys) else pa.array(
        unique_keys, pa.string()).take(pa.array(request_to_unique))
    query_text = None if options.redact_text else pa.array(
        question_texts, pa.string()).take(pa.array(request_to_unique))
    n_req = len(picked)

    trace = Trace(
        request_id=np.arange(n_req, dtype=np.int64),
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        query_tokens=question_tokens[request_to_unique],
        output_tokens=answer_tokens[request_to_unique],
        doc_offsets=doc_offsets,
        doc_ids=doc_ids.astype(np.int64),
        document_ids=np.arange(len(documents), dtype=np.int64),
        document_tokens=documents.tokens,
        stages=stages,
        stage_times_s=stage_times,
        query_text=query_text,
        answer_key=answer_keys,
        query_embedding=(query_vectors[request_to_unique].astype(np.float32)
                         if options.query_embeddings else None),
        document_text=None if options.redact_text else pa.array(documents.texts, pa.string()),
        info={},
    )
    # every search statistic per request, as trace stats computes them (a question asked
    # twice counts twice, with its one measurement)
    convergence = stage_convergence(trace)
    search_s = request_times_s.sum(axis=1)
    exact_ids = exact[request_to_unique]
    p = convergence["stage_converge_p"]
    report = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "corpus": {"source": corpus.name, "passages": len(corpus.ids),
                   "documents": len(documents), "chunking": asdict(options.chunking),
                   "document_tokens": _size_summary(documents.tokens)},
        "questions": {"source": questions.name, "available": len(questions.texts),
                      "distinct_asked": len(np.unique(picked)), "requests": n_req,
                      "sampling": options.sampling, "order": options.order,
                      "zipf_s": options.zipf_s if options.sampling == "zipf" else None,
                      "query_tokens": _size_summary(question_tokens[request_to_unique]),
                      "output_tokens": _size_summary(answer_tokens[request_to_unique]),
                      "output_tokens_from": options.output_tokens,
                      **({"paraphrased": int((templates >= 0).sum()),
                          "distinct_queries": len(unique_variants)}
                         if options.paraphrase_p > 0 else {})},
        "tokenizer": tokenizer.name,
        "embedder": {"model": embedder.model_name, "dimension": int(doc_vectors.shape[1]),
                     "embedded": embedder.embedded, "from_cache": embedder.cached,
                     "seconds": round(embed_s, 3)},
        "index": {**spec.describe(), "top_k": options.top_k,
                  "build_s": round(result.build_s, 4)},
        "staged_search": {
            "recall_at_k_vs_exact": round(recall_at_k(final, exact_ids), 6),
            "final_equals_exact": round(float(
                (np.sort(final, 1) == np.sort(exact_ids, 1)).all(axis=1).mean()), 6),
            "stage_equals_final": convergence["stage_equals_final"],
            "stage_converge_p": None if p is None else round(p, 6),  # None: nothing to fit
            "stage_time_mean_s": [float(f"{t:.4g}") for t in request_times_s.mean(0)],
            "search_time_mean_s": float(f"{search_s.mean():.4g}"),
            "search_time_p50_s": float(f"{np.median(search_s):.4g}"),
            "search_time_p99_s": float(f"{np.percentile(search_s, 99):.4g}"),
            "measured_on": "one query at a time, one thread",
        },
        "arrivals": ({"process": "file"} if options.arrival == "file" else
                     {"process": options.arrival, "rate_rps": options.rate_rps,
                      "cv": 1.0 if options.arrival == "poisson" else options.cv}),
        "retrieval_skew": retrieval_skew(doc_ids),
        "unique_documents_retrieved": len(np.unique(doc_ids)),
        "options": options.describe(),
        "seed": options.seed,
        "text_redacted": options.redact_text,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }
    info = {"source": "built", "corpus": corpus.name, "questions": questions.name,
            "tokenizer": tokenizer.name, "embedder": embedder.model_name,
            "index": report["index"], "top_k": options.top_k,
            "sampling": options.sampling, "seed": options.seed,
            "recall_at_k_vs_exact": report["staged_search"]["recall_at_k_vs_exact"],
            "text_redacted": options.redact_text}
    if options.paraphrase_p > 0:
        info["paraphrase_p"] = options.paraphrase_p
    if options.query_embeddings:
        info["query_embedding"] = {"model": embedder.model_name,
                                   "dimension": int(query_vectors.shape[1])}
    trace.info = info
    mapping = pa.table({
        "doc_id": pa.array(np.arange(len(documents), dtype=np.int64)),
        "passage_ids": pa.array(documents.passage_ids, pa.list_(pa.string())),
        "start_token": pa.array(documents.start_token),
        "tokens": pa.array(documents.tokens),
    })
    return BuildResult(trace=trace, documents=mapping, report=report)
