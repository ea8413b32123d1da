"""Summary statistics of a trace, including the retrieval skew RAGCache's design rests on."""

from __future__ import annotations

import numpy as np

from ragsim.traces.schema import Trace
from ragsim.traces.skew import cumulative_share_curve, retrieved_document_tokens, share_at

SKEW_FRACTIONS = (0.01, 0.03, 0.10)


def retrieval_skew(doc_ids: np.ndarray, fractions=SKEW_FRACTIONS) -> dict[str, float]:
    """Share of retrievals taken by the most-retrieved x% of the documents retrieved at least once.

    The denominator of "x% of documents" is the set of documents the trace retrieves, not the
    whole knowledge base: a trace cannot know documents nobody asked for. The shares are points
    of ``skew.cumulative_share_curve``, the curve ``trace stats --plot`` draws.
    """
    _, cumulative_share = cumulative_share_curve(doc_ids)
    return {f"top_{round(f * 100)}pct_share": share_at(cumulative_share, f) for f in fractions}


def trace_stats(trace: Trace) -> dict:
    top_k = trace.top_k
    unique_tokens = retrieved_document_tokens(trace)
    doc_tokens_flat = trace.doc_tokens_flat
    duration = float(trace.arrival_s[-1] - trace.arrival_s[0]) if trace.n_requests else 0.0
    return {
        "requests": int(trace.n_requests),
        "documents_in_table": int(trace.n_documents),
        "unique_documents_retrieved": len(unique_tokens),
        "retrievals": len(trace.doc_ids),
        "duration_s": duration,
        "mean_rate_rps": (trace.n_requests - 1) / duration if duration > 0 else None,
        "top_k_min": int(top_k.min()) if len(top_k) else 0,
        "top_k_mean": float(top_k.mean()) if len(top_k) else 0.0,
        "top_k_max": int(top_k.max()) if len(top_k) else 0,
        "doc_tokens_retrieved": int(doc_tokens_flat.sum()),
        "doc_tokens_unique": int(unique_tokens.sum()),
        "doc_tokens_mean": float(unique_tokens.mean()) if len(unique_tokens) else 0.0,
        "doc_tokens_p50": float(np.median(unique_tokens)) if len(unique_tokens) else 0.0,
        "query_tokens_total": int(trace.query_tokens.sum()),
        "query_tokens_mean": float(trace.query_tokens.mean()) if trace.n_requests else 0.0,
        "output_tokens_total": int(trace.output_tokens.sum()),
        "output_tokens_mean": float(trace.output_tokens.mean()) if trace.n_requests else 0.0,
        "has_stages": trace.stages is not None,
        **retrieval_skew(trace.doc_ids),
        "info": trace.info,
    }
