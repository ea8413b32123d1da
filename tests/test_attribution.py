"""benchmarks/attribution.py (issue 26): the ladder, the orders and the systems tables print
every row they promise, and their cells are what ``ragsim run`` prints for the same settings
(the CLI route: the ladder's first rung is the sglang preset, its last the ragcache preset).
Tiny sizes; the findings' numbers come from the script at full size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ragsim.cli import app

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "attribution.py"
SIZE = ("--trace", "mmlu", "--requests", "150", "--seeds", "2", "--no-sensitivity")


def script(*args: str) -> str:
    result = subprocess.run([sys.executable, str(SCRIPT), *SIZE, *args], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rows(out: str, first: str) -> list[list[str]]:
    return [line.strip().strip("| ").split(" | ") for line in out.splitlines()
            if line.startswith(f"| {first} |")]


def cli_mean(metric: str, *args: str) -> float:
    values = []
    for seed in ("0", "1"):
        result = CliRunner().invoke(app, ["run", "--trace", "mmlu", "--requests", "150",
                                          "--seed", seed, *args, "--json"])
        assert result.exit_code == 0, result.output
        values.append(json.loads(result.stdout)[metric])
    return sum(values) / 2


def mean_of(cell: str) -> float:
    return float(cell.split(" [")[0])


def test_the_ladder_runs_from_sglang_to_ragcache():
    out = script()
    base = rows(out, "baseline: GPU radix tree, LRU, FCFS")
    top = rows(out, "+ host replicas (= ragcache)")
    assert len(base) == len(top) == 2  # moderate load and saturation
    assert len(rows(out, "+ PGDSF")) == 2
    assert mean_of(base[0][1]) == round(cli_mean("ttft_mean_s", "--system", "sglang", "--rate",
                                                 "1"), 3)
    assert mean_of(top[0][1]) == round(cli_mean("ttft_mean_s", "--system", "ragcache",
                                                "--rate", "1"), 3)
    assert mean_of(top[1][3]) == round(cli_mean("throughput_rps", "--system", "ragcache",
                                                "--rate", "6"), 2)


def test_orders_and_systems_tables_are_the_runs_they_name():
    out = script("--table", "orders")
    sjf = rows(out, "sjf")
    assert len(sjf) == 2 and len(rows(out, "lpm")) == 2
    assert mean_of(sjf[0][1]) == round(cli_mean("ttft_mean_s", "--order", "sjf", "--rate",
                                                "2.5"), 3)
    out = script("--table", "systems")
    for name in ("vllm-offload", "sglang-hicache", "sglang-lpm", "vllm", "ragcache"):
        assert len(rows(out, name)) == 2, name
    hicache = rows(out, "sglang-hicache")[0]
    assert hicache[1] == "192"  # the same host memory as ragcache
    assert mean_of(hicache[2]) == round(cli_mean("ttft_mean_s", "--system", "sglang-hicache",
                                                 "--rate", "1"), 3)


def test_speculation_table_spans_never_to_an_oracle():
    out = script("--table", "speculation")
    never = rows(out, "never")
    assert len(never) == 2 and len(rows(out, "oracle bound: every stage final")) == 2
    assert mean_of(never[0][1]) == round(cli_mean("ttft_mean_s", "--no-speculate", "--rate",
                                                  "1"), 3)
    oracle = rows(out, "oracle bound: every stage final")[0]
    assert mean_of(oracle[1]) == round(cli_mean("ttft_mean_s", "--stage-converge-p", "1",
                                                "--rate", "1"), 3)
