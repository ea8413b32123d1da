"""benchmarks/policy_table.py prints every rule and policy it promises, and a cell it prints is
what ``run_replay`` computes for the same settings by another route."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "policy_table.py"
POLICIES = ["pgdsf", "gdsf", "lfu", "pgdsf-const-cost", "pgdsf-no-size", "lru"]


def test_quick_table_has_every_rule_and_matches_a_direct_replay():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--traces", "nq"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("| host"))
    assert [c.strip() for c in header.strip("|").split("|")][2:8] == POLICIES
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in result.stdout.splitlines() if line.startswith("| 32 GiB")]
    assert [row[1] for row in rows] == ["admission", "lifetime", "window"]
    # the window row: 1,000 requests' worth of the trace's time, by hand from the trace
    trace = resolve_trace("nq", n_requests=2_000)
    window = 1_000 * float(trace.arrival_s[-1] - trace.arrival_s[0]) / (trace.n_requests - 1)
    assert f"window {window:,.0f} s" in result.stdout
    profile = load_profile("a10g-mistral-7b")
    for row, scope, width in zip(rows, ("admission", "lifetime", "window"),
                                 (None, None, window), strict=True):
        config = ReplayConfig(trace="nq", policy="lfu",
                              gpu_capacity_bytes=profile.kv_capacity_bytes,
                              host_capacity_bytes=32 * 2**30, frequency_scope=scope,
                              frequency_window_s=width)
        rate = run_replay(trace, config, profile).summary["token_hit_rate"]
        assert row[2 + POLICIES.index("lfu")] == f"{rate:.1%}", (scope, row)
        # the last column is PGDSF minus its constant-cost ablation, in points (the printed
        # rates are rounded to 0.1 points, the difference is not)
        pgdsf, const = (float(row[2 + POLICIES.index(p)].rstrip("%"))
                        for p in ("pgdsf", "pgdsf-const-cost"))
        assert float(row[-1]) == pytest.approx(pgdsf - const, abs=0.11)
