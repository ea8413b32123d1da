"""What real traffic offers a KV cache, measured on the trace alone (no policy, no capacity).

* **Prefix reuse** (what RAGCache's knowledge tree can reuse): with unlimited memory a request
  hits the tokens of the longest prefix of its path that an earlier request's path shares,
  in order. This is ``ragsim replay --gpu-mem 64TiB --host-mem 64TiB``'s hit count, computed
  here from the trace without the tree, so the two check each other.
* **Order-free reuse** (what position-independent caching, CacheBlend- or EPIC-like, could
  reach at best): a document's tokens count as reusable wherever it stands, if any earlier
  request listed it. No method reaches it whole (each recomputes some tokens to repair
  cross-attention), so it bounds what reordering or blending could add.
* For a trace whose paths begin with system-prompt segments (RAGPulse): both counts over the
  passages alone, and the prefix count with the system prompt cut to its first segment or left
  out, which says what the varying segments cost.
* **Sessions** (a ``session_id`` column): requests per session, and how much of each reuse an
  earlier request of the same session offers, against only other sessions.
* **Diurnal pattern** (traces of a day or more): the share of requests in each hour of the day
  on the trace's clock (``clock_origin_hour`` in its info: the hour its time 0 falls on).
"""

from __future__ import annotations

import numpy as np

from ragsim.traces.schema import Trace

DAY_S = 86_400.0
# trace info: document ids from this one on are system-prompt segments (RAGPulse's import)
SYSTEM_PROMPT_BASE_KEY = "system_prompt_doc_id_base"


def system_prompt_mask(trace: Trace) -> np.ndarray | None:
    """Which entries of ``trace.doc_ids`` are system-prompt segments (bool, same layout), or
    None for a trace whose info declares none (any trace not imported from RAGPulse)."""
    base = (trace.info or {}).get(SYSTEM_PROMPT_BASE_KEY)
    if base is None:
        return None
    return trace.doc_ids >= int(base)


def retrieved_only(trace: Trace, system_prompt: np.ndarray) -> Trace:
    """The trace with its system-prompt segments taken out of every path, and out of the
    documents table: the retrieval alone (passages in rank order), for the statistics that
    describe what a search returned (skew, co-retrieval, drift)."""
    offsets, ids, _ = _keep(trace, ~system_prompt)
    base = int(trace.info[SYSTEM_PROMPT_BASE_KEY])
    knowledge_base = trace.document_ids < base
    return Trace(
        request_id=trace.request_id, arrival_s=trace.arrival_s, query_tokens=trace.query_tokens,
        output_tokens=trace.output_tokens, doc_offsets=offsets, doc_ids=ids,
        document_ids=trace.document_ids[knowledge_base],
        document_tokens=trace.document_tokens[knowledge_base], session_id=trace.session_id,
        info={key: value for key, value in trace.info.items()
              if key != SYSTEM_PROMPT_BASE_KEY})


def _lists(offsets: np.ndarray, ids: np.ndarray) -> list[list[int]]:
    bounds = offsets.tolist()
    flat = ids.tolist()
    return [flat[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


def prefix_hit_depths(offsets: np.ndarray, ids: np.ndarray,
                      groups: np.ndarray | None = None) -> np.ndarray:
    """Per request, how many leading entries of its list an earlier request's list shares (the
    longest such prefix). With ``groups`` (one code per request), only earlier requests of the
    same group count. A trie of the lists seen so far, one dictionary lookup per entry."""
    children: dict[tuple, int] = {}
    depths = np.zeros(len(offsets) - 1, dtype=np.int64)
    codes = groups.tolist() if groups is not None else None
    for i, docs in enumerate(_lists(offsets, ids)):
        node = ("root", codes[i]) if codes is not None else "root"
        matched = 0
        fresh = False
        for doc in docs:
            key = (node, doc)
            child = children.get(key)
            if child is None:
                child = len(children)
                children[key] = child
                fresh = True
            elif not fresh:
                matched += 1
            node = child
        depths[i] = matched
    return depths


def seen_before(offsets: np.ndarray, ids: np.ndarray,
                groups: np.ndarray | None = None) -> np.ndarray:
    """Per entry of ``ids``: whether an earlier request (of the same group, with ``groups``)
    listed that id anywhere. Bool, the layout of ``ids``."""
    n = len(offsets) - 1
    request = np.repeat(np.arange(n), np.diff(offsets))
    if len(ids) == 0:
        return np.zeros(0, dtype=bool)
    key = ids if groups is None else np.stack([groups[request], ids], axis=1)
    _, first, inverse = np.unique(key, axis=0 if groups is not None else None,
                                  return_index=True, return_inverse=True)
    # entries are in request order, so an id's first entry is in its first request
    return request[first][inverse.reshape(-1)] < request


def _positions(offsets: np.ndarray) -> np.ndarray:
    """Each entry's position within its request's list (0 for the first)."""
    return np.arange(offsets[-1]) - np.repeat(offsets[:-1], np.diff(offsets))


def _covered(depths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per entry: inside its request's first ``depths`` entries."""
    return _positions(offsets) < np.repeat(depths, np.diff(offsets))


def _share(tokens: np.ndarray, mask: np.ndarray) -> float | None:
    total = int(tokens.sum())
    return float(tokens[mask].sum()) / total if total else None


def _keep(trace: Trace, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR offsets, ids and token counts of the entries where ``keep`` is True."""
    kept_before = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
    offsets = kept_before[trace.doc_offsets]
    return offsets, trace.doc_ids[keep], trace.doc_tokens_flat[keep]


def reuse_stats(trace: Trace, system_prompt: np.ndarray | None = None) -> dict:
    """Prefix and order-free reuse shares of the path's tokens (module docstring);
    ``system_prompt`` (bool per entry of ``doc_ids``) splits out the passages."""
    offsets, ids, tokens = trace.doc_offsets, trace.doc_ids, trace.doc_tokens_flat
    prefix = _covered(prefix_hit_depths(offsets, ids), offsets)
    free = seen_before(offsets, ids)
    out = {"prefix_reuse_share": _share(tokens, prefix),
           "order_free_reuse_share": _share(tokens, free)}
    if system_prompt is None:
        return out
    passages = ~system_prompt
    out["system_prompt_tokens_share"] = _share(tokens, system_prompt)
    out["prefix_reuse_system_prompt_share"] = _share(tokens[system_prompt],
                                                     prefix[system_prompt])
    out["prefix_reuse_passage_share"] = _share(tokens[passages], prefix[passages])
    out["order_free_reuse_passage_share"] = _share(tokens[passages], free[passages])
    # the system prompt cut to its first segment, and left out: what its other segments cost
    previous_is_prompt = np.r_[False, system_prompt[:-1]] & (_positions(offsets) > 0)
    first = system_prompt & ~previous_is_prompt
    for label, keep in (("first_segment", first | passages), ("no_system_prompt", passages)):
        o, i, t = _keep(trace, keep)
        covered = _covered(prefix_hit_depths(o, i), o)
        is_passage = passages[keep]
        out[f"prefix_reuse_passage_share_{label}"] = _share(t[is_passage], covered[is_passage])
    return out


def session_stats(trace: Trace, system_prompt: np.ndarray | None = None) -> dict:
    """Requests per session, and what of each reuse an earlier request of the same session
    offers (``..._within_session``), the rest coming only from other sessions."""
    if trace.session_id is None:
        return {}
    _, codes, counts = np.unique(np.asarray(trace.session_id.to_pylist(), dtype=object),
                                 return_inverse=True, return_counts=True)
    codes = codes.reshape(-1)
    offsets, ids, tokens = trace.doc_offsets, trace.doc_ids, trace.doc_tokens_flat
    within = _covered(prefix_hit_depths(offsets, ids, codes), offsets)
    free_within = seen_before(offsets, ids, codes)
    out = {
        "sessions": len(counts),
        "requests_per_session_mean": float(counts.mean()),
        "requests_per_session_p50": float(np.median(counts)),
        "requests_per_session_p90": float(np.percentile(counts, 90)),
        "requests_per_session_max": int(counts.max()),
        "single_request_session_share": float((counts == 1).mean()),
        "prefix_reuse_share_within_session": _share(tokens, within),
        "order_free_reuse_share_within_session": _share(tokens, free_within),
    }
    if system_prompt is not None:
        passages = ~system_prompt
        out["prefix_reuse_passage_share_within_session"] = _share(tokens[passages],
                                                                  within[passages])
        out["order_free_reuse_passage_share_within_session"] = _share(tokens[passages],
                                                                      free_within[passages])
    return out


def diurnal_stats(trace: Trace) -> dict:
    """The share of requests in each hour of the day (hour 0: midnight on the trace's clock),
    for traces that span a day or more; the busiest and quietest hours and their ratio."""
    if trace.n_requests < 2 or trace.arrival_s[-1] - trace.arrival_s[0] < DAY_S:
        return {}
    origin_hour = float((trace.info or {}).get("clock_origin_hour", 0))
    hours = ((trace.arrival_s / 3600.0 + origin_hour) % 24).astype(np.int64)
    counts = np.bincount(hours, minlength=24)
    days = ((trace.arrival_s + origin_hour * 3600.0) // DAY_S).astype(np.int64)
    return {
        "clock_origin_hour": origin_hour,
        "arrivals_by_hour_of_day": [round(float(c) / trace.n_requests, 4) for c in counts],
        "busiest_hour_of_day": int(np.argmax(counts)),
        "quietest_hour_of_day": int(np.argmin(counts)),
        "busiest_to_quietest_hour": float(counts.max() / counts.min()) if counts.min() else None,
        "requests_by_day": np.bincount(days - days[0]).tolist(),
    }
