"""The first-time price of a step's token count (``ragsim.profiles.new_shapes``): the model on
hand-worked numbers, the file's checks, that the simulator and the replay of a real run's
decisions each charge a token count once, in their own order, and that the profiler measures
it on token counts its own steps did not run."""

from __future__ import annotations

import json

import pytest
from test_sim_mixed import SEARCH_S, config, trace_of

from ragsim.decisions import priced_s
from ragsim.errors import ProfileError
from ragsim.profiles.new_shapes import NewShapeCharge, NewShapes, fit_new_shapes
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.profiler import ProfilePlan, _sweep_units, new_shape_counts
from ragsim.serving.costs import decode_step_s, prefill_compute_s
from ragsim.sim.simulator import run_simulation

BASE = load_profile("a10g-mistral-7b")
# 2 ms extra for a new 100-token step, 6 ms for a new 500-token one
SHAPES = {"model": "first_pass_extra_by_step_tokens", "step_tokens": [100, 500],
          "extra_s": [0.002, 0.006], "fit": {}}


def with_shapes(shapes: dict | None = SHAPES) -> Profile:
    return Profile.from_dict({**BASE.to_dict(), "new_shapes": shapes}, source="test.json")


def test_the_extra_is_linear_between_measured_sizes_and_flat_past_them():
    shapes = NewShapes([100, 500], [0.002, 0.006])
    assert shapes.extra_at(300) == pytest.approx(0.004, rel=1e-12)  # halfway: (2 + 6) / 2
    assert shapes.extra_at(200) == pytest.approx(0.003, rel=1e-12)  # a quarter: 2 + 4 / 4
    assert shapes.extra_at(7) == 0.002 and shapes.extra_at(9000) == 0.006


def test_a_token_count_is_charged_once_per_engine():
    charge = NewShapeCharge(NewShapes([100, 500], [0.002, 0.006]))
    assert charge(300) == pytest.approx(0.004)
    assert charge(300) == 0.0  # seen
    assert charge(301) == pytest.approx(0.004 + 0.004 / 400)  # new: 2 + 4 * 201 / 400 ms
    assert charge.seen == {300, 301}
    assert NewShapeCharge(None)(300) == 0.0  # a profile without the term charges nothing
    assert NewShapeCharge(NewShapes([100], [0.002]), seen=[64])(64) == 0.0


def test_fit_takes_the_median_extra_of_each_size():
    # size 100: extras 1, 3 and 2 ms (median 2); size 500: 4 ms and a first pass faster than
    # the repeat (noise, -1 ms) and 6 ms: median 4 ms
    timings = [(100, 101, 0.011, 0.010), (100, 103, 0.013, 0.010), (100, 105, 0.012, 0.010),
               (500, 501, 0.054, 0.050), (500, 503, 0.049, 0.050), (500, 505, 0.056, 0.050)]
    fitted = fit_new_shapes(timings)
    assert fitted.step_tokens == [100, 500]
    assert fitted.extra_s == pytest.approx([0.002, 0.004], rel=1e-9)
    assert fitted.fit["first_over_again_median"] == pytest.approx([1.2, 1.08], rel=1e-9)
    assert fit_new_shapes([(10, 11, 0.001, 0.002)]).extra_s == [0.0]  # never below 0


@pytest.mark.parametrize(("change", "field"), [
    ({"step_tokens": [500, 100]}, "new_shapes.step_tokens"),
    ({"step_tokens": [100, 2.5]}, "new_shapes.step_tokens"),
    ({"step_tokens": []}, "new_shapes.step_tokens"),
    ({"extra_s": [0.002]}, "new_shapes.extra_s"),
    ({"extra_s": [0.002, -0.001]}, "new_shapes.extra_s"),
    ({"extra_s": [0.002, float("nan")]}, "new_shapes.extra_s"),
    ({"model": "per_shape"}, "new_shapes.model"),
    ({"fit": []}, "new_shapes.fit"),
])
def test_a_bad_term_names_its_field(change, field):
    with pytest.raises(ProfileError) as raised:
        with_shapes({**SHAPES, **change})
    assert raised.value.field == field and raised.value.file == "test.json"


def test_the_term_survives_a_file_and_scales_with_the_machine(tmp_path):
    profile = with_shapes()
    again = load_profile(str(profile.save(tmp_path / "p.json")))
    assert again.new_shapes == profile.new_shapes
    assert json.loads((tmp_path / "p.json").read_text())["new_shapes"]["extra_s"] == [0.002,
                                                                                     0.006]
    assert profile.scaled_compute(2.0).new_shapes.extra_s == pytest.approx([0.004, 0.012])
    assert with_shapes(None).new_shapes is None


def test_the_simulator_charges_the_first_prefill_of_a_token_count_only():
    """Two requests one after another (arrivals 1 s apart: the first has ended), each one
    document of 300 tokens + 100 query tokens, no cache: the same 400-token prefill. The first
    pays T(0, 400) + 5 ms (2 + 4 * 300 / 400), the second T(0, 400) alone; their decode steps
    (batch 1, a new token count the first time too: 2 ms) come after the first token."""
    trace = trace_of([(0.0, 300, 100, 3), (1.0, 300, 100, 3)])
    settings = config("prefill-first", cache=False)
    plain = run_simulation(trace, settings, BASE).records
    charged = run_simulation(trace, settings, with_shapes()).records
    at = BASE.prefill.at
    assert plain["first_token_s"][0] == pytest.approx(SEARCH_S + at(0, 400), rel=1e-12)
    assert charged["first_token_s"][0] == pytest.approx(SEARCH_S + at(0, 400) + 0.005,
                                                        rel=1e-12)
    assert charged["first_token_s"][1] == pytest.approx(plain["first_token_s"][1], rel=1e-12)
    # the first request's decode steps: one of them paid the batch of 1's first time
    first_finish = charged["finish_s"][0] - charged["first_token_s"][0]
    assert first_finish == pytest.approx(
        plain["finish_s"][0] - plain["first_token_s"][0] + 0.002, rel=1e-9)


def test_an_engine_that_ran_a_count_before_the_run_pays_nothing_for_it():
    """A validation's engine has run steps before its run (warm-up, probes, earlier points):
    the simulation of that run is told, and those counts are built; others are not."""
    profile = with_shapes().warmed([400, 2])
    charge = NewShapeCharge(profile.new_shapes)
    assert charge(400) == 0.0 and charge(2) == 0.0
    assert charge(300) == pytest.approx(0.004)
    # it survives a machine-speed scaling (the speed-adjusted simulation) and adds up
    scaled = profile.scaled_compute(2.0).warmed([300])
    assert scaled.new_shapes.warm_step_tokens == (400, 2, 300)  # the last run last
    assert NewShapeCharge(scaled.new_shapes)(200) == pytest.approx(2 * 0.003)
    assert with_shapes().new_shapes.warm_step_tokens == ()
    assert "warm" not in json.dumps(profile.to_dict())  # a run's state, never in the file
    assert BASE.warmed([400]) is BASE  # no term: nothing to warm
    # the first of the two 400-token prefills (first test above) is now free too
    trace = trace_of([(0.0, 300, 100, 3), (1.0, 300, 100, 3)])
    settings = config("prefill-first", cache=False)
    plain = run_simulation(trace, settings, BASE).records
    warm = run_simulation(trace, settings, profile).records
    assert warm["first_token_s"][0] == pytest.approx(plain["first_token_s"][0], rel=1e-12)


def test_a_validation_prices_the_sim_with_what_the_real_engine_had_run():
    from types import SimpleNamespace

    from ragsim.validation import warmed_like

    profile = with_shapes()
    real = SimpleNamespace(engine_warm_step_tokens=(300,))
    assert warmed_like(profile, real).new_shapes.warm_step_tokens == (300,)
    assert warmed_like(profile, SimpleNamespace()) is profile  # a torch or simulated run
    # the engine's own bound on built counts, where the run recorded one: the profile had
    # none (every count stays built), the run's process keeps 256 of them
    bounded = warmed_like(profile, SimpleNamespace(engine_built_capacity_counts=256,
                                                   engine_warm_step_tokens=(300,)))
    assert bounded.new_shapes.built_capacity_counts == 256
    assert bounded.new_shapes.warm_step_tokens == (300,)
    assert profile.new_shapes.built_capacity_counts is None  # the profile itself unchanged
    assert warmed_like(BASE, SimpleNamespace(engine_built_capacity_counts=256)) is BASE


def test_repeated_runs_are_simulated_each_from_its_own_engines_state():
    """vLLM's repeats of a point share one engine process: the first run built the point's
    token counts, so the runs after it begin warm. The real side averages the runs; the
    simulated side averages one simulation per run's starting state. One request, one
    400-token prefill (first test above): cold it pays 5 ms more; over a cold first run and
    two warm ones the average pays a third of that."""
    from types import SimpleNamespace

    from ragsim.validation import like_runs, run_sim_ensemble, run_sim_like_runs

    trace = trace_of([(0.0, 300, 100, 3)])
    settings = config("prefill-first", cache=False)
    reals = [SimpleNamespace(engine_warm_step_tokens=warm) for warm in ((), (400,), (2, 400))]
    states = like_runs(with_shapes(), reals)
    average, first = run_sim_like_runs(trace, settings, states)
    cold = SEARCH_S + BASE.prefill.at(0, 400) + 0.005
    assert first.columns["first_token_s"][0] == pytest.approx(cold, rel=1e-12)
    assert average.columns["first_token_s"][0] == pytest.approx(cold - 0.005 * 2 / 3,
                                                                rel=1e-12)
    assert average.summary["sim_engine_states"] == 3
    # noisy replicas cycle through the runs' states: three replicas without noise, one each
    replicas = run_sim_ensemble(trace, settings, states, 3, 0.0)
    assert replicas.columns["first_token_s"][0] == pytest.approx(cold - 0.005 * 2 / 3,
                                                                 rel=1e-12)
    # runs that began alike (a torch engine's, or no first-time prices): one simulation
    alike = like_runs(BASE, reals)
    one, same = run_sim_like_runs(trace, settings, alike)
    assert one is same and "sim_engine_states" not in one.summary


def test_the_replay_prices_a_token_count_once_in_the_order_of_the_real_steps():
    profile = with_shapes()
    prefill = {"kind": "prefill", "jobs": [(1, 0, 0, 300, 0)], "size": 0,
               "context_tokens": 0.0}
    mixed = {"kind": "mixed", "jobs": [(2, 1, 0, 296, 0)], "size": 4, "context_tokens": 50.0}
    decode = {"kind": "decode", "jobs": [], "size": 300, "context_tokens": 120.0}
    charge = NewShapeCharge(profile.new_shapes)
    at_300 = 0.004  # 2 + 4 * 200 / 400 ms
    assert priced_s(prefill, profile, new_shape=charge) == pytest.approx(
        prefill_compute_s(profile, [0], [300]) + at_300, rel=1e-12)
    # 296 prompt tokens + 4 decode rows: 300 tokens again, seen
    assert priced_s(mixed, profile, new_shape=charge) == pytest.approx(
        priced_s(mixed, profile), rel=1e-12)
    # a decode step of 300 rows: the same token count, seen too
    assert priced_s(decode, profile, new_shape=charge) == pytest.approx(
        decode_step_s(profile, 300, 120.0), rel=1e-12)
    assert charge.seen == {300}  # one count, charged once
    assert priced_s(prefill, profile) == pytest.approx(prefill_compute_s(profile, [0], [300]))


def test_the_measured_token_counts_are_ones_the_profile_did_not_run():
    plan = ProfilePlan.quick()
    units = _sweep_units(plan, 0)
    ran = {sum(new) for unit in units for _, new in unit.passes} | set(plan.batch_sizes)
    counts = new_shape_counts(plan, units)
    tokens = [t for _, t in counts]
    assert len(tokens) == len(set(tokens)) and not set(tokens) & ran
    sizes = sorted({s for s, _ in counts})
    assert sizes[0] >= 8 and sizes[-1] == max(plan.new_tokens)
    assert all(abs(t - s) <= 16 for s, t in counts)  # near its size


def test_the_torch_profiler_measures_the_first_time_price(tiny_torch_profile):
    profile = load_profile(str(tiny_torch_profile))
    shapes = profile.new_shapes
    # five sizes from 8 to 64, a factor of 8 ** (1 / 4) = 1.682 apart: 8, 13.5, 22.6, 38.1, 64
    assert shapes is not None and shapes.step_tokens == [8, 13, 23, 38, 64]
    assert all(s >= 0 for s in shapes.extra_s)
    raw = profile.obtained["raw"]["new_shapes"]
    assert len(raw) == 15 and all(first > 0 and again > 0 for _, _, first, again in raw)


def test_the_real_runs_iterations_are_priced_with_it_too():
    """The torch harness's per-iteration comparison prices its log as the simulator would: two
    single 300-token prefills (the second of a count already run) and a decode step of 300
    rows: one charge, 4 ms, in the prefills' predicted total."""
    from ragsim.realrun.harness import cost_model_errors

    profile = with_shapes()
    log = [("prefill", [0], [300], 0.05, 0.0, 0.0), ("prefill", [0], [300], 0.05, 0.0, 0.0),
           ("decode", 300, 120.0, 0.05, False, 0.0, 121)]
    priced = cost_model_errors(log, profile)
    plain = cost_model_errors(log, BASE)
    assert priced["prefill_single"]["predicted_s"] == pytest.approx(
        plain["prefill_single"]["predicted_s"] + 0.004, rel=1e-12)
    assert priced["decode"]["predicted_s"] == pytest.approx(plain["decode"]["predicted_s"],
                                                            rel=1e-12)


def test_profiles_show_prints_the_term(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    path = with_shapes().save(tmp_path / "p.json")
    shown = CliRunner().invoke(app, ["profiles", "show", str(path)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "first-time price of a step's token count (tokens: extra) 100: 2 ms, 500: 6 ms" \
        in shown.output
