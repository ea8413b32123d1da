"""Bad input the reliability probe of issue 32 found ending in a traceback, a hang or silence,
each now one line naming the file, row and field (or the flag), exit code 2, or a counted
warning where the input is legitimate.

A test here that reads a FIFO or ``/dev/zero`` runs the command in a child process with a
timeout and a memory limit: the bug it pins blocked forever or read until memory ran out.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.traces import write_trace
from ragsim.traces.io import TraceBuilder
from ragsim.user_files import MAX_DOCUMENT_BYTES

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON and TOML; Python's parsers recurse on it


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def small_trace(folder: Path, n: int = 6) -> Path:
    builder = TraceBuilder("small")
    for i in range(n):
        builder.add(i, 0.5 * i, 20, 4, [i % 3, 5], [100, 50])
    write_trace(builder.build({"name": "small"}), folder)
    return folder


def with_requests_table(folder: Path, change) -> Path:
    """The trace in ``folder`` with its requests table rewritten by ``change(table)``."""
    path = folder / "requests.parquet"
    table = pq.read_table(path)
    pq.write_table(change(table), path)
    return folder


# --------------------------------------------------------------------------- trace contents
@pytest.mark.parametrize("info", [b"[1, 2]", b"7", b'"text"', b"{not json", DEEP.encode()],
                         ids=["list", "number", "string", "invalid", "deep"])
def test_a_trace_description_that_is_no_object_names_the_file_and_key(tmp_path, info):
    def replace_info(table):
        return table.replace_schema_metadata({**table.schema.metadata,
                                              b"ragsim.trace_info": info})

    folder = with_requests_table(small_trace(tmp_path / "t"), replace_info)
    line = one_error_line(runner.invoke(app, ["run", "--trace", str(folder), "--json"]))
    assert f"{folder / 'requests.parquet'}, field 'ragsim.trace_info'" in line


STAGES = pa.list_(pa.list_(pa.int64()))


@pytest.mark.parametrize("row0, times0, says", [
    ([[0, 5], None], [0.01, 0.01], "missing stage list (null)"),
    ([[0, None]], [0.01], "missing id (null)"),
    ([[0, 5]], [None], "missing time (null)"),
], ids=["null-stage-list", "null-id", "null-time"])
def test_a_null_inside_stage_lists_names_row_and_field(tmp_path, row0, times0, says):
    def add_stages(table):
        n = table.num_rows
        stages = pa.array([row0] + [[[k % 3, 5]] for k in range(1, n)], STAGES)
        times = pa.array([times0] + [[0.01]] * (n - 1), pa.list_(pa.float64()))
        return (table.append_column("stages", stages).append_column("stage_times_s", times)
                .replace_schema_metadata(table.schema.metadata))

    folder = with_requests_table(small_trace(tmp_path / "t"), add_stages)
    for command in (["run", "--trace", str(folder), "--json"],
                    ["replay", "--trace", str(folder), "--json"]):
        line = one_error_line(runner.invoke(app, command))
        field = "stage_times_s" if "time" in says else "stages"
        assert f"requests.parquet, row 0, field '{field}': {says}" in line



@pytest.mark.parametrize("seconds", [31 * 86400.0, 1e300], ids=["31-days", "1e300"])
def test_a_stage_time_past_the_longest_duration_names_the_file(tmp_path, seconds):
    """A measured stage longer than MAX_DURATION_S (a unit mistake, and a run that would tick
    through it for ever) is refused by the trace's reader, naming file, row and field: the
    run's own check named only the row, so nothing said which file to look in."""
    def add_stages(table):
        n = table.num_rows
        stages = pa.array([[[k % 3, 5]] for k in range(n)], STAGES)
        times = pa.array([[seconds] if k == 3 else [0.01] for k in range(n)],
                         pa.list_(pa.float64()))
        return (table.append_column("stages", stages).append_column("stage_times_s", times)
                .replace_schema_metadata(table.schema.metadata))

    folder = with_requests_table(small_trace(tmp_path / "t"), add_stages)
    for command in (["run", "--trace", str(folder), "--search-latency", "trace", "--json"],
                    ["replay", "--trace", str(folder), "--json"]):
        line = one_error_line(runner.invoke(app, command))
        assert f"{folder / 'requests.parquet'}, row 3, field 'stage_times_s'" in line
        assert "30 days" in line


def test_a_request_without_recorded_stages_is_still_accepted(tmp_path):
    """A null for a whole request's stages means none were recorded for it (the format lets
    a request have none): not an error."""
    def add_stages(table):
        n = table.num_rows
        stages = pa.array([None] + [[[k % 3, 5]] for k in range(1, n)], STAGES)
        return table.append_column("stages", stages).replace_schema_metadata(
            table.schema.metadata)

    folder = with_requests_table(small_trace(tmp_path / "t"), add_stages)
    result = runner.invoke(app, ["run", "--trace", str(folder), "--json"])
    assert result.exit_code == 0, result.output


# --------------------------------------------------------------------------- nesting
def test_deeply_nested_json_and_toml_are_one_line(tmp_path):
    jsonl = tmp_path / "deep.jsonl"
    jsonl.write_text('{"arrival_s": 0, "query_tokens": 1, "output_tokens": 1, "doc_ids": '
                     + DEEP + "}\n")
    line = one_error_line(runner.invoke(app, ["trace", "import-jsonl", str(jsonl),
                                              str(tmp_path / "out")]))
    assert f"{jsonl}, row 1: nested too deeply" in line
    profile = tmp_path / "deep.json"
    profile.write_text('{"a": ' + DEEP + "}")
    for args in (["--profile", str(profile)],
                 ["--answer-cache", "--answer-profile", str(profile)]):
        line = one_error_line(runner.invoke(app, ["run", *args, "--requests", "5"]))
        assert line.startswith(f"error: {profile}: nested too deeply")
    config = tmp_path / "deep.toml"
    config.write_text("[run]\nfail_gpu_at_s = " + DEEP + "\n")
    for command in (["run", "--config", str(config)],
                    ["sweep", "--out", str(tmp_path / "s"), str(config)]):
        line = one_error_line(runner.invoke(app, command))
        assert line.startswith(f"error: {config}: not valid TOML here: nested too deeply")


# --------------------------------------------------------------------------- what a path names
USER_FILE_OPTIONS = {
    "config": ["run", "--config", "{}", "--requests", "5"],
    "profile": ["run", "--profile", "{}", "--requests", "5"],
    "answer-profile": ["run", "--answer-cache", "--answer-profile", "{}", "--requests", "5"],
    "jsonl": ["trace", "import-jsonl", "{}", "OUT"],
    "mooncake": ["trace", "import-mooncake", "{}", "OUT"],
    "sweep": ["sweep", "--out", "OUT", "{}"],
}


def _args(kind: str, path: Path, tmp_path: Path) -> list[str]:
    return [a.replace("{}", str(path)).replace("OUT", str(tmp_path / "out"))
            for a in USER_FILE_OPTIONS[kind]]


@pytest.mark.parametrize("kind", sorted(USER_FILE_OPTIONS))
def test_a_folder_or_an_oversized_file_is_refused_naming_it(tmp_path, kind):
    folder = tmp_path / "folder"
    folder.mkdir()
    line = one_error_line(runner.invoke(app, _args(kind, folder, tmp_path)))
    assert line == f"error: {folder}: is a folder, not a regular file; give a file" or \
        line == f"error: {folder}: is a folder; give a file"
    if kind in ("jsonl", "mooncake"):  # streamed: bounded per line, not per file
        big = tmp_path / "one-line.jsonl"
        with big.open("wb") as handle:  # sparse: nothing is stored on disk
            handle.truncate(65 * 2**20)
        line = one_error_line(runner.invoke(app, _args(kind, big, tmp_path)))
        assert f"{big}, row 1: a line longer than 64 MiB" in line
        return
    big = tmp_path / "big.file"
    with big.open("wb") as handle:
        handle.truncate(MAX_DOCUMENT_BYTES + 1)
    line = one_error_line(runner.invoke(app, _args(kind, big, tmp_path)))
    assert line.startswith(f"error: {big}: is larger than 64 MiB")


def _limited_memory() -> None:  # the child's address space: a read without end fails fast
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


@pytest.mark.parametrize("kind", ["config", "profile", "answer-profile", "jsonl", "sweep"])
def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path, kind):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO (named pipe)"), (Path("/dev/zero"),
                                                        "a character device")):
        done = subprocess.run([sys.executable, "-m", "ragsim", *_args(kind, path, tmp_path)],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              preexec_fn=_limited_memory, check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == f"error: {path}: is {what}, not a regular file; give " \
            "a file", done.stderr


# --------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("text, field, says", [
    ('colour = "red"\n[run]\nseed = 1\n', "colour", "unknown key"),
    ('seed = 1\n[run]\nn_requests = 5\n', "seed", "settings go in the [run] table"),
    ("version = true\n[run]\nseed = 1\n", "version", "unsupported version True"),
    ("version = 1.0\n[run]\nseed = 1\n", "version", "unsupported version 1.0"),
])
def test_a_config_file_refuses_what_it_would_ignore(tmp_path, text, field, says):
    config = tmp_path / "c.toml"
    config.write_text(text)
    line = one_error_line(runner.invoke(app, ["run", "--config", str(config)]))
    assert line.startswith(f"error: {config}, field '{field}': ") and says in line


def test_a_sweep_file_refuses_a_true_version_too(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text("version = true\n[base]\nn_requests = 5\n")
    line = one_error_line(runner.invoke(app, ["sweep", "--out", str(tmp_path / "o"),
                                              str(sweep)]))
    assert line.startswith(f"error: {sweep}, field 'version': unsupported version True")


@pytest.mark.parametrize("setting, args, field, says", [
    # whole numbers past a C integer (the compiled core's) ended in a traceback (an
    # OverflowError) or a MemoryError: found by test_fuzz_cli
    ("max_cached_depth = 2147483648", [], "run.max_cached_depth", "must be <= 2,147,483,647"),
    (f"max_cached_depth = {2**63}", [], "run.max_cached_depth", "must lie within"),
    (f"top_k = {2**63}", [], "run.top_k", "must lie within +-1,152,921,504,606,846,976"),
    (f"host_cache_bytes = {2**63}", [], "run.host_cache_bytes", "must lie within"),
    (f"host_replicas = {2**63}", [], "run.host_replicas", "must lie within"),
    (f"search_stages = {2**60}", [], "run.search_stages", "must be <= 1024"),
    (None, ["--top-k", str(2**63)], "--top-k", "must lie within"),
])
def test_a_whole_number_past_what_the_core_computes_in_is_one_line(tmp_path, setting, args,
                                                                    field, says):
    config = tmp_path / "c.toml"
    if setting is not None:
        config.write_text(f"[run]\n{setting}\n")
        args = [*args, "--config", str(config)]
    line = one_error_line(runner.invoke(app, ["run", *args, "--requests", "20"]))
    assert f"field '{field}': {says}" in line or (
        line.startswith(f"error: {config}, field '{field}': ") and says in line), line


@pytest.mark.parametrize("args, field, says", [
    (["--cache-depth", str(2**63)], "--cache-depth", "must be <= 2,147,483,647"),
    (["--kv-bytes-per-token", str(2**63)], "--kv-bytes-per-token", "must lie within"),
    (["--seed", str(-(2**63) - 1)], "--seed", "must lie within"),
])
def test_a_replays_whole_numbers_past_the_core_are_one_line(args, field, says):
    line = one_error_line(runner.invoke(app, ["replay", *args, "--requests", "20"]))
    assert f"field '{field}': {says}" in line, line


@pytest.mark.parametrize("flag, value", [("--epsilon", "-1"), ("--epsilon", "0"),
                                         ("--epsilon", "nan"), ("--m", "0"),
                                         ("--ef-runtime", "0")])
def test_answer_index_options_are_refused_before_a_server_starts(flag, value):
    line = one_error_line(runner.invoke(app, ["answers", "bench", flag, value]))
    assert f"field '{flag}'" in line


# --------------------------------------------------------------------------- a full disk
class FullDisk:
    """The disk holding ``folder`` is full: every write of a file under it (Parquet, text,
    figures: whatever opens it for writing) fails with ENOSPC, after ``allow`` writes of the
    kinds in ``kinds`` went through. Files are still created and removed, as on a full disk
    (a check that a folder is writable makes an empty temporary file)."""

    def __init__(self, monkeypatch, folder: Path, kinds=("parquet", "text"), allow: int = 0):
        import builtins
        import errno
        import pathlib

        self.folder, self.allow = str(folder), allow
        real_write_table, real_open = pq.write_table, builtins.open
        real_path_open = pathlib.Path.open

        def full(where, kind) -> None:
            if kind not in kinds or not isinstance(where, str | os.PathLike):
                return
            if not os.path.realpath(where).startswith(self.folder):
                return
            if self.allow > 0:
                self.allow -= 1
                return
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))

        def write_table(table, where, *args, **kwargs):
            full(where, "parquet")
            return real_write_table(table, where, *args, **kwargs)

        def writing(mode: str) -> bool:
            return any(c in mode for c in "wax+")

        def open_(file, mode="r", *args, **kwargs):
            if writing(mode):
                full(file, "text")
            return real_open(file, mode, *args, **kwargs)

        def path_open(self_, mode="r", *args, **kwargs):
            if writing(mode):
                full(self_, "text")
            return real_path_open(self_, mode, *args, **kwargs)

        monkeypatch.setattr(pq, "write_table", write_table)
        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(pathlib.Path, "open", path_open)


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("command", ["run", "replay"])
@pytest.mark.parametrize("kinds", [("parquet", "text"), ("text",)],
                         ids=["records-fail", "summary-fails"])
def test_a_full_disk_keeps_the_printed_summary_and_no_half_result(tmp_path, monkeypatch,
                                                                  command, kinds):
    out = tmp_path / "full" / "result"
    FullDisk(monkeypatch, tmp_path / "full", kinds)
    result = runner.invoke(app, [command, "--requests", "30", "--json", "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    summary = json.loads(result.stdout)  # the finished run's figures are printed, not lost
    assert summary["requests"] == 30
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        f"error: {out}, field '--out': the results could not be written (No space left on "
        "device): the summary printed above is all that is kept of this run; the folder holds "
        "none of its files")
    # records written before the summary failed are gone: nothing looks like a result
    assert [name for name in files_in(out) if not name.startswith(".")] == []


@pytest.mark.parametrize("kinds, allow", [(("parquet",), 0), (("parquet",), 1)],
                         ids=["requests-fail", "documents-fail"])
def test_a_full_disk_leaves_no_half_trace(tmp_path, monkeypatch, kinds, allow):
    FullDisk(monkeypatch, tmp_path / "full", kinds, allow)
    for command in (["trace", "generate", "mmlu", "{}", "--requests", "20"],
                    ["trace", "retime", "mmlu", "{}", "--rate", "2", "--requests", "20"]):
        out = tmp_path / "full" / command[1]
        line = one_error_line(runner.invoke(app, [a.replace("{}", str(out)) for a in command]))
        assert line == (f"error: {out}: the trace could not be written (No space left on "
                        "device); the folder holds none of its files")
        assert files_in(out) == []


def test_a_full_disk_leaves_earlier_files_of_export_report_and_plot(tmp_path, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    sweep = tmp_path / "sweep"
    assert runner.invoke(app, ["sweep", "--out", str(sweep), "--set", "n_requests=20",
                               "--axis", "host_mem=1GiB,2GiB", "--jobs", "1"]).exit_code == 0
    earlier = {name: full / name for name in ("t.jsonl", "r.html", "p.png")}
    for path in earlier.values():
        path.write_text("earlier\n")
    FullDisk(monkeypatch, full)
    commands = {
        "t.jsonl": ["trace", "export-jsonl", "mmlu", str(earlier["t.jsonl"]), "--requests",
                    "20", "--force"],
        "r.html": ["report", str(sweep), "--out", str(earlier["r.html"])],
        "p.png": ["plot", str(sweep), "--out", str(earlier["p.png"]), "--x",
                  "host_cache_bytes", "--y", "ttft_mean_s"],
    }
    for name, command in commands.items():
        line = one_error_line(runner.invoke(app, command))
        assert line.startswith(f"error: {earlier[name]}") and "No space left on device" in line
        assert earlier[name].read_text() == "earlier\n"
    assert files_in(full) == sorted(earlier)  # no temporary file left behind


def test_a_full_disk_mid_sweep_keeps_the_finished_points_and_resumes(tmp_path, monkeypatch):
    import ragsim.study.sweep as sweeping

    out = tmp_path / "sweep"
    args = ["sweep", "--out", str(out), "--set", "n_requests=20", "--axis",
            "policy=lru,pgdsf,gdsf", "--jobs", "1"]
    write_table = sweeping.write_results_table
    calls = []

    def fills_up(folder, rows):  # the first point's table is written; then the disk is full
        calls.append(len(rows))
        if len(calls) > 1:
            import errno
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_table(folder, rows)

    monkeypatch.setattr(sweeping, "write_results_table", fills_up)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {out}, field '--out': could not write the point's files "
                           "and results.parquet (No space left on device): point ")
    assert "policy=pgdsf" in line
    assert ") finished but its result was lost; the 1 point(s) finished before " \
        "are kept in results.parquet; free space and run the same command to resume" in line
    assert len(pd_read(out)) == 1
    monkeypatch.setattr(sweeping, "write_results_table", write_table)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "2 point(s) run, 1 already done" in result.stderr
    assert len(pd_read(out)) == 3


def pd_read(folder: Path):
    import pandas as pd

    return pd.read_parquet(folder / "results.parquet")


# --------------------------------------------------------------------------- accepted silently
def test_an_empty_parquet_trace_is_refused_as_an_empty_jsonl_file_is(tmp_path):
    folder = with_requests_table(small_trace(tmp_path / "t"), lambda table: table.slice(0, 0))
    for command in ("run", "replay"):
        line = one_error_line(runner.invoke(app, [command, "--trace", str(folder)]))
        assert line == f"error: {folder / 'requests.parquet'}: no requests in the table"


@pytest.mark.parametrize("given, n_bytes", [("1EiB", 2**60), ("1 EiB", 2**60),
                                            ("2PiB", 2**51), ("1EB", 10**18)])
def test_the_largest_size_the_limit_names_can_be_typed(given, n_bytes):
    from ragsim.units import parse_bytes

    assert parse_bytes(given) == n_bytes
    line = one_error_line(runner.invoke(app, ["run", "--gpu-mem", "2EiB"]))
    assert "at most 1,152,921,504,606,846,976 bytes, 1 EiB" in line
    result = runner.invoke(app, ["run", "--gpu-mem", given, "--requests", "5", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gpu_kv_bytes"] == n_bytes


def test_a_dollar_in_a_path_is_drawn_as_written(tmp_path):
    """A pair of ``$`` in a legal folder name started matplotlib's mathtext: ``$^^$`` (a double
    superscript) made plot, report and trace stats --plot fail with a parse error."""
    traces = [tmp_path / "run$^^$1", tmp_path / r"b$\nope$"]
    for folder in traces:
        small_trace(folder)
    sweep = tmp_path / "s$^^$"
    result = runner.invoke(app, ["sweep", "--out", str(sweep), "--set", "n_requests=6",
                                 "--axis", "trace=" + ",".join(str(t) for t in traces),
                                 "--axis", "host_mem=1GiB,2GiB", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    for command in (["plot", str(sweep), "--out", str(tmp_path / "p.png"), "--x",
                     "host_cache_bytes", "--y", "ttft_mean_s", "--by", "trace"],
                    ["report", str(sweep), "--out", str(tmp_path / "r.html")],
                    ["trace", "stats", *map(str, traces), "--plot", str(tmp_path / "s.png")]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
    from ragsim.figures import new_figure, plain

    fig = new_figure(3, 2)
    fig.add_subplot().set_title(plain(traces[0]))
    fig.canvas.draw()  # the escaped text renders; its characters are the path's
    assert fig.axes[0].title.get_text().replace("\\$", "$") == str(traces[0])


# --------------------------------------------------------------------------- a huge sweep
def _grid(tmp_path: Path, seeds: int, policies: str = "lru,nope") -> list[str]:
    """A sweep of ``seeds`` x 2 points whose second policy is refused once the points are
    checked: reaching that refusal shows the grid's size was let through."""
    return ["sweep", "--out", str(tmp_path / "s"), "--set", "n_requests=5",
            "--axis", "seed=" + ",".join(map(str, range(seeds))), "--axis",
            f"policy={policies}"]


def test_a_grid_over_a_thousand_points_needs_yes_off_a_terminal(tmp_path):
    line = one_error_line(runner.invoke(app, _grid(tmp_path, 1_000_000 // 2)))
    assert line == ("error: field '--yes': the sweep has 1,000,000 points (more than 1,000); "
                    "give --yes to run them all")
    line = one_error_line(runner.invoke(app, [*_grid(tmp_path, 501), "--yes"]))
    assert "field 'axes.policy'" in line  # past the count: the points were checked
    line = one_error_line(runner.invoke(app, _grid(tmp_path, 500)))  # 1,000: not asked
    assert "field 'axes.policy'" in line
    assert not (tmp_path / "s").exists()


def test_a_grid_over_a_thousand_points_asks_on_a_terminal(tmp_path, monkeypatch):
    import ragsim.cli.study as study

    monkeypatch.setattr(study, "_on_a_terminal", lambda: True)
    result = runner.invoke(app, _grid(tmp_path, 501), input="n\n")
    assert result.exit_code == 1 and "The sweep has 1,002 points. Run them all?" in \
        result.stderr and "not started" in result.stderr
    assert not (tmp_path / "s").exists()
    result = runner.invoke(app, _grid(tmp_path, 501), input="y\n")
    assert result.exit_code == 2 and "field 'axes.policy'" in result.stderr


def test_a_profile_overhead_that_could_not_apply_is_refused(tmp_path):
    """``overhead_s`` records the fixed cost every grid point already includes (the simulator
    reads the grids): 1e300 once changed nothing at all; more than the cheapest prefill is
    now refused, and a value within it still loads."""
    from ragsim.profiles.profile import load_profile

    data = load_profile("a10g-mistral-7b").to_dict()
    cheapest = min(min(row) for row in data["prefill"]["seconds"])
    path = tmp_path / "p.json"
    for overhead, ok in ((1e300, False), (cheapest * 1.01, False), (cheapest, True),
                         (0.0, True)):
        path.write_text(json.dumps({**data, "overhead_s": overhead}))
        result = runner.invoke(app, ["run", "--profile", str(path), "--requests", "5",
                                     "--json"])
        if ok:
            assert result.exit_code == 0, result.output
        else:
            line = one_error_line(result)
            assert line.startswith(f"error: {path}, field 'overhead_s': is ") and \
                "more than the cheapest prefill iteration of the grid" in line


def trace_of(rows: list[tuple[float, list[int]]]):
    builder = TraceBuilder("hand")
    for i, (arrival, docs) in enumerate(rows):
        builder.add(i, arrival, 20, 4, docs, [100] * len(docs))
    return builder.build({})


def test_a_prompt_over_the_token_budget_is_counted_and_said():
    """prefill-first: a request whose new tokens alone exceed max_batched_tokens runs alone
    (the budget cannot split it), which is what a budget of 1 did without a word. By hand:
    three requests of 120 new tokens arriving together; a budget of 1 runs them one by one,
    three prefills over it; a budget of 120 holds one each (not over); 360 all at once."""
    from ragsim.profiles.profile import load_profile
    from ragsim.serving.config import build_config
    from ragsim.sim.simulator import run_simulation

    trace = trace_of([(0.0, [1]), (0.0, [2]), (0.0, [3])])
    profile = load_profile("a10g-mistral-7b")
    for budget, iterations, over in ((1, 3, 3), (120, 3, 0), (360, 1, 0)):
        s = run_simulation(trace, build_config({"system": "sglang", "stage_source": "none",
                                                "max_batched_tokens": budget}), profile)
        assert s.summary["iterations_prefill"] == iterations
        said = [w for w in s.summary["warnings"] if "max_batched_tokens" in w]
        assert said == ([f"{over} prefill(s) computed more new tokens than max_batched_tokens "
                         f"({budget:,}) allows: a prompt larger than the budget runs alone in its "
                         "iteration (vLLM v0.3 refuses a budget below its longest prompt; the "
                         "mixed scheduler splits prompts into chunks instead)"] if over else [])


def test_a_document_listed_twice_is_counted_and_each_copy_cached_once():
    """By hand: requests [3, 3], [3, 3], [3] with 100-token documents: the first computes 200
    tokens (both copies), the second hits both copies (200), the third the first copy (100):
    token hit rate 300 / 500. Two requests list a document twice, and the run says so."""
    from ragsim.profiles.profile import load_profile
    from ragsim.serving.config import build_config
    from ragsim.sim.replay import ReplayConfig, run_replay
    from ragsim.sim.simulator import run_simulation

    trace = trace_of([(0.0, [3, 3]), (5.0, [3, 3]), (10.0, [3])])
    s = run_simulation(trace, build_config({"system": "sglang", "stage_source": "none"}),
                       load_profile("a10g-mistral-7b"))
    assert s.records["doc_tokens"].tolist() == [200, 200, 100]
    assert s.records["hit_tokens_gpu"].tolist() == [0, 200, 100]
    assert s.records["recomputed_tokens"].tolist() == [200, 0, 0]
    assert s.summary["token_hit_rate"] == pytest.approx(300 / 500)
    said = [w for w in s.summary["warnings"] if "more than once" in w]
    assert len(said) == 1 and said[0].startswith("2 request(s) list a document more than once")
    replayed = run_replay(trace, ReplayConfig(trace="hand", policy="lru", kv_bytes_per_token=1,
                                              gpu_capacity_bytes=10**6,
                                              host_capacity_bytes=0))
    assert replayed.summary["token_hit_rate"] == pytest.approx(300 / 500)
    assert any(w.startswith("2 request(s) list a document") for w in
               replayed.summary["warnings"])


def test_mooncake_ids_that_are_not_prefix_chained_are_counted_at_import(tmp_path):
    source = tmp_path / "mc.jsonl"
    rows = [{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
            {"timestamp": 10, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
            {"timestamp": 20, "input_length": 1024, "output_length": 4, "hash_ids": [3, 2]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["trace", "import-mooncake", str(source), str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert ("warning: 1 request(s) whose hash_ids are not chained by prefix, as Mooncake's are"
            in result.stderr and "row 3: block 2 follows 3, at row 1 it followed 1"
            in result.stderr)
    from ragsim.traces import read_trace

    info = read_trace(tmp_path / "t").info
    assert info["unchained_block_rows"] == 1


def test_the_real_mooncake_sample_is_chained(mooncake_sample, tmp_path):
    result = runner.invoke(app, ["trace", "import-mooncake", str(mooncake_sample),
                                 str(tmp_path / "t")])
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output


def test_generating_no_requests_is_refused_before_the_folder_is_made(tmp_path):
    out = tmp_path / "out"
    line = one_error_line(runner.invoke(app, ["trace", "generate", "mmlu", str(out),
                                              "--requests", "0"]))
    assert "field '--requests'" in line and "must be > 0" in line
    assert not out.exists()
