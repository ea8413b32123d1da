"""The comparison of two greedy generations (``tests/greedy_ties.py``) on hand-made outputs."""

from __future__ import annotations

from greedy_ties import parting

SAME = [5, 7, 9]
SCORES = [{5: -0.1, 6: -2.0}, {7: -0.5, 8: -0.9}, {9: -0.2, 1: -3.0}]


def test_identical_outputs_agree():
    assert parting(SAME, list(SAME), SCORES, SCORES) is None


def test_a_parting_at_a_tie_in_both_runs_is_rounding():
    first, second = [5, 7, 9], [5, 8, 2]  # after the parting anything may follow
    a = [{5: -0.1}, {7: -0.700001, 8: -0.70004}, {9: -0.2}]
    b = [{5: -0.1}, {8: -0.70002, 7: -0.70003}, {2: -0.3}]
    assert parting(first, second, a, b) is None


def test_a_parting_far_from_a_tie_is_reported():
    a = [{5: -0.1}, {7: -0.5, 8: -0.9}, {9: -0.2}]
    b = [{5: -0.1}, {8: -0.70002, 7: -0.70003}, {9: -0.2}]
    said = parting([5, 7, 9], [5, 8, 9], a, b)
    assert said is not None and "step 1" in said and "first run" in said


def test_a_token_outside_the_other_runs_top_tokens_is_no_tie():
    a = [{5: -0.1}, {7: -0.5, 3: -0.6}, {9: -0.2}]
    b = [{5: -0.1}, {8: -0.5, 7: -0.50001}, {9: -0.2}]
    said = parting([5, 7, 9], [5, 8, 9], a, b)
    assert said is not None and "not both" in said


def test_outputs_of_other_lengths_differ():
    assert parting([1, 2], [1], SCORES, SCORES) == "2 tokens against 1"
