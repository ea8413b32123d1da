"""Token ids for the prompts of a trace: encoded from its text, or drawn per document.

A trace built from a corpus carries (or can recover) its documents' and queries' text and names
the tokenizer that counted it: the real engine encodes that text (``PromptTokens`` with
``trace_texts``). Synthetic and imported traces give token counts, not text; KV reuse is only
real if a document has the same ids every time it is retrieved, so a document's ids are drawn
from a generator seeded by its id, a query's by its request id. The seed is a hash of the id's
text (stable across processes, unlike Python's ``hash``), with a different prefix for documents
and queries so that document 7 and request 7 do not share tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ragsim.errors import RagsimInputError
from ragsim.traces.schema import Trace

SYSTEM_PROMPT_KEY = "__system_prompt__"  # the system prompt's token ids are drawn like a doc's


def _seed(kind: str, key: object) -> int:
    digest = hashlib.blake2b(f"{kind}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _draw(kind: str, key: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    rng = np.random.default_rng(_seed(kind, key))
    return rng.integers(0, vocab_size, size=n_tokens, dtype=np.int64)


def document_token_ids(doc_id: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    """The ``n_tokens`` token ids of document ``doc_id``, each in ``[0, vocab_size)``.

    The same document id (int or str; ``7`` and ``"7"`` are the same document) always gives the
    same ids, in every process and on every machine, so a cached document's KV is exactly the
    KV that recomputing it would give.
    """
    return _draw("document", doc_id, n_tokens, vocab_size)


def query_token_ids(request_id: object, n_tokens: int, vocab_size: int) -> np.ndarray:
    """The ``n_tokens`` token ids of the query of request ``request_id`` (see above)."""
    return _draw("query", request_id, n_tokens, vocab_size)


# --------------------------------------------------------------------------- real text
@dataclass
class TraceTexts:
    """The text behind a trace's documents and queries, and the tokenizer that counted it.

    A trace built from a corpus (``ragsim trace build``) counted its tokens with a named
    tokenizer on this text, so encoding it again gives the prompt a real engine would see: the
    same counts, real token statistics, and KV reuse that is real because the text is."""

    tokenizer: Any  # ragsim.traces.corpus.tokenizers.Tokenizer
    origin: str  # where the document text came from
    document_text: Callable[[int], str | None]  # document id -> its text
    query_text: Sequence[str | None] | None  # per request row


def trace_texts(trace: Trace) -> tuple[TraceTexts | None, str | None]:
    """The trace's text and tokenizer, and what of it is missing (None: nothing): without
    document text or tokenizer no text is used at all.

    Documents' text comes from the trace (a trace built with its text) or, for the packaged
    traces (built with ``--redact-text``), from the offline corpus they were built from, through
    their ``passages.parquet`` (each document's passage; ``passage`` chunking only)."""
    from ragsim.traces.corpus.tokenizers import load_tokenizer, tokenizer_of_trace

    info = trace.info or {}
    choice = tokenizer_of_trace(info.get("tokenizer"))
    if choice is None:
        return None, "the trace names no built-in tokenizer (synthetic or imported trace)"
    document_text, origin = _document_texts(trace)
    if document_text is None:
        return None, origin
    try:
        tokenizer = load_tokenizer(choice)
    except RagsimInputError as exc:
        return None, f"its tokenizer is not installed ({exc.message})"
    if trace.query_text is None:
        return (TraceTexts(tokenizer, origin, document_text, None),
                "queries: the trace carries no query text (built with --redact-text)")
    return TraceTexts(tokenizer, origin, document_text, trace.query_text.to_pylist()), None


def _document_texts(trace: Trace) -> tuple[Callable[[int], str | None] | None, str]:
    if trace.document_text is not None:
        by_id = dict(zip(trace.document_ids.tolist(), trace.document_text.to_pylist(),
                         strict=True))
        return by_id.get, "the trace's text"
    builtin = (trace.info or {}).get("builtin")
    if builtin is None:
        return None, "the trace carries no document text (built with --redact-text)"
    from ragsim.traces import packaged_trace_dir
    from ragsim.traces.corpus import PASSAGES_FILE, REPORT_FILE
    from ragsim.traces.corpus.chunking import passage_text
    from ragsim.traces.corpus.sources import load_corpus

    folder = packaged_trace_dir(builtin)
    report = json.loads((folder / REPORT_FILE).read_text())
    corpus_report = report.get("corpus", {})
    if corpus_report.get("chunking", {}).get("mode") != "passage":
        return None, f"{builtin}'s documents are not whole passages"
    try:
        corpus = load_corpus(corpus_report["source"])
    except RagsimInputError as exc:
        return None, f"its corpus is not installed ({exc.message})"
    passages = pq.read_table(folder / PASSAGES_FILE, columns=["doc_id", "passage_ids"])
    where = {pid: i for i, pid in enumerate(corpus.ids)}
    text_of: dict[int, str] = {}
    for doc_id, ids in zip(passages.column("doc_id").to_pylist(),
                           passages.column("passage_ids").to_pylist(), strict=True):
        if len(ids) == 1 and ids[0] in where:
            text_of[doc_id] = passage_text(corpus, where[ids[0]])
    return text_of.get, f"the {corpus.name} corpus ({builtin}'s {PASSAGES_FILE})"


@dataclass
class TokenIdsReport:
    """How a run's prompts got their token ids (in the run's summary as ``token_ids``)."""

    source: str = "drawn"  # or the tokenizer's name
    text_origin: str | None = None
    why_drawn: str | None = None
    documents_encoded: int = 0
    documents_drawn: int = 0  # no text, or a count that disagrees with the trace's
    queries_encoded: int = 0
    queries_drawn: int = 0
    # of the documents and queries above, those given ids before the run's clock started
    # (``PromptTokens.encode_ahead``) and those met only during the run (a real search's
    # intermediate list may hold a document the trace recorded for no stage)
    prepared_before_clock: int = 0
    prepared_during_run: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class PromptTokens:
    """Token ids of a request's prompt: the system prompt, its documents, its query.

    With the trace's text (``trace_texts``) documents and queries are encoded by the tokenizer
    that counted them; an id past the model's vocabulary is folded into it (a scaled-down model
    may have fewer). A document whose text is missing, or encodes to another count than the
    trace's, gets ids drawn from its id, as do documents and queries of traces without text:
    the same document always has the same ids, so reuse is real either way. The system prompt
    has no text and is drawn."""

    def __init__(self, trace: Trace, system_prompt_tokens: int, vocab_size: int,
                 texts: TraceTexts | None = None, why_no_text: str | None = None) -> None:
        self.request_ids = trace.request_id
        self.vocab_size = vocab_size
        self.texts = texts
        self.report = TokenIdsReport(
            source="drawn" if texts is None else texts.tokenizer.name,
            text_origin=None if texts is None else texts.origin, why_drawn=why_no_text)
        self.system = document_token_ids(SYSTEM_PROMPT_KEY, system_prompt_tokens, vocab_size)
        self._trace = trace
        self._docs: dict[tuple[Hashable, int], np.ndarray] = {}
        self._queries: dict[int, np.ndarray] = {}
        self._encoded_ahead = False

    def encode_ahead(self) -> int:
        """Give every document the trace's requests retrieve (their final lists and the lists
        their recorded search stages found) and every query its ids now, before the run's
        clock starts; returns how many were prepared. Why: ragsim's serving model takes
        prompts as token ids (a trace gives token counts), as an engine's loop does, while a
        front end tokenizes text outside it. Encoded on the engine's thread when a request was
        submitted, the text cost a vLLM run ~0.3 ms a request at rest (measured: a third of
        the 0.9 ms between a search's end and the step that scheduled it) and the torch
        engine the same inside its timed prefill: time on the real side for work the
        simulated system does not have. What is met later (``prepared_during_run``) is
        encoded then, and counted."""
        trace = self._trace
        size_of = trace.tokens_by_id
        wanted = dict.fromkeys(int(d) for d in trace.doc_ids.tolist())
        if trace.stages is not None:
            for stage_lists in trace.stages.to_pylist():
                for found in stage_lists or ():
                    wanted.update(dict.fromkeys(int(d) for d in found))
        before = len(self._docs) + len(self._queries)
        for doc in wanted:
            self.document(doc, int(size_of[doc]))
        for row in range(trace.n_requests):
            self.query(row, int(trace.query_tokens[row]))
        self._encoded_ahead = True
        prepared = len(self._docs) + len(self._queries) - before
        self.report.prepared_before_clock += prepared
        return prepared

    def _encode(self, text: str | None, n_tokens: int) -> np.ndarray | None:
        if text is None:
            return None
        ids = np.asarray(self.texts.tokenizer.encode(text), dtype=np.int64)
        return ids % self.vocab_size if len(ids) == n_tokens else None

    def document(self, doc_id: Hashable, n_tokens: int) -> np.ndarray:
        key = (doc_id, n_tokens)
        ids = self._docs.get(key)
        if ids is None:
            if self.texts is not None:
                ids = self._encode(self.texts.document_text(int(doc_id)), n_tokens)
                if ids is None:
                    self.report.documents_drawn += 1
                else:
                    self.report.documents_encoded += 1
            if ids is None:
                ids = document_token_ids(doc_id, n_tokens, self.vocab_size)
            self._docs[key] = ids
            self.report.prepared_during_run += self._encoded_ahead
        return ids

    def query(self, row: int, n_tokens: int) -> np.ndarray:
        """A query's ids; a retry's longer query (the tokens it generated before) is the
        question's ids, then stand-ins drawn past them."""
        ids = self._queries.get(row)
        if ids is None:
            ids = None
            if self.texts is not None and self.texts.query_text is not None:
                ids = self._encode(self.texts.query_text[row], n_tokens)
            if ids is None:
                ids = query_token_ids(self.request_ids[row], n_tokens, self.vocab_size)
                self.report.queries_drawn += 1
            else:
                self.report.queries_encoded += 1
            self._queries[row] = ids
            self.report.prepared_during_run += self._encoded_ahead
        if n_tokens <= len(ids):
            return ids[:n_tokens]
        extra = query_token_ids(f"{self.request_ids[row]}+", n_tokens, self.vocab_size)
        return np.concatenate([ids, extra[len(ids):]])

    def of(self, docs: Sequence[Hashable], doc_tokens: Sequence[int], row: int,
           query_tokens: int) -> np.ndarray:
        parts = [self.system]
        parts += [self.document(d, int(n)) for d, n in zip(docs, doc_tokens, strict=True)]
        parts.append(self.query(row, query_tokens))
        return np.concatenate(parts)
