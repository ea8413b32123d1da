"""A step after new token counts, and the bounded cache of built counts
(``ragsim.profiles.after_new_shapes``, ``NewShapeCharge``): the model on hand-worked numbers,
the cache's least-recently-used order, the extra charged only while the cache grows, the
file's checks, and the profiler measuring within the room the engine's cache has left."""

from __future__ import annotations

import json

import pytest

from ragsim.errors import ProfileError
from ragsim.profiles.after_new_shapes import (
    AfterNewShapes,
    FreshCountsSince,
    fit_after_new_shapes,
)
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.new_shapes import NewShapeCharge, NewShapes
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.profiler import ProfilePlan, TorchEngine, after_new_sizes, run_profile

BASE = load_profile("a10g-mistral-7b")


def flat(rows: list[list[float]]) -> list[float]:
    return [v for row in rows for v in row]

# a step of 1,000 tokens: +4 ms after 4 fresh counts, +10 ms after 24; 3,000 tokens: +12, +30
AFTER = AfterNewShapes([1000, 3000], [4, 24], [[0.004, 0.010], [0.012, 0.030]])


def test_the_extra_is_linear_in_counts_and_tokens_through_zero_and_flat_past_them():
    assert AFTER.extra_at(1000, 4) == pytest.approx(0.004)
    assert AFTER.extra_at(1000, 2) == pytest.approx(0.002)  # half of 4 counts' extra
    assert AFTER.extra_at(1000, 14) == pytest.approx(0.007)  # halfway from 4 to 24: 4 + 6 / 2
    assert AFTER.extra_at(1000, 100) == pytest.approx(0.010)  # flat past 24
    assert AFTER.extra_at(500, 4) == pytest.approx(0.002)  # half of 1,000 tokens' extra
    assert AFTER.extra_at(2000, 24) == pytest.approx(0.020)  # halfway between the sizes
    assert AFTER.extra_at(9000, 24) == pytest.approx(0.030)  # flat past the largest size
    assert AFTER.extra_at(1000, 0) == 0.0 and AFTER.extra_at(0, 24) == 0.0


def test_fit_takes_each_cells_median_over_the_steady_time():
    steady = {1000: 0.050, 3000: 0.100}
    timings = [(1000, 4, 0.053), (1000, 4, 0.057), (1000, 24, 0.060), (1000, 24, 0.064),
               (3000, 4, 0.095), (3000, 4, 0.097), (3000, 24, 0.190), (3000, 24, 0.210)]
    fitted = fit_after_new_shapes(steady, timings)
    assert fitted.step_tokens == [1000, 3000] and fitted.fresh_counts == [4, 24]
    # medians 55 and 62 ms over 50; 96 ms (faster than steady: 0) and 200 ms over 100
    assert flat(fitted.extra_s) == pytest.approx([0.005, 0.012, 0.0, 0.100], abs=1e-12)
    assert flat(fitted.fit["over_steady_median"]) == pytest.approx([1.1, 1.24, 0.96, 2.0])
    with pytest.raises(ValueError, match="size 3000 after 24"):
        fit_after_new_shapes(steady, timings[:6])


def test_fresh_counts_are_counted_since_the_last_step_at_least_as_big():
    since = FreshCountsSince()
    assert since.step(1000, False) == 0  # nothing built yet
    assert since.step(100, True) == 0  # the 1,000-token step ran after none
    assert since.step(101, True) == 1  # since the last step of >= 101 tokens (1,000): 100
    assert since.step(50, False) == 0  # the 101-token step ran just before, nothing since
    assert since.step(1000, False) == 2  # 100 and 101 since the last 1,000
    assert since.step(900, True) == 0  # the 1,000-token step just ran
    assert since.step(80, True) == 0  # 900 is fresh but ran as the step as big (itself)
    assert since.step(2000, False) == 4  # no step as big ever: every fresh count (4)
    assert since.step(1000, False) == 0  # the 2,000-token step is as big, none since


def test_a_bounded_cache_drops_the_least_recently_run_count():
    """Room for 2 counts: 100 and 200 built, 100 run again (now the most recent), 300 pushes
    out 200, which then pays its first-time price again, pushing out 100."""
    shapes = NewShapes([100], [0.002], built_capacity_counts=2)
    charge = NewShapeCharge(shapes)
    assert charge(100) == pytest.approx(0.002) and charge(200) == pytest.approx(0.002)
    assert charge(100) == 0.0
    assert charge(300) == pytest.approx(0.002) and charge.seen == {100, 300}
    assert charge(200) == pytest.approx(0.002) and charge.seen == {300, 200}
    assert charge(300) == 0.0
    unbounded = NewShapeCharge(NewShapes([100], [0.002]))
    for t in (100, 200, 300):
        unbounded(t)
    assert unbounded(100) == 0.0 and unbounded.seen == {100, 200, 300}


def test_the_warm_counts_are_built_in_the_order_they_last_ran():
    """A process that ran 100, 200, 300 and then 100 again keeps, with room for 2, 300 and
    100: 200 is built again; and it had built 3 counts, its cache was full."""
    shapes = NewShapes([100], [0.002], built_capacity_counts=2).warmed([100, 200, 300])
    shapes = shapes.warmed([100])
    assert shapes.warm_step_tokens == (200, 300, 100)
    charge = NewShapeCharge(shapes)
    assert charge.seen == {300, 100} and charge.ever_built == 3
    assert charge(200) == pytest.approx(0.002)


def test_the_step_after_new_counts_pays_only_while_the_cache_grows():
    """Room for 3 counts; a 1,000-token step pays 1 ms a fresh count built while the cache
    grew since its last run (4 ms after 4; linear below). 100 and 101 grow the cache (with
    1,000: 3 counts built), 102 pushes out 100 (the least recently run): no growth."""
    after = AfterNewShapes([1000], [4], [[0.004]])
    charge = NewShapeCharge(NewShapes([100], [0.002], built_capacity_counts=3, after=after))
    assert charge(1000) == pytest.approx(0.002)  # first time; nothing built before it
    assert charge(100) == pytest.approx(0.002)  # grows the cache (2 of 3)
    assert charge(1000) == pytest.approx(0.001)  # built; one growing count since
    assert charge(101) == pytest.approx(0.002)  # grows it (3 of 3: full)
    # built in the memory of the count it drops; itself a step after 101 grew the cache
    assert charge(102) == pytest.approx(0.002 + 0.001 * 102 / 1000)
    assert charge.seen == {1000, 101, 102}
    assert charge(1000) == pytest.approx(0.001)  # 101 grew it, 102 did not
    assert charge(100) == pytest.approx(0.002)  # dropped: its first-time price again
    assert charge(1000) == 0.0  # full: no count grows it any more
    # the same steps on an engine with room for all: every fresh count grows the cache
    roomy = NewShapeCharge(NewShapes([100], [0.002], after=after))
    for t in (1000, 100, 1000, 101, 102):
        roomy(t)
    assert roomy(1000) == pytest.approx(0.002)  # 101 and 102


def test_the_terms_survive_a_file_and_scale_with_the_machine(tmp_path):
    shapes = NewShapes([100], [0.002], built_capacity_counts=256, after=AFTER)
    profile = Profile.from_dict({**BASE.to_dict(), "new_shapes": shapes.to_dict()},
                                source="t.json")
    again = load_profile(str(profile.save(tmp_path / "p.json")))
    assert again.new_shapes == shapes
    written = json.loads((tmp_path / "p.json").read_text())["new_shapes"]
    assert written["built_capacity_counts"] == 256
    assert written["after_new_counts"]["extra_s"] == [[0.004, 0.010], [0.012, 0.030]]
    doubled = profile.scaled_compute(2.0).new_shapes
    assert flat(doubled.after.extra_s) == pytest.approx([0.008, 0.020, 0.024, 0.060])
    assert doubled.built_capacity_counts == 256  # a count of products, not a time
    assert "256 counts stay built" in shapes.describe()
    assert "after 24 new token counts (tokens: extra) 1,000: 10 ms, 3,000: 30 ms" \
        in shapes.describe()


GOOD = {"model": "first_pass_extra_by_step_tokens", "step_tokens": [100], "extra_s": [0.002],
        "fit": {}, "built_capacity_counts": 256, "after_new_counts": AFTER.to_dict()}


@pytest.mark.parametrize(("change", "field"), [
    ({"built_capacity_counts": 0}, "new_shapes.built_capacity_counts"),
    ({"built_capacity_counts": 2.5}, "new_shapes.built_capacity_counts"),
    ({"after_new_counts": {**AFTER.to_dict(), "model": "x"}},
     "new_shapes.after_new_counts.model"),
    ({"after_new_counts": {**AFTER.to_dict(), "fresh_counts": [24, 4]}},
     "new_shapes.after_new_counts.fresh_counts"),
    ({"after_new_counts": {**AFTER.to_dict(), "step_tokens": [1000]}},
     "new_shapes.after_new_counts.extra_s"),
    ({"after_new_counts": {**AFTER.to_dict(), "extra_s": [[0.004], [0.012, 0.03]]}},
     "new_shapes.after_new_counts.extra_s"),
    ({"after_new_counts": {**AFTER.to_dict(), "extra_s": [[0.004, -1], [0.012, 0.03]]}},
     "new_shapes.after_new_counts.extra_s"),
    ({"after_new_counts": {**AFTER.to_dict(), "fit": 3}}, "new_shapes.after_new_counts.fit"),
])
def test_a_bad_term_names_its_field(change, field):
    with pytest.raises(ProfileError) as raised:
        Profile.from_dict({**BASE.to_dict(), "new_shapes": {**GOOD, **change}}, source="t.json")
    assert raised.value.field == field and raised.value.file == "t.json"


SPEC = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
PLAN = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 16, 64], batch_sizes=[1, 2],
                   context_tokens=[16, 32], batches=2, held_out_points=1, held_out_batches=1,
                   copy_bytes=[2**12], warmup=0, repetitions=1)


class BoundedTorchEngine(TorchEngine):
    """The torch engine, declaring a cache of built counts of ``capacity`` with ``built``
    counts in it already (the torch engine keeps none: this exercises the profiler's budget)."""

    def __init__(self, built: int, capacity: int) -> None:
        super().__init__(SPEC, "cpu", "fp32", 1, 0)
        self._built = (built, capacity)

    def built_shapes(self) -> tuple[int, int]:
        return self._built


def test_the_profiler_times_a_step_after_new_counts(tmp_path):
    profile = run_profile(SPEC, name="t", device="cpu", dtype="fp32", plan=PLAN,
                          out=tmp_path / "p.json")
    after = profile.new_shapes.after
    # two sizes, geometric from a sixth of the plan's largest (64 / 6 = 10.7) to it
    assert after_new_sizes(PLAN) == [11, 64] and after.step_tokens == [11, 64]
    assert after.fresh_counts == [8, 24] and all(s >= 0 for row in after.extra_s for s in row)
    raw = profile.obtained["raw"]["after_new_counts"]
    assert len(raw) == 2 + 2 * 2 * 2  # the steady times, then 2 repeats x 2 sizes x 2 counts
    assert profile.new_shapes.built_capacity_counts is None  # torch: every count stays built


def test_the_profiler_measures_only_as_many_repeats_as_the_cache_has_room_for(tmp_path):
    """A repeat builds 2 sizes x (8 + 24) = 64 counts; the timed sizes take 2 more."""
    one = run_profile(SPEC, name="t", device="cpu", dtype="fp32", plan=PLAN,
                      out=tmp_path / "one.json", engine=BoundedTorchEngine(100, 200))
    assert len(one.obtained["raw"]["after_new_counts"]) == 2 + 2 * 2  # 98 of room: 1 repeat
    assert one.new_shapes.built_capacity_counts == 200
    assert any("1 of 2 repeats" in w for w in one.obtained["warnings"])
    none = run_profile(SPEC, name="t", device="cpu", dtype="fp32", plan=PLAN,
                       out=tmp_path / "none.json", engine=BoundedTorchEngine(180, 200))
    assert none.new_shapes.after is None and none.new_shapes.built_capacity_counts == 200
    assert any("0 of 2 repeats" in w and "built 180 of the 200" in w
               for w in none.obtained["warnings"])
