"""benchmarks/gpu_validate.sh dry-run on the CPU with the shipped small model: every stage it
runs ends well and writes what the next GPU session reads.

A GPU session has 15 minutes of device time; a mistake in this script costs them (its first
run spent a call on `--search-latency trace` refused for a built-in trace). Here each stage must
end with status 0, the validation must print its raw errors per load, and the served run under
torch.profiler must report its decode steps. Slow: about two minutes of real serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_script_dry_runs_every_stage_on_a_cpu(tmp_path):
    out = tmp_path / "gv"
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "fp32",
           "MODEL_ARGS": "--layers 2 --hidden 256", "REUSE_PROFILE": "cpu-mistral-7b-l2-h256",
           "LOADS": "over", "IDLE_REQUESTS": "6", "OVERLAP_REQUESTS": "4",
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", "benchmarks/gpu_validate.sh", str(out), "12"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert [name for name, _, _ in stages] == ["derived-vs-measured", "decode-paths",
                                               "validate", "validate-idle", "run",
                                               "run-overlap"]
    assert all(rc == "0" for _, rc, _ in stages), stages
    for name, load in (("validate.json", "over"), ("validate-idle.json", "idle")):
        rows = json.loads((out / name).read_text())["loads"]
        assert [row["load"] for row in rows] == [load]
        for field in ("ttft_mean_error", "ttft_p90_abs_error", "throughput_error",
                      "hit_agreement", "cost_model_error", "decision_error"):
            assert rows[0][field] is not None, (name, field)
    paths = (out / "decode_paths.txt").read_text()
    assert "served " in paths and "decode steps measured" in paths
    for name in ("overlap.json", "overlap-on.json"):
        assert json.loads((out / name).read_text())["requests_completed"] == 4
