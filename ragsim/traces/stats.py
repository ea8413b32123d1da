"""Summary statistics of a trace, including the retrieval skew RAGCache's design rests on."""

from __future__ import annotations

import numpy as np

from ragsim.traces.schema import Trace
from ragsim.traces.skew import cumulative_share_curve, retrieved_document_tokens, share_at
from ragsim.traces.stage_stats import stage_convergence, stage_shapes
from ragsim.traces.traffic import (
    diurnal_stats,
    retrieved_only,
    reuse_stats,
    session_stats,
    system_prompt_mask,
)

SKEW_FRACTIONS = (0.01, 0.03, 0.10)


def retrieval_skew(doc_ids: np.ndarray, fractions=SKEW_FRACTIONS) -> dict[str, float]:
    """Share of retrievals taken by the most-retrieved x% of the documents retrieved at least once.

    The denominator of "x% of documents" is the set of documents the trace retrieves, not the
    whole knowledge base: a trace cannot know documents nobody asked for. The shares are points
    of ``skew.cumulative_share_curve``, the curve ``trace stats --plot`` draws.
    """
    _, cumulative_share = cumulative_share_curve(doc_ids)
    return {f"top_{round(f * 100)}pct_share": share_at(cumulative_share, f) for f in fractions}


def co_retrieval(trace: Trace, min_first_count: int = 5) -> dict:
    """How often requests retrieve the same ordered pair of leading documents.

    A prefix tree caches ``[D1, D2]`` as a path: ``D2``'s KV is reusable only after ``D1``, so a
    trace's value to a knowledge tree depends on whether the pair recurs, not only on how popular
    each document is. Real retrieval co-retrieves neighbours (similar passages come together);
    independent draws from a popularity law almost never repeat a pair.

    * ``pair_repeat_share``: requests whose (D1, D2) was retrieved before;
    * ``pair_repeat_given_first_share``: the same, among requests whose D1 was seen before;
    * ``favourite_second_share``: for first documents seen at least ``min_first_count`` times,
      the mean share of their most frequent second document.
    """
    empty = {"pair_repeat_share": None, "pair_repeat_given_first_share": None,
             "favourite_second_share": None}
    has_pair = trace.top_k >= 2
    if not has_pair.any():
        return empty
    starts = trace.doc_offsets[:-1][has_pair]
    first = trace.doc_ids[starts]
    second = trace.doc_ids[starts + 1]
    pair_code = np.unique(np.stack([first, second], axis=1), axis=0, return_inverse=True)[1]
    pair_code = pair_code.reshape(-1)
    first_code = np.unique(first, return_inverse=True)[1].reshape(-1)
    n = len(first)
    order = np.arange(n)

    def seen_before(codes: np.ndarray) -> np.ndarray:
        first_index = np.full(codes.max() + 1, n, dtype=np.int64)
        np.minimum.at(first_index, codes, order)
        return first_index[codes] < order

    pair_seen = seen_before(pair_code)
    first_seen = seen_before(first_code)
    first_counts = np.bincount(first_code)
    pair_counts = np.bincount(pair_code)
    pair_first = np.zeros(len(pair_counts), dtype=np.int64)
    pair_first[pair_code] = first_code
    favourite = np.zeros(len(first_counts), dtype=np.int64)
    np.maximum.at(favourite, pair_first, pair_counts)
    frequent = first_counts >= min_first_count
    return {
        "pair_repeat_share": float(pair_seen.mean()),
        "pair_repeat_given_first_share": float(pair_seen[first_seen].mean())
        if first_seen.any() else None,
        "favourite_second_share": float((favourite[frequent] / first_counts[frequent]).mean())
        if frequent.any() else None,
    }


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties given their average rank (what Spearman's correlation uses)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[inverse]


def size_popularity(trace: Trace) -> dict:
    """Whether retrieval favours short or long documents: Spearman's rank correlation between a
    retrieved document's tokens and how often it is retrieved (negative: short ones more often).

    It decides how much a size-aware policy gains: GDSF's 1/size keeps short documents, which
    pays in token hits only where short documents are also the popular ones. (Computed here in
    numpy: importing scipy.stats for it took a second of every ``trace stats``.)
    """
    docs, counts = np.unique(trace.doc_ids, return_counts=True)
    tokens = trace.tokens_of(docs)
    if len(counts) < 3 or np.all(tokens == tokens[0]) or np.all(counts == counts[0]):
        return {"size_popularity_spearman": None}  # undefined for a constant column
    rho = np.corrcoef(_ranks(tokens), _ranks(counts))[0, 1]
    return {"size_popularity_spearman": float(rho)}


DRIFT_WINDOW_REQUESTS = 1000
DRIFT_TOP_N = 10
DRIFT_SHUFFLES = 20


def shared_prefix_depth(trace: Trace) -> int:
    """How many leading documents every request with documents has in common (0 for most
    traces): a prefix all requests send, such as a chat service's system-prompt block that
    begins every Mooncake conversation request, says nothing about what is popular."""
    has_docs = trace.top_k > 0
    starts, lengths = trace.doc_offsets[:-1][has_docs], trace.top_k[has_docs]
    depth = 0
    while len(starts) and (lengths > depth).all():
        column = trace.doc_ids[starts + depth]
        if (column != column[0]).any():
            break
        depth += 1
    return depth


def leading_documents(trace: Trace) -> np.ndarray:
    """Each request's first document past the prefix every request shares, for the requests
    that have one.

    The unit popularity drift is measured on, the same for every kind of trace: a RAG request's
    top-ranked passage (what the question is about), a Mooncake request's first block (its
    prefix: blocks are chained, so the first one names the shared context). Counting every
    document instead would let one long Mooncake prefix fill a window's top with its blocks.
    A block that begins every request (Mooncake's conversation trace starts all 12,031 with
    block 0, its system prompt) is skipped: the next one names the conversation."""
    depth = shared_prefix_depth(trace)
    has_docs = trace.top_k > depth
    return trace.doc_ids[trace.doc_offsets[:-1][has_docs] + depth]


def top_n_turnover(keys: np.ndarray, window: int = DRIFT_WINDOW_REQUESTS,
                   top_n: int = DRIFT_TOP_N) -> float | None:
    """Mean share of a window's ``top_n`` most frequent keys that are not among the next
    window's ``top_n`` (consecutive windows of ``window`` keys; a last, partial window is left
    out). None with fewer than two windows.

    Ties at the cut are broken by the smaller key, the same way in every window, so a tie
    never counts as turnover by itself. Vectorised (one ``np.unique`` for all windows): ``trace
    stats`` runs it ``DRIFT_SHUFFLES + 1`` times."""
    n_windows = len(keys) // window
    if n_windows < 2:
        return None
    ids, dense = np.unique(keys[: n_windows * window], return_inverse=True)
    n_ids = len(ids)
    codes = np.repeat(np.arange(n_windows, dtype=np.int64), window) * n_ids + dense.reshape(-1)
    cell, counts = np.unique(codes, return_counts=True)
    win, key = cell // n_ids, cell % n_ids
    order = np.lexsort((key, -counts, win))  # by window, then count down, then key up
    win, key = win[order], key[order]
    starts = np.searchsorted(win, np.arange(n_windows))
    top = (np.arange(len(win)) - starts[win]) < top_n
    win, key = win[top], key[top]
    top_codes = win * n_ids + key  # sorted: windows in order, keys unique within a window
    has_next = win < n_windows - 1
    kept = np.isin(top_codes[has_next] + n_ids, top_codes)  # same key, next window's top
    sizes = np.bincount(win[has_next], minlength=n_windows - 1)
    stayed = np.bincount(win[has_next], weights=kept, minlength=n_windows - 1)
    return float(np.mean(1.0 - stayed / sizes))


def popularity_drift(trace: Trace, window: int = DRIFT_WINDOW_REQUESTS,
                     top_n: int = DRIFT_TOP_N, shuffles: int = DRIFT_SHUFFLES,
                     seed: int = 0) -> dict:
    """How fast the most popular documents change: top-N turnover between consecutive windows
    of requests, corrected for the turnover finite samples show without any drift.

    ``top10_turnover``: ``top_n_turnover`` of the leading documents. A stationary trace shows
    turnover too (a window of 1,000 requests estimates its top 10 with noise), so the same
    trace in ``shuffles`` seeded random orders (the same popularity, no drift) gives the noise,
    ``top10_turnover_shuffled``, and ``top10_turnover_corrected`` = (observed - noise) /
    (1 - noise): the share of the top that changed for a reason other than sampling, if a
    fraction ``d`` changes and the noise replaces a share ``noise`` of the rest. About 0 for
    stationary traffic (negative values are noise), 1 when the top is replaced every window.
    ``..._per_hour``: the corrected share times the windows an hour holds at the trace's own
    timestamps (a rate: above 1, the top turns over more than once an hour).

    The generator's ``drift_per_1k_requests`` (share of popularity ranks that trade documents
    every 1,000 requests) is a different quantity; ``ragsim.traces.drift.fit_drift`` finds the
    value whose traces show a given corrected turnover, measured by this function.
    """
    tag = f"top{top_n}_turnover"
    keys = leading_documents(trace)
    observed = top_n_turnover(keys, window, top_n)
    out = {f"{tag}_window_requests": window, tag: observed, f"{tag}_shuffled": None,
           f"{tag}_corrected": None, f"{tag}_corrected_per_hour": None}
    if observed is None:
        return out
    rng = np.random.default_rng(seed)
    noise = float(np.mean([top_n_turnover(rng.permutation(keys), window, top_n)
                           for _ in range(shuffles)]))
    out[f"{tag}_shuffled"] = noise
    if noise >= 1.0:  # every window's top differs even without order: nothing to measure
        return out
    corrected = (observed - noise) / (1.0 - noise)
    out[f"{tag}_corrected"] = corrected
    arrivals = trace.arrival_s[trace.top_k > shared_prefix_depth(trace)]
    n_windows = len(keys) // window
    span_s = float(arrivals[n_windows * window - 1] - arrivals[0])
    if span_s > 0:
        out[f"{tag}_corrected_per_hour"] = corrected * 3600.0 * n_windows / span_s
    return out


def trace_stats(trace: Trace) -> dict:
    """Every statistic ``trace stats`` prints. For a trace whose paths begin with system-prompt
    segments (RAGPulse), the retrieval rows (documents, top-k, skew, co-retrieval, drift)
    describe the passages alone, and rows for the whole path and the system prompt follow."""
    system_prompt = system_prompt_mask(trace)
    path = trace
    if system_prompt is not None:
        trace = retrieved_only(path, system_prompt)
    top_k = trace.top_k
    unique_tokens = retrieved_document_tokens(trace)
    doc_tokens_flat = trace.doc_tokens_flat
    duration = float(trace.arrival_s[-1] - trace.arrival_s[0]) if trace.n_requests else 0.0
    prompt_rows = {} if system_prompt is None else {
        "path_tokens_total": int(path.doc_tokens_flat.sum()),
        "system_prompt_tokens_total": int(path.doc_tokens_flat[system_prompt].sum()),
        "system_prompt_distinct_by_position": _distinct_by_position(path, system_prompt),
    }
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
        **stage_convergence(trace),
        **_stage_shape_fit(trace),
        **retrieval_skew(trace.doc_ids),
        **co_retrieval(trace),
        **size_popularity(trace),
        **popularity_drift(trace),
        **prompt_rows,
        **reuse_stats(path, system_prompt),
        **session_stats(path, system_prompt),
        **diurnal_stats(path),
        "info": path.info,
    }


def _distinct_by_position(trace: Trace, system_prompt: np.ndarray) -> list[int]:
    """Distinct system-prompt segment ids at each position of the prompt (first, second,
    ...): a position with many is a part of the prompt that varies between requests."""
    position = np.arange(len(trace.doc_ids)) - np.repeat(trace.doc_offsets[:-1], trace.top_k)
    ids, at = trace.doc_ids[system_prompt], position[system_prompt]
    return [len(np.unique(ids[at == p])) for p in range(int(at.max()) + 1 if len(at) else 0)]


def _stage_shape_fit(trace: Trace) -> dict:
    """The synthetic stage model's shape shares (``stage_stats.stage_shapes``), flat."""
    fit = stage_shapes(trace)
    return {key: fit.get(key) for key in ("stage_keeps_d1_p", "stage_other_found_p",
                                          "wrong_list_unchanged_share")}
