"""A step begun after the engine sat idle (``ragsim.profiles.idle_start``): the model on
hand-worked numbers, the file's checks, that the simulator, the replay of a real run's
decisions and the torch harness's per-iteration comparison charge it for the pause before a
step and only then, and that the profiler times it."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from test_sim_mixed import SEARCH_S, config, trace_of

from ragsim.decisions import replay
from ragsim.errors import ProfileError
from ragsim.profiles.idle_start import IdleStart, fit_idle_start
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.profiler import (
    IDLE_PAUSES_S,
    IDLE_REPEATS,
    ProfilePlan,
    idle_sizes,
    run_profile,
)
from ragsim.sim.simulator import run_simulation

BASE = load_profile("a10g-mistral-7b")
# 1 ms extra after 10 ms idle, 2 ms after 100 ms and longer
IDLE = IdleStart([0.01, 0.1], [0.001, 0.002])


def with_idle(term: IdleStart = IDLE) -> Profile:
    return Profile.from_dict({**BASE.to_dict(), "idle_start": term.to_dict()},
                             source="test.json")


def test_the_extra_is_linear_in_the_pause_from_zero_and_flat_past_the_longest():
    assert IDLE.seconds(0.0) == 0.0
    assert IDLE.seconds(-1.0) == 0.0  # a step that began before the last ended: no pause
    assert IDLE.seconds(0.005) == pytest.approx(0.0005)  # half of 10 ms: through 0
    assert IDLE.seconds(0.055) == pytest.approx(0.0015)  # halfway from 10 to 100 ms
    assert IDLE.seconds(0.1) == pytest.approx(0.002)
    assert IDLE.seconds(5.0) == pytest.approx(0.002)
    assert IDLE.seconds(float("inf")) == pytest.approx(0.002)  # no step before it
    assert BASE.idle_start_s(float("inf")) == 0.0  # a profile without the term: nothing


def test_fit_averages_the_sizes_extras_over_back_to_back_medians():
    """Two sizes; per size and pause three timings (ms). Size 64, no pause: median 4; after
    10 ms: median 5 (+1); after 100 ms: median 5.5 (+1.5). Size 512, no pause: median 20;
    after 10 ms: median 22 (+2); after 100 ms: median 21.5 (+1.5). Means over the sizes:
    +1.5 and +1.5 ms. A faster step after a pause counts 0, not a negative extra."""
    ms = 1e-3
    rows = [(64, 0.0, 4 * ms), (64, 0.0, 3 * ms), (64, 0.0, 9 * ms),
            (64, 0.01, 5 * ms), (64, 0.01, 5 * ms), (64, 0.01, 4 * ms),
            (64, 0.1, 5.5 * ms), (64, 0.1, 6 * ms), (64, 0.1, 5 * ms),
            (512, 0.0, 20 * ms), (512, 0.0, 19 * ms), (512, 0.0, 21 * ms),
            (512, 0.01, 22 * ms), (512, 0.01, 23 * ms), (512, 0.01, 21 * ms),
            (512, 0.1, 21.5 * ms), (512, 0.1, 21 * ms), (512, 0.1, 30 * ms)]
    fitted = fit_idle_start(rows)
    assert fitted.idle_s == [0.01, 0.1]
    assert fitted.extra_s == pytest.approx([1.5 * ms, 1.5 * ms])
    assert fitted.fit["extra_s_by_size"]["64"] == pytest.approx([1 * ms, 1.5 * ms])
    assert fitted.fit["extra_s_by_size"]["512"] == pytest.approx([2 * ms, 1.5 * ms])
    # extras of -1 (a step faster after the pause: 0), 2, 1 and 1.5 ms: not non-decreasing;
    # isotonic regression pools 2 and 1 (1.5 each), and 1.5 follows
    faster = [(64, 0.0, 4 * ms), (64, 0.003, 3 * ms), (64, 0.01, 6 * ms), (64, 0.03, 5 * ms),
              (64, 0.1, 5.5 * ms)]
    assert fit_idle_start(faster).extra_s == pytest.approx([0.0, 1.5 * ms, 1.5 * ms, 1.5 * ms])
    with pytest.raises(ValueError, match="every size"):
        fit_idle_start([(64, 0.0, ms), (64, 0.01, ms), (512, 0.0, ms)])


@pytest.mark.parametrize(("change", "message", "field"), [
    ({"idle_s": [0.1, 0.01]}, "increasing", "idle_start.idle_s"),
    ({"idle_s": [0.0, 0.1]}, "> 0", "idle_start.idle_s"),
    ({"extra_s": [0.001]}, "as long as", "idle_start.extra_s"),
    ({"extra_s": [0.002, 0.001]}, "never below", "idle_start.extra_s"),
    ({"extra_s": [-0.001, 0.001]}, ">= 0", "idle_start.extra_s"),
    ({"model": "x"}, "unknown model", "idle_start.model"),
])
def test_a_bad_term_names_its_field(change, message, field):
    with pytest.raises(ProfileError, match=message) as raised:
        Profile.from_dict({**BASE.to_dict(), "idle_start": {**IDLE.to_dict(), **change}},
                          source="t.json")
    assert raised.value.field == field


def test_the_term_survives_a_file_and_scales_with_the_machine(tmp_path):
    profile = with_idle()
    assert load_profile(str(profile.save(tmp_path / "p.json"))).idle_start == IDLE
    assert profile.scaled_compute(2.0).idle_start.extra_s == pytest.approx([0.002, 0.004])


def test_the_simulator_charges_a_step_for_the_pause_before_it():
    """Two requests of one 300-token document + 100 query tokens, one output token each, no
    cache. The first prefill is the run's first step (no step before it): +2 ms. The second
    request arrives so that its prefill begins 20 ms after the first ended: +1 ms + 1 ms x
    10 / 90 (between 10 and 100 ms). A third, 1 s later: +2 ms."""
    at = BASE.prefill.at(0, 400)
    first_end = SEARCH_S + at + 0.002
    second_arrival = first_end + 0.020 - SEARCH_S
    trace = trace_of([(0.0, 300, 100, 1), (second_arrival, 300, 100, 1),
                      (second_arrival + 1.0, 300, 100, 1)])
    settings = config("prefill-first", cache=False)
    plain = run_simulation(trace, settings, BASE).records
    charged = run_simulation(trace, settings, with_idle()).records
    assert plain["first_token_s"][0] == pytest.approx(SEARCH_S + at, rel=1e-12)
    assert charged["first_token_s"][0] == pytest.approx(first_end, rel=1e-12)
    assert charged["ttft_s"][1] - plain["ttft_s"][1] == pytest.approx(0.001 + 0.001 / 9,
                                                                      rel=1e-9)
    assert charged["ttft_s"][2] - plain["ttft_s"][2] == pytest.approx(0.002, rel=1e-9)


def test_a_step_right_after_another_pays_nothing():
    """One request decoding 40 tokens; its decode steps follow its prefill and each other with
    no pause: only the first prefill pays (+2 ms), so the request's last token comes exactly
    2 ms later than without the term, under both schedulers (the mixed one prices decode steps
    one by one, prefill-first ones as runs of steps)."""
    trace = trace_of([(0.0, 300, 100, 40)])
    for scheduler in ("prefill-first", "mixed"):
        settings = config(scheduler, cache=False)
        plain = run_simulation(trace, settings, BASE).records
        charged = run_simulation(trace, settings, with_idle()).records
        assert charged["finish_s"][0] - plain["finish_s"][0] == pytest.approx(0.002, rel=1e-9)


def test_the_replay_charges_the_pause_before_an_iteration_it_retimes():
    """Three real iterations priced 10 ms each: the first (no step before it) pays 2 ms; the
    second was ready 5 ms after the first's replayed end (+0.5 ms); the third was ready
    before the second ended (no pause)."""
    decisions = [
        {"kind": "prefill", "start_s": 0.0, "end_s": 0.02, "jobs": [(0, 0, 0, 10, 0)]},
        {"kind": "prefill", "start_s": 0.03, "end_s": 0.05, "jobs": [(1, 1, 0, 10, 0)]},
        {"kind": "prefill", "start_s": 0.05, "end_s": 0.07, "jobs": [(2, 2, 0, 10, 0)]}]
    columns = {"first_token_s": np.array([0.02, 0.05, 0.07]),
               "arrival_s": np.zeros(3), "search_end_s": np.zeros(3)}
    submitted = {0: 0.0, 1: 0.017, 2: 0.02}
    ttft = replay(decisions, submitted, columns, lambda d: 0.010, cold_start=IDLE.seconds)
    # 0 -> 12 ms; ready at 17 ms: 5 ms idle, 17 -> 27.5 ms; ready at 20 ms: 27.5 -> 37.5 ms
    assert ttft == pytest.approx([0.012, 0.0275, 0.0375])
    plain = replay(decisions, submitted, columns, lambda d: 0.010)
    assert plain == pytest.approx([0.010, 0.027, 0.037])


def test_the_torch_harness_prices_its_iterations_pause():
    from ragsim.realrun.harness import cost_model_errors

    profile = with_idle()
    log = [("prefill", [0], [300], 0.05, 0.0, float("inf")),
           ("prefill", [0], [300], 0.05, 0.0, 0.055), ("decode", 4, 120.0, 0.05, False, 0.0, 121)]
    priced, plain = cost_model_errors(log, profile), cost_model_errors(log, BASE)
    assert priced["prefill_single"]["predicted_s"] == pytest.approx(
        plain["prefill_single"]["predicted_s"] + 0.002 + 0.0015, rel=1e-12)
    assert priced["decode"]["predicted_s"] == pytest.approx(plain["decode"]["predicted_s"],
                                                            rel=1e-12)


def test_the_torch_profiler_times_steps_after_pauses(tmp_path):
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 16, 64, 512], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12], warmup=0, repetitions=1)
    # the plan's new tokens of 32 and more: 64 and 512; the smallest and the middle one
    assert idle_sizes(plan) == [64, 512]
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan,
                          out=tmp_path / "p.json")
    raw = profile.obtained["raw"]["idle_start"]
    pauses = [0.0, *IDLE_PAUSES_S]
    assert len(raw) == 2 * len(pauses) * IDLE_REPEATS
    assert sorted((int(z), p) for z, p, _ in raw) == sorted(
        (z, p) for z in (64, 512) for p in pauses for _ in range(IDLE_REPEATS))
    term = profile.idle_start
    assert term is not None and term.idle_s == list(IDLE_PAUSES_S)
    # each size's extras, worked from the raw rows: median after the pause - median without
    for z in (64, 512):
        base = statistics.median(t for size, p, t in raw if size == z and p == 0.0)
        expected = [max(0.0, statistics.median(t for size, q, t in raw if size == z and q == p)
                        - base) for p in IDLE_PAUSES_S]
        assert term.fit["extra_s_by_size"][str(z)] == pytest.approx(expected, rel=1e-12)
    assert load_profile(str(tmp_path / "p.json")).idle_start == term


def test_profiles_show_prints_the_term(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    path = with_idle().save(tmp_path / "p.json")
    shown = CliRunner().invoke(app, ["profiles", "show", str(path)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "a step after the engine sat idle: 1 ms after 10 ms, 2 ms after 100 ms" \
        in shown.output


def test_the_split_puts_the_steps_prices_and_the_time_outside_them_apart():
    """Two requests, real TTFTs 10 and 30 ms (mean 20); replayed at the profile's prices 8 and
    24 (mean 16: the cost model -20%); at the steps' measured durations 9 and 27 (mean 18:
    -10% outside the steps, so -10% on the steps' prices); simulated 15 and 21 (mean 18:
    decisions +10%)."""
    import pandas as pd

    from ragsim.decisions import split_error

    joined = pd.DataFrame({"request_id": [7, 9], "ttft_s_real": [0.010, 0.030],
                           "ttft_s_sim": [0.015, 0.021]})
    ids = np.array([9, 7])  # the real run's rows: request 9 first
    split = split_error(joined, np.array([0.024, 0.008]), ids, np.array([0.027, 0.009]))
    assert split["cost_model_error"] == pytest.approx(-0.20)
    assert split["outside_steps_error"] == pytest.approx(-0.10)
    assert split["step_price_error"] == pytest.approx(-0.10)
    assert split["decision_error"] == pytest.approx(0.10)
    assert "outside_steps_error" not in split_error(joined, np.array([0.024, 0.008]), ids)


def test_a_host_copy_beside_the_compute_does_not_hide_the_cold_start():
    """With ``overlap_swap`` a step takes the longer of its compute and its host->GPU copy; the
    cold start comes on top of that (the engine starts the step late, copy or not), in a
    prefill-first step and in a mixed one alike. The first step of a run pays the longest
    pause's 2 ms; a copy of 1 GB (tens of ms at the A10G's bandwidth) outlasts the compute."""
    import simpy

    from ragsim.serving.engine import Job
    from ragsim.sim.predicted import PredictedIterations

    def job() -> Job:
        j = Job(0, 0, [1], [300], 100, 1, speculative=False)
        j.alpha, j.beta, j.swap_in_bytes = 300, 100, 2**30
        return j

    profile = with_idle()
    copy_s = profile.transfers.host_to_device_s(2**30)
    compute_s = BASE.prefill.at(300, 100)
    assert copy_s > compute_s + 0.002  # the copy hides the compute, and would hide 2 ms

    for step in ("prefill", "mixed"):
        for overlap, expected in ((True, copy_s + 0.002), (False, compute_s + copy_s + 0.002)):
            env = simpy.Environment()
            engine = PredictedIterations(env, profile, overlap)
            one = job()
            run = (engine.prefill([one]) if step == "prefill"
                   else engine.mixed([(one, one.beta)], set(), 0.0))
            timing = env.run(env.process(run))
            assert timing.duration_s == pytest.approx(expected, rel=1e-9), (step, overlap)
            assert env.now == pytest.approx(expected, rel=1e-9)
