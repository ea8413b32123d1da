"""`ragsim run --backend torch|vllm` on a CPU without --profile serves the shipped profile
measured on that engine's scaled-down model, as `validate` does, and says so; a profile the
user gave (flag or --config) is kept. The default profile's Mistral-7B would not fit a CPU run
(the torch backend refuses it; vLLM would try to build it)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ragsim.cli import app

runner = CliRunner()


def test_torch_backend_on_a_cpu_serves_the_scaled_down_profile(tmp_path):
    result = runner.invoke(app, ["run", "--backend", "torch", "--requests", "2", "--out",
                                 str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert ("note: --backend torch on a CPU: profile cpu-mistral-7b-l2-h256"
            in " ".join(result.output.split()))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests_completed"] == 2
    assert 'profile = "cpu-mistral-7b-l2-h256"' in (tmp_path / "run" / "config.toml").read_text()


def test_vllm_backend_on_a_cpu_names_its_profile_before_anything_runs():
    result = runner.invoke(app, ["run", "--backend", "vllm", "--system", "vllm", "--requests",
                                 "2"])
    text = " ".join(result.output.split())
    assert "note: --backend vllm on a CPU: profile cpu-vllm-mistral-7b-l2-h256" in text


def test_a_profile_the_user_gave_is_kept(tmp_path):
    # the flag: the torch backend then refuses the 7B model in one line naming the way out
    result = runner.invoke(app, ["run", "--backend", "torch", "--requests", "2",
                                 "--profile", "a10g-mistral-7b"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "on a CPU: profile" not in text
    assert "too large for the torch backend on a CPU" in text
    # the config file's [run] table: the same
    config = tmp_path / "run.toml"
    config.write_text('format = "ragsim.config"\nversion = 1\n[run]\n'
                      'profile = "a10g-mistral-7b"\n')
    result = runner.invoke(app, ["run", "--backend", "torch", "--requests", "2",
                                 "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "too large for the torch backend on a CPU" in " ".join(result.output.split())
