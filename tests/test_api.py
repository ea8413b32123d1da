"""``ragsim`` as a library: the API gives what the command line gives, and says bad input the
same way, in Python's words (``rate``) where the CLI says ``--rate``."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

import ragsim
from ragsim.cli import app
from ragsim.serving.summary import WALL_CLOCK_FIELDS

runner = CliRunner()
REPLAY_WALL = ("elapsed_s", "requests_per_s")


def _simulated(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_FIELDS}


def _cli_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_simulate_equals_run_json_in_every_simulated_field():
    api = ragsim.simulate(trace="mmlu", requests=2000, rate=1.5, seed=3).summary
    cli = _cli_json("run", "--trace", "mmlu", "--requests", "2000", "--rate", "1.5",
                    "--seed", "3")
    assert json.loads(json.dumps(_simulated(api), default=str)) == _simulated(cli)


def test_simulate_takes_sizes_as_text_or_bytes_and_fields_by_either_name():
    by_text = ragsim.simulate(requests=200, host_mem="8GiB", gpu_mem="2GiB", policy="LRU")
    by_bytes = ragsim.simulate(requests=200, host_cache_bytes=8 * 2**30, gpu_mem=2 * 2**30,
                               policy="lru")
    assert by_text.config == by_bytes.config
    assert by_text.config.host_cache_bytes == 8 * 2**30 and by_text.config.policy == "lru"
    assert _simulated(by_text.summary) == _simulated(by_bytes.summary)


def test_the_records_are_a_dataframe_one_row_per_request():
    run = ragsim.simulate(trace="nq", requests=300, rate=2.0, seed=1)
    assert isinstance(run.requests, pd.DataFrame) and len(run.requests) == 300
    completed = run.requests[run.requests["status"] == "completed"]
    assert len(completed) == run.summary["requests_completed"]
    # the summary's mean TTFT is the records' mean, computed here from the rows
    assert completed["ttft_s"].mean() == pytest.approx(run.summary["ttft_mean_s"])


def test_a_config_file_a_config_object_and_a_dict_run_alike(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('format = "ragsim.config"\nversion = 1\n[run]\nsystem = "sglang"\n'
                    'rate_rps = 2.0\nn_requests = 150\n')
    from_file = ragsim.simulate(file)
    from_dict = ragsim.simulate({"system": "sglang", "rate_rps": 2.0, "n_requests": 150})
    from_object = ragsim.simulate(from_file.config)
    assert _simulated(from_file.summary) == _simulated(from_dict.summary) == \
        _simulated(from_object.summary)
    # options override the config, as flags override --config
    assert ragsim.simulate(file, rate=1.0).config.rate_rps == 1.0


def test_save_writes_what_out_writes_and_keeps_an_earlier_result(tmp_path):
    run = ragsim.simulate(requests=100)
    run.save(tmp_path / "r")
    written = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert _simulated(written) == json.loads(json.dumps(_simulated(run.summary), default=str))
    assert len(pd.read_parquet(tmp_path / "r" / "requests.parquet")) == 100
    with pytest.raises(ragsim.RagsimInputError, match=r"force=True"):
        run.save(tmp_path / "r")
    run.save(tmp_path / "r", force=True)
    # what was saved reruns as it ran
    again = ragsim.simulate(tmp_path / "r" / "config.toml")
    assert _simulated(again.summary) == _simulated(run.summary)



def _folder_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("call", ["simulate", "replay", "config"])
def test_save_never_writes_over_what_the_run_read(tmp_path, call):
    """``simulate(trace=D).save(D, force=True)`` replaced the trace's requests.parquet (the
    command line refused it; the API did not pass the run's inputs): ``force`` replaces an
    earlier result, never an input (a trace, a config file)."""
    from ragsim.traces import resolve_trace, write_trace

    folder = tmp_path / "input"
    write_trace(resolve_trace("mmlu", n_requests=40), folder)
    if call == "config":
        (folder / "config.toml").write_text(
            'format = "ragsim.config"\nversion = 1\n[run]\nn_requests = 40\n')
        result = ragsim.simulate(folder / "config.toml")
        named = "config.toml"
    elif call == "simulate":
        result = ragsim.simulate(trace=str(folder))
        named = "requests.parquet"
    else:
        result = ragsim.replay(str(folder))
        named = "requests.parquet"
    before = _folder_bytes(folder)
    with pytest.raises(ragsim.RagsimInputError, match=f"own input \\({named}") as raised:
        result.save(folder, force=True)
    assert str(folder) in str(raised.value)
    assert _folder_bytes(folder) == before


@pytest.mark.parametrize(("options", "named", "says"), [
    ({"rate": -1}, "rate", "positive rate"),
    ({"host_mem": "3parsecs"}, "host_mem", "unknown size unit"),
    ({"rates": 1.0}, "rates", "did you mean 'rate'"),
    ({"answer_threshold": 0.9, "answer_distance": 0.1}, "answer_threshold", "not both"),
    ({"backend": "nope"}, "backend", "must be one of"),
    ({"rate": 1.0, "rate_rps": 2.0}, "rate_rps", "give one"),
])
def test_bad_input_raises_naming_the_option_as_python_spells_it(options, named, says):
    with pytest.raises(ragsim.RagsimInputError) as raised:
        ragsim.simulate(**options)
    assert raised.value.field == named and says in str(raised.value)


def test_the_same_check_on_the_command_line_names_the_flag():
    result = runner.invoke(app, ["run", "--host-mem", "3parsecs"])
    assert result.exit_code == 2
    assert "field '--host-mem': unknown size unit" in result.stderr
    # and the command line's spelling does not leak into a later library call
    with pytest.raises(ragsim.RagsimInputError) as raised:
        ragsim.simulate(host_mem="3parsecs")
    assert raised.value.field == "host_mem"


def test_replay_equals_replay_json():
    api = ragsim.replay("mmlu", requests=3000, policy="lru", gpu_mem="2GiB").summary
    cli = _cli_json("replay", "--requests", "3000", "--policy", "lru", "--gpu-mem", "2GiB")
    drop = lambda s: {k: v for k, v in s.items() if k not in REPLAY_WALL}  # noqa: E731
    assert json.loads(json.dumps(drop(api), default=str)) == drop(cli)
    with pytest.raises(ragsim.RagsimInputError, match="did you mean 'policy'"):
        ragsim.replay(polcy="lru")


def test_sweep_rows_equal_the_single_runs_they_stand_for(tmp_path):
    spec = {"base": {"trace": "mmlu", "n_requests": 300, "rate": 1.5},
            "axes": {"policy": ["lru", "pgdsf"]}, "seeds": [0, 1]}
    table = ragsim.sweep(spec, jobs=1)
    assert len(table) == 4
    for row in table.to_dict("records"):
        single = ragsim.simulate(trace="mmlu", requests=300, rate=1.5, policy=row["policy"],
                                 seed=row["seed"]).summary
        for name in ("ttft_mean_s", "ttft_p99_s", "token_hit_rate", "requests_completed",
                     "throughput_rps", "swap_in_bytes"):
            assert row[name] == pytest.approx(single[name], rel=1e-12), name
    # kept and resumed in a folder of the caller's
    kept = ragsim.sweep(spec, jobs=1, out_dir=tmp_path / "s")
    assert (tmp_path / "s" / "results.parquet").exists()
    pd.testing.assert_frame_equal(
        kept.drop(columns=[c for c in kept if c in WALL_CLOCK_FIELDS]).reset_index(drop=True),
        table.drop(columns=[c for c in table if c in WALL_CLOCK_FIELDS]).reset_index(drop=True))


def test_a_sweep_whose_point_is_bad_input_raises_before_running():
    with pytest.raises(ragsim.RagsimInputError, match="rate_rps"):
        ragsim.sweep({"base": {"n_requests": 50}, "axes": {"rate": [-1.0, 1.0]}})


def test_validate_returns_what_it_wrote(tmp_path):
    found = ragsim.validate(tmp_path / "v", backend="sim", requests=20)
    written = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert json.loads(json.dumps(found.summary, default=str)) == written
    assert found.report["requests"] == 20 and not found.interrupted


def test_load_trace_and_load_profile_are_what_a_run_reads():
    trace = ragsim.load_trace("mmlu", requests=500, seed=2)
    assert trace.n_requests == 500
    assert len(trace.requests_table().to_pandas()) == 500
    profile = ragsim.load_profile("a10g-mistral-7b")
    assert profile.name == "a10g-mistral-7b"
    with pytest.raises(ragsim.RagsimInputError):
        ragsim.load_trace("no-such-trace")


def test_a_call_that_did_not_ask_for_progress_prints_nothing(capfd):
    ragsim.simulate(requests=100)
    ragsim.replay(requests=1000)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_import_ragsim_stays_light():
    code = ("import sys, ragsim; heavy = [m for m in ('numpy', 'pandas', 'simpy', 'torch', "
            "'ragsim.api.run') if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_the_api_takes_every_option_ragsim_run_has():
    import inspect

    import ragsim
    from ragsim.api.run import EXECUTION_OPTIONS, RUN_OPTIONS
    from ragsim.cli.run import run

    flags = set(inspect.signature(run).parameters) - {"config_file", "json_output", "out_dir",
                                                       "force"}
    # how many seeds and the repricing: ragsim.simulate's own keywords
    extra = {"seeds", "sensitivity"}
    assert extra <= set(inspect.signature(ragsim.simulate).parameters)
    assert flags == set(RUN_OPTIONS) | set(EXECUTION_OPTIONS) | extra


def test_the_api_takes_every_option_ragsim_validate_has():
    """``ragsim.validate`` takes each of the command's options (--search-latency and
    --replay-decisions among them), under the command's own names, less the CLI's printing."""
    import inspect

    from ragsim.api.validation import setup_validation
    from ragsim.cli.validate import validate

    flags = set(inspect.signature(validate).parameters) - {"json_output", "out_dir", "check",
                                                            "config_file"}
    api = set(inspect.signature(setup_validation).parameters) - {"out_dir", "on_note",
                                                                 "on_profile_phase", "config"}
    assert flags == api
    assert {"search_latency", "replay_decisions"} <= api
    with pytest.raises(ragsim.RagsimInputError, match="replay_decisions"):
        ragsim.validate("never-written", backend="sim", replay_decisions=True)
