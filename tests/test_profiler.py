"""``ragsim profile`` on this CPU: a real (scaled-down) model, measured into a valid profile."""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
import pytest
import torch  # noqa: F401 - [profile] in [dev]: missing is a broken set-up, not a skip
import transformers  # noqa: F401
from typer.testing import CliRunner

from ragsim.api.engine_steps import measure_engine_steps
from ragsim.cli import app
from ragsim.profiles.decode_after_prompt import DECODE_SETTLE_STEPS
from ragsim.profiles.grid import BilinearGrid, monotone_values
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.profile import BatchedPrefill, load_profile
from ragsim.profiles.profiler import (
    AFTER_NEW_PHASE,
    BATCH_COPY_PHASE,
    DECODE_ROUNDS,
    FIRST_DECODE_PHASE,
    GROWTH_PHASE,
    IDLE_PHASE,
    NEW_SHAPES_PHASE,
    ProfilePlan,
    TorchEngine,
    _sweep_groups,
    _sweep_units,
    run_profile,
)

runner = CliRunner()


# What a shared two-core CI machine can hold. Absolute accuracy cannot be tested here: when the
# grid and the held-out points were timed minutes apart, the same quick profile measured 4% / 2%
# held-out error on a quiet machine and 51% / 31% with other test suites running (load average 6
# on 2 cores); timed in the same sweeps, one run in eight still missed a batch by 27% (a
# median of 7 sweeps is that noisy under load). `ragsim profile` reports that error and warns above
# the targets (10% median, 25% max). What can be tested is a ratio: a prediction from points
# timed in the same sweeps as the thing predicted (same load), so noise cancels and a wrong model
# does not.
# In one sweep every point is timed once; the median of five sweeps is kept, and an attempt whose
# ratio falls outside the bound is measured again (up to three attempts) before failing.
SAME_RUN_RATIO_BOUND = 1.25
ATTEMPTS = 3
SETTLING_RUNS = 4  # untimed runs of a sweep's quickest pass before it is timed


@pytest.mark.slow  # needs the session's fresh profile (minutes)
def test_quick_profile_is_valid_measured_and_predicts_held_out_points(quick_profile):
    p = load_profile(str(quick_profile))
    # the default name is a shipped profile's: the measurement says so in its own
    assert p.kind == "measured" and p.name == "cpu-mistral-7b-l2-h256-measured"
    assert "scaled down" in p.obtained["label"]
    assert p.model.num_layers == 2 and p.model.hidden_size == 256
    assert p.obtained["libraries"]["torch"]
    # the allocator it was measured on: this process's own (timings differ: allocator.py)
    from ragsim.profiles.allocator import memory_allocator

    assert p.obtained["allocator"] == memory_allocator() != "unknown"
    said = "measured on glibc's malloc" in " ".join(
        (quick_profile.parent / "printed.txt").read_text().split())
    assert said == (p.obtained["allocator"] == "glibc")  # and said so when it is glibc's
    v = p.obtained["validation"]
    # the stored errors and the warnings follow from the stored measurements (no timing here)
    held = v["held_out_prefill"]
    errors = [abs(h["predicted"] - h["seconds"]) / h["seconds"] for h in held]
    assert v["held_out_prefill_median_rel_error"] == pytest.approx(float(np.median(errors)))
    assert [h["predicted"] for h in held] == [p.prefill_s(h["cached"], h["new"]) for h in held]
    raw = p.obtained["raw"]
    batch_errors = [abs(p.batched_prefill.iteration_s(b["cached"], b["new"]) - b["seconds"])
                    / b["seconds"] for b in raw["held_out_batches"]]
    assert p.batched_prefill.heldout_max_error == pytest.approx(max(batch_errors))
    missed = {"prefill points": (np.median(errors), max(errors)),
              "batches": (np.median(batch_errors), max(batch_errors))}
    for what, (median, worst) in missed.items():
        expected = median > 0.10 or worst > 0.25
        assert any(w.startswith(f"held-out {what}:") for w in p.warnings) == expected, what
    assert all("idle machine" in w for w in p.warnings)
    printed = " ".join((quick_profile.parent / "printed.txt").read_text().split())
    for warning in p.warnings:  # said where the person running it sees it, not only stored
        assert f"warning: {' '.join(warning.split())}" in printed
    # physics: more tokens cost more, a cached prefix makes the same request cheaper. Both
    # sides inside the measured grid (new tokens up to 1,024 in the quick plan): a point past
    # it is a linear extrapolation of an attention-bound cost, which a noisy sweep can put
    # below a measured point (CI saw T(0, 2048) extrapolated at 0.102 s < T(1024, 1024) 0.104 s)
    assert p.prefill_s(0, 1024) > p.prefill_s(0, 64)
    assert p.prefill_s(0, 1024) > p.prefill_s(896, 128)
    assert p.decode_s(16, 2048) > p.decode_s(1, 128)
    assert p.transfers.host_to_device_bytes_per_s > 1e8
    assert p.batched_prefill.padding == "left_masked"
    # its decode steps run one batch padded to a common end (``decode_layout``)
    assert p.decode_padding == "common_end"
    # the decode grid keeps its batch axis as measured (a CPU's 4 rows can run faster than
    # its 3): a batch size whose medians already rise with the context is held as measured
    assert p.decode.monotone_x is False
    raw = p.obtained["raw"]["decode"]
    for i, rows in enumerate(p.decode.x_axis):
        medians = [raw[f"{int(rows)},{int(c)}"][0] for c in p.decode.y_axis]
        if medians == sorted(medians):
            assert p.decode.values[i] == medians
    # the per-request term measured at every row count the engine's batches reach (2 to its
    # max_prefill_bs), on rows over a cached prefix (the masked path of the runs' batches)
    from ragsim.serving.config import SimConfig

    wide = p.batched_prefill.wide
    assert wide.rows == [float(n) for n in range(2, SimConfig().max_prefill_bs + 1)]
    assert wide.row_cached_tokens == 512 and wide.row_new_tokens == 128
    assert [(w["rows"], w["cached"]) for w in p.obtained["raw"]["wide_batches"]] == [
        (n, 512) for n in range(2, 9)]
    assert wide.heldout["points"] == 6
    # the grid, the batches and the held-out points were timed in the same sweeps
    assert p.obtained["timing"].startswith("grid, batches and held-out points")
    speeds = p.obtained["validation"]["sweep_speed"]
    assert [len(group) for group in speeds] == [p.obtained["repetitions"]]


@pytest.fixture(scope="module")
def small_engine():
    """Mistral's shape scaled to 2 layers of 512, with a 1,024-token vocabulary: these tests
    judge how prompts and batches are priced from the grid. With Mistral's 32,000 tokens at
    hidden 256 the last token's logits (a 32 MB fp32 weight read per row, beyond a 32 MiB L3)
    were most of a short prefill, at a cost the BLAS library makes non-linear in rows (on one
    AMD EPYC with MKL: 1, 2, 3, 4 rows in 2.7, 5.0, 7.5, 4.7 ms), which no per-row term
    prices, and at hidden 256 a batch's fixed costs swamped its tokens: the machine's error,
    not the model's. (The validation engine keeps the full vocabulary: docs/validation.md.)"""
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=512).with_dtype("fp32")
    return TorchEngine(dataclasses.replace(spec, vocab_size=1024), "cpu", "fp32", threads=1,
                       seed=0)


def _same_sweeps(engine, batches: list[tuple[list[int], list[int]]],
                 points: list[tuple[int, int]]) -> tuple[list[float], dict]:
    """Every batch and single-request point timed once per sweep; medians of 5 sweeps (after
    one to warm up), so a slow spell of the machine lands on all of them alike.

    Each sweep runs the passes from the quickest to the slowest (as a first untimed sweep
    timed them), after a few untimed runs of the quickest: a pass right after a much larger
    one runs slower for several passes (a 2 x 8 batch after a 1,538-token pass: 8.2, 6.7, 5.4,
    5.4, 5.0 ms; no page faults), and in the order the cases were listed that fell on the
    smallest batch, which follows the largest pass of the sweep before it: its price then
    came out at 0.77-0.83x of a measurement that was the order's, not the model's."""
    passes = list(batches) + [([a], [b]) for a, b in points]
    first = engine.sweeps(passes, 0, 1).passes
    order = sorted(range(len(passes)), key=lambda k: first[k].median_s)
    settling = [passes[order[0]]] * SETTLING_RUNS
    timed = engine.sweeps(settling + [passes[k] for k in order], 1, 5).passes[SETTLING_RUNS:]
    seconds = [0.0] * len(passes)
    for k, m in zip(order, timed, strict=True):
        seconds[k] = m.median_s
    return seconds[:len(batches)], dict(zip(points, seconds[len(batches):], strict=True))


def _grid_of(points: list[tuple[int, int]], seconds: dict) -> BilinearGrid:
    xs, ys = sorted({a for a, _ in points}), sorted({b for _, b in points})
    return BilinearGrid("t", "cached_tokens", "new_tokens", xs, ys, monotone_values(
        [[seconds[(a, b)] for b in ys] for a in xs]))


# Held-out single requests and the grid corners around them (on the quick plan's axes).
HELD_OUT_POINTS = [((300, 200), [256, 512], [128, 256]),
                   ((700, 90), [512, 1024], [64, 128]),
                   ((50, 40), [1, 128], [16, 64])]


def test_grid_predicts_held_out_requests_from_corners_timed_with_them(small_engine):
    """Bilinear interpolation (the paper's Algorithm 1) on real timings: each held-out request
    against the four grid points around it, all in the same sweeps."""
    for (a, b), xs, ys in HELD_OUT_POINTS:
        corners = [(x, y) for x in xs for y in ys]
        ratios = []
        for _ in range(ATTEMPTS):
            _, seconds = _same_sweeps(small_engine, [], [(a, b), *corners])
            ratios.append(_grid_of(corners, seconds).at(a, b) / seconds[(a, b)])
            if 1 / SAME_RUN_RATIO_BOUND <= ratios[-1] <= SAME_RUN_RATIO_BOUND:
                break
        else:
            pytest.fail(f"T({a}, {b}) predicted / measured {ratios}")


# Batches and the single requests their price looks up, worked out by hand. The engine left-pads
# every row to the longest new segment and longest cached prefix. Equal uncached rows need no
# mask and keep the causal fast path: b new tokens compute b^2/2 query-key pairs, as T(0, b)
# does; the pairs a batch does not compute are taken off at the rate of the masked columns
# (cached >= 1): T(0, n) - (T(1 + m, n) - T(1, n)) for n tokens and m missing pairs per token.
# Any other batch passes a 2-D mask, under which attention computes the full rectangle,
# rows x L x (C + L) pairs for longest new L and longest cached C, as a single request with a
# prefix does (b new on a cached: b(a + b) pairs); the batch is priced as the masked request
# with as many tokens and pairs, mirrored about the first masked column (1) when a < 1.
BATCHES = [
    # fast path, one iteration's fixed cost paid once: 2 x 8 tokens, 2 x 8 x 4 = 64 pairs,
    # 64/16 - 16/2 = -4: T(0, 16) - (T(5, 16) - T(1, 16)); the member T(0, 8)
    ([0, 0], [8, 8], [(0, 16), (1, 16), (5, 16), (0, 8)]),
    # fast path: 128 tokens, 4 x 32 x 16 = 2,048 pairs: 16 - 64 = -48:
    # T(0, 128) - (T(49, 128) - T(1, 128)); member T(0, 32)
    ([0, 0, 0, 0], [32, 32, 32, 32], [(0, 128), (1, 128), (49, 128), (0, 32)]),
    # masked: 256 tokens, 2 x 128 x 640 pairs = 256 x (a + 256): a = 384; member T(512, 128)
    ([512, 512], [128, 128], [(384, 256), (512, 128)]),
    # masked, padded to 3 x 128 on 256 cached: 384 tokens, 3 x 128 x 384 pairs: a = 0, mirrored
    # about the first masked column: 2 T(1, 384) - T(2, 384); members T(256, 64), T(0, 128)
    ([256, 0, 256], [64, 128, 64], [(1, 384), (2, 384), (256, 64), (0, 128)]),
    # masked only because one row is a token short: 1,024 tokens, 2 x 512 x 512 pairs: a = -512:
    # 2 T(1, 1024) - T(514, 1024); members T(0, 512), T(0, 511). The fast-path column
    # T(0, 1024) would under-price it (the CPU's masked kernel cannot skip the causal half)
    ([0, 0], [512, 511], [(1, 1024), (514, 1024), (0, 512), (0, 511)]),
]


def test_batch_model_predicts_real_batches_from_single_requests_timed_with_them(small_engine):
    """Each batch priced on a grid of exactly the single requests it looks up, all timed in the
    same sweeps, with the per-request term fitted to the other batches (leave one out): the
    error is the model's, not the machine's. (On the model of ``small_engine`` a row costs
    ~0.2-0.8 ms beyond its tokens and pairs on the CPUs seen here.)"""
    cases = [(cached, new, [(a, b) for a in sorted({a for a, _ in looked_up})
                            for b in sorted({b for _, b in looked_up})])
             for cached, new, looked_up in BATCHES]
    points = sorted({pt for *_, cartesian in cases for pt in cartesian})
    ratios = []
    for _ in range(ATTEMPTS):
        measured, seconds = _same_sweeps(small_engine, [(c, n) for c, n, _ in cases], points)
        models = [BatchedPrefill(_grid_of(cartesian, seconds), padding="left_masked")
                  for *_, cartesian in cases]
        # per_extra_request_s by hand: least squares on the relative error, at least zero
        gap = [(y - m.equivalent_s(c, n), len(n) - 1, y)
               for m, (c, n, _), y in zip(models, cases, measured, strict=True)]
        ratios = []
        for i, (m, (cached, new, _)) in enumerate(zip(models, cases, strict=True)):
            others = gap[:i] + gap[i + 1:]
            per_request = max(sum(g * k / y**2 for g, k, y in others)
                              / sum(k * k / y**2 for _, k, y in others), 0.0)
            fitted = BatchedPrefill(m.grid, "left_masked", per_extra_request_s=per_request)
            ratios.append(fitted.iteration_s(cached, new) / measured[i])
            assert m.grid.extrapolated_queries == 0  # every look-up was a point timed here
        if all(1 / SAME_RUN_RATIO_BOUND <= r <= SAME_RUN_RATIO_BOUND for r in ratios):
            return
    pytest.fail(f"predicted / measured batch times {ratios} (last attempt of {ATTEMPTS})")


# the engine's fitted step terms against held-out runs' steps, in total: the same machine
# minutes later (-11% and +12% in two sittings here; a shared CPU drifts 10-15% in speed over
# such a window, docs/validation.md run AZ); terms that miss a kind of step's work (the
# greedy-only ones: -37% and -64% here, prompt steps -87%) fall out
HELD_OUT_STEPS_BOUND = 0.35


@pytest.mark.slow  # needs the session's fresh profile (minutes)
def test_quick_profile_prices_the_engines_own_steps_from_its_real_runs(quick_profile):
    """``ragsim profile`` ends with two real runs of the torch engine and prices its steps'
    work around their passes from them (``api/engine_steps.py``), keeping the profiler's
    sampling-only terms beside. Judged on steps the fit never saw: two more real runs of other
    requests and arrivals (another seed), whose steps' time outside their passes the fitted
    terms must price within ``HELD_OUT_STEPS_BOUND`` in total. A prompt step is dearer than a
    decode step of as many rows (the prompt's tokens looked up and its KV kept), and the
    fitted terms price held-out prompt steps closer than the profiler's greedy-only terms,
    which leave that work out. (Those are not compared step for step: a CI machine's priced an
    8-row step above the engine's whole work around its pass; the greedy timed alone, on
    rows up to 64, is no bound on the engine's.)"""
    p = load_profile(str(quick_profile))
    found = p.obtained["engine_steps"]
    assert found["measured"] and found["trace"] == "mmlu" and found["requests"] == 48
    assert [load["share"] for load in found["loads"]] == [0.5, 0.9]
    assert found["steps"] == sum(group["steps"] for group in found["by_kind"]) > 0
    kinds = {group["kind"] for group in found["by_kind"]}
    assert kinds == {"prefill", "decode"}
    assert "probe runs' steps" in p.step_overhead.fit["against"]
    sampling = found["profiler_step_overhead"]
    assert "greedy" in sampling["fit"]["against"]
    for rows in (1, 8):
        assert p.step_overhead_s(rows, rows) > p.step_overhead_s(rows)
    held_out = measure_engine_steps(p, seed=1).obtained["engine_steps"]["by_kind"]

    def error(groups, price) -> float:
        """Priced / measured - 1 of ``groups``' steps' time outside their passes, in total."""
        return (sum(g["steps"] * price(g["rows"], g["kind"] == "prefill") for g in groups)
                / sum(g["steps"] * g["outside_mean_s"] for g in groups) - 1)

    def fitted(rows, prompt):
        return p.step_overhead_s(rows, rows if prompt else 0)

    def greedy(rows, _prompt):
        return sampling["per_step_s"] + sampling["per_row_s"] * rows

    prompts = [g for g in held_out if g["kind"] == "prefill"]
    errors = {"all": (error(held_out, fitted), error(held_out, greedy)),
              "prompt steps": (error(prompts, fitted), error(prompts, greedy))}
    assert abs(errors["all"][0]) < HELD_OUT_STEPS_BOUND, errors
    assert abs(errors["prompt steps"][0]) < abs(errors["prompt steps"][1]), errors
    printed = " ".join((quick_profile.parent / "printed.txt").read_text().split())
    assert f"engine steps: {found['steps']} steps of two real runs of 48 mmlu requests" \
        in printed


@pytest.mark.slow  # needs the session's fresh profile (minutes)
def test_replay_accepts_a_measured_profile(quick_profile):
    result = runner.invoke(app, ["replay", "--requests", "300", "--profile", str(quick_profile),
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["profile"] == str(quick_profile)


def test_interrupted_profile_resumes_without_remeasuring(tmp_path):
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 1, 64], new_tokens=[1, 16, 64], batch_sizes=[1, 2],
                       context_tokens=[32, 64], batches=4, held_out_points=2,
                       held_out_batches=2, copy_bytes=[2**12, 2**16], warmup=0,
                       repetitions=2)
    out = tmp_path / "p.json"
    # KV for about 300 tokens at a time: the sweeps come in several groups, saved one by one
    capacity = 600 * spec.kv_bytes_per_token
    sweeps = "prefill grid, batches, held-out points"

    class Stop(Exception):
        pass

    def stop_after_first_group(phase, done, total):
        if phase == sweeps and done == 1:  # (done 0 says the phase begins)
            assert total > 2
            raise Stop

    with pytest.raises(Stop):
        run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out,
                    kv_capacity_bytes=capacity, progress=stop_after_first_group)
    partial = json.loads((tmp_path / "p.json.partial.json").read_text())
    assert partial["groups_done"] == 1 and partial["decode"] and partial["copies"]
    # (the torch plan's batches by row count are among what the first groups measure)
    first = partial["prefill"] | {str(b): b["seconds"] for b in partial["batches"]
                                  + partial["wide_batches"]}
    assert first
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out,
                          kv_capacity_bytes=capacity)
    raw = profile.obtained["raw"]
    again = raw["prefill"] | {str(b): b["seconds"] for b in raw["batches"]
                              + raw["wide_batches"]}
    assert all(again[k] == v for k, v in first.items())  # kept, not remeasured
    assert len(raw["prefill"]) == 9 and len(raw["batches"]) == 4
    assert len(raw["held_out_batches"]) == 2 and len(profile.obtained["validation"][
        "held_out_prefill"]) == 2
    assert not (tmp_path / "p.json.partial.json").exists()


class _Recorded:
    """The torch engine, each timed call written into ``log`` as it starts."""

    TIMED = ("decode", "copy", "sample", "sweeps", "blend_selection", "first_decode",
             "batch_copy")

    def __init__(self, engine, log: list) -> None:
        self._engine, self._log = engine, log

    def __getattr__(self, name: str):
        found = getattr(self._engine, name)
        if name not in self.TIMED:
            return found

        def timed(*args, **kwargs):
            self._log.append(("work", name))
            return found(*args, **kwargs)

        return timed


def test_every_phase_is_reported_before_its_work(tmp_path):
    """A quick profile was silent from ~19 s to ~100 s: the held-out decode points and the step
    overhead reported nothing, and the prefill sweeps only once their first group had ended.
    Every timed call must run under a report of its phase that still has work to come."""
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 64], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12, 2**16], warmup=0,
                       repetitions=1, held_out_decode=2, overhead_rows=[1, 4])
    log: list = []
    engine = _Recorded(TorchEngine(spec, "cpu", "fp32", 1, 0), log)
    run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=tmp_path / "p.json",
                engine=engine, progress=lambda *report: log.append(("report", *report)))
    phase_of = {"decode": ("decode",), "first_decode": (FIRST_DECODE_PHASE,),
                "batch_copy": (BATCH_COPY_PHASE,),
                "copy": ("transfers",),
                "sample": ("step overhead",), "sweeps": ("prefill grid, batches, held-out "
                                                         "points", NEW_SHAPES_PHASE,
                                                         AFTER_NEW_PHASE, IDLE_PHASE),
                "blend_selection": ("blend selection pass",), "twin": (GROWTH_PHASE,)}
    last = None
    for entry in log:
        if entry[0] == "report":
            last = entry[1:]
            continue
        assert last is not None, f"{entry[1]} ran before any phase was reported"
        phase, done, total = last
        assert phase in phase_of[entry[1]] and done < total, (entry[1], last)
    reported = [entry[1] for entry in log if entry[0] == "report"]
    assert list(dict.fromkeys(reported)) == [
        "decode", "transfers", "step overhead",
        "prefill grid, batches, held-out points", NEW_SHAPES_PHASE, AFTER_NEW_PHASE,
        IDLE_PHASE, FIRST_DECODE_PHASE, BATCH_COPY_PHASE, GROWTH_PHASE,
        "blend selection pass"]
    finals = {phase: (done, total) for _, phase, done, total in
              (e for e in log if e[0] == "report")}
    assert all(done == total for done, total in finals.values())  # each ended at its total


def test_the_decode_grid_is_timed_after_one_untimed_pass_over_its_cells(tmp_path):
    """The decode grid is a new process's first timing, and timed cold its cells ran up to
    1.45x their time a pass later: each cell runs once untimed, in order, before any is
    timed. Then the cells and the held-out point are timed in ``DECODE_ROUNDS`` rounds, each
    round every one of them once, in its own order; a cell is the median of its rounds'
    medians, a held-out point likewise."""
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=128).with_dtype("fp32")
    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 64], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**12, 2**16], warmup=0,
                       repetitions=2, held_out_decode=1)
    engine = TorchEngine(spec, "cpu", "fp32", 1, 0)
    calls, warmups, timed = [], set(), engine.decode
    medians: dict[tuple[int, int], list[float]] = {}

    def decode(batch, context, warmup, repetitions):
        calls.append((batch, context, repetitions))
        warmups.add(warmup)
        m = timed(batch, context, warmup, repetitions)
        if repetitions == 2:
            medians.setdefault((batch, context), []).append(m.median_s)
        return m

    engine.decode = decode
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan,
                          out=tmp_path / "p.json", engine=engine)
    cells = [(1, 16), (1, 32), (2, 16), (2, 32)]
    assert calls[:4] == [(*cell, 1) for cell in cells]
    held = profile.obtained["validation"]["held_out_decode"]
    shapes = sorted([*cells, (held[0]["batch"], held[0]["context"])])
    assert len(set(shapes)) == 5  # the held-out point is no cell (each shape's medians apart)
    rounds = [calls[4 + i * 5:4 + (i + 1) * 5] for i in range(DECODE_ROUNDS)]
    assert len(calls) == 4 + 5 * DECODE_ROUNDS
    for timed_round in rounds:
        assert sorted((b, c) for b, c, _ in timed_round) == shapes
        assert all(reps == 2 for _, _, reps in timed_round)
    raw = profile.obtained["raw"]["decode"]
    for b, c in cells:
        assert raw[f"{b},{c}"][0] == pytest.approx(statistics.median(medians[b, c]), rel=1e-12)
    assert held[0]["seconds"] == pytest.approx(
        statistics.median(medians[held[0]["batch"], held[0]["context"]]), rel=1e-12)
    # every cell settles past the positions after its prompts' step before it is timed (the
    # plan's warm-up is 0): the grid prices steady steps (``decode_after_prompt``)
    assert warmups == {DECODE_SETTLE_STEPS}


def test_each_phase_is_one_line_where_stderr_is_no_terminal(capsys):
    """In a log or CI the bars draw nothing: each phase still says, once, that it began."""
    from ragsim.cli.common import phased_progress

    progress, report = phased_progress()
    with progress:
        for phase, done, total in (("decode", 0, 6), ("decode", 3, 6), ("decode", 6, 6),
                                   ("transfers", 0, 3), ("transfers", 3, 3)):
            report(phase, done, total)
    lines = [line for line in capsys.readouterr().err.splitlines() if line]  # (rich ends
    assert lines == ["decode: 6 steps", "transfers: 3 steps"]  # a stopped display with a blank)


def test_the_torch_profiler_measures_the_blend_selection_pass(tmp_path):
    """The torch engine's profile carries CacheBlend's selection pass per reused token, timed
    with the engine's own code; it is written, read back and used by the simulator's price.
    A one-layer model has no layer 1 to select on: left out (the default price applies)."""
    from ragsim.serving.costs import blend_selection_s

    plan = ProfilePlan(cached_tokens=[0, 64], new_tokens=[1, 64], batch_sizes=[1, 2],
                       context_tokens=[16, 32], batches=2, held_out_points=1,
                       held_out_batches=1, copy_bytes=[2**16, 2**20, 2**22], warmup=0,
                       repetitions=2)
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=128).with_dtype("fp32")
    out = tmp_path / "two.json"
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out)
    per_token = profile.blend_selection_s_per_token
    assert per_token is not None and per_token > 0
    assert json.loads(out.read_text())["blend_selection_s_per_token"] == per_token
    assert load_profile(str(out)).blend_selection_s_per_token == per_token
    assert blend_selection_s(profile, "blend", 100) == pytest.approx(100 * per_token)
    one = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=1, hidden=128).with_dtype("fp32")
    single = run_profile(one, name="t1", device="cpu", dtype="fp32", plan=plan,
                         out=tmp_path / "one.json")
    assert single.blend_selection_s_per_token is None
    assert "blend_selection_s_per_token" not in json.loads(
        (tmp_path / "one.json").read_text())


def test_sweeps_mix_every_kind_and_spread_the_held_out_batches():
    """Every group of sweeps holds grid rows, fitted and held-out batches and held-out points, so
    a group is never judged against a grid timed under other load."""
    plan = ProfilePlan.quick()
    units = _sweep_units(plan, seed=0)
    kinds = [u.kind for u in units]
    assert kinds.count("grid") == len(plan.cached_tokens)
    assert kinds.count("batch") == plan.batches
    assert kinds.count("held_out_batch") == plan.held_out_batches
    assert kinds.count("held_out_point") == plan.held_out_points
    assert kinds.count("mixed_level") == len(plan.mixed_chunk_tokens)
    assert kinds.count("held_out_mixed") == plan.held_out_mixed
    # 50 units: each third has every kind but the two mixed levels (one in the first, one in
    # the last third), and held-out mixed steps beside both
    for thirds in (kinds[:17], kinds[17:34], kinds[34:]):
        assert set(thirds) - {"mixed_level"} == {"grid", "batch", "held_out_batch",
                                                  "held_out_point", "held_out_mixed"}
    assert "mixed_level" in kinds[:17] and "mixed_level" in kinds[34:]
    # the quick plan's 8 of 24 batches: every third one
    held = [k for k in kinds if k in ("batch", "held_out_batch")]
    assert held[2::3] == ["held_out_batch"] * 8
    assert "held_out_batch" not in held[0::3] + held[1::3]
    # a budget of about a third of the KV splits them into groups of consecutive units
    groups = _sweep_groups(units, 1, sum(u.kv_tokens() for u in units) // 3)
    assert [u for g in groups for u in g] == units and len(groups) >= 3


def test_the_torch_plan_times_every_row_count_on_cached_rows_in_the_same_sweeps():
    """The torch engine's plan: a level at each of 2-8 rows (the serving default's
    max_prefill_bs), rows of 128 new tokens on 512 cached, and held-out batches of 2-8 rows of
    32-256 new tokens within the last level's 1,024, mixed into the sweeps with the grid."""
    from ragsim.profiles.profiler import with_torch_row_levels
    from ragsim.serving.config import SimConfig

    plan = with_torch_row_levels(ProfilePlan.quick())
    assert plan.wide_batch_rows[-1] == SimConfig().max_prefill_bs
    units = _sweep_units(plan, seed=3)
    levels = [u.passes[0] for u in units if u.kind == "wide_batch"]
    assert levels == [([512] * n, [128] * n) for n in range(2, 9)]
    held = [u.passes[0] for u in units if u.kind == "held_out_wide"]
    assert len(held) == 6
    for cached, new in held:
        assert 2 <= len(new) <= 8 and sum(new) <= 1024 and all(32 <= b <= 256 for b in new)
        assert set(cached) <= {0, 1, 128, 256, 512}
    kinds = [u.kind for u in units]
    assert "wide_batch" in kinds[: len(kinds) // 2] and "wide_batch" in kinds[len(kinds) // 2:]
    # a plan that names its own levels (vLLM's wide batches) keeps them
    own = dataclasses.replace(ProfilePlan.quick(), wide_batch_rows=[8, 64])
    assert with_torch_row_levels(own) == own
    # a run that prefills up to 16 prompts a step (a validation's --max-prefill-bs) is
    # measured that far, on rows of 3,072 // 16 = 192 > 128 new tokens: still 128
    wider = with_torch_row_levels(ProfilePlan.quick().covering(prefill_rows=16))
    assert wider.wide_batch_rows == list(range(2, 17)) and wider.wide_row_tokens == 128
    # on a grid of 1,024 new tokens at most, rows of 1,024 // 16 = 64
    small = dataclasses.replace(ProfilePlan.quick(), new_tokens=[1, 16, 64, 256, 1024],
                                prefill_rows=16)
    assert with_torch_row_levels(small).wide_row_tokens == 64


def _linear_cost(fixed_s: float, token_s: float, pair_s: float, row_s: float):
    """A CPU-like cost with the attention kernels' two paths, written from the physics and not
    from the batch model: fixed + tokens + rows, plus pairs, where a masked pass computes the full
    rectangle of queries by keys and the unmasked causal one the lower half."""
    def batch_s(cached: list[int], new: list[int]) -> float:
        rows, longest_new, longest_cached = len(new), max(new), max(cached)
        if longest_cached == 0 and len(set(new)) == 1:
            pairs = rows * longest_new * longest_new / 2
        else:
            pairs = rows * longest_new * (longest_cached + longest_new)
        return fixed_s + token_s * rows * longest_new + pair_s * pairs + row_s * rows
    return batch_s


def test_masked_batch_model_prices_a_masked_engine_exactly_and_the_causal_one_does_not():
    """On a grid of a cost that is linear in tokens and pairs, with the engine's two attention
    paths (masked rectangle, causal fast path without a mask), the masked-padding model prices
    batches as the cost itself does, to rounding, where the batch's tokens lie on the grid;
    the causal-pairs model ("left") does not."""
    cost = _linear_cost(5e-3, 4e-5, 1e-8, 0.0)
    xs, ys = [0, 1, 128, 512, 1024, 2048], [16, 64, 256, 512, 1024]
    grid = BilinearGrid("t", "cached_tokens", "new_tokens", [float(x) for x in xs],
                        [float(y) for y in ys], [[cost([a], [b]) for b in ys] for a in xs])
    masked = BatchedPrefill(grid, "left_masked")
    causal = BatchedPrefill(grid, "left")
    batches = [([0, 0], [256, 200]),          # padded uncached rows: a = 256 - 512 < 1
               ([0, 1024, 128, 512], [64, 40, 64, 10]),  # a = 1024 + 64 - 256 = 832
               ([2048, 0], [512, 100]),        # a = 2048 + 512 - 1024 = 1536
               ([0, 0, 0, 0], [256, 256, 256, 256])]  # no mask: causal fast path
    for cached, new in batches:
        assert masked.iteration_s(cached, new) == pytest.approx(cost(cached, new), rel=1e-9)
    # the causal-pairs model prices the masked batches with half their rectangle, and fetches
    # uncached ones off T(0, .), the fast path: 7% and 11% under here (attention about a tenth
    # of a 1,024-token pass, as on the CPU engine)
    ratios = [causal.iteration_s(c, n) / cost(c, n) for c, n in batches]
    assert ratios[0] < 0.95 and ratios[3] < 0.95, ratios


def test_scaled_down_keeps_the_architecture_family():
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=256)
    assert (spec.num_layers, spec.hidden_size, spec.head_dim) == (2, 256, 128)
    assert spec.num_attention_heads % spec.num_kv_heads == 0 and spec.num_kv_heads >= 1
    assert spec.num_attention_heads * spec.head_dim == spec.hidden_size
    result = runner.invoke(app, ["profile", "--hidden", "100", "--quick"])
    assert result.exit_code == 2 and "--hidden" in result.output


@pytest.mark.parametrize("fixed_s", [0.0, 5e-3])
def test_padded_batch_past_the_grid_is_priced_row_by_row(fixed_s):
    """A padded batch whose equivalent single request (rows x longest new) lies past the grid:
    each row costs a request of the padded shape, which the model prices on the grid, less the
    step's fixed cost for every row after the first (the one-token step on the grid, paid
    once), plus the per-request term; on a cost written from the physics (a fixed part, tokens,
    pairs and rows) that is the cost itself, to the one-token step's own tokens and pairs. The
    equivalent request, extrapolated to three times the grid's new tokens, is far off (an
    overloaded CPU run's 8-row batches ran 14x it); a fixed part counted once a row is off by
    (rows - 1) times it (run AJ: a RAG burst's eight rows priced 9-10% high)."""
    cost = _linear_cost(fixed_s, 4e-5, 1e-8, 2e-4)
    xs, ys = [0, 1, 128, 512, 1024, 2048], [1, 16, 64, 256, 512, 1024]
    grid = BilinearGrid("t", "cached_tokens", "new_tokens", [float(x) for x in xs],
                        [float(y) for y in ys], [[cost([a], [b]) for b in ys] for a in xs])
    model = BatchedPrefill(grid, "left_masked", per_extra_request_s=2e-4)
    # longest rows on the grid's points, so interpolation adds nothing
    for cached, new in [([0, 0, 0], [900, 800, 1024]), ([512, 0, 128, 0], [700, 1024, 300, 50])]:
        rows, column = len(new), max(max(cached), 1)  # masked: at least 1 cached token
        # by hand: rows x one masked request of the padded shape, the one-token step's cost
        # taken back from every row after the first, the per-request term added for each
        by_hand = rows * cost([column], [max(new)]) - (rows - 1) * (cost([column], [1]) - 2e-4)
        assert model.iteration_s(cached, new) == pytest.approx(by_hand, rel=1e-9)
        assert model.iteration_s(cached, new) == pytest.approx(cost(cached, new), rel=2e-3)
        extrapolated = model.equivalent_s(cached, new)
        assert abs(extrapolated - cost(cached, new)) / cost(cached, new) > 0.2
    if fixed_s:  # the fixed part once a row, as before: (rows - 1) x 5 ms too much
        cached, new = [512, 0, 128, 0], [700, 1024, 300, 50]
        once_a_row = len(new) * cost([512], [max(new)])
        assert once_a_row - cost(cached, new) == pytest.approx(3 * fixed_s, rel=1e-9)


def test_mixed_rows_reach_the_decode_axis_fourfold():
    """vLLM decodes every running request in the steps that prefill: its mixed grid's decode
    rows reach the decode axis (1, 4, 16, 64, and its last batch), so that no step with dozens
    of decode rows is priced on the straight line through 1 and 4 rows."""
    from dataclasses import replace

    quick = ProfilePlan.quick()  # decode rows up to 16, mixed rows 1 and 4
    assert quick.with_mixed_rows_to_decode().mixed_batch_sizes == [1, 4, 16]
    overload = quick.covering(batch_size=64)
    assert overload.batch_sizes == [1, 2, 3, 4, 8, 16, 32, 64]
    assert overload.with_mixed_rows_to_decode().mixed_batch_sizes == [1, 4, 16, 64]
    assert quick.covering(batch_size=40).with_mixed_rows_to_decode().mixed_batch_sizes == \
        [1, 4, 16, 40]
    small = replace(quick, batch_sizes=[1, 2], mixed_batch_sizes=[1, 2])
    assert small.with_mixed_rows_to_decode().mixed_batch_sizes == [1, 2]
    none = replace(quick, mixed_batch_sizes=[], mixed_chunk_tokens=[])
    assert none.with_mixed_rows_to_decode() == none
    # the held-out mixed steps spread over the rows in log: a few rows as often as dozens
    wide = replace(overload.with_mixed_rows_to_decode(), held_out_mixed=200)
    rows = [len(u.passes[0][0]) - 1 for u in _sweep_units(wide, seed=0)
            if u.kind == "held_out_mixed"]
    assert min(rows) == 1 and 48 <= max(rows) <= 64
    assert 0.35 < np.mean(np.array(rows) <= 8) < 0.65  # half of log(64) is log(8)


def test_engine_steps_replace_the_profilers_terms_and_round_trip(tiny_torch_profile, tmp_path):
    """``measure_engine_steps`` on a one-layer profile: two real runs of eight requests each
    price the profile's step overhead (four terms) and batch write from the engine's steps; the
    profiler's own terms are kept beside them unchanged, the input profile is left as it was,
    and the result reads back whole."""
    from ragsim.api.engine_steps import measure_engine_steps

    grid = load_profile(str(tiny_torch_profile))
    heard = []
    priced = measure_engine_steps(grid, requests=8, on_run=lambda done, total:
                                  heard.append((done, total)))
    assert heard == [(1, 2), (2, 2)]
    assert "engine_steps" not in grid.obtained  # the profiler's profile, untouched
    found = priced.obtained["engine_steps"]
    assert found["measured"] and found["requests"] == 8
    assert found["profiler_step_overhead"] == (grid.step_overhead and grid.step_overhead.to_dict())
    assert found["profiler_batch_copy"] == (grid.batch_copy and grid.batch_copy.to_dict())
    assert priced.step_overhead != grid.step_overhead
    assert priced.step_overhead.fit["steps"] == found["steps"]
    back = load_profile(str(priced.save(tmp_path / "priced.json")))
    assert back.step_overhead == priced.step_overhead
    assert back.batch_copy == priced.batch_copy
    assert back.obtained["engine_steps"]["steps"] == found["steps"]
    for rows, prompts in ((1, 0), (4, 0), (2, 2)):
        assert back.step_overhead_s(rows, prompts) == priced.step_overhead_s(rows, prompts)
