"""On a CPU, a validation's real search workers take the cores its engine leaves (at least one),
on both sides, where the configuration file does not say (``api.validation``): the simulation
models the search tier sharing nothing with the engine. Worked by hand from the core count and
the engine's threads."""

from __future__ import annotations

import dataclasses

import pytest

from ragsim.api.validation import _search_pool_beside_engine
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config

TORCH_CPU = load_profile("cpu-mistral-7b-l2-h256")  # measured on 1 thread
VLLM_CPU = dataclasses.replace(  # a vLLM profile measured on 2 threads
    load_profile("cpu-vllm-mistral-7b-l2-h256"),
    obtained={**load_profile("cpu-vllm-mistral-7b-l2-h256").obtained, "threads": 2})


@pytest.fixture
def cores(monkeypatch):
    def use(n: int) -> None:
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(n)), raising=False)
    return use


def pool(config, threads, profile, config_file=None):
    notes: list[str] = []
    out = _search_pool_beside_engine(config, config_file, threads, profile, notes.append)
    return out.search_workers, notes


@pytest.mark.parametrize(("n_cores", "threads", "profile", "workers"), [
    (2, None, TORCH_CPU, 1),  # 2 cores - the profile's 1 thread
    (2, None, VLLM_CPU, 1),  # 2 - 2 = 0: at least one
    (8, None, TORCH_CPU, 7),
    (8, 3, TORCH_CPU, 5),  # the threads asked for, not the profile's
    (8, None, VLLM_CPU, 6),
])
def test_the_pool_takes_the_cores_the_engine_leaves(cores, n_cores, threads, profile, workers):
    cores(n_cores)
    found, notes = pool(build_config({"system": "ragcache"}), threads, profile)
    assert found == workers
    assert len(notes) == 1 and f"{workers} worker thread(s)" in notes[0]
    assert "search_workers was 16" in notes[0]


def test_a_pool_smaller_already_or_set_in_the_file_is_kept(cores, tmp_path):
    cores(64)
    assert pool(build_config({"system": "ragcache"}), None, TORCH_CPU) == (16, [])
    cores(2)
    small = build_config({"system": "ragcache", "search_workers": 1})
    assert pool(small, None, TORCH_CPU) == (1, [])
    file = tmp_path / "c.toml"
    file.write_text('format = "ragsim.config"\nversion = 1\n[run]\nsearch_workers = 16\n')
    assert pool(build_config({"system": "ragcache", "search_workers": 16}), None, TORCH_CPU,
                file) == (16, [])


def test_a_profile_of_another_device_leaves_the_engine_every_core(cores):
    cores(4)
    gpu = dataclasses.replace(TORCH_CPU, obtained={**TORCH_CPU.obtained, "device_type": "cuda"})
    assert pool(build_config({"system": "ragcache"}), None, gpu)[0] == 1  # 4 - 4, at least 1
