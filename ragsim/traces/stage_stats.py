"""What a staged search's wrong intermediate lists look like, per stage.

An IVF search computes exact distances for the vectors of the lists it has probed, so a
document of the final top-k that has been found always ranks above one that is not in the final
top-k. An intermediate list is therefore *the final documents found so far, in their final
order, followed by documents that the final list will not hold*. What varies is which final
documents are found by a stage; this module counts that on a trace with recorded stages
(``ragsim trace build``), and fits the two shares the simulator's synthetic stage model draws
from (``sim/retrieval.py``):

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

from ragsim.traces.schema import Trace


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
