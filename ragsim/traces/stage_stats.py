"""What a trace's staged search looked like: when its lists became final, and what the
wrong ones held. Both fit the simulator's synthetic stage model (``serving/retrieval.py``).

``stage_convergence``: how early each request's list was final, and ``stage_converge_p``.

``stage_shapes``: what the wrong intermediate lists look like, per stage.

An IVF search computes exact distances for the vectors of the lists it has probed, so a
document of the final top-k that has been found always ranks above one that is not in the final
top-k. An intermediate list is therefore *the final documents found so far, in their final
order, followed by documents that the final list will not hold*. What varies is which final
documents are found by a stage; this module counts that on a trace with recorded stages
(``ragsim trace build``), and fits the two shares the simulator's synthetic stage model draws
from (``serving/retrieval.py``):

* ``stage_keeps_d1_p``: of a request's first wrong list, the share that already holds the
  final D1 (then its first document is right, and a speculation on it shares the final
  list's first node);
* ``stage_other_found_p``: of the first wrong lists that miss D1, the share that hold each
  other final document (for top-2: the list starts with the final D2).

Fitted on the first wrong list because the model draws one wrong list per request and holds it
until the final list appears (consecutive wrong lists of a request are the same list in 79% of
cases in ``wiki-trivia``). ``benchmarks/fit_stage_model.py`` prints the per-stage table and fit.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.compute as pc

from ragsim.traces.schema import Trace


def stage_convergence(trace: Trace) -> dict:
    """How early a trace's staged search held its final top-k, and the synthetic model's fit.

    For each request, the first stage whose list equals the final one (``doc_ids``). The fit is
    the maximum-likelihood ``p`` of the simulator's synthetic stage model (each stage before the
    last finds the final list with probability ``p``; a request whose list is only final at the
    last stage is censored there): successes over trials. ``stage_equals_final`` is the share of
    requests whose list is final at each stage (requests with fewer stages count as final).
    """
    empty = {"stage_converge_p": None, "stage_equals_final": None, "search_time_mean_s": None}
    if trace.stages is None or trace.n_requests == 0:
        return empty
    n = trace.n_requests
    stage_counts = pc.fill_null(pc.list_value_length(trace.stages), 0).to_numpy().astype(
        np.int64)
    n_stages = int(stage_counts.max())
    if n_stages == 0:
        return empty
    # one entry per (request, stage), one element per id: compared with doc_ids in arrays
    stage_lists = pc.list_flatten(trace.stages)
    entry_request = np.repeat(np.arange(n), stage_counts)
    entry_stage = np.arange(len(entry_request)) - np.repeat(np.cumsum(stage_counts)
                                                            - stage_counts, stage_counts)
    entry_len = pc.fill_null(pc.list_value_length(stage_lists), 0).to_numpy().astype(np.int64)
    ids = pc.list_flatten(stage_lists).to_numpy(zero_copy_only=False)
    elem_entry = np.repeat(np.arange(len(entry_len)), entry_len)
    elem_pos = np.arange(len(ids)) - np.repeat(np.cumsum(entry_len) - entry_len, entry_len)
    elem_request = entry_request[elem_entry]
    within = elem_pos < trace.top_k[elem_request]
    final_at = np.where(within, trace.doc_offsets[elem_request] + elem_pos, 0)
    final_ids = trace.doc_ids[final_at] if len(trace.doc_ids) else np.full(len(ids), -1)
    mismatches = np.bincount(elem_entry, weights=~within | (ids != final_ids),
                             minlength=len(entry_len))
    equal = (entry_len == trace.top_k[entry_request]) & (mismatches == 0)
    first = stage_counts.copy()  # 1-based stage of the first final list; the last by default
    np.minimum.at(first, entry_request[equal], entry_stage[equal] + 1)
    first = np.maximum(first, 1)
    last = np.maximum(stage_counts, 1)
    found_early = first < last
    successes = int(found_early.sum())
    trials = int(np.where(found_early, first, last - 1).sum())
    final_by = np.cumsum(np.bincount(first - 1, minlength=n_stages))
    times = None
    if trace.stage_times_s is not None:
        flat = pc.list_flatten(trace.stage_times_s).to_numpy(zero_copy_only=False)
        times = float(flat.sum() / trace.n_requests)
    return {
        "stage_converge_p": successes / trials if trials else None,
        "stage_equals_final": [round(float(c) / n, 6) for c in final_by],
        "search_time_mean_s": times,
    }


def list_shape(current: list, final: list) -> str:
    """``final`` (the list is the final one), ``keeps_d1`` (D1 found, something else missing),
    ``other_first`` (D1 missing, another final document found), ``none_found``."""
    if current == final:
        return "final"
    if current[:1] == final[:1]:
        return "keeps_d1"
    if set(current) & set(final[1:]):
        return "other_first"
    return "none_found"


def stage_shapes(trace: Trace) -> dict:
    """Per stage (1-based, the last excluded: it is the final list), how many requests' lists
    are of each shape; and the fit of the synthetic model on each request's first wrong list.
    Only requests with at least two stages count. Empty dict when the trace has no stages."""
    if trace.stages is None:
        return {}
    stages = trace.stages.to_pylist()
    offsets = trace.doc_offsets.tolist()
    ids = trace.doc_ids.tolist()
    per_stage: dict[int, Counter] = {}
    first_wrong: Counter = Counter()
    others_found = others_missed = 0
    unchanged = changed = 0
    for i, lists in enumerate(stages):
        if not lists or len(lists) < 2:
            continue
        final = ids[offsets[i]:offsets[i + 1]]
        k = len(final)
        seen_wrong = False
        previous = None
        for s, current in enumerate(lists[:-1], start=1):
            current = current[:k]
            shape = list_shape(current, final)
            per_stage.setdefault(s, Counter())[shape] += 1
            if shape != "final" and previous is not None:
                unchanged += current == previous
                changed += current != previous
            previous = current if shape != "final" else None
            if shape == "final" or seen_wrong:
                continue
            seen_wrong = True
            first_wrong[shape] += 1
            if shape != "keeps_d1":
                found = sum(1 for d in final[1:] if d in current)
                others_found += found
                others_missed += k - 1 - found
    wrong = sum(first_wrong.values())
    missing_d1 = others_found + others_missed
    return {
        "per_stage": {s: dict(sorted(c.items())) for s, c in sorted(per_stage.items())},
        "first_wrong": dict(sorted(first_wrong.items())),
        "stage_keeps_d1_p": first_wrong["keeps_d1"] / wrong if wrong else None,
        "stage_other_found_p": others_found / missing_d1 if missing_d1 else None,
        "wrong_list_unchanged_share": unchanged / (unchanged + changed)
        if unchanged + changed else None,
    }
