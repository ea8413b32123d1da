"""benchmarks/paper_grid.py, the timing docs/studies.md quotes: a slice of the paper's grid runs
as one sweep, every cell of the grid is there, and a cell is the run `ragsim run` gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from ragsim.cli import app

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paper_grid.py"


def test_paper_grid_slice(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--scale",
                           "0.003", "--seeds", "1", "--rates", "2.0", "--jobs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # 2 traces x 2 models x 3 systems at one rate, 30 requests each
    assert "12 runs of 30 requests (360 simulated)" in done.stdout
    assert "whole grid (480 runs x 10,000 requests) estimated at" in done.stdout
    assert "simulated requests per CPU-s" in done.stdout
    table = pd.read_parquet(tmp_path / "results" / "results.parquet")
    cells = set(zip(table["trace"], table["profile"], table["system"], strict=True))
    assert cells == {(t, p, s) for t in ("mmlu", "nq")
                     for p in ("a10g-mistral-7b", "a10g-llama2-7b")
                     for s in ("vllm", "sglang", "ragcache")}
    row = table[(table["trace"] == "nq") & (table["profile"] == "a10g-llama2-7b")
                & (table["system"] == "sglang")].iloc[0]
    by_hand = CliRunner().invoke(app, ["run", "--json", "--trace", "nq", "--requests", "30",
                                       "--profile", "a10g-llama2-7b", "--system", "sglang",
                                       "--rate", "2", "--seed", "0"])
    assert json.loads(by_hand.stdout)["ttft_p90_s"] == row["ttft_p90_s"]
