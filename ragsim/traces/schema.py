"""Trace format v1: a table of requests and a table of documents.

On disk a trace is a directory holding ``requests.parquet`` and ``documents.parquet``; both carry
``ragsim.trace_version`` in their Parquet metadata, and ``requests.parquet`` also carries the
trace's description (``ragsim.trace_info``, JSON: how it was made, with every parameter).

Requests (one row each, in arrival order; a trace whose times go backwards is refused):

================  ======================  =====================================================
column            type                    meaning
================  ======================  =====================================================
request_id        int64                   unique id
arrival_s         float64                 arrival time, seconds, finite, >= 0, non-decreasing
query_tokens      int64                   tokens of the question itself (>= 0), never cached
output_tokens     int64                   tokens to generate (>= 0)
doc_ids           list<int64>             retrieved documents in rank order (may be empty
                                          only when the request has no retrieval)
stages            list<list<int64>>       optional: top-k after each vector-search stage
stage_times_s     list<float64>           optional: measured wall time of each search stage
                                          (seconds, >= 0; one per entry of ``stages``)
query_text        string                  optional
answer_key        string                  optional: identity of the expected answer
has_history       bool                    optional: multi-turn request (skips answer caches)
query_embedding   list<float32>           optional: the query's embedding (finite, not all
                                          zero, one length for every row): the answer cache's
                                          semantic tier uses it instead of embedding the text
session_id        string                  optional: the conversation the request belongs to
                                          (no missing values; any text): recorded traces such
                                          as RAGPulse keep it for session statistics
================  ======================  =====================================================

Documents: ``doc_id`` (int64, unique), ``tokens`` (int64 > 0), optional ``text`` (string).
Every id in ``doc_ids`` and ``stages`` must appear in the documents table. An id may appear
more than once in one request's ``doc_ids``: each occurrence is its own position in the cached
path (a prefix tree holds ``[A, B, A]`` as three nodes), as a service that sends a passage twice
makes its model read it twice.

In memory the request table is columnar (numpy), with document lists in CSR form
(``doc_offsets``, ``doc_ids``) so a million requests cost a few arrays, not a million objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

TRACE_VERSION = 1
VERSION_KEY = b"ragsim.trace_version"
INFO_KEY = b"ragsim.trace_info"

REQUIRED_REQUEST_COLUMNS = ("request_id", "arrival_s", "query_tokens", "output_tokens", "doc_ids")
OPTIONAL_REQUEST_COLUMNS = ("stages", "stage_times_s", "query_text", "answer_key",
                            "has_history", "query_embedding", "session_id")
REQUIRED_DOCUMENT_COLUMNS = ("doc_id", "tokens")
OPTIONAL_DOCUMENT_COLUMNS = ("text",)


@dataclass
class Trace:
    """A validated trace, columnar. Build with ``Trace.build`` or read with ``read_trace``."""

    request_id: np.ndarray
    arrival_s: np.ndarray
    query_tokens: np.ndarray
    output_tokens: np.ndarray
    doc_offsets: np.ndarray  # int64, len n_requests + 1
    doc_ids: np.ndarray  # int64, flat, rank order within each request
    document_ids: np.ndarray  # int64, sorted
    document_tokens: np.ndarray  # int64, aligned with document_ids
    stages: pa.Array | None = None  # list<list<int64>> per request
    stage_times_s: pa.Array | None = None  # list<float64> per request, aligned with stages
    query_text: pa.Array | None = None
    answer_key: pa.Array | None = None
    has_history: np.ndarray | None = None
    query_embedding: np.ndarray | None = None  # float32, (n_requests, dimension)
    session_id: pa.Array | None = None  # string per request
    document_text: pa.Array | None = None
    info: dict = field(default_factory=dict)
    _doc_tokens_flat: np.ndarray | None = field(default=None, repr=False)
    # derived from the documents table when first asked for; not an argument, so that a
    # dataclasses.replace of the table cannot carry a stale copy
    _tokens_by_id: dict | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def n_requests(self) -> int:
        return len(self.request_id)

    @property
    def n_documents(self) -> int:
        return len(self.document_ids)

    @property
    def top_k(self) -> np.ndarray:
        return np.diff(self.doc_offsets)

    @property
    def doc_tokens_flat(self) -> np.ndarray:
        """Token count of every entry of ``doc_ids`` (same layout)."""
        if self._doc_tokens_flat is None:
            self._doc_tokens_flat = self.tokens_of(self.doc_ids)
        return self._doc_tokens_flat

    @property
    def doc_tokens_per_request(self) -> np.ndarray:
        """Each request's retrieved documents' tokens, summed."""
        running = np.concatenate(([0], np.cumsum(self.doc_tokens_flat)))
        return running[self.doc_offsets[1:]] - running[self.doc_offsets[:-1]]

    def tokens_of(self, doc_ids) -> np.ndarray:
        """Token counts of ``doc_ids`` (ids or an array of ids, each in the documents table)."""
        return self.document_tokens[np.searchsorted(self.document_ids, doc_ids)]

    @property
    def tokens_by_id(self) -> dict[int, int]:
        """Token count of every document, by id, as a Python dict: for drivers that look up
        one short list at a time (a numpy search per list costs microseconds), built once."""
        if self._tokens_by_id is None:
            self._tokens_by_id = dict(zip(self.document_ids.tolist(),
                                          self.document_tokens.tolist(), strict=True))
        return self._tokens_by_id

    def docs_of(self, i: int) -> np.ndarray:
        return self.doc_ids[self.doc_offsets[i]: self.doc_offsets[i + 1]]

    def head(self, n: int) -> Trace:
        """The first ``n`` requests (documents table unchanged)."""
        n = min(n, self.n_requests)
        end = int(self.doc_offsets[n])
        return Trace(
            request_id=self.request_id[:n],
            arrival_s=self.arrival_s[:n],
            query_tokens=self.query_tokens[:n],
            output_tokens=self.output_tokens[:n],
            doc_offsets=self.doc_offsets[: n + 1],
            doc_ids=self.doc_ids[:end],
            document_ids=self.document_ids,
            document_tokens=self.document_tokens,
            stages=None if self.stages is None else self.stages[:n],
            stage_times_s=None if self.stage_times_s is None else self.stage_times_s[:n],
            query_text=None if self.query_text is None else self.query_text[:n],
            answer_key=None if self.answer_key is None else self.answer_key[:n],
            has_history=None if self.has_history is None else self.has_history[:n],
            query_embedding=(None if self.query_embedding is None
                             else self.query_embedding[:n]),
            session_id=None if self.session_id is None else self.session_id[:n],
            document_text=self.document_text,
            info={**self.info, "head": n},
            # the sizes already looked up stay valid for the prefix (a replay cut short by
            # Ctrl-C, or cut to what it did, asks for them again: 0.2 s per 2M documents)
            _doc_tokens_flat=(None if self._doc_tokens_flat is None
                              else self._doc_tokens_flat[:end]),
        )

    def select(self, indices) -> Trace:
        """The requests at ``indices`` (ascending positions), in that order, with everything
        they carry; the documents table unchanged. What one replica of a fleet serves."""
        indices = np.asarray(indices, dtype=np.int64)
        counts = np.diff(self.doc_offsets)[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        starts = self.doc_offsets[indices]
        flat = (np.repeat(starts - offsets[:-1], counts) + np.arange(int(offsets[-1]))
                if len(indices) else np.zeros(0, dtype=np.int64))
        pick = pa.array(indices)

        def rows(column):
            return None if column is None else column.take(pick)

        return Trace(
            request_id=self.request_id[indices], arrival_s=self.arrival_s[indices],
            query_tokens=self.query_tokens[indices], output_tokens=self.output_tokens[indices],
            doc_offsets=offsets, doc_ids=self.doc_ids[flat], document_ids=self.document_ids,
            document_tokens=self.document_tokens, stages=rows(self.stages),
            stage_times_s=rows(self.stage_times_s), query_text=rows(self.query_text),
            answer_key=rows(self.answer_key),
            has_history=None if self.has_history is None else self.has_history[indices],
            query_embedding=(None if self.query_embedding is None
                             else self.query_embedding[indices]),
            session_id=rows(self.session_id), document_text=self.document_text,
            info=dict(self.info),
            _doc_tokens_flat=(None if self._doc_tokens_flat is None
                              else self._doc_tokens_flat[flat]),
        )

    # -- Arrow tables --------------------------------------------------------------------
    def requests_table(self) -> pa.Table:
        columns = {
            "request_id": pa.array(self.request_id, pa.int64()),
            "arrival_s": pa.array(self.arrival_s, pa.float64()),
            "query_tokens": pa.array(self.query_tokens, pa.int64()),
            "output_tokens": pa.array(self.output_tokens, pa.int64()),
            "doc_ids": pa.ListArray.from_arrays(
                pa.array(self.doc_offsets.astype(np.int32), pa.int32()),
                pa.array(self.doc_ids, pa.int64()),
            ),
        }
        if self.stages is not None:
            columns["stages"] = self.stages
        if self.stage_times_s is not None:
            columns["stage_times_s"] = self.stage_times_s
        if self.query_text is not None:
            columns["query_text"] = self.query_text
        if self.answer_key is not None:
            columns["answer_key"] = self.answer_key
        if self.has_history is not None:
            columns["has_history"] = pa.array(self.has_history, pa.bool_())
        if self.query_embedding is not None:
            columns["query_embedding"] = embedding_column(self.query_embedding)
        if self.session_id is not None:
            columns["session_id"] = self.session_id
        table = pa.table(columns)
        return table.replace_schema_metadata({
            VERSION_KEY: str(TRACE_VERSION).encode(),
            INFO_KEY: json.dumps(self.info, sort_keys=True).encode(),
        })

    def documents_table(self) -> pa.Table:
        columns = {
            "doc_id": pa.array(self.document_ids, pa.int64()),
            "tokens": pa.array(self.document_tokens, pa.int64()),
        }
        if self.document_text is not None:
            columns["text"] = self.document_text
        table = pa.table(columns)
        return table.replace_schema_metadata({VERSION_KEY: str(TRACE_VERSION).encode()})


def embedding_column(vectors: np.ndarray) -> pa.Array:
    """(n, d) vectors as a list<float32> column (one list of d numbers per request)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    offsets = np.arange(0, n * d + 1, d, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(vectors.ravel(), pa.float32()))
