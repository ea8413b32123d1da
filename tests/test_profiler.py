"""``ragsim profile`` on this CPU: a real (scaled-down) model, measured into a valid profile."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch  # noqa: F401 - [profile] in [dev]: missing is a broken set-up, not a skip
import transformers  # noqa: F401
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.grid import BilinearGrid, monotone_values
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.profile import BatchedPrefill, load_profile
from ragsim.profiles.profiler import ProfilePlan, TorchEngine, run_profile

runner = CliRunner()


# What a shared two-core CI machine can hold. Absolute accuracy cannot be tested here: the same
# quick profile measured 4% / 2% held-out error on a quiet machine and 51% / 31% with other test
# suites running (load average 6 on 2 cores), because the grid and the held-out points are timed
# minutes apart under different load; `ragsim profile` reports that error and warns above the
# targets (10% median, 25% max). What can be tested is a ratio: a prediction from points timed in
# the same sweeps as the thing predicted (same load), so noise cancels and a wrong model does not.
# In one sweep every point is timed once; the median of five sweeps is kept, and an attempt whose
# ratio falls outside the bound is measured again (up to three attempts) before failing.
SAME_RUN_RATIO_BOUND = 1.25
ATTEMPTS = 3


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    """A quick CPU profile of a scaled-down Mistral-7B (about a minute on two cores); what
    `ragsim profile` printed is kept next to it."""
    out = tmp_path_factory.mktemp("profile") / "cpu.json"
    result = runner.invoke(app, ["profile", "--model", "mistral-7b", "--layers", "2", "--hidden",
                                 "256", "--device", "cpu", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (out.parent / "printed.txt").write_text(result.output)
    return out


def test_quick_profile_is_valid_measured_and_predicts_held_out_points(quick_profile):
    p = load_profile(str(quick_profile))
    assert p.kind == "measured" and p.name == "cpu-mistral-7b-l2-h256"
    assert "scaled down" in p.obtained["label"]
    assert p.model.num_layers == 2 and p.model.hidden_size == 256
    assert p.obtained["libraries"]["torch"]
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
    assert p.batched_prefill.padding == "left"


@pytest.fixture(scope="module")
def small_engine():
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=256).with_dtype("fp32")
    return TorchEngine(spec, "cpu", "fp32", threads=1, seed=0)


def _same_sweeps(engine, batches: list[tuple[list[int], list[int]]],
                 points: list[tuple[int, int]]) -> tuple[list[float], dict]:
    """Every batch and single-request point timed once per sweep; medians of 5 sweeps (after
    one to warm up), so a slow spell of the machine lands on all of them alike."""
    batch_times: list[list[float]] = [[] for _ in batches]
    point_times: dict = {pt: [] for pt in points}
    for _ in range(6):
        for times, (cached, new) in zip(batch_times, batches, strict=True):
            times.append(engine.prefill_batch(cached, new, 0, 1).median_s)
        for (a, b), times in point_times.items():
            times.append(engine.prefill(a, b, 0, 1).median_s)
    return ([float(np.median(t[1:])) for t in batch_times],
            {pt: float(np.median(t[1:])) for pt, t in point_times.items()})


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


# Batches and the single requests their price looks up, worked out by hand (left padding: every
# row computes the longest new segment on the longest cached prefix; a request of b new on a
# cached computes b(a + b/2) query-key pairs):
BATCHES = [
    # tiny prefills, one iteration's fixed cost paid once: 2 x 8 padded tokens, 2 x 8 x 4 = 64
    # pairs, i.e. 16 new on 64/16 - 8 = -4 cached: 2 T(0, 16) - T(4, 16); the member T(0, 8)
    ([0, 0], [8, 8], [(0, 16), (4, 16), (0, 8)]),
    # 128 tokens, 4 x 32 x 16 = 2,048 pairs: 128 new on -48: 2 T(0, 128) - T(48, 128)
    ([0, 0, 0, 0], [32, 32, 32, 32], [(0, 128), (48, 128), (0, 32)]),
    # 256 tokens, 2 x 128 x 576 pairs: 256 new on 576 - 128 = 448 cached
    ([512, 512], [128, 128], [(448, 256), (512, 128)]),
    # padded to 3 x 128 on 256 cached: 384 tokens, 3 x 128 x 320 pairs: 384 new on 128 cached
    ([256, 0, 256], [64, 128, 64], [(128, 384), (256, 64), (0, 128)]),
]


def test_batch_model_predicts_real_batches_from_single_requests_timed_with_them(small_engine):
    """Each batch priced on a grid of exactly the single requests it looks up, all timed in the
    same sweeps, with the per-request term fitted to the other batches (leave one out): the
    error is the model's, not the machine's. On this CPU a row costs ~1-3 ms beyond its tokens
    and pairs; without the term a batch of four 32-token rows is under-predicted by ~30%."""
    cases = [(cached, new, [(a, b) for a in sorted({a for a, _ in looked_up})
                            for b in sorted({b for _, b in looked_up})])
             for cached, new, looked_up in BATCHES]
    points = sorted({pt for *_, cartesian in cases for pt in cartesian})
    ratios = []
    for _ in range(ATTEMPTS):
        measured, seconds = _same_sweeps(small_engine, [(c, n) for c, n, _ in cases], points)
        models = [BatchedPrefill(_grid_of(cartesian, seconds), padding="left")
                  for *_, cartesian in cases]
        # per_extra_request_s by hand: least squares on the relative error, at least zero
        gap = [(y - m.equivalent_s(c, n), len(n) - 1, y)
               for m, (c, n, _), y in zip(models, cases, measured, strict=True)]
        ratios = []
        for i, (m, (cached, new, _)) in enumerate(zip(models, cases, strict=True)):
            others = gap[:i] + gap[i + 1:]
            per_request = max(sum(g * k / y**2 for g, k, y in others)
                              / sum(k * k / y**2 for _, k, y in others), 0.0)
            fitted = BatchedPrefill(m.grid, "left", per_extra_request_s=per_request)
            ratios.append(fitted.iteration_s(cached, new) / measured[i])
            assert m.grid.extrapolated_queries == 0  # every look-up was a point timed here
        if all(1 / SAME_RUN_RATIO_BOUND <= r <= SAME_RUN_RATIO_BOUND for r in ratios):
            return
    pytest.fail(f"predicted / measured batch times {ratios} (last attempt of {ATTEMPTS})")


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

    class Stop(Exception):
        pass

    def stop_after_prefill(phase, done, total):
        if phase == "decode":
            raise Stop

    with pytest.raises(Stop):
        run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out,
                    progress=stop_after_prefill)
    partial = json.loads((tmp_path / "p.json.partial.json").read_text())
    assert len(partial["prefill"]) == 9 and partial["decode"]
    profile = run_profile(spec, name="t", device="cpu", dtype="fp32", plan=plan, out=out)
    raw = profile.obtained["raw"]["prefill"]
    assert all(raw[k] == v for k, v in partial["prefill"].items())  # kept, not remeasured
    assert not (tmp_path / "p.json.partial.json").exists()


def test_scaled_down_keeps_the_architecture_family():
    spec = scaled_down(BUILTIN_MODELS["mistral-7b"], layers=2, hidden=256)
    assert (spec.num_layers, spec.hidden_size, spec.head_dim) == (2, 256, 128)
    assert spec.num_attention_heads % spec.num_kv_heads == 0 and spec.num_kv_heads >= 1
    assert spec.num_attention_heads * spec.head_dim == spec.hidden_size
    result = runner.invoke(app, ["profile", "--hidden", "100", "--quick"])
    assert result.exit_code == 2 and "--hidden" in result.output
