"""Results never over an input, never silently over an earlier result, and always one set: what
``--out`` and a trace's destination refuse, and what a cut write leaves behind."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import ragsim.outputs as outputs
from ragsim.cli import app
from ragsim.errors import RagsimInputError
from ragsim.outputs import SET_ID_KEY, check_result_set, write_run_result

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def files_of(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def small_trace(tmp_path):
    trace = tmp_path / "trace"
    assert invoke("trace", "generate", "mmlu", str(trace), "--requests", "30").exit_code == 0
    return trace


def test_a_run_never_writes_over_its_own_trace(small_trace):
    before = files_of(small_trace)
    for force in ([], ["--force"]):  # destroying the input is refused whatever --force says
        result = invoke("run", "--trace", str(small_trace), "--out", str(small_trace),
                        "--requests", "10", *force)
        assert result.exit_code == 2, result.output
        assert "own input (requests.parquet)" in result.stderr
    assert files_of(small_trace) == before


def test_a_rerun_from_a_results_config_cannot_replace_that_config(tmp_path, small_trace):
    run1 = tmp_path / "run1"
    assert invoke("run", "--trace", str(small_trace), "--requests", "10", "--json", "--out",
                  str(run1)).exit_code == 0
    result = invoke("run", "--config", str(run1 / "config.toml"), "--out", str(run1), "--force")
    assert result.exit_code == 2 and "own input (config.toml)" in result.stderr


def test_an_earlier_result_is_kept_unless_forced(tmp_path, small_trace):
    run1 = tmp_path / "run1"
    args = ("run", "--trace", str(small_trace), "--json", "--out", str(run1))
    assert invoke(*args, "--requests", "20").exit_code == 0
    before = files_of(run1)
    result = invoke(*args, "--requests", "5")  # a shorter run must not replace the longer
    assert result.exit_code == 2 and "holds an earlier result" in result.stderr
    assert "--force" in result.stderr
    assert files_of(run1) == before
    assert invoke(*args, "--requests", "5", "--force").exit_code == 0
    assert len(pd.read_parquet(run1 / "requests.parquet")) == 5
    check_result_set(run1)  # the replaced files are one set


def test_replay_refuses_an_earlier_result_too(tmp_path, small_trace):
    out = tmp_path / "replay"
    args = ("replay", "--trace", str(small_trace), "--json", "--out", str(out))
    assert invoke(*args).exit_code == 0
    assert invoke(*args).exit_code == 2
    assert invoke(*args, "--force").exit_code == 0
    assert not (out / "config.toml").exists()


def test_validate_refuses_an_earlier_validation_too(tmp_path):
    """validate --out over an earlier comparison: refused (exit 2, nothing touched) unless
    --force, as run's --out is (the 'real' side simulated: seconds, not minutes)."""
    out = tmp_path / "v"
    args = ("validate", "--out", str(out), "--backend", "sim", "--requests", "20", "--json")
    assert invoke(*args).exit_code == 0
    before = files_of(out)
    result = invoke(*args, "--requests", "10")
    assert result.exit_code == 2 and "holds an earlier result" in result.stderr
    assert "--force" in result.stderr and files_of(out) == before
    assert invoke(*args, "--requests", "10", "--force").exit_code == 0
    assert json.loads((out / "validation.json").read_text())["requests"] == 10


def test_the_python_validate_takes_force(tmp_path):
    from ragsim.api.validation import setup_validation

    out = tmp_path / "v"
    out.mkdir()
    (out / "validation.json").write_text("{}\n")
    with pytest.raises(RagsimInputError, match=r"earlier result.*force=True"):
        setup_validation(out, backend="sim", requests=5)
    assert setup_validation(out, backend="sim", requests=5, force=True).out_dir == out


class _Measured(Exception):
    """What the profiler stand-in raises: the command got past its checks to the measuring."""


def test_profile_refuses_an_earlier_profile_but_resumes_its_own_partial(tmp_path, monkeypatch):
    """profile --out over a finished profile is refused before any measuring unless --force;
    an interrupted measurement (only OUT.partial.json there) resumes without it."""
    import ragsim.profiles.profiler as profiler

    def measure(*args, **kwargs):
        raise _Measured

    monkeypatch.setattr(profiler, "run_profile", measure)
    out = tmp_path / "p.json"
    args = ("profile", "--layers", "2", "--hidden", "256", "--quick", "--out", str(out))
    (tmp_path / "p.json.partial.json").write_text("{}")  # an interrupted measurement's state
    assert isinstance(invoke(*args).exception, _Measured)
    out.write_text('{"measured": "an hour ago"}')
    result = invoke(*args)
    assert result.exit_code == 2 and "holds an earlier result" in result.stderr
    assert "--force" in result.stderr and out.read_text() == '{"measured": "an hour ago"}'
    assert isinstance(invoke(*args, "--force").exception, _Measured)


def test_plan_refuses_an_earlier_plan_and_force_replaces_it_whole(tmp_path):
    out = tmp_path / "plan"
    args = ("plan", "--requests", "50", "--replicas", "1", "--host-mem", "0", "--jobs", "1",
            "--json", "--out", str(out))
    assert invoke(*args).exit_code == 0
    before = files_of(out)
    result = invoke(*args, "--rate", "2")
    assert result.exit_code == 2 and "holds an earlier result (plan.json)" in result.stderr
    assert files_of(out) == before
    # forced: another plan's candidates (another sweep's points) replace the earlier ones
    assert invoke(*args, "--rate", "2", "--force").exit_code == 0
    assert json.loads((out / "plan.json").read_text())["rate_rps"] == 2.0
    assert set(pd.read_parquet(out / "results.parquet")["rate_rps"]) == {2.0}


def test_a_trace_is_never_written_into_a_runs_folder_or_over_its_source(tmp_path, small_trace):
    run1 = tmp_path / "run1"
    assert invoke("run", "--trace", str(small_trace), "--requests", "5", "--json", "--out",
                  str(run1)).exit_code == 0
    before = files_of(run1)
    jsonl = tmp_path / "t.jsonl"
    assert invoke("trace", "export-jsonl", str(small_trace), str(jsonl)).exit_code == 0
    for args in (("trace", "import-jsonl", str(jsonl), str(run1)),
                 ("trace", "generate", "mmlu", str(run1), "--requests", "5"),
                 ("trace", "retime", str(small_trace), str(run1), "--rate", "2")):
        result = invoke(*args)
        assert result.exit_code == 2 and "holds an earlier result" in result.stderr, args
    assert files_of(run1) == before
    result = invoke("trace", "retime", str(small_trace), str(small_trace), "--rate", "2",
                    "--force")
    assert result.exit_code == 2 and "own input" in result.stderr
    result = invoke("trace", "export-jsonl", str(small_trace), str(jsonl))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert invoke("trace", "export-jsonl", str(small_trace), str(jsonl), "--force").exit_code == 0


@pytest.mark.parametrize("args", [("run", "--requests", "5", "--out", ""),
                                  ("replay", "--requests", "5", "--out", ""),
                                  ("trace", "generate", "mmlu", "", "--requests", "5")])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2 and "empty path" in result.output
    assert list(tmp_path.iterdir()) == []


def _records(n: int) -> pd.DataFrame:
    return pd.DataFrame({"request_id": range(n), "ttft_s": [0.1] * n})


def test_a_results_files_carry_one_set_id(tmp_path):
    set_id = write_run_result(tmp_path, _records(3), {"requests": 3}, "a = 1\n")
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "requests.parquet").metadata[SET_ID_KEY] == set_id.encode()
    assert json.loads((tmp_path / "summary.json").read_text())["set_id"] == set_id
    assert (tmp_path / "config.toml").read_text().splitlines()[0].endswith(set_id)
    check_result_set(tmp_path)


def test_records_beside_another_sets_summary_are_refused(tmp_path):
    """What a SIGKILL between two renames of an old, unguarded writer would leave: new records
    beside an old summary. The report names the mismatch instead of mixing them."""
    other = tmp_path / "other"
    write_run_result(tmp_path, _records(3), {"requests": 3}, "a = 1\n")
    write_run_result(other, _records(5), {"requests": 5}, "a = 2\n")
    (tmp_path / "requests.parquet").write_bytes((other / "requests.parquet").read_bytes())
    with pytest.raises(RagsimInputError, match=r"another result than summary\.json"):
        check_result_set(tmp_path)
    result = invoke("report", str(tmp_path), "--out", str(tmp_path / "page.html"))
    assert result.exit_code == 2 and "another result" in result.stderr


def test_a_write_cut_before_the_summary_leaves_no_old_summary(tmp_path, monkeypatch):
    write_run_result(tmp_path, _records(200), {"requests": 200}, "a = 1\n")
    real = outputs.write_text_atomically

    def killed_at_the_summary(path, text):
        if path.name == "summary.json":
            raise KeyboardInterrupt  # the second Ctrl-C, or a kill, while writing
        return real(path, text)

    monkeypatch.setattr(outputs, "write_text_atomically", killed_at_the_summary)
    with pytest.raises(KeyboardInterrupt):
        write_run_result(tmp_path, _records(34), {"requests": 34}, "a = 2\n")
    assert not (tmp_path / "summary.json").exists()  # the 200-request summary does not vouch
    with pytest.raises(RagsimInputError, match="stopped before it finished writing"):
        check_result_set(tmp_path)
