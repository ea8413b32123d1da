"""Imports point one way: ``cli`` -> ``sim``/``realrun`` -> ``serving`` -> ``cache``,
``profiles``, ``traces``. The policy core knows no driver, no SimPy, torch or Redis client; the
simulator and the real harness never import each other (only ``validate`` sees both).

Read from the source with ``ast`` (what a module imports, at any depth, lazily or not), so the
rule holds for code paths no test happens to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ragsim

ROOT = Path(ragsim.__file__).parent

# package -> module prefixes it must never import
FORBIDDEN = {
    "cache": ("simpy", "torch", "transformers", "redis", "vllm", "ragsim.sim", "ragsim.realrun",
              "ragsim.serving", "ragsim.cli"),
    "serving": ("torch", "transformers", "vllm", "ragsim.sim", "ragsim.realrun", "ragsim.cli"),
    "sim": ("torch", "transformers", "vllm", "ragsim.realrun", "ragsim.cli"),
    "realrun": ("ragsim.sim", "ragsim.cli"),
    "traces": ("ragsim.sim", "ragsim.realrun", "ragsim.serving", "ragsim.cli"),
    "profiles": ("ragsim.sim", "ragsim.realrun", "ragsim.serving", "ragsim.cli"),
    # the API is what the CLI calls; the study layer and validation call the API or below it
    "api": ("ragsim.cli",),
    "study": ("ragsim.cli",),
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imports_of(path):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    found.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert (ROOT / package).is_dir()
    assert violations(package) == []


def test_the_checker_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from ragsim.sim.simulator import run_simulation\n")
    assert "ragsim.sim.simulator" in imports_of(module)


def test_only_the_command_line_imports_the_command_line():
    """The one import that ran upward (a sweep point called the typer command) is gone: every
    module outside ``ragsim/cli`` reaches runs through ``ragsim.api`` or the layers below."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.is_relative_to(ROOT / "cli") or path == ROOT / "__main__.py":
            continue
        found += [f"{path.relative_to(ROOT.parent)} imports {name}" for name in imports_of(path)
                  if name == "ragsim.cli" or name.startswith("ragsim.cli.")]
    assert found == []
