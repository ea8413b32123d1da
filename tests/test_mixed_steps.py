"""Measured mixed steps and the per-step overhead (``ragsim.profiles.steps``): the model on
hand-worked numbers, the overhead fitted from a timing table with a known answer, the files'
checks, and that a profile without them prices everything as before."""

from __future__ import annotations

import json

import pytest
from test_sim_mixed import SEARCH_S, config, trace_of

from ragsim.decisions import priced_s
from ragsim.errors import ProfileError
from ragsim.profiles.profile import Profile, load_profile
from ragsim.profiles.steps import fit_step_overhead, ratio_summary
from ragsim.serving.costs import decode_step_s, mixed_step_s, prefill_compute_s
from ragsim.sim.simulator import run_simulation

BASE = load_profile("a10g-mistral-7b")
# what b decode rows of context c add to a step prefilling k chunk tokens (seconds), at
# k = 100 and k = 300, over b in {1, 3} x c in {100, 300}
MIXED = {"model": "decode_increment", "chunk_tokens": [100, 300], "batch_sizes": [1, 3],
         "context_tokens": [100, 300],
         "seconds": [[[0.001, 0.002], [0.003, 0.005]],
                     [[0.002, 0.004], [0.006, 0.010]]],
         "heldout": None, "fit": {}}
OVERHEAD = {"model": "per_step_plus_per_row", "per_step_s": 0.001, "per_row_s": 0.0002,
            "fit": {}}


def with_terms(**terms) -> Profile:
    return Profile.from_dict({**BASE.to_dict(), **terms}, source="test.json")


def test_the_decode_increment_is_bilinear_per_chunk_level_and_linear_between_levels():
    p = with_terms(mixed_steps=MIXED)
    at = p.prefill.at
    # b = 2, c = 200: the centre of each level, the mean of its four corners:
    # k=100: (1 + 2 + 3 + 5) / 4 = 2.75 ms; k=300: (2 + 4 + 6 + 10) / 4 = 5.5 ms
    # one chunk of 200 tokens (halfway): 2.75 + (5.5 - 2.75) / 2 = 4.125 ms
    assert mixed_step_s(p, [0], [200], 2, 200) == pytest.approx(at(0, 200) + 0.004125,
                                                                rel=1e-12)
    # two chunks of 60 + 40 = 100 tokens: level k=100 exactly, at b=3, c=100: 3 ms
    assert mixed_step_s(p, [500, 0], [60, 40], 3, 100) == pytest.approx(
        p.batched_prefill.iteration_s([500, 0], [60, 40]) + 0.003, rel=1e-12)
    # below the first level / past the last: the nearest level (b=1, c=300: 2 ms / 4 ms)
    assert mixed_step_s(p, [0], [10], 1, 300) == pytest.approx(at(0, 10) + 0.002, rel=1e-12)
    assert mixed_step_s(p, [0], [900], 1, 300) == pytest.approx(at(0, 900) + 0.004, rel=1e-12)
    # no decode rows: the chunks alone; no chunks: a decode step
    assert mixed_step_s(p, [0], [200], 0, 0) == at(0, 200)
    assert mixed_step_s(p, [], [], 4, 700) == p.decode.at(4, 700)


def test_on_a_left_padding_engine_the_increment_is_read_at_the_longest_prefix():
    """The torch engine (left_masked padding) pads every row to the longest cached prefix: a
    chunk of 200 tokens on 250 cached beside 2 decode rows of 200 costs the chunk on the masked
    path without its prefix, T(1, 200), plus the increment at context 250:
    k=100: b=1 row 1 + 0.75 * 1 = 1.75 ms, b=3 row 3 + 0.75 * 2 = 4.5 ms, b=2: 3.125 ms;
    k=300: 2 + 0.75 * 2 = 3.5, 6 + 0.75 * 4 = 9, b=2: 6.25 ms; k=200: 4.6875 ms."""
    cpu = load_profile("cpu-mistral-7b-l2-h256")
    assert cpu.batched_prefill.padding == "left_masked" and 1.0 in cpu.prefill.x_axis
    # the increment alone: the shipped profile's own step overhead and first-time price off
    base = {k: v for k, v in cpu.to_dict().items() if k not in ("step_overhead", "new_shapes")}
    p = Profile.from_dict({**base, "mixed_steps": MIXED}, source="t")
    assert mixed_step_s(p, [250], [200], 2, 200) == pytest.approx(
        p.prefill.at(1, 200) + 0.0046875, rel=1e-12)
    # decode rows longer than the prefix: the increment at their context (2.75 + 5.5) / 2 ms
    assert mixed_step_s(p, [0], [200], 2, 200) == pytest.approx(
        p.prefill.at(1, 200) + 0.004125, rel=1e-12)


def test_without_the_measurement_a_mixed_step_is_priced_additively_as_before():
    at, decode = BASE.prefill.at, BASE.decode.at
    assert mixed_step_s(BASE, [0], [200], 2, 200) == at(0, 200) + decode(2, 200)
    assert prefill_compute_s(BASE, [0], [200]) == at(0, 200)
    assert decode_step_s(BASE, 5, 900) == decode(5, 900)


def test_the_step_overhead_is_charged_once_per_step_for_every_row():
    p = with_terms(step_overhead=OVERHEAD)
    at, decode = p.prefill.at, p.decode.at
    # 1 ms + 0.2 ms a row
    assert prefill_compute_s(p, [0], [200]) == pytest.approx(at(0, 200) + 0.0012, rel=1e-12)
    assert decode_step_s(p, 4, 700) == pytest.approx(decode(4, 700) + 0.0018, rel=1e-12)
    # a mixed step of 2 chunks and 3 decode rows: additive compute, one overhead of 5 rows
    assert mixed_step_s(p, [0, 0], [50, 50], 3, 100) == pytest.approx(
        p.batched_prefill.iteration_s([0, 0], [50, 50]) + decode(3, 100) + 0.002, rel=1e-12)
    both = with_terms(step_overhead=OVERHEAD, mixed_steps=MIXED)
    assert mixed_step_s(both, [0], [100], 3, 100) == pytest.approx(
        at(0, 100) + 0.003 + 0.0018, rel=1e-12)
    # the replay prices a real run's mixed step the same way
    decision = {"kind": "mixed", "jobs": [(0, 0, 0, 100, 0)], "size": 3,
                "context_tokens": 100}
    assert priced_s(decision, both) == pytest.approx(at(0, 100) + 0.003 + 0.0018, rel=1e-12)


def test_the_step_overhead_fit_recovers_a_known_table():
    rows = [1, 2, 4, 8, 16, 32]
    seconds = [0.0015 + 0.00025 * r for r in rows]
    fitted = fit_step_overhead(rows, seconds, against="synthetic")
    assert fitted.per_step_s == pytest.approx(0.0015, rel=1e-9)
    assert fitted.per_row_s == pytest.approx(0.00025, rel=1e-9)
    assert fitted.fit["max_rel_error"] < 1e-9
    # a table that falls with rows: no negative per-row term (work is not negative)
    falling = fit_step_overhead([1, 2, 4], [0.004, 0.003, 0.002])
    assert falling.per_row_s == 0.0 and falling.per_step_s > 0
    with pytest.raises(ValueError, match="two or more row counts"):
        fit_step_overhead([4, 4], [0.1, 0.2])


def test_ratio_summary_on_hand_numbers():
    summary = ratio_summary([1.0, 2.0, 3.0, 4.5, 6.0], [1.0, 2.0, 2.0, 5.0, 5.0])
    # ratios 1, 1, 1.5, 0.9, 1.2: median 1.0; p90 (numpy's linear) 1.2 + 0.6 * 0.3 = 1.38
    assert summary["median_ratio"] == pytest.approx(1.0)
    assert summary["p90_ratio"] == pytest.approx(1.38)
    # |ratio - 1|: 0, 0, 0.5, 0.1, 0.2 -> median 0.1
    assert summary["median_abs_error"] == pytest.approx(0.1)
    assert summary["points"] == 5


def test_the_simulator_prices_mixed_steps_from_the_measurement():
    """As test_sim_mixed's hand example: A decodes while B's 12,050-token prompt goes in six
    chunks of 2,047 tokens; each step now costs B's chunk plus the measured increment of A's
    one decode row (levels flat in context and chunk: 3 ms for b = 1), not A's decode step."""
    flat = {**MIXED, "chunk_tokens": [100, 3000], "batch_sizes": [1, 8],
            "context_tokens": [100, 5000],
            "seconds": [[[0.003, 0.003], [0.01, 0.01]]] * 2}
    p = with_terms(mixed_steps=flat)
    trace = trace_of([(0.0, 300, 20, 200), (1.0, 12000, 50, 2)])
    run = run_simulation(trace, config("mixed"), p)
    prefill, decode = p.prefill.at, p.decode.at
    t = SEARCH_S + prefill(0, 320)
    a_context = 321
    while t < 1.0 + SEARCH_S:
        t += decode(1, a_context)
        a_context += 1
    done = 0
    for _ in range(6):
        take = min(2047, 12050 - done)
        t += prefill(done, take) + 0.003
        done += take
    assert run.records["first_token_s"][1] == pytest.approx(t, rel=1e-12)


def test_increments_equal_to_the_decode_grid_reproduce_the_additive_run_exactly():
    """A differential check of the plumbing: when what decode rows add is the decode step
    itself, the measured model is the additive one, bit for bit."""
    d = BASE.decode
    same = {"model": "decode_increment", "chunk_tokens": [1, 16384],
            "batch_sizes": d.x_axis, "context_tokens": d.y_axis,
            "seconds": [d.values, d.values]}
    trace = trace_of([(0.0, 300, 20, 200), (0.5, 3000, 30, 40), (1.0, 12000, 50, 2)])
    additive = run_simulation(trace, config("mixed"), BASE)
    measured = run_simulation(trace, config("mixed"), with_terms(mixed_steps=same))
    for column in ("first_token_s", "finish_s"):
        assert list(measured.records[column]) == list(additive.records[column])


def test_a_profile_scaled_for_speed_scales_both_terms():
    p = with_terms(mixed_steps=MIXED, step_overhead=OVERHEAD).scaled_compute(2.0)
    assert p.mixed_steps.levels[1].values[1][1] == pytest.approx(0.020)
    assert p.step_overhead.per_row_s == pytest.approx(0.0004)
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())), source="x")
    assert again.mixed_steps.to_dict() == p.mixed_steps.to_dict()
    assert again.step_overhead.to_dict() == p.step_overhead.to_dict()


@pytest.mark.parametrize(("terms", "field", "message"), [
    ({"mixed_steps": {**MIXED, "model": "sum"}}, "mixed_steps.model", "unknown model"),
    ({"mixed_steps": {**MIXED, "chunk_tokens": [300, 100]}}, "mixed_steps.chunk_tokens",
     "increase strictly"),
    ({"mixed_steps": {**MIXED, "chunk_tokens": [0, 100]}}, "mixed_steps.chunk_tokens", ">= 1"),
    ({"mixed_steps": {**MIXED, "chunk_tokens": [100]}}, "mixed_steps.seconds", "2 levels"),
    ({"mixed_steps": {**MIXED, "seconds": [MIXED["seconds"][0], [[0.002, 0.001],
                                                                 [0.006, 0.010]]]}},
     "mixed_steps.seconds[1].seconds", "non-decreasing"),
    ({"mixed_steps": {k: v for k, v in MIXED.items() if k != "batch_sizes"}},
     "mixed_steps.batch_sizes", "missing"),
    ({"mixed_steps": {**MIXED, "heldout": {"points": 3, "median_ratio": "x",
                                           "p90_ratio": 1.0}}},
     "mixed_steps.heldout.median_ratio", "must be a number"),
    ({"step_overhead": {**OVERHEAD, "per_row_s": -1e-4}}, "step_overhead.per_row_s", ">= 0"),
    ({"step_overhead": {**OVERHEAD, "model": "x"}}, "step_overhead.model", "unknown model"),
    ({"step_overhead": [1, 2]}, "step_overhead", "must be an object"),
])
def test_bad_terms_are_refused_naming_file_and_field(terms, field, message):
    with pytest.raises(ProfileError, match=message) as caught:
        with_terms(**terms)
    assert caught.value.file == "test.json"
    assert caught.value.field == field


def tiny_plan():
    from ragsim.profiles.profiler import ProfilePlan

    return ProfilePlan(cached_tokens=[0, 1, 64], new_tokens=[1, 16, 64], batch_sizes=[1, 2],
                       context_tokens=[32, 64], batches=4, held_out_points=2,
                       held_out_batches=2, copy_bytes=[2**18, 2**24], warmup=0,
                       repetitions=2, mixed_chunk_tokens=[16, 64], mixed_batch_sizes=[1, 2],
                       mixed_context_tokens=[32, 64], held_out_mixed=3, held_out_decode=2,
                       overhead_rows=[1, 8])


def test_a_tiny_real_profile_measures_mixed_steps_and_the_step_overhead(tmp_path):
    """On this CPU, a one-layer model: the file carries both terms, built from its own raw
    timings as the docstrings say (no timing is asserted: the machine is shared)."""
    import numpy as np

    from ragsim.profiles.grid import monotone_values
    from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
    from ragsim.profiles.profiler import run_profile

    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    out = tmp_path / "p.json"
    run_profile(spec, name="t", device="cpu", dtype="fp32", plan=tiny_plan(), out=out,
                kv_capacity_bytes=2**28)
    p = load_profile(str(out))  # the file passes the format's checks
    raw = p.mixed_steps.fit["raw"]
    assert p.mixed_steps.chunk_tokens == [16.0, 64.0]
    for level, k in zip(p.mixed_steps.levels, (16, 64), strict=True):
        times = [t[0] for t in raw[str(k)]]  # chunk alone, then (1,32) (1,64) (2,32) (2,64)
        # each cell over the chunk's price on the masked path (one row: the grid at 1 cached
        # token), not over the chunk timed alone (times[0], kept raw)
        chunk_s = p.prefill.at(1, k)
        increments = [[max(times[1] - chunk_s, 0), max(times[2] - chunk_s, 0)],
                      [max(times[3] - chunk_s, 0), max(times[4] - chunk_s, 0)]]
        assert np.allclose(level.values, monotone_values(increments), rtol=0, atol=1e-15)
    held = p.obtained["validation"]["held_out_mixed"]
    assert len(held) == 3
    for h in held:  # one chunk on the masked path, the increment at the longest prefix
        k, b, c = h["new"][0], len(h["new"]) - 1, h["cached"][1]
        expected = p.prefill.at(1, k) + p.mixed_steps.increment_s(b, max(c, h["cached"][0]), k)
        assert h["predicted"] == pytest.approx(expected, rel=1e-12)
    ratios = [h["predicted"] / h["seconds"] for h in held]
    assert p.mixed_steps.heldout["median_ratio"] == pytest.approx(float(np.median(ratios)))
    summary = p.obtained["validation"]["iteration_ratios"]
    # (and the torch engine's batches by row count, held out: ``profiler.with_torch_row_levels``)
    assert set(summary) == {"prefill_points", "batches", "decode_points", "mixed_steps",
                            "wide_batches"}
    sampling = p.obtained["raw"]["sampling"]
    # two row counts: the fit goes through both points (unless a term would be negative)
    slope = (sampling["8"][0] - sampling["1"][0]) / 7
    if slope >= 0 and sampling["1"][0] - slope >= 0:
        assert p.step_overhead.per_row_s == pytest.approx(slope, rel=1e-6, abs=1e-12)
    assert p.step_overhead.per_step_s >= 0 and p.step_overhead.per_row_s >= 0


def test_the_per_iteration_warning_is_told_apart_from_the_held_out_error_warnings():
    """``held-out batches:`` starts the error-target warning (test_profiler checks which kinds
    carry one); the per-iteration one says so first."""
    from ragsim.profiles.steps import iteration_warning

    miss = {"median_ratio": 0.93, "p90_abs_error": 0.10, "points": 8}
    warning = iteration_warning("batches", miss)
    assert warning.startswith("per iteration, held-out batches: predicted/measured median 0.930")
    assert "idle machine" in warning
    assert iteration_warning("batches", {**miss, "median_ratio": 0.96}) is None
    assert iteration_warning("batches", {**miss, "median_ratio": 1.0, "p90_abs_error": 0.16})


def test_a_step_with_prompt_rows_pays_the_prompt_terms_and_a_decode_step_does_not():
    """The four-term overhead (``validate`` measures it on its probe runs): 1 ms a step + 0.2
    ms a row, and a step with prompts 0.3 ms + 0.1 ms a prompt more. By hand: a prefill of two
    prompts 1 + 0.4 + 0.3 + 0.2 = 1.9 ms; a decode step of four rows 1 + 0.8 = 1.8 ms; a mixed
    step of two chunks and three decode rows 1 + 1.0 + 0.3 + 0.2 = 2.5 ms."""
    p = with_terms(step_overhead={**OVERHEAD, "prompt_step_s": 0.0003, "prompt_row_s": 0.0001})
    assert prefill_compute_s(p, [0, 0], [100, 100]) == pytest.approx(
        p.batched_prefill.iteration_s([0, 0], [100, 100]) + 0.0019, rel=1e-12)
    assert decode_step_s(p, 4, 700) == pytest.approx(p.decode.at(4, 700) + 0.0018, rel=1e-12)
    assert mixed_step_s(p, [0, 0], [50, 50], 3, 100) == pytest.approx(
        p.batched_prefill.iteration_s([0, 0], [50, 50]) + p.decode.at(3, 100) + 0.0025,
        rel=1e-12)
    # written and read back with them; a profile without them reads as before (0)
    again = Profile.from_dict(p.to_dict(), source="again.json").step_overhead
    assert (again.prompt_step_s, again.prompt_row_s) == (0.0003, 0.0001)
    plain = with_terms(step_overhead=OVERHEAD).step_overhead
    assert (plain.prompt_step_s, plain.prompt_row_s) == (0.0, 0.0)
    assert "prompt_step_s" not in plain.to_dict()
