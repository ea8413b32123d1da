"""The compiled policy core is the one in use, and it is not older than its source."""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compiled_modules() -> list[str]:
    """setup.py's ``COMPILED``: a list of paths, or a sum of named lists of them."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    lists: dict[str, list[str]] = {}

    def value_of(node: ast.expr) -> list[str]:
        if isinstance(node, ast.List):
            return [elt.value for elt in node.elts]
        if isinstance(node, ast.Name):
            return lists[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return value_of(node.left) + value_of(node.right)
        raise AssertionError(f"setup.py: cannot read {ast.dump(node)}")

    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.List | ast.Name | ast.BinOp):
                lists[name] = value_of(node.value)
    assert "COMPILED" in lists, "setup.py has no COMPILED list"
    return lists["COMPILED"]


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
        for origin in (src, src.with_suffix(".pxd")):  # the declarations compile in too
            if origin.exists():
                assert built.stat().st_mtime >= origin.stat().st_mtime, (
                    f"{built.name} is older than {origin.relative_to(ROOT)}: rebuild with "
                    "`pip install -e .`")


PURE_SCRIPT = r"""
import json, sys
import ragsim.cache.tree as tree
assert tree.__file__.endswith(".py"), tree.__file__
from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import builtin_trace
trace = builtin_trace("mmlu", n_requests=1500, seed=11)
out = {}
for policy in ("pgdsf", "gdsf", "lru", "lfu", "fifo", "belady"):
    for flat in (False, True):
        config = ReplayConfig(trace="mmlu", policy=policy, flat=flat, gpu_capacity_bytes=2**30,
                              host_capacity_bytes=0 if flat else 4 * 2**30)
        s = run_replay(trace, config, load_profile("a10g-mistral-7b")).summary
        out[f"{policy}-{flat}"] = [s[k] for k in ("hit_tokens_gpu", "hit_tokens_host",
                                                  "swap_out_bytes", "evictions_gpu",
                                                  "evictions_host")]
print(json.dumps(out))
"""


def test_pure_python_source_behaves_exactly_like_the_compiled_build(tmp_path):
    """The same .py files run uncompiled: a copy without extension modules must replay
    every policy to exactly the same counters as the compiled core."""
    import json
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "ragsim", tmp_path / "ragsim",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", PURE_SCRIPT], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    pure = json.loads(result.stdout.strip().splitlines()[-1])

    from ragsim.profiles.profile import load_profile
    from ragsim.sim.replay import ReplayConfig, run_replay
    from ragsim.traces import builtin_trace

    trace = builtin_trace("mmlu", n_requests=1500, seed=11)
    for key, expected in pure.items():
        policy, flat = key.split("-")
        config = ReplayConfig(trace="mmlu", policy=policy, flat=flat == "True",
                              gpu_capacity_bytes=2**30,
                              host_capacity_bytes=0 if flat == "True" else 4 * 2**30)
        s = run_replay(trace, config, load_profile("a10g-mistral-7b")).summary
        got = [s[k] for k in ("hit_tokens_gpu", "hit_tokens_host", "swap_out_bytes",
                              "evictions_gpu", "evictions_host")]
        assert got == expected, key


def test_no_extension_module_outlives_its_source():
    """An .so left behind by a deleted or renamed module would still import, silently."""
    orphans = [str(so.relative_to(ROOT)) for so in (ROOT / "ragsim").rglob("*.so")
               if not so.with_name(so.name.split(".")[0] + ".py").exists()]
    assert not orphans, f"remove stale builds: {orphans}"


SIM_SCRIPT = r"""
import json, sys
import ragsim.serving.engine as engine
assert engine.__file__.endswith(".py") == (sys.argv[1] == "pure"), engine.__file__
import sim_fingerprint
out = {json.dumps(case, sort_keys=True): sim_fingerprint.fingerprint(case, 300)["hash"]
       for case in sim_fingerprint.cases()}
print(json.dumps(out))
"""


def test_pure_python_simulation_is_the_compiled_simulation(tmp_path):
    """The serving stack (engine, pipeline, clock) is compiled as it is: uncompiled, the same
    source must simulate every configuration of ``benchmarks/sim_fingerprint.py`` (systems,
    loads, schedulers, failures, the answer cache...) to the same per-request columns and
    summary, bit for bit. A construct whose compiled meaning differs from Python's (a negative
    index without wraparound, an annotation enforced as a C type) shows up here."""
    import json
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "ragsim", tmp_path / "ragsim",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__"))

    def fingerprints(root, kind):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT / "benchmarks")])}
        result = subprocess.run([sys.executable, "-c", SIM_SCRIPT, kind], cwd=root, env=env,
                                capture_output=True, text=True, timeout=900, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    pure = fingerprints(tmp_path, "pure")
    compiled = fingerprints(ROOT, "compiled")
    assert len(pure) > 40
    differ = {case: [c for c in pure[case] if pure[case][c] != compiled[case].get(c)]
              for case in pure if pure[case] != compiled.get(case)}
    assert not differ, differ


def _assigned_fields(source: Path, class_name: str) -> set[str]:
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            fields = set()
            for n in ast.walk(node):
                targets = (n.targets if isinstance(n, ast.Assign)
                           else [n.target] if isinstance(n, ast.AnnAssign | ast.AugAssign)
                           else [])
                for target in targets:
                    for e in ast.walk(target):
                        if (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                                and e.value.id == "self"):
                            fields.add(e.attr)
            return fields
    raise AssertionError(f"{source} has no class {class_name}")


def _declared_fields(pxd: Path) -> dict[str, set[str]]:
    classes: dict[str, set[str]] = {}
    current = None
    for line in pxd.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("cdef class "):
            current = stripped[len("cdef class "):].split("(")[0].rstrip(":")
            classes[current] = set()
        elif current and stripped.startswith("cdef public object "):
            classes[current].add(stripped.split()[-1])
    return classes


@pytest.mark.parametrize("pxd", sorted(str(p.relative_to(ROOT)) for p in
                                       (ROOT / "ragsim" / "serving").glob("*.pxd")))
def test_extension_types_declare_every_field_their_source_sets(pxd):
    """A ``.pxd`` beside a plain-Python module makes its classes extension types when compiled,
    whose fields exist only if declared: a field the source sets and the ``.pxd`` lacks would
    work uncompiled and raise AttributeError compiled, mid-run."""
    declared = _declared_fields(ROOT / pxd)
    assert declared
    source = ROOT / pxd.replace(".pxd", ".py")
    for class_name, fields in declared.items():
        missing = _assigned_fields(source, class_name) - fields
        assert not missing, (f"{pxd}: class {class_name} sets {sorted(missing)}; declare each "
                             "as `cdef public object NAME`")
