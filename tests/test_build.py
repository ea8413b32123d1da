"""The compiled policy core is the one in use, and it is not older than its source."""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compiled_modules() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED":
            return [elt.value for elt in node.value.elts]
    raise AssertionError("setup.py has no COMPILED list")


@pytest.mark.parametrize("source", compiled_modules())
def test_compiled_module_is_in_use_and_fresh(source):
    if os.environ.get("RAGSIM_ALLOW_PURE_PYTHON") == "1":
        pytest.skip("pure-Python run requested")
    name = source[: -len(".py")].replace("/", ".")
    module = importlib.import_module(name)
    built = Path(module.__file__)
    assert built.suffix in (".so", ".pyd"), (
        f"{name} runs uncompiled from {built}; install with `pip install -e .` so the policy "
        "core is compiled (or set RAGSIM_ALLOW_PURE_PYTHON=1 to test the pure-Python path)")
    src = ROOT / source
    if src.exists() and built.parent == src.parent:
        assert built.stat().st_mtime >= src.stat().st_mtime, (
            f"{built.name} is older than {source}: rebuild with `pip install -e .`")
