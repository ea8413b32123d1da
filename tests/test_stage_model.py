"""The synthetic stage model's wrong lists against the statistics of real staged searches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragsim.serving.config import SimConfig
from ragsim.serving.retrieval import StagedSearch
from ragsim.traces.io import TraceBuilder
from ragsim.traces.stage_stats import list_shape, stage_shapes


def trace_of(finals: list[list[int]], stages=None, corpus: int = 50):
    b = TraceBuilder("stages")
    for i, docs in enumerate(finals):
        b.add(i, float(i), 10, 1, docs, [100] * len(docs))
    for d in range(corpus):
        b.doc_tokens.setdefault(d, 100)
    trace = b.build({"name": "stages"})
    if stages is not None:
        trace = dataclasses.replace(
            trace, stages=pa.array(stages, pa.list_(pa.list_(pa.int64()))))
    return trace


def test_stage_shapes_counts_a_hand_built_trace():
    finals = [[1, 2], [1, 2], [3, 4], [5, 6]]
    stages = [
        [[1, 9], [1, 2], [1, 2]],  # keeps D1 at stage 1
        [[2, 9], [2, 8], [1, 2]],  # D2 first (twice, changed), final at the last stage
        [[7, 8], [3, 4], [3, 4]],  # none found, then final
        [[5, 6], [5, 6], [5, 6]],  # final from the start
    ]
    fit = stage_shapes(trace_of(finals, stages))
    assert fit["per_stage"] == {1: {"final": 1, "keeps_d1": 1, "none_found": 1,
                                    "other_first": 1},
                                2: {"final": 3, "other_first": 1}}
    assert fit["first_wrong"] == {"keeps_d1": 1, "none_found": 1, "other_first": 1}
    assert fit["stage_keeps_d1_p"] == pytest.approx(1 / 3)
    # of the two first wrong lists without D1, one holds D2: 1 found of 2 chances
    assert fit["stage_other_found_p"] == pytest.approx(1 / 2)
    assert fit["wrong_list_unchanged_share"] == 0.0  # [2, 9] then [2, 8]
    assert list_shape([2, 1], [1, 2]) == "other_first"


def synthetic_lists(finals, keeps_d1_p, other_found_p, converge_p=0.3, stages=4, seed=0):
    trace = trace_of(finals, corpus=500)
    search = StagedSearch(trace, lambda i: finals[i], stages=stages, search_s=1.0,
                          source="synthetic", seed=seed, converge_p=converge_p,
                          keeps_d1_p=keeps_d1_p, other_found_p=other_found_p)
    return trace, [[search.stage_list(i, s) for s in range(1, stages + 1)]
                   for i in range(len(finals))]


def test_the_synthetic_lists_reproduce_the_fit_they_were_given():
    """Round trip: lists drawn with (keeps D1, other found) = (0.477, 0.777), measured back by
    the statistics written for real traces, within four standard errors."""
    rng = np.random.default_rng(1)
    finals = [[int(a), int(a) + 1] for a in rng.integers(0, 400, 2500)]
    trace, lists = synthetic_lists(finals, 0.477, 0.777)
    fit = stage_shapes(dataclasses.replace(
        trace, stages=pa.array(lists, pa.list_(pa.list_(pa.int64())))))
    wrong = sum(fit["first_wrong"].values())
    assert wrong > 1200
    assert fit["stage_keeps_d1_p"] == pytest.approx(0.477, abs=4 * (0.25 / wrong) ** 0.5)
    assert fit["stage_other_found_p"] == pytest.approx(0.777, abs=0.05)
    assert fit["wrong_list_unchanged_share"] == 1.0  # one wrong list per request, held


def test_the_default_fit_is_wiki_trivias():
    """The defaults name their command (benchmarks/fit_stage_model.py): the fit on the
    shipped wiki-trivia trace's recorded stages."""
    from ragsim.traces import resolve_trace

    fit = stage_shapes(resolve_trace("wiki-trivia"))
    assert SimConfig().stage_keeps_d1_p == pytest.approx(fit["stage_keeps_d1_p"], abs=0.001)
    assert SimConfig().stage_other_found_p == pytest.approx(fit["stage_other_found_p"],
                                                            abs=0.001)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=5, unique=True),
                min_size=1, max_size=20),
       st.floats(0, 1), st.floats(0, 1), st.integers(0, 5))
def test_a_wrong_list_is_found_final_documents_in_order_then_others(finals, keep, other,
                                                                   seed):
    _, lists = synthetic_lists(finals, keep, other, seed=seed)
    for final, stage_lists in zip(finals, lists, strict=True):
        assert stage_lists[-1] == final
        for current in stage_lists[:-1]:
            assert len(current) == len(final) and len(set(current)) == len(current)
            if current == final:
                continue
            found = [d for d in current if d in final]
            assert found == [d for d in final if d in found]  # final order
            assert current[:len(found)] == found  # ahead of the others
            if keep == 0.0:
                assert current[:1] != final[:1]
            if keep == 1.0 and len(final) > 1:
                assert current[0] == final[0]
