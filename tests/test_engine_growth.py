"""A new engine's first step above its largest (``ragsim.profiles.growth``): the model on
hand-worked numbers, its charge per engine in the order steps run, the file's checks, and the
profiler timing it on a twin of its engine."""

from __future__ import annotations

import pytest

from ragsim.errors import ProfileError
from ragsim.profiles.growth import EngineGrowth, fit_engine_growth
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.new_shapes import NewShapeCharge, NewShapes
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.profiler import ProfilePlan, growth_sizes, run_profile

BASE = load_profile("a10g-mistral-7b")
# up to 4,000 tokens: 300 ms in all; up to 16,000: 1,300 ms (1,000 more between them)
GROWTH = EngineGrowth([4000, 16000], [0.300, 1.300])


def test_a_step_pays_the_growth_above_the_engines_largest():
    assert GROWTH.extra_above(0, 2000) == pytest.approx(0.150)  # half of 4,000: through 0
    assert GROWTH.extra_above(2000, 4000) == pytest.approx(0.150)  # the other half
    assert GROWTH.extra_above(4000, 10000) == pytest.approx(0.500)  # half of 1,000 ms
    assert GROWTH.extra_above(0, 16000) == pytest.approx(1.300)
    assert GROWTH.extra_above(16000, 30000) == 0.0  # flat past the largest size
    assert GROWTH.extra_above(10000, 3000) == 0.0  # not bigger: nothing


def test_fit_sums_first_minus_again_over_increasing_sizes():
    fitted = fit_engine_growth([(4000, 0.377, 0.097), (16000, 1.410, 0.382),
                                (20000, 0.400, 0.410)])  # the last faster than again: 0
    assert fitted.step_tokens == [4000, 16000, 20000]
    assert fitted.extra_s == pytest.approx([0.280, 1.308, 1.308])
    assert fitted.fit["first_over_again"][0] == pytest.approx(0.377 / 0.097)
    with pytest.raises(ValueError, match="increasing"):
        fit_engine_growth([(4000, 0.3, 0.1), (4000, 0.3, 0.1)])


def test_a_process_pays_for_its_growth_once():
    shapes = NewShapes([100], [0.0], growth=GROWTH)
    engine = NewShapeCharge(shapes)
    assert engine(2000) == pytest.approx(0.150)
    assert engine(1000) == 0.0  # below its largest
    assert engine(4000) == pytest.approx(0.150)
    assert engine(4000) == 0.0
    assert engine(16000) == pytest.approx(1.000)
    assert NewShapeCharge(shapes)(16000) == pytest.approx(1.300)  # a new process: all of it
    # a new engine in a process that had run a step of 4,000 tokens: the memory is there
    assert NewShapeCharge(shapes.warmed([4000, 64]))(16000) == pytest.approx(1.000)


def test_the_term_survives_a_file_scales_and_names_bad_fields(tmp_path):
    shapes = NewShapes([100], [0.002], growth=GROWTH)
    profile = Profile.from_dict({**BASE.to_dict(), "new_shapes": shapes.to_dict()},
                                source="t.json")
    assert load_profile(str(profile.save(tmp_path / "p.json"))).new_shapes == shapes
    assert profile.scaled_compute(2.0).new_shapes.growth.extra_s == pytest.approx([0.6, 2.6])
    assert "1.3e+03 ms up to 16,000 tokens" in shapes.describe()
    for change, message in [({"extra_s": [0.3]}, "as long as"),
                            ({"extra_s": [0.3, 0.2]}, "never below"),
                            ({"step_tokens": [16000, 4000]}, "increase"),
                            ({"model": "x"}, "unknown model")]:
        bad = {**shapes.to_dict(), "engine_growth": {**GROWTH.to_dict(), **change}}
        with pytest.raises(ProfileError, match=message) as raised:
            Profile.from_dict({**BASE.to_dict(), "new_shapes": bad}, source="t.json")
        assert raised.value.field.startswith("new_shapes.engine_growth")


def test_the_profiler_times_a_twin_engines_first_steps(tmp_path):
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 16, 64, 512], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12], warmup=0, repetitions=1)
    # from 256 to the plan's largest prefill (512; no wide batches), 2 ** (1 / 3) apart:
    # 256, 322.5, 406.4, 512
    assert growth_sizes(plan) == [256, 323, 406, 512]
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan,
                          out=tmp_path / "p.json")
    growth = profile.new_shapes.growth
    assert growth.step_tokens == [256, 323, 406, 512]
    raw = profile.obtained["raw"]["engine_growth"]
    assert [r[0] for r in raw] == [256, 323, 406, 512] and all(r[1] > 0 and r[2] > 0
                                                              for r in raw)
    # the term is the raw timings' running sum of (first - again), each clipped at 0, worked
    # here from the rows the profile kept (a profile that stored another statistic, or rows
    # that do not match its term, fails)
    running, expected = 0.0, []
    for _, first_s, again_s in raw:
        running += first_s - again_s if first_s > again_s else 0.0
        expected.append(running)
    assert growth.extra_s == pytest.approx(expected, rel=1e-12, abs=1e-15)
