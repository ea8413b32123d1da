"""Retrieval skew and document sizes of a trace, as curves (RAGCache's Figures 5 and 3).

RAGCache's design rests on two facts about RAG traffic: retrievals are skewed (in MMLU, 3% of the
retrieved documents receive 60% of the retrievals, so a small cache catches most of them), and
retrieved documents are long (hundreds to thousands of tokens, so recomputing their KV is
expensive). These functions turn a trace into the two curves that show both facts, so that any
trace (built-in, imported, or a user's own) can be compared against the paper's.

The curves are exact (no binning): ``cumulative_share_curve`` has one point per retrieved
document and ``document_size_cdf`` one point per distinct size. ``retrieval_skew`` in
``ragsim.traces.stats`` reads its fixed-fraction shares off the same curve, so a table and a plot
of one trace can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ragsim.traces.schema import Trace

MARKER_FRACTION = 0.03  # the paper's headline: the top 3% of documents


def ranked_retrieval_counts(doc_ids: np.ndarray) -> np.ndarray:
    """Retrievals of each document retrieved at least once, most retrieved first (int64)."""
    if len(doc_ids) == 0:
        return np.zeros(0, dtype=np.int64)
    _, counts = np.unique(doc_ids, return_counts=True)
    return np.sort(counts)[::-1].astype(np.int64)


def cumulative_share_curve(doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rank_fraction, cumulative_share)``: the top ``rank_fraction[i]`` of the documents
    take ``cumulative_share[i]`` of the retrievals.

    Point ``i`` is the ``i + 1`` most retrieved documents: ``rank_fraction[i] = (i + 1) / n``
    over the ``n`` documents the trace retrieves (not the whole knowledge base: a trace cannot
    know documents nobody asked for), so the curve runs from ``1 / n`` to exactly ``(1, 1)``.
    Both arrays are float64 and empty for a trace with no retrievals.
    """
    counts = ranked_retrieval_counts(doc_ids)
    if len(counts) == 0:
        return np.zeros(0), np.zeros(0)
    cumulative = np.cumsum(counts)
    rank_fraction = np.arange(1, len(counts) + 1, dtype=np.float64) / len(counts)
    return rank_fraction, cumulative / cumulative[-1]


def share_at(cumulative_share: np.ndarray, fraction: float) -> float:
    """Share of retrievals taken by the top ``fraction`` of documents, read off the curve.

    "The top x%" is the ``ceil(x * n)`` most retrieved documents, at least one, so that a tiny
    trace still has a top 1%. The product is rounded first: 0.07 * 100 is 7.000000000000001 in
    floating point, and the top 7% of 100 documents is 7 documents, not 8. An empty curve (no
    retrievals) has a share of 0.
    """
    n = len(cumulative_share)
    if n == 0:
        return 0.0
    top = min(n, max(1, math.ceil(round(fraction * n, 9))))
    return float(cumulative_share[top - 1])


def retrieved_document_tokens(trace: Trace) -> np.ndarray:
    """Sizes in tokens of the distinct documents the trace retrieves, in document-id order.

    Distinct, not per retrieval: the paper's Figure 3 is about how big the documents are, and
    counting a hot document once per retrieval would turn it into a popularity plot.
    """
    return trace.tokens_of(np.unique(trace.doc_ids))


def document_size_cdf(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """``(size_tokens, cdf)``: the fraction ``cdf[i]`` of the distinct retrieved documents
    has at most ``size_tokens[i]`` tokens.

    One point per distinct size (the jumps of the empirical CDF), ascending, ending at
    ``cdf == 1``; exact, and small even for millions of documents because sizes are integers.
    """
    sizes_tokens, counts = np.unique(retrieved_document_tokens(trace), return_counts=True)
    if len(sizes_tokens) == 0:
        return sizes_tokens.astype(np.int64), np.zeros(0)
    cumulative = np.cumsum(counts)
    return sizes_tokens.astype(np.int64), cumulative / cumulative[-1]


@dataclass(frozen=True)
class TraceSkew:
    """Both curves of one trace, named, ready to plot or to print."""

    name: str
    rank_fraction: np.ndarray
    cumulative_share: np.ndarray
    size_tokens: np.ndarray
    size_cdf: np.ndarray
    median_doc_tokens: float

    @property
    def has_retrievals(self) -> bool:
        return len(self.rank_fraction) > 0

    @property
    def n_documents_retrieved(self) -> int:
        return len(self.rank_fraction)

    @property
    def top_3pct_share(self) -> float:
        return share_at(self.cumulative_share, MARKER_FRACTION)


def trace_skew(trace: Trace, name: str) -> TraceSkew:
    """Both curves of ``trace`` under the label ``name`` (a trace name or path)."""
    rank_fraction, cumulative_share = cumulative_share_curve(trace.doc_ids)
    size_tokens, size_cdf = document_size_cdf(trace)
    sizes = retrieved_document_tokens(trace)
    return TraceSkew(name=name, rank_fraction=rank_fraction, cumulative_share=cumulative_share,
                     size_tokens=size_tokens, size_cdf=size_cdf,
                     median_doc_tokens=float(np.median(sizes)) if len(sizes) else 0.0)
