"""The per-request term by row count (``profile.WideBatches``): batches of many prompts on a
varlen engine (vLLM's profiles), and every row count of the torch engine's batches.

Worked by hand on a grid of T(alpha, beta) = 1 + 0.01 beta + 0.001 alpha seconds, measured at
alpha in {0, 100} and beta in {1, 11} (bilinear, so exact for this linear T).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ragsim.errors import ProfileError
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.profile import (
    BatchedPrefill,
    Profile,
    WideBatches,
    load_profile,
    with_wide_batches,
)


def linear_grid() -> BilinearGrid:
    def t(a: float, b: float) -> float:
        return 1 + 0.01 * b + 0.001 * a

    return BilinearGrid("t", "cached_tokens", "new_tokens", [0.0, 100.0], [1.0, 11.0],
                        [[t(0, 1), t(0, 11)], [t(100, 1), t(100, 11)]])


def test_a_varlen_batch_past_the_grid_is_priced_in_grid_sized_groups():
    """Three rows of 5 uncached tokens (15 > the grid's 11): groups [5, 5] and [5].
    [5, 5]: 10 tokens, 2 x 5 x 2.5 = 25 pairs, the equivalent request alpha = 25/10 - 5 = -2.5:
    2 T(0, 10) - T(2.5, 10) = 2.2 - 1.1025 = 1.0975. [5]: T(0, 5) = 1.05. The step's fixed
    cost T(0, 1) = 1.01 once: 1.0975 + 1.05 - 1.01 = 1.1375; + 0.1 for each of 2 extra rows."""
    model = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1)
    assert model.tokens_and_pairs_s([0, 0, 0], [5, 5, 5]) == pytest.approx(1.1375)
    assert model.iteration_s([0, 0, 0], [5, 5, 5]) == pytest.approx(1.3375)
    # within the grid, the equivalent request as before: 2 rows of 5 = the first group above
    assert model.iteration_s([0, 0], [5, 5]) == pytest.approx(1.0975 + 0.1)


def test_the_per_request_term_follows_the_wide_levels_by_rows():
    """Fitted 0.1 up to 4 rows, measured 0.2 at 8 and 0.4 at 16: 6 rows half way from 4 to 8
    (0.15), 12 rows half way from 8 to 16 (0.3), 40 rows the last level (0.4)."""
    wide = WideBatches([8.0, 16.0], [0.2, 0.4], 1)
    assert [wide.extra_s(n, 0.1) for n in (2, 4, 6, 8, 12, 16, 40)] == pytest.approx(
        [0.1, 0.1, 0.15, 0.2, 0.3, 0.4, 0.4])
    model = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1, wide=wide)
    # six rows of 1 uncached token: 6 tokens, 3 pairs, alpha = 3/6 - 3 = -2.5:
    # 2 T(0, 6) - T(2.5, 6) = 2.12 - 1.0625 = 1.0575; + 5 x 0.15
    assert model.iteration_s([0] * 6, [1] * 6) == pytest.approx(1.0575 + 5 * 0.15)


def test_the_wide_term_is_what_each_row_adds_to_the_measured_batch():
    """Batches timed as their tokens and pairs plus a planted 0.3 s (8 rows) and 0.5 s (16 rows)
    per extra row: the fit gives those back. On this varlen engine it keeps the levels' own
    times too, and prices a held-out batch of their shape from them: 12 rows of 2 tokens half
    way between the levels' times, 16 rows the second level's (predicted / measured: 1.0)."""
    from ragsim.profiles.profile import Batches

    base = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1)
    planted = {8: 0.3, 16: 0.5}
    seconds = [base.tokens_and_pairs_s([0] * n, [2] * n) + e * (n - 1)
               for n, e in planted.items()]
    held_rows = [12, 16]
    held = Batches([[0] * n for n in held_rows], [[2] * n for n in held_rows],
                   [(seconds[0] + seconds[1]) / 2, seconds[1]])
    fitted = with_wide_batches(base, list(planted), seconds, 2, held)
    assert fitted.wide.per_extra_request_s == pytest.approx([0.3, 0.5])
    assert fitted.wide.seconds == pytest.approx(seconds)
    # a pair's price from the grid: T(100, 2) - T(0, 2) = 0.1 s over 100 x 2 pairs
    assert fitted.wide.pair_s == pytest.approx(0.0005)
    assert fitted.wide.heldout["median_ratio"] == pytest.approx(1.0)
    assert fitted.wide.heldout["points"] == 2
    assert fitted.per_extra_request_s == 0.1  # the 2-4 row fit is kept
    # a padding engine (torch's) keeps the term alone
    padded = with_wide_batches(replace(base, padding="left_masked"), list(planted), seconds, 2)
    assert padded.wide.seconds is None and padded.wide.pair_s is None


def test_a_wide_batch_is_priced_from_the_levels_times_and_its_pairs_past_theirs():
    """Levels of 8 and 16 rows of 2 new tokens measured at 1.0 s and 1.8 s (16 and 32 tokens),
    a query-key pair at 0.01 s, by hand:

    * 10 rows, eight of 2 tokens and two of 4, one of those on 5 cached: 24 tokens, 1.0 +
      8 x 0.05 = 1.4 s on the levels' line; its pairs 8 x 2 x 1 + 4 x 2 + 4 x (5 + 2) = 52
      against a level's 24 of as many tokens (1 a token): 1.4 + 0.01 x 28 = 1.68 s;
    * 40 rows of 2: 80 tokens, along the last two levels past the last, 1.8 + 48 x 0.05 =
      4.2 s, its pairs a level's;
    * 6 rows of 4 (fewer rows than the first level) and 8 rows of 1 (fewer tokens): the
      per-request term, as before."""
    wide = WideBatches([8.0, 16.0], [0.2, 0.4], 2, seconds=[1.0, 1.8], pair_s=0.01)
    model = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1, wide=wide)
    assert model.iteration_s([0] * 9 + [5], [2] * 8 + [4, 4]) == pytest.approx(1.68)
    assert model.iteration_s([0] * 40, [2] * 40) == pytest.approx(4.2)
    term = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1,
                          wide=WideBatches([8.0, 16.0], [0.2, 0.4], 2))
    for rows, tokens in ((6, 4), (8, 1)):
        assert model.iteration_s([0] * rows, [tokens] * rows) == pytest.approx(
            term.iteration_s([0] * rows, [tokens] * rows))
    # never below the costliest row alone: one row of 11 on 100 cached costs T(100, 11)
    cheap = replace(wide, seconds=[0.01, 0.02], pair_s=0.0)
    costly = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1, wide=cheap)
    assert costly.iteration_s([100] + [0] * 7, [11] + [2] * 7) == pytest.approx(1.21)
    # a padding engine never prices from levels it was given
    masked = BatchedPrefill(linear_grid(), "left_masked", per_extra_request_s=0.1, wide=wide)
    assert masked.iteration_s([0] * 40, [2] * 40) != pytest.approx(4.2)


def test_levels_at_the_fitted_rows_replace_the_fitted_term_there():
    """The torch engine's levels: 2, 3, 4 and 8 rows measured (0.3, 0.35, 0.05, 0.02). Each
    measured count takes its own level, 6 rows half way from 4 to 8 (0.035), past 8 the last;
    the fitted 0.1 is used nowhere (one row has no extra request)."""
    wide = WideBatches([2.0, 3.0, 4.0, 8.0], [0.3, 0.35, 0.05, 0.02], 1)
    assert [wide.extra_s(n, 0.1) for n in (2, 3, 4, 6, 8, 12)] == pytest.approx(
        [0.3, 0.35, 0.05, 0.035, 0.02, 0.02])
    model = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1, wide=wide)
    # three rows of 1 uncached token: 3 tokens, 1.5 pairs, alpha = 0.5 - 1.5 = -1:
    # 2 T(0, 3) - T(1, 3) = 2.06 - 1.031 = 1.029; + 2 x 0.35
    assert model.iteration_s([0] * 3, [1] * 3) == pytest.approx(1.029 + 2 * 0.35)


def test_levels_on_cached_rows_and_the_random_batches_judged_again():
    """Rows of 2 new tokens on 50 cached ones, timed as their tokens and pairs plus a planted
    0.3 s (2 rows) and 0.05 s (4 rows) per extra row. The levels give those back, priced on the
    cached rows' pairs: a level priced as uncached rows would read 0.001 x 50 = 0.05 s of the
    cached prefix into the term (2 rows: 0.35). Random batches built the same way (3 rows:
    0.175 half way) were fitted with 0.1 and missed; judged again with the levels they are
    exact, and the fitted term stays what it was."""
    from ragsim.profiles.profile import Batches

    base = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1,
                          fit={"points": 1, "median_rel_error": 0.2, "against": "by hand"})
    planted = {2: 0.3, 4: 0.05}

    def timed(cached: list[float], new: list[float]) -> float:
        n = len(new)
        extra = planted.get(n, 0.175)
        return base.tokens_and_pairs_s(cached, new) + extra * (n - 1)

    seconds = [timed([50.0] * n, [2.0] * n) for n in planted]
    batches = [([50.0, 10.0, 0.0], [3.0, 2.0, 5.0]), ([0.0, 100.0], [4.0, 4.0])]
    fitted = Batches([batches[0][0]], [batches[0][1]], [timed(*batches[0])])
    held = Batches([batches[1][0]], [batches[1][1]], [timed(*batches[1])])
    assert base.iteration_s(*batches[1]) != pytest.approx(held.seconds[0])
    widened = with_wide_batches(base, list(planted), seconds, 2, row_cached_tokens=50,
                                batches=(fitted, held))
    assert widened.wide.per_extra_request_s == pytest.approx([0.3, 0.05])
    assert widened.wide.row_cached_tokens == 50
    assert widened.heldout_median_error == pytest.approx(0.0, abs=1e-12)
    assert widened.fit["median_rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert widened.fit["against"] == "by hand" and widened.per_extra_request_s == 0.1
    # levels above the fitted rows (vLLM's) leave the random batches' errors as they were
    above = with_wide_batches(base, [8], [timed([0.0] * 8, [2.0] * 8)], 2,
                              batches=(fitted, held))
    assert above.fit == base.fit and above.heldout_median_error is None


def _profile_with_wide(tmp_path, wide: dict | None):
    data = load_profile("cpu-vllm-mistral-7b-l2-h256").to_dict()
    data["batched_prefill"]["padding"] = "none"
    data["batched_prefill"].pop("wide", None)
    if wide is not None:
        data["batched_prefill"]["wide"] = wide
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


def test_a_profile_file_keeps_its_wide_batches_and_scales_them(tmp_path):
    wide = {"rows": [8, 64], "per_extra_request_s": [0.001, 0.002], "row_new_tokens": 256,
            "heldout": None}
    profile = load_profile(str(_profile_with_wide(tmp_path, wide)))
    assert profile.batched_prefill.wide == WideBatches([8.0, 64.0], [0.001, 0.002], 256)
    again = Profile.from_dict(profile.to_dict(), source="again")
    assert again.batched_prefill.wide == profile.batched_prefill.wide
    slower = profile.scaled_compute(2.0)
    assert slower.batched_prefill.wide.per_extra_request_s == pytest.approx([0.002, 0.004])
    # a profile without them loads as before
    assert load_profile(str(_profile_with_wide(tmp_path, None))).batched_prefill.wide is None
    # the levels' own times and a pair's price, kept, and scaled with the compute
    timed = load_profile(str(_profile_with_wide(tmp_path, {**wide, "seconds": [0.1, 0.9],
                                                           "pair_s": 1e-8})))
    assert timed.batched_prefill.wide.seconds == [0.1, 0.9]
    assert timed.batched_prefill.wide.pair_s == 1e-8
    again = Profile.from_dict(timed.to_dict(), source="again")
    assert again.batched_prefill.wide == timed.batched_prefill.wide
    slower = timed.scaled_compute(2.0).batched_prefill.wide
    assert slower.seconds == pytest.approx([0.2, 1.8]) and slower.pair_s == pytest.approx(2e-8)
    # rows over a cached prefix (the torch engine's levels) are kept as such
    cached = load_profile(str(_profile_with_wide(tmp_path, {**wide, "rows": [2, 3],
                                                            "row_cached_tokens": 512})))
    assert cached.batched_prefill.wide.row_cached_tokens == 512
    again = Profile.from_dict(cached.to_dict(), source="again")
    assert again.batched_prefill.wide == cached.batched_prefill.wide


W = "batched_prefill.wide"


@pytest.mark.parametrize(("wide", "field"), [
    ({"rows": [1, 8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256}, W + ".rows"),
    ({"rows": [8, 8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256}, W + ".rows"),
    ({"rows": [8], "per_extra_request_s": [0.1], "row_new_tokens": 256,
      "row_cached_tokens": -1}, W + ".row_cached_tokens"),
    ({"rows": [16, 8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256}, W + ".rows"),
    ({"rows": [8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256},
     W + ".per_extra_request_s"),
    ({"rows": [8], "per_extra_request_s": [-0.1], "row_new_tokens": 256},
     W + ".per_extra_request_s"),
    ({"rows": [8], "per_extra_request_s": [0.1]}, W + ".row_new_tokens"),
    ({"rows": [8, 16], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256,
      "seconds": [0.1], "pair_s": 1e-8}, W + ".seconds"),
    ({"rows": [8], "per_extra_request_s": [0.1], "row_new_tokens": 256, "seconds": [0.0],
      "pair_s": 1e-8}, W + ".seconds"),
    ({"rows": [8], "per_extra_request_s": [0.1], "row_new_tokens": 256, "seconds": [0.1]},
     W + ".pair_s"),
    ("wide", W),
])
def test_a_malformed_wide_entry_names_the_file_and_field(tmp_path, wide, field):
    path = _profile_with_wide(tmp_path, wide)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"{path}, field '{field}':")
