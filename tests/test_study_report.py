"""`ragsim report`: one HTML file that a real headless browser (Debian's chromium) renders
offline, with its figures drawn (their curves' colours are on the screenshot) and its tables
filled (read back from the browser's DOM)."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from ragsim.cli import app
from tests.test_study_plot import HOST_MEM_RUN
from tests.test_study_plot import RUN as SWEEP

runner = CliRunner()
# matplotlib's first two curve colours (C0, C1), as 8-bit RGB
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)


class _Dom(HTMLParser):
    """What the browser's DOM holds: images (and their sources), table rows, text."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.alts: list[str] = []
        self.rows = 0
        self.cells: list[str] = []
        self.text: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
            self.alts.append(dict(attrs).get("alt", ""))
        elif tag == "tr":
            self.rows += 1
        elif tag in ("td", "th"):
            self._in_cell = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_cell:
            self.cells.append(data.strip())


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium package is needed (apt-get install chromium; CI installs it)"
    return path


def browse(page: Path, tmp: Path) -> tuple[_Dom, np.ndarray]:
    """The DOM chromium built from the file and a screenshot of the page."""
    flags = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp / 'profile'}", "--window-size=1280,4200"]
    url = page.resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    shot = tmp / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=120,
                   check=True)
    parsed = _Dom()
    parsed.feed(dom)
    return parsed, (imread(shot)[:, :, :3] * 255).round().astype(int)


def pixels_of(image: np.ndarray, rgb: tuple[int, int, int]) -> int:
    return int((np.abs(image - np.array(rgb)).max(axis=2) <= 3).sum())


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "s.toml").write_text(SWEEP)
    result = runner.invoke(app, ["sweep", str(tmp / "s.toml"), "--out", str(tmp / "out"),
                                 "--jobs", "1"])
    assert result.exit_code == 0, result.output
    return tmp / "out"


@pytest.mark.browser  # Debian's chromium: CI installs it (pytest -m "slow or browser")
def test_report_renders_in_a_real_browser(sweep_dir, tmp_path):
    page = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(sweep_dir), "--out", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text
    dom, shot = browse(page, tmp_path)
    # one figure per metric against the swept rate (curves per system) and a TTFT CDF
    assert len(dom.images) == 4 + 1
    assert all(src.startswith("data:image/png;base64,") for src in dom.images)
    table = pd.read_parquet(sweep_dir / "results.parquet")
    points = table.groupby(["rate_rps", "system"]).size()
    assert dom.rows == 1 + len(points)  # the results table: a header and a row per point
    ttft = table.groupby(["rate_rps", "system"])["ttft_mean_s"].mean()
    for value in ttft:
        assert any(cell.startswith(f"{value:.4g}") for cell in dom.cells), value
    assert "[axes]" in "".join(dom.text)  # the configuration
    # drawn: both curve colours cover real areas of the screenshot (a broken image shows none)
    assert pixels_of(shot, BLUE) > 300 and pixels_of(shot, ORANGE) > 300


def one_run_page(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["run", "--requests", "100", "--json", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = tmp_path / "run.html"
    assert runner.invoke(app, ["report", str(run_dir), "--out", str(page)]).exit_code == 0
    return page


def test_report_of_one_run(tmp_path):
    dom = _Dom()
    dom.feed(one_run_page(tmp_path).read_text())
    assert len(dom.images) == 1 and dom.images[0].startswith("data:image/png;base64,")
    assert "ttft_p90_s" in dom.cells


@pytest.mark.browser  # Debian's chromium: CI installs it (pytest -m "slow or browser")
def test_report_of_one_run_renders_in_a_real_browser(tmp_path):
    dom, shot = browse(one_run_page(tmp_path), tmp_path)
    assert len(dom.images) == 1 and "ttft_p90_s" in dom.cells
    assert pixels_of(shot, BLUE) > 100


def test_report_refuses_other_folders(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "neither a sweep folder" in result.output
    result = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.png")])
    assert result.exit_code == 2 and "must end in .html" in result.output


def test_the_header_counts_points_and_seeds_and_coinciding_curves_are_said_not_drawn(
        sweep_dir, tmp_path):
    """2 systems x 2 rates over 2 seeds: 8 runs of 4 points. At 1 and 4 req/s of 200 requests
    both systems finish every request, so a curve of requests completed per system would show
    one line over the other: it is named instead of drawn."""
    page = tmp_path / "report.html"
    assert runner.invoke(app, ["report", str(sweep_dir), "--out", str(page)]).exit_code == 0
    dom = _Dom()
    dom.feed(page.read_text())
    text = " ".join(dom.text)
    assert "8 runs: 4 points x 2 seeds" in text
    table = pd.read_parquet(sweep_dir / "results.parquet")
    from ragsim.study.report import RUN_METRICS, _curves_coincide

    coinciding = [y for y in RUN_METRICS if _curves_coincide(table, "rate_rps", y, "system")]
    for y in coinciding:  # checked by hand: means within 1% per rate for both systems
        means = table.groupby(["rate_rps", "system"])[y].mean().unstack("system")
        gap = (means["ragcache"] - means["vllm"]).abs()
        assert (gap <= 0.01 * (means["ragcache"] + means["vllm"]).abs() / 2).all()
    assert len(dom.images) == len(RUN_METRICS) - len(coinciding) + 1  # + the TTFT CDF
    assert ("Not drawn" in text) == bool(coinciding)


def test_plot_takes_the_name_the_sweep_used_and_suggests_the_closest_column(tmp_path):
    from tests.test_study_plot import _sweep

    spec = ('seeds = [0]\n[base]\nmode = "replay"\ntrace = "mmlu"\nrequests = 500\n'
            '[axes]\nhost_mem = ["1GiB", "2GiB"]\n')
    out = _sweep(tmp_path, spec)
    fig = tmp_path / "f.png"
    by_swept_name = runner.invoke(app, ["plot", str(out), "--x", "host_mem", "--y",
                                        "token_hit_rate", "--out", str(fig)])
    assert by_swept_name.exit_code == 0, by_swept_name.output
    typo = runner.invoke(app, ["plot", str(out), "--x", "host_mem", "--y", "token_hit_rat",
                               "--out", str(tmp_path / "g.png")])
    assert typo.exit_code == 2
    assert "did you mean 'token_hit_rate'" in typo.stderr
    assert len(typo.stderr) < 400  # one line, not the ~100 columns


def test_curves_that_coincide_are_named_not_drawn(tmp_path):
    """max_retries does nothing without GPU failures: every curve per max_retries lies on the
    others, so those figures are left out and named."""
    from tests.test_study_plot import _sweep

    spec = ('seeds = [0]\n[base]\ntrace = "mmlu"\nn_requests = 100\n'
            '[axes]\nrate_rps = [1.0, 2.0]\nmax_retries = [3, 4]\n')
    out = _sweep(tmp_path, spec)
    table = pd.read_parquet(out / "results.parquet")
    for retries, rows in table.groupby("max_retries"):  # by hand: the same runs either way
        other = table[table["max_retries"] != retries]
        assert rows["ttft_mean_s"].tolist() == other["ttft_mean_s"].tolist()
    page = tmp_path / "report.html"
    assert runner.invoke(app, ["report", str(out), "--out", str(page)]).exit_code == 0
    dom = _Dom()
    dom.feed(page.read_text())
    text = " ".join(dom.text)
    assert "Not drawn (their curves coincide)" in text and "every max_retries" in text
    captions = [t for t in dom.text if "one curve per max_retries" in t]
    assert captions == []  # none drawn against rate with a curve per max_retries


def _report_of(out: Path, tmp_path: Path) -> _Dom:
    page = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(out), "--out", str(page)])
    assert result.exit_code == 0, result.output
    dom = _Dom()
    dom.feed(page.read_text())
    return dom


@pytest.fixture(scope="module")
def host_mem_sweep(tmp_path_factory) -> Path:
    from tests.test_study_plot import _sweep

    return _sweep(tmp_path_factory.mktemp("host_mem"), HOST_MEM_RUN)


def test_captions_give_swept_sizes_in_gib(host_mem_sweep, tmp_path):
    """Swept over host memory (2 and 10 GiB): the CDF is drawn at the smallest, and its caption
    says ``2 GiB``, not ``2147483648`` (the column's values are numpy integers)."""
    dom = _report_of(host_mem_sweep, tmp_path)
    captions = dom.alts  # each figure's caption is also its image's alt text
    assert len(captions) == len(dom.images) > 0
    assert any("host_cache_bytes = 2 GiB)" in c for c in captions), captions
    for caption in captions:
        assert caption in dom.text
        assert not re.search(r"\d{7,}", caption), caption  # no size in bytes


def test_curves_within_one_percent_are_named_not_drawn(host_mem_sweep, tmp_path):
    """Both systems keep up with the load, so their throughputs are the arrival rate and differ
    by 0.2% (0.9470 vs 0.9487 req/s): drawn, one line hides the other. That figure is named;
    TTFT and hit rate, which differ, are drawn (and the CDF)."""
    table = pd.read_parquet(host_mem_sweep / "results.parquet")
    means = table.groupby(["system", "host_cache_bytes"])["throughput_rps"].mean()
    assert means.nunique() > 1  # not equal: close
    assert means.max() - means.min() < 0.01 * means.mean()
    dom = _report_of(host_mem_sweep, tmp_path)
    text = " ".join(dom.text)
    assert ("Not drawn (their curves coincide): throughput (req/s) vs host cache (GiB): every "
            "system gives the same values (within 1%)") in text
    assert not any(a.startswith("throughput") for a in dom.alts)
    assert sorted(a.split(" vs ")[0] for a in dom.alts if " vs " in a) == [
        "TTFT mean (s)", "TTFT p90 (s)", "token hit rate"]
    assert len(dom.images) == 3 + 1  # + the TTFT CDF: the systems' TTFTs differ


def test_a_cdf_whose_curves_coincide_is_named_not_drawn(tmp_path):
    """100 requests fit in memory, so nothing is evicted and the replacement policy changes
    no request's TTFT: the CDF per policy would be one curve over the other."""
    from tests.test_study_plot import _sweep

    spec = ('seeds = [0]\n[base]\ntrace = "mmlu"\nn_requests = 100\n'
            '[axes]\npolicy = ["pgdsf", "lru"]\n')
    out = _sweep(tmp_path, spec)
    dom = _report_of(out, tmp_path)
    text = " ".join(dom.text)
    assert "TTFT CDF per policy: every policy gives the same percentiles (within 1%)" in text
    assert dom.images == []


def test_a_runs_page_carries_its_intervals_and_marks_an_unstable_range(tmp_path):
    """Issue 26: a range that spans more than 2x is flagged in the summary, the report and
    findings. A run with --seeds and --sensitivity shows each metric's interval and range; a
    summary whose TTFT range spans 3x (made by hand) is marked UNSTABLE on its row only."""
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["run", "--requests", "100", "--seeds", "2", "--sensitivity",
                                 "--json", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = tmp_path / "run.html"
    assert runner.invoke(app, ["report", str(run_dir), "--out", str(page)]).exit_code == 0
    dom = _Dom()
    dom.feed(page.read_text())
    assert "Uncertainty" in " ".join(dom.text)
    assert "95% interval" in dom.cells and "range repriced" in dom.cells

    from ragsim.study.report import uncertainty_table

    summary = {"ttft_mean_s": 1.0, "token_hit_rate": 0.5, "seeds": [0, 1],
               "mean": {"ttft_mean_s": 1.1, "token_hit_rate": 0.5},
               "ci95": {"ttft_mean_s": [0.9, 1.3], "token_hit_rate": [0.45, 0.55]},
               "sensitivity": {"ttft_mean_s": [0.5, 1.5], "token_hit_rate": [0.49, 0.51]},
               "sensitivity_unstable": ["ttft_mean_s"]}
    table = uncertainty_table(summary).set_index("metric")
    assert table.loc["ttft_mean_s", "95% interval"] == "[0.9, 1.3]"
    assert table.loc["ttft_mean_s", "range repriced"] == "0.5-1.5"
    assert table.loc["ttft_mean_s", "stability"].startswith("UNSTABLE")
    assert table.loc["token_hit_rate", "stability"] == ""
    assert uncertainty_table({"ttft_mean_s": 1.0}) is None
