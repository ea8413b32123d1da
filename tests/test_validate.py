"""``ragsim validate``: the comparison statistics against values worked by hand and against
scipy's own tests, the join of two runs, the load plan, and the command on two simulations."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from typer.testing import CliRunner

from ragsim import validation as v
from ragsim.cli import app
from ragsim.errors import RagsimInputError


def _columns(ids, ttft, gpu, host, status=None) -> dict[str, np.ndarray]:
    """Requests that arrive at 0 and whose TTFT is all prefill (no search, queue or copy)."""
    n = len(ids)
    zeros = np.zeros(n)
    return {"request_id": np.asarray(ids), "ttft_s": np.asarray(ttft, float),
            "hit_tokens_gpu": np.asarray(gpu), "hit_tokens_host": np.asarray(host),
            "status": np.asarray(status or ["completed"] * n),
            "arrival_s": zeros, "search_start_s": zeros, "search_end_s": zeros,
            "prefill_start_s": zeros, "swap_in_s": zeros,
            "first_token_s": np.asarray(ttft, float)}


# four requests worked by hand:
#   real TTFT 1, 2, 4, 5 s; sim 1.1, 1.8, 4, 6 s -> per-request errors +0.1, -0.1, 0, +0.2
#   means 3.0 and 3.225 -> mean error 0.075; |errors| sorted 0, 0.1, 0.1, 0.2 -> p50 0.1,
#   p90 at rank 0.9 * 3 = 2.7 -> 0.1 + 0.7 * 0.1 = 0.17
#   hits (gpu, host): equal; gpu differs; equal; same total split differently -> agreement 0.5
REAL = _columns([0, 1, 2, 3], [1.0, 2.0, 4.0, 5.0], [10, 20, 0, 100], [0, 5, 0, 0])
SIM = _columns([0, 1, 2, 3], [1.1, 1.8, 4.0, 6.0], [10, 25, 0, 0], [0, 5, 0, 100])


def _joined():
    joined, dropped = v.join_runs(REAL, SIM)
    assert dropped == []
    return joined


def test_ttft_errors_by_hand():
    errors = v.ttft_errors(_joined())
    assert errors["ttft_mean_error"] == pytest.approx(0.075)
    assert errors["ttft_p50_abs_error"] == pytest.approx(0.1)
    assert errors["ttft_p90_abs_error"] == pytest.approx(0.17)
    assert errors["ttft_mean_abs_error_per_request"] == pytest.approx(0.1)
    # the medians: real (2 + 4) / 2 = 3, sim (1.8 + 4) / 2 = 2.9 -> -1/30
    assert errors["ttft_p50_error"] == pytest.approx(-1 / 30)


def test_hit_agreement_counts_each_tier():
    assert v.hit_agreement(_joined()) == pytest.approx(0.5)


def test_join_keeps_only_requests_completed_in_both():
    real = _columns([0, 1, 2, 3, 5], [1, 1, 1, 1, 1], [0] * 5, [0] * 5,
                    ["completed", "completed", "completed", "failed", "completed"])
    sim = _columns([0, 1, 2, 3, 4], [1, 1, 1, 1, 1], [0] * 5, [0] * 5,
                   ["completed", "pending", "completed", "completed", "completed"])
    joined, dropped = v.join_runs(real, sim)
    assert joined["request_id"].tolist() == [0, 2]
    assert dropped == [1, 3, 4, 5]  # pending in sim, failed in real, each missing in one run


def test_ks_matches_scipy_and_a_hand_value():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(0, 0.5, 40), rng.lognormal(0.2, 0.5, 50)
    direct = stats.ks_2samp(a, b)
    ours = v.ks_test(a, b)
    assert ours["ks_statistic"] == pytest.approx(direct.statistic)
    assert ours["ks_pvalue"] == pytest.approx(direct.pvalue)
    assert v.ks_test(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))["ks_statistic"] == 1.0


def _scipy_tost(sim, real, margin=0.10):
    """TOST as two one-sided one-sample t-tests of scipy on the log ratios."""
    d = np.log(sim / real)
    p_low = stats.ttest_1samp(d, math.log(1 - margin), alternative="greater").pvalue
    p_high = stats.ttest_1samp(d, math.log(1 + margin), alternative="less").pvalue
    return p_low, p_high


def test_tost_accepts_close_runs_like_scipy():
    rng = np.random.default_rng(7)
    real = rng.lognormal(0, 0.6, 60)
    sim = real * np.exp(rng.normal(0.02, 0.05, 60))  # ~2% slower, 5% noise
    ours = v.tost_log_ratio(sim, real)
    p_low, p_high = _scipy_tost(sim, real)
    assert ours["tost_p_lower"] == pytest.approx(p_low)
    assert ours["tost_p_upper"] == pytest.approx(p_high)
    assert ours["tost_equivalent"] is True
    assert ours["tost_pvalue"] == pytest.approx(max(p_low, p_high)) and ours["tost_pvalue"] < 0.05


def test_tost_rejects_a_biased_or_noisy_sim():
    rng = np.random.default_rng(8)
    real = rng.lognormal(0, 0.6, 60)
    biased = real * np.exp(rng.normal(math.log(1.15), 0.05, 60))  # 15% slow: outside the margin
    result = v.tost_log_ratio(biased, real)
    _, p_high = _scipy_tost(biased, real)
    assert result["tost_p_upper"] == pytest.approx(p_high) and p_high > 0.05
    assert result["tost_equivalent"] is False
    # unbiased on average but so noisy that 8 requests cannot show equivalence
    noisy = real[:8] * np.exp(rng.normal(0.0, 0.5, 8))
    assert v.tost_log_ratio(noisy, real[:8])["tost_equivalent"] is False


def test_tost_with_identical_ratios():
    real = np.array([1.0, 2.0, 3.0])
    assert v.tost_log_ratio(real * 1.05, real)["tost_equivalent"] is True
    assert v.tost_log_ratio(real * 1.2, real)["tost_equivalent"] is False


def test_components_and_the_dominant_one():
    # two requests; the real TTFTs 1.5 and 2.5 (mean 2.0); the simulation moves 0.3 s of the
    # first request's queue and adds 0.2 s of prefill to each: by hand, queue -0.15 s on
    # average (-7.5% of the real mean TTFT), prefill +0.2 s (+10%)
    real = pd.DataFrame({"ttft_s": [1.5, 2.5], "search_wait_s": [0.1, 0.1],
                         "search_s": [0.5, 0.5], "queue_s": [0.4, 0.4], "swap_in_s": [0.0, 0.0],
                         "prefill_s": [0.5, 1.5]})
    sim = real.copy()
    sim["queue_s"] = [0.1, 0.4]
    sim["prefill_s"] = [0.7, 1.7]
    joined = real.add_suffix("_real").join(sim.add_suffix("_sim"))
    components = v.component_errors(joined)
    assert components["queue"]["error_s"] == pytest.approx(-0.15)
    assert components["queue"]["share_of_ttft"] == pytest.approx(-0.075)
    assert components["prefill"]["share_of_ttft"] == pytest.approx(0.1)
    assert components["search"]["error_s"] == 0
    assert v.dominant_component(components) == "prefill"
    assert "scheduling" in components["queue"]["assumption"]


def test_checks_apply_where_they_mean_something():
    report = {"hit_agreement": 0.9, "ttft_mean_error": -0.08, "ttft_p90_abs_error": 0.3,
              "throughput_error": 0.12}
    marks = {c["metric"]: c["passed"] for c in v.checks(report, sequential=False,
                                                         overload=False)}
    assert marks == {"hit_agreement": None, "ttft_mean_abs_error": True,
                     "ttft_p90_abs_error": False, "throughput_abs_error": None}
    marks = {c["metric"]: c["passed"] for c in v.checks(report, sequential=True, overload=True)}
    assert marks["hit_agreement"] is False and marks["throughput_abs_error"] is False


def test_compare_on_hand_made_runs():
    summary = {"throughput_rps": 4.0, "ttft_mean_s": 3.0, "profile": "p"}
    config = SimpleNamespace(system="ragcache", trace="t", arrival="poisson", rate_rps=2.0,
                             profile="p")
    real = SimpleNamespace(columns=REAL, summary=summary, config=config)
    sim = SimpleNamespace(columns=SIM, summary={**summary, "throughput_rps": 3.0}, config=config)
    report = v.compare(real, sim, backend="sim")
    assert report["requests"] == 4 and report["requests_dropped"] == 0
    assert report["throughput_error"] == pytest.approx(-0.25)
    assert report["ttft_mean_error"] == pytest.approx(0.075)
    assert report["real_is_simulated"] is True
    assert report["real"]["throughput_rps"] == 4.0 and report["sim"]["throughput_rps"] == 3.0


def test_parse_loads_orders_the_points():
    assert v.parse_loads("idle,50,90,over") == ["over", "90", "50", "idle"]
    assert v.parse_loads("50%") == ["over", "50"]  # the capacity comes from the overload point
    assert v.parse_loads("idle") == ["idle"]
    for bad in ("150", "fast", ""):
        with pytest.raises(RagsimInputError, match="--loads"):
            v.parse_loads(bad)


def test_per_request_table():
    table = v.per_request(_joined())
    assert table["ttft_error"].tolist() == pytest.approx([0.1, -0.1, 0.0, 0.2])
    assert table["hits_agree"].tolist() == [True, False, True, False]
    assert isinstance(table, pd.DataFrame)


# --------------------------------------------------------------------------- the command
# two simulations stand in for the real run (--backend sim): the A10G profile is simulated
# against the L4 one, so the two sides differ as a real engine and its model would
runner = CliRunner()
PAIR = ["--backend", "sim", "--requests", "30", "--profile", "a10g-mistral-7b",
        "--reference-profile", "l4-mistral-7b"]


def _invoke(*args: str):
    return runner.invoke(app, ["validate", *args], env={"COLUMNS": "200"})


def _completed_ttft(path: Path) -> pd.Series:
    records = pd.read_parquet(path)
    return records[records["status"] == "completed"].set_index("request_id")["ttft_s"]


def test_cli_writes_the_report_and_figures(tmp_path):
    result = _invoke(*PAIR, "--rate", "2", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    written = json.loads((tmp_path / "validation.json").read_text())
    assert printed == written
    for key in ("requests", "backend", "system", "hit_agreement", "ttft_mean_error",
                "ttft_p90_abs_error", "throughput_error", "real", "sim"):
        assert key in written
    assert written["backend"] == "sim" and written["real_is_simulated"] is True
    assert "not a real run" in result.stderr
    # the errors again, from the two runs' own records (pandas, not the module)
    real, sim = _completed_ttft(tmp_path / "real/requests.parquet"), _completed_ttft(
        tmp_path / "sim/requests.parquet")
    both = real.index.intersection(sim.index)
    assert written["requests"] == len(both) == 30
    assert written["ttft_mean_error"] == pytest.approx(
        sim[both].mean() / real[both].mean() - 1)
    assert written["ttft_p90_abs_error"] == pytest.approx(
        float(np.percentile((sim[both] / real[both] - 1).abs(), 90)))
    assert written["ttft_mean_error"] != 0  # the two profiles do differ
    for name in ("ttft_scatter.png", "ttft_cdf.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(table) == 30 and {"ttft_error", "hits_agree"} <= set(table.columns)


def test_cli_a_simulation_against_itself_agrees_exactly(tmp_path):
    result = _invoke("--backend", "sim", "--requests", "30", "--profile", "a10g-mistral-7b",
                     "--sequential", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["arrival"] == "sequential"
    assert report["hit_agreement"] == 1.0
    assert report["ttft_mean_error"] == 0 and report["ttft_p90_abs_error"] == 0
    assert report["tost_equivalent"] is True and report["ks_statistic"] == 0
    marks = {c["metric"]: c["passed"] for c in report["checks"]}
    assert marks["hit_agreement"] is True and marks["throughput_abs_error"] is None


def test_cli_loads_take_the_capacity_from_the_overload_point(tmp_path):
    result = _invoke(*PAIR, "--loads", "50,over", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    combined = json.loads(result.stdout)
    assert [row["load"] for row in combined["loads"]] == ["over", "50"]
    capacity = json.loads((tmp_path / "load-over/real/summary.json").read_text())[
        "throughput_rps"]
    assert combined["capacity_rps"] == pytest.approx(capacity)
    half = json.loads((tmp_path / "load-50/validation.json").read_text())
    assert half["rate_rps"] == pytest.approx(capacity / 2)
    # the share of capacity carries the overload point's throughput error (the diagnosis's)
    over_error = json.loads((tmp_path / "load-over/validation.json").read_text())[
        "throughput_error"]
    assert half["capacity_error"] == over_error
    assert pd.read_parquet(tmp_path / "loads.parquet")["load"].tolist() == ["over", "50"]
    over = json.loads((tmp_path / "load-over/validation.json").read_text())
    marks = {c["metric"]: c["applies"] for c in over["checks"]}
    assert marks["throughput_abs_error"] is True and marks["hit_agreement"] is False


@pytest.mark.parametrize("args, flag", [
    (["--loads", "fast"], "--loads"),
    (["--loads", "idle", "--sequential"], "--sequential"),
    (["--profile-now"], "--profile"),
    (["--layers", "3"], "--layers"),
    (["--rate", "-1"], "--rate"),
])
def test_cli_bad_input_is_one_line_naming_the_option(tmp_path, args, flag):
    result = _invoke(*PAIR, *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_iteration_time_ratio_sums_every_kind():
    # by hand: predicted 0.5 + 3.0 = 3.5 s against measured 2.0 + 2.0 = 4.0 s -> 0.875
    summary = {"cost_model_errors": {
        "prefill_single": {"predicted_s": 0.5, "measured_s": 2.0},
        "decode": {"predicted_s": 3.0, "measured_s": 2.0}}}
    assert v.iteration_time_ratio(summary) == pytest.approx(0.875)
    assert v.iteration_time_ratio({}) is None  # a simulated "real" side has no iterations


def test_beyond_profile_time_share():
    # by hand: 1.5 s of 4.0 s measured lay past the profile's grids -> 0.375
    summary = {"cost_model_errors": {
        "prefill_batch": {"measured_s": 2.0, "beyond_profile_measured_s": 1.5},
        "decode": {"measured_s": 2.0, "beyond_profile_measured_s": 0.0}}}
    assert v.beyond_profile_time_share(summary) == pytest.approx(0.375)
    assert v.beyond_profile_time_share({}) is None


# --------------------------------------------------------------------------- machine speed
def test_machine_speed_is_the_geometric_mean_of_the_probes_and_says_when_it_moved():
    assert v.machine_speed({}) is None
    speed = v.machine_speed({"speed_ratio_before": 0.9, "speed_ratio_after": 1.6})
    assert speed["factor"] == pytest.approx(1.2)  # sqrt(0.9 * 1.6) = sqrt(1.44)
    assert speed["change_during_run"] == pytest.approx(1.6 / 0.9 - 1)
    assert speed["steady"] is False
    assert v.machine_speed({"speed_ratio_before": 1.0, "speed_ratio_after": 1.05})["steady"]


def test_machine_speed_gives_each_kind_of_probe_point_its_own_factor():
    """Run L's torch probes: two prefill points near 1 and a decode point at 0.86-0.89 gave a
    median of ~1.0; by kind, prefill is sqrt(1.015 * 1.02) and decode sqrt(0.86 * 0.89), each
    kind's median per probe first (by hand)."""
    def points(prefill_a, prefill_b, decode):
        return [{"kind": "prefill", "ratio": prefill_a}, {"kind": "prefill", "ratio": prefill_b},
                {"kind": "decode", "ratio": decode}]

    summary = {"speed_ratio_before": 1.01, "speed_ratio_after": 1.02,
               "speed_probes": {"before": points(1.0, 1.03, 0.86),
                                "after": points(1.02, 1.02, 0.89)}}
    kinds = v.machine_speed(summary)["by_kind"]
    assert kinds["prefill"] == pytest.approx(math.sqrt(1.015 * 1.02))
    assert kinds["decode"] == pytest.approx(math.sqrt(0.86 * 0.89))
    config = SimpleNamespace(system="ragcache", trace="t", arrival="poisson", rate_rps=2.0,
                             profile="p")
    real = SimpleNamespace(columns=REAL, config=config, summary={
        "throughput_rps": 4.0, "profile": "p", **summary})
    sim = SimpleNamespace(columns=SIM, config=config, summary={"throughput_rps": 4.0,
                                                                "profile": "p"})
    row = v.load_row({**v.compare(real, sim, backend="sim"), "load": "50"})
    assert row["machine_speed_decode"] == pytest.approx(math.sqrt(0.86 * 0.89))
    assert row["machine_speed_prefill"] == pytest.approx(kinds["prefill"])
    # a kind probed on one side only (vLLM without prefix caching drops a point) has no factor
    one_sided = {**summary, "speed_probes": {"before": points(1.0, 1.0, 0.9),
                                             "after": points(1.0, 1.0, 0.9)[:2]}}
    assert set(v.machine_speed(one_sided)["by_kind"]) == {"prefill"}
    assert v.machine_speed({"speed_ratio_before": 1.0, "speed_ratio_after": 1.0})["by_kind"] == {}


def test_a_profile_scaled_to_a_slower_machine_prices_every_iteration_that_much_slower():
    """Bilinear interpolation is linear in the grid's values, so scaling every value scales
    every price, on the grid or between its points, single or batched."""
    from ragsim.profiles.profile import load_profile

    base = load_profile("cpu-mistral-7b-l2-h256")
    slow = base.scaled_compute(1.5)
    for cached, new in ((0, 100), (700, 333), (1500, 2900)):
        assert slow.prefill_s(cached, new) == pytest.approx(1.5 * base.prefill_s(cached, new))
    for batch, context in ((1, 100), (7, 1234)):
        assert slow.decode_s(batch, context) == pytest.approx(1.5 * base.decode_s(batch, context))
    rows = ([0, 512, 512], [300, 40, 90])
    assert slow.batched_prefill.iteration_s(*rows) == pytest.approx(
        1.5 * base.batched_prefill.iteration_s(*rows))
    assert slow.transfers.to_dict() == base.transfers.to_dict()
    with pytest.raises(ValueError):
        base.scaled_compute(0.0)


def test_speed_probes_time_the_profiles_own_grid_points():
    from ragsim.profiles.profile import load_profile
    from ragsim.profiles.torch_model import TorchModel
    from ragsim.realrun.speed import probe_speed

    profile = load_profile("cpu-mistral-7b-l2-h256")
    model = TorchModel.build(profile.model, "cpu", "fp32", threads=1, seed=0)
    probe = probe_speed(model, profile)
    assert [p["kind"] for p in probe.points] == ["prefill", "prefill", "decode"]
    for point in probe.points:
        grid = profile.prefill if point["kind"] == "prefill" else profile.decode
        assert point["x"] in grid.x_axis and point["y"] in grid.y_axis  # measured, not fitted
        assert point["ratio"] == pytest.approx(point["measured_s"] / point["profiled_s"])
    assert probe.ratio == pytest.approx(float(np.median([p["ratio"] for p in probe.points])))
    assert 0.05 < probe.ratio < 20  # the same model on the same kind of machine


def test_a_profile_measured_for_a_validation_reaches_what_its_runs_ask():
    """Three requests worked by hand (system prompt 10): prompts 10+100+5, 10+300+40+20,
    10+1+7 tokens; outputs 4, 8, 2 -> longest prompt 370, longest context 378; mean context
    (119+378+20)/3 = 172.3; 4 MiB of KV at 2,048 B/token = 2,048 tokens -> 11 requests of the
    mean context fit, fewer than the 256 the batch limit allows, more than the 3 requests
    there are."""
    from ragsim.profiles.profiler import ProfilePlan
    from ragsim.serving.config import build_config
    from ragsim.traces.io import TraceBuilder

    b = TraceBuilder("needs")
    b.add(0, 0.0, 5, 4, [1], [100])
    b.add(1, 0.0, 20, 8, [2, 3], [300, 40])
    b.add(2, 0.0, 7, 2, [4], [1])
    trace = b.build({"name": "needs"})
    config = build_config({"trace": "mmlu", "system_prompt_tokens": 10,
                           "gpu_kv_bytes": 4 * 2**20})
    needs = v.run_needs(trace, config, 2048)
    assert needs == {"cached_tokens": 370, "new_tokens": 370, "batch_size": 3,
                     "context_tokens": 378, "prefill_rows": 8}
    config = config.replace(gpu_kv_bytes=1 * 2**20)  # 512 tokens: 2 requests of 172 fit
    assert v.run_needs(trace, config, 2048)["batch_size"] == 2
    quick = ProfilePlan.quick()
    plan = quick.covering(cached_tokens=2300, new_tokens=100, batch_size=40,
                          context_tokens=5000)
    assert plan.cached_tokens == [*quick.cached_tokens, 2304]  # rounded up to 256s
    assert plan.new_tokens == quick.new_tokens  # 100 is inside already
    # 40 rows, and 32 on the way (16 doubled): a decode step is not a straight line from 16
    # rows to 40
    assert plan.batch_sizes == [*quick.batch_sizes, 32, 40]
    assert plan.context_tokens == [*quick.context_tokens, 5120]


def test_validate_on_vllm_needs_a_profile_of_vllm(tmp_path):
    """On a GPU there is no shipped profile of vLLM: one must be measured and given. On a CPU
    the shipped one is used (and here the run then stops at vLLM's missing CPU engine)."""
    result = CliRunner().invoke(app, ["validate", "--backend", "vllm", "--device", "cuda",
                                      "--out", str(tmp_path / "v")])
    assert result.exit_code == 2
    assert "ragsim profile --engine vllm" in result.output
    on_cpu = CliRunner().invoke(app, ["validate", "--backend", "vllm", "--requests", "5",
                                      "--out", str(tmp_path / "c")])
    assert "ragsim profile --engine vllm" not in on_cpu.output
    # the settings vLLM runs with, said in one line before the runs (ragcache's preset)
    notes = [line for line in on_cpu.stderr.splitlines() if line.startswith("note:")]
    terms = [line for line in notes if "both sides run as it does" in line]
    assert len(terms) == 1 and "speculate true -> false" in terms[0], on_cpu.stderr
    # and, on glibc's malloc, that the engine's steps of new sizes cost more than profiled
    from ragsim.profiles.allocator import memory_allocator

    assert any("glibc's malloc" in line for line in notes) == (memory_allocator() == "glibc")


def test_the_simulation_of_a_vllm_run_uses_the_mixed_scheduler_unless_told(tmp_path):
    """vLLM >= 0.4 forms every step from decodes and prompt chunks: validating against it
    simulates that by default; the torch engine runs prefill-first; an explicit choice (flag
    or config file) stands."""
    from ragsim.api.validation import _config

    common = dict(trace="mmlu", system="vllm", rate=None, requests=10, seed=0, policy=None,
                  gpu_mem=None, host_mem=None)
    assert _config(None, **common, backend="vllm")[0].scheduler == "mixed"
    assert _config(None, **common, backend="torch")[0].scheduler == "prefill-first"
    assert _config(None, **common, backend="vllm",
                   scheduler="prefill-first")[0].scheduler == "prefill-first"
    file = tmp_path / "c.toml"
    file.write_text('format = "ragsim.config"\nversion = 1\n[run]\nscheduler = "prefill-first"\n')
    assert _config(file, **common, backend="vllm")[0].scheduler == "prefill-first"


def test_the_verdict_is_one_line_on_the_raw_errors_and_check_exits_1_on_a_miss(tmp_path):
    """A 'real' side priced on another GPU (H100 against A10G) misses the TTFT targets by far:
    the verdict says FAIL with what was missed, and --check makes that exit 1; the same
    validation against itself passes and exits 0."""
    same = runner.invoke(app, ["validate", "--out", str(tmp_path / "same"), "--backend", "sim",
                               "--requests", "20", "--check"], env={"COLUMNS": "200"})
    assert same.exit_code == 0, same.output
    assert "verdict: pass: 2 of 2 targets met" in same.stdout
    other = runner.invoke(app, ["validate", "--out", str(tmp_path / "other"), "--backend", "sim",
                                "--requests", "20", "--reference-profile", "h100-mistral-7b",
                                "--check"], env={"COLUMNS": "200"})
    assert other.exit_code == 1, other.output
    verdict = [line for line in other.stdout.splitlines() if line.startswith("verdict:")]
    assert len(verdict) == 1 and "FAIL: 2 of 2 targets missed" in verdict[0]
    assert "TTFT mean |error|" in verdict[0] and "(target <= 10%)" in verdict[0]
    # without --check the same miss is reported and the command succeeds (a measurement)
    plain = runner.invoke(app, ["validate", "--out", str(tmp_path / "plain"), "--backend", "sim",
                                "--requests", "20", "--reference-profile", "h100-mistral-7b"])
    assert plain.exit_code == 0 and "verdict: FAIL" in plain.stdout
    # the API says the same
    import ragsim

    found = ragsim.validate(tmp_path / "api", backend="sim", requests=20,
                            reference_profile="h100-mistral-7b")
    assert found.verdict == verdict[0].removeprefix("verdict: ")


def test_the_loads_tables_speed_names_the_decode_probe_where_the_median_hides_it():
    from ragsim.cli.validate import _speed

    row = {"machine_speed_factor": 1.0, "machine_speed_change": 0.0,
           "machine_speed_decode": 0.87, "machine_speed_prefill": 1.03}
    assert _speed(row) == "x1.00 (decode x0.87)"
    assert _speed({**row, "machine_speed_decode": 0.95}) == "x1.00"
    # a report of an older ragsim, without the kinds, as before
    assert _speed({"machine_speed_factor": 1.2, "machine_speed_change": 0.2}) == "x1.20*"
