"""`ragsim plot`: the drawn curves are the seeds' means of the table, the bands their Student-t
95% intervals (computed here with pandas and scipy, not with the plotting code), axes in units."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from scipy import stats
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.study.plot import plot_figure

runner = CliRunner()

REPLAY = """
seeds = [0, 1, 2]
[base]
mode = "replay"
trace = "mmlu"
requests = 1500
gpu_mem = "1GiB"
[axes]
policy = ["pgdsf", "lru"]
host_mem = ["1GiB", "3GiB", "6GiB"]
"""
# two systems at two rates over two seeds, small: the report's tests use it too
RUN = """
seeds = [0, 1]
[base]
trace = "mmlu"
n_requests = 200
[axes]
system = ["ragcache", "vllm"]
rate_rps = [1.0, 4.0]
"""
# two systems over host memory, 100 requests at the default rate: both keep up, so both
# throughputs are the arrival rate (within 0.2%), and 2 seeds give a t band of +-12.7 SE
HOST_MEM_RUN = """
seeds = [0, 1]
[base]
trace = "mmlu"
n_requests = 100
[axes]
system = ["ragcache", "vllm"]
host_mem = ["2GiB", "10GiB"]
"""


def _sweep(tmp: Path, text: str) -> Path:
    spec = tmp / "s.toml"
    spec.write_text(text)
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp / "out"), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    return tmp / "out"


@pytest.fixture(scope="module")
def replay_sweep(tmp_path_factory) -> Path:
    return _sweep(tmp_path_factory.mktemp("replay"), REPLAY)


@pytest.fixture(scope="module")
def run_sweep(tmp_path_factory) -> Path:
    return _sweep(tmp_path_factory.mktemp("run"), RUN)


def test_curves_are_seed_means_with_t_bands(replay_sweep):
    table = pd.read_parquet(replay_sweep / "results.parquet")
    fig = plot_figure(replay_sweep, table, x=None, y=None, by=None,
                      preset="hit-rate-vs-host-memory")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "host capacity (GiB)" and ax.get_ylabel() == "token hit rate"
    expected = table.groupby(["policy", "host_capacity_bytes"])["token_hit_rate"]
    means, sems, counts = expected.mean(), expected.sem(), expected.count()
    assert (counts == 3).all()
    assert means.loc["pgdsf"].to_numpy().tolist() != means.loc["lru"].to_numpy().tolist()
    lines = {line.get_label(): line for line in ax.get_lines()
             if not line.get_label().startswith("_")}
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert set(lines) == {"policy = pgdsf", "policy = lru"} and len(bands) == 2
    # and each seed's own line (thin): the three seeds of each policy, as the table has them
    seed_lines = {line.get_label(): line for line in ax.get_lines()
                  if line.get_label().startswith("_seed")}
    assert len(seed_lines) == 6
    for (policy, seed), rows in table.groupby(["policy", "seed"]):
        line = seed_lines[f"_seed {seed} of policy = {policy}"]
        rows = rows.sort_values("host_capacity_bytes")
        np.testing.assert_allclose(line.get_ydata(), rows["token_hit_rate"].to_numpy())
    for (label, line), band in zip(sorted(lines.items()), sorted(
            bands, key=lambda b: _band_key(b, lines)), strict=True):
        policy = label.removeprefix("policy = ")
        xs = means.loc[policy].index.to_numpy() / 2**30
        np.testing.assert_allclose(line.get_xdata(), xs)
        np.testing.assert_allclose(line.get_ydata(), means.loc[policy].to_numpy(), rtol=1e-12)
        vertices = band.get_paths()[0].vertices
        for x, mean, sem in zip(xs, means.loc[policy], sems.loc[policy], strict=True):
            lo, hi = stats.t.interval(0.95, 2, loc=mean, scale=sem)
            at = vertices[np.isclose(vertices[:, 0], x)][:, 1]
            assert at.min() == pytest.approx(lo, abs=1e-12)
            assert at.max() == pytest.approx(hi, abs=1e-12)


def test_sizes_are_drawn_in_gib(replay_sweep):
    table = pd.read_parquet(replay_sweep / "results.parquet")
    fig = plot_figure(replay_sweep, table, x="host_cache_bytes", y="swap_in_bytes", by="policy")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "swap in (GiB)"
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "policy = lru")
    means = table[table["policy"] == "lru"].groupby("host_capacity_bytes")["swap_in_bytes"].mean()
    np.testing.assert_allclose(line.get_ydata(), means.to_numpy() / 2**30, rtol=1e-12)


def _band_key(band, lines) -> str:
    """The label of the line drawn in the band's colour."""
    colour = tuple(band.get_facecolor()[0][:3])
    for label, line in lines.items():
        from matplotlib.colors import to_rgb

        if np.allclose(to_rgb(line.get_color()), colour):
            return label
    raise AssertionError("a band without its line")


def test_cli_writes_png_and_svg(replay_sweep, tmp_path):
    for name in ("fig.png", "fig.svg"):
        result = runner.invoke(app, ["plot", str(replay_sweep), "--x",
                                     "host_cache_bytes", "--y", "token_hit_rate",
                                     "--by", "policy", "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "fig.svg").read_bytes()[:400]


def test_averaging_over_a_swept_option_is_refused(replay_sweep, tmp_path):
    result = runner.invoke(app, ["plot", str(replay_sweep), "--x", "host_cache_bytes", "--y",
                                 "token_hit_rate", "--out", str(tmp_path / "f.png")])
    assert result.exit_code == 2
    assert "policy also vary" in result.output and "--by policy" in result.output
    assert not (tmp_path / "f.png").exists()
    result = runner.invoke(app, ["plot", str(replay_sweep), "--x", "host_cache_bytes", "--y",
                                 "nope", "--out", str(tmp_path / "f.png")])
    assert result.exit_code == 2 and "no column 'nope'" in result.output


def test_rate_preset_and_ttft_cdf(run_sweep):
    table = pd.read_parquet(run_sweep / "results.parquet")
    fig = plot_figure(run_sweep, table, x=None, y=None, by=None, preset="ttft-vs-rate")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "rate (req/s)" and ax.get_ylabel() == "TTFT mean (s)"
    vllm = next(line for line in ax.get_lines() if line.get_label() == "system = vllm")
    means = table[table["system"] == "vllm"].groupby("rate_rps")["ttft_mean_s"].mean()
    np.testing.assert_allclose(vllm.get_ydata(), means.to_numpy(), rtol=1e-12)
    fig = plot_figure(run_sweep, table, x=None, y=None, by=None, preset="ttft-cdf",
                      where=["rate_rps=4.0"])
    ax = fig.axes[0]
    for line in ax.get_lines():
        system = line.get_label().removeprefix("system = ")
        ids = table[(table["system"] == system) & (table["rate_rps"] == 4.0)]["point_id"]
        ttft = np.sort(np.concatenate([
            pd.read_parquet(run_sweep / "points" / i / "requests.parquet")["ttft_s"].dropna()
            for i in ids]))
        np.testing.assert_allclose(line.get_xdata(), ttft)
        assert line.get_ydata()[-1] == 1.0 and len(ttft) == 2 * 200


def test_bands_stop_where_the_metric_does(tmp_path):
    """Over 2 seeds the Student-t interval of a throughput near 0.95 req/s runs from about -1
    to 3 and a hit rate's past 1: the band is cut at 0 (and at 1 for a rate of hits), the
    note says so, and the line of means is the table's."""
    out = _sweep(tmp_path, HOST_MEM_RUN)
    table = pd.read_parquet(out / "results.parquet")
    for y, high in (("throughput_rps", np.inf), ("token_hit_rate", 1.0)):
        groups = table.groupby(["system", "host_cache_bytes"])[y]
        half = stats.t.ppf(0.975, groups.count() - 1) * groups.sem()
        # what an uncut band would draw: below 0 req/s, above a hit rate of 1
        assert (groups.mean() - half).min() < 0 or (groups.mean() + half).max() > high
        ax = plot_figure(out, table, x="host_mem", y=y, by="system").axes[0]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 2
        for band in bands:
            heights = band.get_paths()[0].vertices[:, 1]
            assert heights.min() >= 0 and heights.max() <= high
        assert any("cut to the values the metric can take" in t.get_text() for t in ax.texts)
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "system = vllm")
        means = table[table["system"] == "vllm"].groupby("host_cache_bytes")[y].mean()
        np.testing.assert_allclose(line.get_ydata(), means.to_numpy(), rtol=1e-12)


def test_the_readme_tour_plots_by_the_name_it_swept(tmp_path):
    """The tour sweeps ``host_mem`` and plots it by that name (one name per quantity, not the
    results' ``host_cache_bytes``): its two commands, run as written on fewer requests."""
    lines = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    sweep = shlex.split(next(ln for ln in lines if ln.startswith("ragsim sweep ")))[1:]
    plot = shlex.split(next(ln for ln in lines if ln.startswith("ragsim plot ")))[1:]
    swept = {a.split("=")[0] for a, flag in zip(sweep[1:], sweep, strict=False)
             if flag == "--axis"}
    assert plot[plot.index("--x") + 1] in swept, (plot, swept)
    out = tmp_path / "sw"
    sweep[sweep.index("--out") + 1] = str(out)
    result = runner.invoke(app, [*sweep, "--set", "n_requests=100", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    plot[1] = str(out)
    plot[plot.index("--out") + 1] = str(tmp_path / "hits.png")
    result = runner.invoke(app, plot)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hits.png").read_bytes()[:4] == b"\x89PNG"
