"""The notebooks run, top to bottom, in a real Jupyter kernel (nbclient), at tiny sizes: their
parameters cell is replaced, everything else is what a reader runs. A failing cell fails the
test; so does a summary row left empty or a plan that answers nothing."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient
from typer.testing import CliRunner

from ragsim.cli import app

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
runner = CliRunner()


def execute(name: str, parameters: str, cwd: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    cells = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "a notebook has one parameters cell (tagged 'parameters')"
    cells[0].source = parameters
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode, kind: str) -> list[str]:
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if kind in data:
                found.append(data[kind])
    return found


@pytest.mark.slow  # half a minute: dozens of runs and a kernel
def test_reproduce_ragcache_runs(tmp_path):
    notebook = execute("reproduce_ragcache.ipynb", """
REQUESTS = 60
SEEDS = [0]
RATES_A10G = [1.0]
OVERLOAD_A10G = 4.0
RATES_H800 = [2.0]
HOST_GIB = [8]
TOP_KS = [1, 2]
JOBS = 1
WORK = "work"
""", tmp_path)
    assert len(outputs(notebook, "image/png")) >= 10
    table = pd.read_csv(tmp_path / "work" / "summary.csv", index_col=0)
    assert len(table) == 14 and not table["ragsim"].isna().any(), table
    # the notebook's numbers are ragsim run's: one of its rows, rerun by hand
    rows = pd.read_parquet(tmp_path / "work" / "overall" / "results.parquet")
    row = rows[(rows["trace"] == "nq") & (rows["system"] == "sglang")
               & (rows["profile"] == "a10g-llama2-7b") & (rows["rate_rps"] == 1.0)].iloc[0]
    by_hand = runner.invoke(app, ["run", "--json", "--trace", "nq", "--requests", "60",
                                  "--system", "sglang", "--profile", "a10g-llama2-7b",
                                  "--rate", "1", "--seed", "0"])
    assert json.loads(by_hand.stdout)["ttft_mean_s"] == row["ttft_mean_s"]


@pytest.mark.slow
def test_capacity_planning_runs(tmp_path):
    notebook = execute("capacity_planning.ipynb", """
TRACE = "mmlu"
MODEL = "mistral-7b"
RATE = 3.0
SLO = "ttft_p90_s<=0.5"
REQUESTS = 60
REPLICAS = [1]
HOST_MEM = ["0"]
JOBS = 1
WORK = "work"
""", tmp_path)
    plan = json.loads((tmp_path / "work" / "plan" / "plan.json").read_text())
    assert plan["best"] is not None and plan["best"]["ttft_p90_s"] <= 0.5
    streams = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert f"{plan['best']['profile']}" in streams
    assert len(outputs(notebook, "image/png")) == 2


@pytest.mark.slow
def test_answer_cache_runs(tmp_path):
    execute("answer_cache.ipynb", """
TRACE = "wiki-trivia"
REQUESTS = 200
RATES = [2.0, 40.0]
TIERS_RATE = 16.0
SEEDS = [0]
INSTANCES = [1, 2]
L1_SIZES = [10]
JOBS = 1
WORK = "work"
""", tmp_path)
    load = pd.read_parquet(tmp_path / "work" / "load" / "results.parquet")
    assert sorted(load["answer_cache"].tolist()) == [False, False, True, True]
    # the cache's hits are requests that never reached the engine
    with_cache = load[load["answer_cache"]]
    assert (with_cache["answer_cache_hit_rate"] > 0).all()


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebooks_are_stored_without_outputs(name):
    """Outputs are made by running them (the tests do); stored ones would go stale."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in notebook.cells if c.cell_type == "code")


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_a_notebook_calls_the_api_not_a_subprocess(name):
    """Notebooks are where ragsim's users live: they call ``ragsim.sweep``/``ragsim.plan`` and
    get DataFrames and dicts, not a command line's stdout to parse."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert "subprocess" not in code and "import ragsim" in code
