"""Batches of many prompts on a varlen engine (``profile.WideBatches``, vLLM's profiles).

Worked by hand on a grid of T(alpha, beta) = 1 + 0.01 beta + 0.001 alpha seconds, measured at
alpha in {0, 100} and beta in {1, 11} (bilinear, so exact for this linear T).
"""

from __future__ import annotations

import json

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
    per extra row: the fit gives those back, and predicts held-out batches built the same way
    exactly (their predicted / measured summary: 1.0)."""
    from ragsim.profiles.profile import Batches

    base = BatchedPrefill(linear_grid(), "none", per_extra_request_s=0.1)
    planted = {8: 0.3, 16: 0.5}
    seconds = [base.tokens_and_pairs_s([0] * n, [2] * n) + e * (n - 1)
               for n, e in planted.items()]
    held_rows = [12, 16]
    held = Batches([[0] * n for n in held_rows], [[2] * n for n in held_rows],
                   [base.tokens_and_pairs_s([0] * n, [2] * n) + (0.4 if n == 12 else 0.5)
                    * (n - 1) for n in held_rows])
    fitted = with_wide_batches(base, list(planted), seconds, 2, held)
    assert fitted.wide.per_extra_request_s == pytest.approx([0.3, 0.5])
    assert fitted.wide.heldout["median_ratio"] == pytest.approx(1.0)
    assert fitted.wide.heldout["points"] == 2
    assert fitted.per_extra_request_s == 0.1  # the 2-4 row fit is kept


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


W = "batched_prefill.wide"


@pytest.mark.parametrize(("wide", "field"), [
    ({"rows": [4, 8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256}, W + ".rows"),
    ({"rows": [16, 8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256}, W + ".rows"),
    ({"rows": [8], "per_extra_request_s": [0.1, 0.2], "row_new_tokens": 256},
     W + ".per_extra_request_s"),
    ({"rows": [8], "per_extra_request_s": [-0.1], "row_new_tokens": 256},
     W + ".per_extra_request_s"),
    ({"rows": [8], "per_extra_request_s": [0.1]}, W + ".row_new_tokens"),
    ("wide", W),
])
def test_a_malformed_wide_entry_names_the_file_and_field(tmp_path, wide, field):
    path = _profile_with_wide(tmp_path, wide)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"{path}, field '{field}':")
