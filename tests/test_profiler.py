"""``ragsim profile`` on this CPU: a real (scaled-down) model, measured into a valid profile."""

from __future__ import annotations

import json

import pytest
import torch  # noqa: F401 - [profile] in [dev]: missing is a broken set-up, not a skip
import transformers  # noqa: F401
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.models import BUILTIN_MODELS, scaled_down
from ragsim.profiles.profile import load_profile
from ragsim.profiles.profiler import ProfilePlan, run_profile

runner = CliRunner()


# The targets, 10% (single requests) and 15% (batches) median held-out error, are a property of
# a quiet machine: `ragsim profile` reports them in its validation, and the README quotes what it
# printed. On a shared two-core CI machine one profile measured 25% / 48% under load and 4% / 2%
# when quiet, so a test can only catch systematic errors (a wrong axis, a units slip: errors far
# above 100%), not check the targets. Hence one measurement and a wide bound.
PREFILL_TOLERANCE, BATCH_TOLERANCE = 0.60, 0.80


def _profile_into(path) -> dict:
    result = runner.invoke(app, ["profile", "--model", "mistral-7b", "--layers", "2",
                                 "--hidden", "256", "--device", "cpu", "--quick",
                                 "--out", str(path)])
    assert result.exit_code == 0, result.output
    return load_profile(str(path)).obtained["validation"]


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    """A quick CPU profile of a scaled-down Mistral-7B (about a minute on two cores)."""
    out = tmp_path_factory.mktemp("profile") / "cpu.json"
    _profile_into(out)
    return out


def test_quick_profile_is_valid_measured_and_predicts_held_out_points(quick_profile):
    p = load_profile(str(quick_profile))
    assert p.kind == "measured" and p.name == "cpu-mistral-7b-l2-h256"
    assert "scaled down" in p.obtained["label"]
    assert p.model.num_layers == 2 and p.model.hidden_size == 256
    assert p.obtained["libraries"]["torch"]
    v = p.obtained["validation"]
    assert v["held_out_prefill_median_rel_error"] < PREFILL_TOLERANCE, v
    assert v["held_out_batch_median_rel_error"] < BATCH_TOLERANCE, v
    # physics: more tokens cost more, a cached prefix makes the same request cheaper
    assert p.prefill_s(0, 1024) > p.prefill_s(0, 64)
    assert p.prefill_s(0, 1024 + 1024) > p.prefill_s(1024, 1024)
    assert p.decode_s(16, 2048) > p.decode_s(1, 128)
    assert p.transfers.host_to_device_bytes_per_s > 1e8
    assert p.batched_prefill.padding == "left"


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
