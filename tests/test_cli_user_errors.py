"""The command line in the user's words: help that shows defaults and no type noise, errors that
name the flag or the config entry the user wrote, sizes echoed in their units, names never cut,
results never lost to an unusable --out or a SIGTERM, missing extras in one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.units import describe_bytes, parse_bytes

runner = CliRunner()
WIDE = {"COLUMNS": "250"}  # one help line per option, so a line can be checked whole
REPO = Path(__file__).resolve().parents[1]


def help_line(args: list[str], option: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines()
             if re.search(rf"│ {re.escape(option)}\s", line)]
    assert len(lines) == 1, (option, result.stdout)
    return lines[0]


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# --------------------------------------------------------------------------- help
@pytest.mark.parametrize("args", [[], ["run"], ["replay"], ["trace"], ["trace", "build"],
                                  ["profiles"], ["profiles", "list"], ["profile"]])
def test_help_has_no_type_label_after_flags(args):
    result = runner.invoke(app, [*args, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    assert "--help" in result.stdout


def test_run_help_shows_the_effective_defaults():
    # the paper's setup, by hand: 192 GiB host memory for RAGCache, none for the baselines;
    # PGDSF for RAGCache, LRU for the others; vLLM APC reuses 16-token blocks
    assert "[default: 192 GiB; vllm, vllm-apc, sglang, sglang-lpm: 0 B]" in help_line(
        ["run"], "--host-mem")
    assert "[default: pgdsf; vllm, vllm-apc, sglang, sglang-lpm, sglang-hicache," in help_line(
        ["run"], "--policy")  # the line wraps before the rest
    from ragsim.cli.run import effective_defaults

    shown = effective_defaults()
    assert shown["policy"] == ("pgdsf; vllm, vllm-apc, sglang, sglang-lpm, sglang-hicache, "
                               "vllm-offload: lru")
    assert shown["order"] == ("cache-aware; vllm, vllm-apc, sglang, sglang-hicache, "
                              "vllm-offload: fcfs; sglang-lpm: lpm")
    assert "[default: 1; vllm-apc, vllm-offload: 16]" in help_line(["run"], "--block-tokens")
    assert "[default: on; vllm: off]" in help_line(["run"], "--cache")
    assert "[default: mmlu]" in help_line(["run"], "--trace")
    assert "[default: ragcache]" in help_line(["run"], "--system")
    assert "[default: a10g-mistral-7b]" in help_line(["run"], "--profile")
    assert "[default: the whole trace]" in help_line(["run"], "--requests")
    assert "[default: 256]" in help_line(["run"], "--max-batch-size")
    # rich markup must not swallow the table's name
    assert "(its [run] table)" in help_line(["run"], "--config")


def test_every_run_setting_shows_a_default():
    result = runner.invoke(app, ["run", "--help"], env=WIDE)
    options = re.findall(r"│ (--[a-z0-9-]+)", result.stdout)
    assert len(options) > 35, result.stdout
    without = [o for o in options if "[default:" not in help_line(["run"], o)]
    # switches off by default that set no configuration field, as --json
    assert sorted(without) == ["--config", "--force", "--help", "--json", "--out",
                               "--sensitivity"]


def test_replay_help_shows_its_own_memory_defaults():
    assert "[default: 32GiB]" in help_line(["replay"], "--host-mem")
    assert "[default: 4GiB]" in help_line(["replay"], "--gpu-mem")
    assert "[default:" in help_line(["replay"], "--drift")


# --------------------------------------------------------------------------- names never cut
def test_profile_names_are_whole_in_80_columns():
    from ragsim.profiles.profile import shipped_profile_names

    result = runner.invoke(app, ["profiles", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    cells = {cell.strip() for line in result.stdout.splitlines() for cell in line.split("│")}
    assert set(shipped_profile_names()) <= cells


def test_names_are_whole_in_a_pipe_and_python_m_ragsim_works():
    from ragsim.profiles.models import BUILTIN_MODELS
    from ragsim.profiles.profile import shipped_profile_names

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for command, names in ((["profiles", "list"], shipped_profile_names()),
                           (["models"], list(BUILTIN_MODELS))):
        done = subprocess.run([sys.executable, "-m", "ragsim", *command], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout
        cells = {cell.strip() for line in done.stdout.splitlines() for cell in line.split("│")}
        assert set(names) <= cells, done.stdout


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("args, flag, internal", [
    (["--rate", "-1"], "--rate", "rate_rps"),
    (["--requests", "0"], "--requests", "n_requests"),
    (["--gpu-recovery", "-2"], "--gpu-recovery", "gpu_recovery_s"),
    (["--max-batch-size", "0"], "--max-batch-size", "max_batch_size"),
    (["--drift", "2"], "--drift", "trace_drift_per_1k_requests"),
])
def test_errors_name_the_flag_not_the_field(args, flag, internal):
    line = one_error_line(runner.invoke(app, ["run", *args]))
    assert f"'{flag}'" in line and internal not in line


def test_errors_name_the_config_entry_and_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[run]\nn_requests = 0\n")
    line = one_error_line(runner.invoke(app, ["run", "--config", str(config)]))
    assert line == f"error: {config}, field 'run.n_requests': must be >= 1"
    # the same value given by a flag next to a good file: the flag is named, not the file
    config.write_text("[run]\nseed = 3\n")
    line = one_error_line(runner.invoke(app, ["run", "--config", str(config), "--requests",
                                              "0"]))
    assert line == "error: field '--requests': must be >= 1"
    # a flag overrides a bad value in the file: nothing to complain about
    config.write_text("[run]\nmax_batch_size = 0\n")
    result = runner.invoke(app, ["run", "--config", str(config), "--max-batch-size", "4",
                                 "--requests", "20", "--json"])
    assert result.exit_code == 0, result.output


def test_a_missing_trace_path_is_a_missing_file(tmp_path):
    for path in (str(tmp_path / "traces" / "mine"), "mine.jsonl"):
        for command in (["run"], ["replay"]):
            line = one_error_line(runner.invoke(app, [*command, "--trace", path]))
            assert line == f"error: {path}: no such file or folder"
    line = one_error_line(runner.invoke(app, ["run", "--trace", "mmlu2"]))
    assert "no such trace; built-in traces are mmlu, nq, wiki-trivia" in line


def test_sizes_are_echoed_in_the_units_given():
    # 32 GB = 32e9 bytes = 29.80 GiB (32e9 / 2**30 = 29.802...)
    result = runner.invoke(app, ["run", "--requests", "20", "--host-mem", "32GB"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "/ 32 GB (29.80 GiB)" in result.stdout
    result = runner.invoke(app, ["replay", "--requests", "20", "--host-mem", "32GB"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "4 GiB / 32 GB (29.80 GiB)" in result.stdout


@pytest.mark.parametrize("text, shown", [
    ("32GB", "32 GB (29.80 GiB)"), ("192GiB", "192 GiB"), ("1TB", "1 TB (931.32 GiB)"),
    ("4096", "4 KiB"), ("1536MiB", "1,536 MiB"), ("0", "0 B"), ("123456789", "117.74 MiB"),
    # 5,901,686 KiB exactly, but nobody writes that: 6043326464 / 2**30 = 5.628...
    ("6043326464", "5.63 GiB"),
])
def test_describe_bytes_by_hand(text, shown):
    assert describe_bytes(parse_bytes(text)) == shown


@given(st.integers(1, 9_999),
       st.sampled_from(["KiB", "MiB", "GiB", "TiB", "kB", "MB", "GB", "TB"]))
def test_an_exact_size_reads_back_as_itself(count, unit):
    n = parse_bytes(f"{count}{unit}")
    exact = describe_bytes(n).split(" (")[0].replace(",", "").replace(" ", "")
    assert parse_bytes(exact) == n


# --------------------------------------------------------------------------- --out
@pytest.mark.parametrize("command", [["run"], ["replay"]])
def test_an_unusable_out_is_refused_before_the_work(tmp_path, command):
    in_the_way = tmp_path / "results"
    in_the_way.write_text("not a folder")
    for out in (in_the_way, in_the_way / "run1"):
        result = runner.invoke(app, [*command, "--requests", "20", "--out", str(out)])
        assert result.exit_code == 2, result.output
        line = one_error_line(result)
        assert str(out) in line and "'--out'" in line
        assert result.stdout == ""  # refused before: no summary of a run that happened
    assert in_the_way.read_text() == "not a folder"


def test_a_refused_run_leaves_no_out_folder(tmp_path):
    out = tmp_path / "a" / "b"
    result = runner.invoke(app, ["run", "--rate", "-1", "--out", str(out)])
    assert result.exit_code == 2
    assert not (tmp_path / "a").exists()


def test_a_read_only_out_is_refused(tmp_path):
    """A folder the user cannot write: a read-only one; as root (CI), which writes anywhere
    chmod allows, sysfs, where not even root may create a folder."""
    if os.geteuid() == 0:
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no sysfs to stand for an unwritable folder as root")
        result = runner.invoke(app, ["replay", "--requests", "20", "--out", "/sys/ragsim-out"])
        assert result.exit_code == 2 and "cannot write" in one_error_line(result)
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = runner.invoke(app, ["replay", "--requests", "20", "--out", str(locked / "o")])
        assert result.exit_code == 2 and "cannot write" in one_error_line(result)
    finally:
        locked.chmod(0o700)


# --------------------------------------------------------------------------- SIGTERM
def sigterm_from_progress(monkeypatch: pytest.MonkeyPatch, at_completed: int) -> None:
    """A real SIGTERM to this process once the progress bar hears of ``at_completed`` done."""
    from rich.progress import Progress

    update = Progress.update

    def update_then_terminate(self, task, *args, completed=None, **kwargs):
        update(self, task, *args, completed=completed, **kwargs)
        if completed is not None and completed >= at_completed:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Progress, "update", update_then_terminate)


def test_sigterm_during_replay_keeps_what_was_replayed(tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    sigterm_from_progress(monkeypatch, at_completed=10_000)  # reported every 10,000
    out = tmp_path / "o"
    result = runner.invoke(app, ["replay", "--requests", "25000", "--out", str(out)])
    assert result.exit_code == 143, result.output
    assert "terminated (SIGTERM) after the first 10,000 of 25,000 requests" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["interrupted_by"] == "SIGTERM"
    assert summary["requests"] == 10_000
    assert len(pd.read_parquet(out / "requests.parquet")) == 10_000
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


def test_sigterm_to_a_running_simulation_keeps_its_records(tmp_path):
    """A real process, a real signal: sent once the progress bar shows simulated time passing,
    so the simulation is under way (the bar is drawn on stderr as on a terminal)."""
    out = tmp_path / "o"
    env = {**os.environ, "TTY_INTERACTIVE": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "120"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ragsim", "run", "--requests", "50000", "--rate", "5",
         "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    seen: list[str] = []
    running = threading.Event()

    def watch() -> None:
        for chunk in iter(lambda: process.stderr.read1(4096), b""):
            seen.append(chunk.decode(errors="replace"))
            if re.search(r"[1-9][\d,]* simulated s", "".join(seen[-3:])):
                running.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert running.wait(timeout=240), "".join(seen)[-2000:]
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        process.kill()
    watcher.join(timeout=10)
    stdout = process.stdout.read()
    assert process.returncode == 143, "".join(seen)[-2000:]
    assert "terminated (SIGTERM) at" in "".join(seen)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["interrupted_by"] == "SIGTERM"
    records = pd.read_parquet(out / "requests.parquet")
    ended = summary["requests_completed"] + summary["requests_failed"]
    assert len(records) == 50_000 and 0 < ended < 50_000
    assert (records.status == "pending").sum() == 50_000 - ended
    assert (out / "config.toml").exists() and b"interrupted" in stdout


# --------------------------------------------------------------------------- extras
def test_profile_without_torch_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    result = runner.invoke(app, ["profile", "--quick", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "`ragsim profile` needs torch" in line
    assert "CPU build of torch" in line and "pip install '.[profile]'" in line
    assert not (tmp_path / "p.json").exists()


def test_profile_refuses_a_missing_steps_trace_before_measuring(tmp_path, monkeypatch):
    """The engine-step runs' workload is read before the grid: a typo must not cost minutes of
    measuring, and the error names the option."""
    import ragsim.profiles.profiler as profiler

    def measure(*args, **kwargs):
        raise AssertionError("measured before the workload was checked")

    monkeypatch.setattr(profiler, "run_profile", measure)
    missing = tmp_path / "nowhere.jsonl"
    result = runner.invoke(app, ["profile", "--quick", "--steps-trace", str(missing),
                                 "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "--steps-trace" in line and "no such file" in line and "nowhere.jsonl" in line
    assert not (tmp_path / "p.json").exists()


def test_trace_build_without_faiss_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "faiss", None)
    result = runner.invoke(app, ["trace", "build", "--corpus", "wiki-offline", "--questions",
                                 "trivia", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "`ragsim trace build` needs faiss" in line and "pip install '.[corpus]'" in line
    assert "torch" not in line


def test_version_is_the_packages_own():
    import tomllib
    from pathlib import Path

    from typer.testing import CliRunner

    from ragsim.cli import app

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"ragsim {declared['project']['version']}"


def test_a_measured_profile_never_takes_a_shipped_profiles_name(tmp_path, capsys):
    """`--profile NAME` loads the shipped file of that name: a measurement named so would be
    shadowed by it without a word (the tour measured cpu-mistral-7b-l2-h256, then ran the
    shipped one)."""
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.cli.profiles import _measured_name

    assert _measured_name("", "cpu-mistral-7b-l2-h256") == "cpu-mistral-7b-l2-h256-measured"
    assert "shipped profile" in capsys.readouterr().err
    assert _measured_name("", "cpu-mistral-7b-l2-h999") == "cpu-mistral-7b-l2-h999"
    assert _measured_name("mine", "cpu-mistral-7b-l2-h256") == "mine"
    result = CliRunner().invoke(app, ["profile", "--model", "mistral-7b", "--layers", "2",
                                      "--hidden", "256", "--quick", "--name", "a10g-mistral-7b",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "shipped profile's name" in result.stderr
    assert not (tmp_path / "p.json").exists()


def test_profiles_show_fits_every_grid_cell_in_80_columns():
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.profiles.profile import load_profile

    result = CliRunner().invoke(app, ["profiles", "show", "a10g-mistral-7b"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    grid = load_profile("a10g-mistral-7b").prefill
    for y in grid.y_axis:  # every column of the grid is shown, whole
        assert f"┃ {y:g} " in result.stdout
