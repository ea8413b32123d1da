"""The benchmark scripts the README quotes still run (tiny sizes; their numbers are not checked
here: the ordering tests in test_sim_paper_results.py and friends do that)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / name), *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_paper_comparison_policy_table_with_drift():
    out = run_script("paper_comparison.py", "--policies-only", "--requests", "400",
                     "--drift", "0.3")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "GiB" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["8 GiB", "32 GiB", "128 GiB"]
    for row in rows:  # four hit rates, three ratios
        cells = [c.strip() for c in row.strip("| \n").split("|")[1:]]
        assert all(0 < float(c.removesuffix("%")) <= 100 for c in cells[:4])
        assert all(0 < float(c.removesuffix("x")) < 10 for c in cells[4:])
    assert "drift_per_1k_requests 0.3" in out and "pgdsf / lfu (paper 1.06-1.75x)" in out


def test_policy_seeds_prints_a_row_per_seed_and_the_ranges():
    out = run_script("policy_seeds.py", "--synthetic", "nq", "--seeds", "2", "--requests",
                     "300", "--host-gib", "8")
    label = f"| nq (drift {BUILTIN_DRIFT_PER_1K_REQUESTS:g}) |"  # the built-in default
    per_seed = [line for line in out.splitlines() if line.startswith(label)]
    assert len(per_seed) == 2
    ranges = [line for line in out.splitlines() if line.startswith("| 8 GiB |")]
    assert len(ranges) == 1
    for cell in ranges[0].strip("| ").split(" | ")[1:]:  # "0.98-1.03x"
        low, high = (float(v) for v in cell.removesuffix("x").split("-"))
        assert 0 < low <= high < 10


def test_vllm_prefix_cache_prints_the_ratio_and_the_identical_share():
    out = run_script("vllm_prefix_cache.py", "--requests", "200", "--blocks", "400")
    row = [line for line in out.splitlines() if line.startswith("| 6,400 |")]
    assert len(row) == 1
    ratio, same = row[0].strip("| ").split(" | ")[1:]
    assert 0.9 < float(ratio.removesuffix("x")) < 1.1 and 0 < float(same.removesuffix("%")) <= 100


def test_policy_regimes_prints_every_cell_and_names_the_best_baseline():
    out = run_script("policy_regimes.py", "--traces", "nq", "--requests", "1500", "--drifts",
                     "0", "0.3", "--host-gib", "8", "32", "--workers", "1")
    rows = [line.strip("| ").split(" | ") for line in out.splitlines()
            if line.startswith("| nq |")]
    assert [(r[2], r[3]) for r in rows] == [("0", "8 GiB"), ("0", "32 GiB"),
                                            ("0.3", "8 GiB"), ("0.3", "32 GiB")]
    for r in rows:
        rates = dict(zip(("pgdsf", "gdsf", "lru", "lfu"),
                         (float(c.removesuffix("%")) for c in r[4:8]), strict=True))
        assert r[8] in ("gdsf", "lru", "lfu")
        assert rates[r[8]] == max(rates["gdsf"], rates["lru"], rates["lfu"])
        # the ratios are of the unrounded rates; the printed ones are rounded to 0.1 point
        assert abs(float(r[9].removesuffix("x")) - rates["pgdsf"] / rates[r[8]]) < 0.02
        assert abs(float(r[10].removesuffix("x")) - rates["pgdsf"] / rates["lfu"]) < 0.02
