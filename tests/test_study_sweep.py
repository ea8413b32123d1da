"""`ragsim sweep`: its rows are the runs a user would start by hand, whichever executor ran them;
an interrupted sweep keeps what finished and resumes; bad sweep files are one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.serving.summary import WALL_CLOCK_FIELDS

runner = CliRunner()

SMALL = """
seeds = [0, 3]
[base]
trace = "mmlu"
n_requests = 150
rate_rps = 4.0
gpu_mem = "2GiB"
[axes]
policy = ["pgdsf", "lru"]
host_cache_bytes = ["1GiB", "4GiB"]
"""


def sweep(tmp_path: Path, text: str, *args: str, name: str = "out"):
    spec = tmp_path / f"{name}.toml"
    spec.write_text(text)
    out = tmp_path / name
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out), *args])
    return result, out


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """The table without what measures this machine's speed (differs between any two runs)."""
    keep = [c for c in frame.columns if c not in WALL_CLOCK_FIELDS]
    return frame[keep].sort_values("point_id").reset_index(drop=True)


def test_rows_are_the_runs_ragsim_run_gives(tmp_path):
    result, out = sweep(tmp_path, SMALL, "--jobs", "1")
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 2 * 2 * 2 and table["point_id"].is_unique
    # swept options are columns named as in config.toml, sizes resolved to bytes
    assert {"policy", "host_cache_bytes", "seed", "gpu_kv_bytes"} <= set(table.columns)
    assert set(table["host_cache_bytes"]) == {2**30, 4 * 2**30}
    for policy, host, seed in [("lru", "1GiB", 3), ("pgdsf", "4GiB", 0)]:
        by_hand = runner.invoke(app, ["run", "--json", "--trace", "mmlu", "--requests", "150",
                                      "--rate", "4", "--gpu-mem", "2GiB", "--policy", policy,
                                      "--host-mem", host, "--seed", str(seed)])
        assert by_hand.exit_code == 0, by_hand.output
        summary = json.loads(by_hand.stdout)
        row = table[(table["policy"] == policy) & (table["seed"] == seed)
                    & (table["host_cache_bytes"] == summary["config"]["host_cache_bytes"])]
        assert len(row) == 1
        row = row.iloc[0]
        for name, value in summary.items():
            if name in WALL_CLOCK_FIELDS or name == "config":
                continue
            if isinstance(value, dict | list):
                assert json.loads(row[name]) == value, name
            elif value is None:
                assert row[name] is None or pd.isna(row[name]), name
            else:
                assert row[name] == value, name
        for name, value in summary["config"].items():
            if name not in summary:
                expected = json.dumps(value) if isinstance(value, list) else value
                assert (row[name] == expected or (value is None and pd.isna(row[name]))), name
    # the seeds are repetitions: the same point under another seed is another run
    lru = table[(table["policy"] == "lru") & (table["host_cache_bytes"] == 2**30)]
    assert lru["ttft_mean_s"].nunique() == 2
    # each point keeps what `ragsim run --out` writes
    point = out / "points" / table["point_id"].iloc[0]
    assert {p.name for p in point.iterdir()} == {"summary.json", "config.toml",
                                                 "requests.parquet"}
    resolved = (out / "sweep.toml").read_text()
    assert all(pid in resolved for pid in table["point_id"])


def test_replay_mode(tmp_path):
    text = """
[base]
mode = "replay"
trace = "mmlu"
requests = 400
gpu_mem = "1GiB"
[axes]
policy = ["pgdsf", "lru"]
host_capacity_bytes = [0, 2147483648]
"""
    result, out = sweep(tmp_path, text, "--jobs", "1")
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "results.parquet")
    by_hand = runner.invoke(app, ["replay", "--json", "--trace", "mmlu", "--requests", "400",
                                  "--gpu-mem", "1GiB", "--host-mem", "2GiB", "--policy", "lru"])
    summary = json.loads(by_hand.stdout)
    row = table[(table["policy"] == "lru") & (table["host_capacity_bytes"] == 2**31)].iloc[0]
    for name in ("token_hit_rate", "token_hit_rate_host", "evictions_gpu", "swap_in_bytes"):
        assert row[name] == summary[name], name
    assert row["mode"] == "replay"


@pytest.mark.slow  # starts a Ray cluster (~15 s; CI runs it: pytest -m slow)
def test_ray_and_local_processes_give_the_same_table(tmp_path):
    local, local_out = sweep(tmp_path, SMALL, "--jobs", "2", name="local")
    assert local.exit_code == 0, local.output
    ray_run, ray_out = sweep(tmp_path, SMALL, "--executor", "ray", "--jobs", "2", name="ray")
    assert ray_run.exit_code == 0, ray_run.output
    a = comparable(pd.read_parquet(local_out / "results.parquet"))
    b = comparable(pd.read_parquet(ray_out / "results.parquet"))
    assert len(a) == 8
    pd.testing.assert_frame_equal(a, b)


def six_point_sweep(tmp_path, out) -> list[str]:
    """The command of a sweep of 6 points of 20,000 requests (2 policies x 3 seeds) on 2
    workers: long enough to be stopped mid-way. A point of 10,000 took ~0.65 s on 2 December
    (0.33 s its trace, 0.32 s the simulation at ~30,000 requests/s), close to the second the
    killed-worker test waits before it kills one; each speed-up of the simulator had shortened
    that margin (at 1,500 requests a worker once finished its three points in time)."""
    spec = tmp_path / "s.toml"
    spec.write_text("""
seeds = [0, 1, 2]
[base]
trace = "mmlu"
n_requests = 20000
rate_rps = 2.0
[axes]
policy = ["pgdsf", "lru"]
""")
    return [sys.executable, "-m", "ragsim", "sweep", str(spec), "--out", str(out), "--jobs", "2"]


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_sweep_keeps_what_finished_and_resumes(tmp_path, stop, code):
    out = tmp_path / "out"
    command = six_point_sweep(tmp_path, out)
    # Ctrl-C as a terminal delivers it, whatever launched the tests: a shell's background job
    # (`cmd &` without job control) starts with SIGINT ignored, and Python then keeps ignoring
    # it, so the sweep would run to its end
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_interruptible)
    deadline = time.monotonic() + 120
    while not (out / "results.parquet").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                             text=True).stdout.split()
    assert workers, "the sweep runs its points in worker processes"
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    kept = pd.read_parquet(out / "results.parquet")
    assert 1 <= len(kept) < 6, "interrupt a sweep that has not ended"
    assert "run the same command to resume" in stderr
    resumed = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{6 - len(kept)} point(s) run, {len(kept)} already done" in resumed.stderr
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 6 and table["point_id"].is_unique
    again = comparable(table[table["point_id"].isin(kept["point_id"])])
    pd.testing.assert_frame_equal(again, comparable(kept))
    # no worker outlived the interrupted sweep (a zombie left to init is gone)
    assert all(not _alive(int(pid)) for pid in workers)


def test_a_killed_worker_fails_its_point_and_the_rest_resume(tmp_path):
    out = tmp_path / "out"
    command = six_point_sweep(tmp_path, out)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    workers: list[str] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = subprocess.run(["pgrep", "-P", str(process.pid), "-f", "spawn_main"],
                                 capture_output=True, text=True).stdout.split()
        time.sleep(0.05)
    time.sleep(1)  # the workers have taken points
    os.kill(int(workers[0]), signal.SIGKILL)  # as the kernel's out-of-memory killer would
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "a worker process died" in stderr and "run the same command to resume" in stderr
    assert "Traceback" not in stderr
    resumed = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert len(pd.read_parquet(out / "results.parquet")) == 6


def test_a_sigkilled_sweep_leaves_no_process_behind(tmp_path):
    """kill -9 of the sweep itself (no handler of ragsim's runs): its workers and
    multiprocessing's resource tracker end with it instead of running on for good."""
    out = tmp_path / "out"
    process = subprocess.Popen(six_point_sweep(tmp_path, out), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    children: list[str] = []
    while len(children) < 3 and time.monotonic() < deadline:  # 2 workers + the tracker
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                                  text=True).stdout.split()
        time.sleep(0.05)
    assert len(children) >= 3, children
    process.kill()
    process.wait()
    deadline = time.monotonic() + 30
    while any(_alive(int(pid)) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(int(pid))]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


@pytest.mark.parametrize(("text", "where"), [
    ("[base]\npolicy = 'lru'\n[axes]\npolicy = 'lru'\n", "field 'axes.policy'"),
    ("[base]\n[axes]\npolicy = ['lru', 'nope']\n", "field 'axes.policy'"),
    ("[base]\nwarp = 9\n", "field 'base.warp'"),
    ("color = 1\n", "field 'color'"),
    ("seeds = [0, -1]\n", "field 'seeds'"),
    ("[base]\nmode = 'replay'\n[axes]\nreorder = [true]\n", "field 'axes.reorder'"),
    ("[[points]]\nrate_rps = -1\n", "field 'points[0].rate_rps'"),
    ("[axes\n", "not valid TOML"),
])
def test_bad_sweep_files_are_one_line_exit_2(tmp_path, text, where):
    result, out = sweep(tmp_path, text)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert str(tmp_path / "out.toml") in result.output.replace("\n", "")
    assert where in result.output.replace("\n", "")
    assert not (out / "results.parquet").exists()



PASSWORD = "s3cr3t-PW"
REDIS = f"redis://:{PASSWORD}@127.0.0.1:1"


@pytest.mark.parametrize(("args", "where"), [
    (["--set", f"answer_redis_url={REDIS}"], "field 'base.answer_redis_url'"),
    (["--axis", f"redis_url={REDIS},redis://:other-{PASSWORD}@127.0.0.1:2"],
     "field 'axes.redis_url'"),
    (["--axis", f"answer_redis_url={REDIS}"], "field 'axes.answer_redis_url'"),
    (["--set", "answer_namespace=team-a"], "field 'base.answer_namespace'"),
    (["--file"], "field 'base.answer_redis_url'"),
    # mistyped: no '=' (the whole text echoed), or a URL whose query holds the '=' (the URL
    # taken as an option's name)
    (["--set", REDIS], "must be KEY=VALUE"),
    (["--set", f"{REDIS}?password=x"], "not a `ragsim run` option"),
], ids=["set", "axis-alias", "axis", "namespace", "file", "no-equals", "url-as-key"])
def test_a_users_redis_is_refused_by_a_sweep_without_its_password(tmp_path, args, where):
    """A sweep records its settings (sweep.toml, results.parquet) and says them in errors: a
    Redis URL given to it wrote its password into --out. It is refused, one line naming the key
    and never the value, before anything is written."""
    out = tmp_path / "out"
    if args == ["--file"]:
        spec = tmp_path / "sweep.toml"
        spec.write_text(f'[base]\ntrace = "mmlu"\nanswer_redis_url = "{REDIS}"\n')
        args = [str(spec)]
    command = ["sweep", *args, "--set", "trace=mmlu", "--set", "n_requests=20", "--jobs", "1",
               "--out", str(out)]
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and where in lines[0], lines
    assert PASSWORD not in result.output
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not any(PASSWORD.encode() in p.read_bytes() for p in written), written


def test_flags_make_the_same_sweep_as_a_file(tmp_path):
    text = """
seeds = [0, 1]
[base]
trace = "mmlu"
n_requests = 100
host_mem = "8GiB"
[axes]
policy = ["pgdsf", "lru"]
rate_rps = [1.5]
"""
    from_file, file_out = sweep(tmp_path, text, "--jobs", "1", name="file")
    assert from_file.exit_code == 0, from_file.output
    flags_out = tmp_path / "flags"
    by_flags = runner.invoke(app, ["sweep", "--set", "trace=mmlu", "--set", "n_requests=100",
                                   "--set", "host_mem=8GiB", "--axis", "policy=pgdsf,lru",
                                   "--axis", "rate_rps=1.5", "--seeds", "0,1", "--out",
                                   str(flags_out), "--jobs", "1"])
    assert by_flags.exit_code == 0, by_flags.output
    a = comparable(pd.read_parquet(file_out / "results.parquet"))
    b = comparable(pd.read_parquet(flags_out / "results.parquet"))
    assert len(a) == 4
    pd.testing.assert_frame_equal(a, b)
    # a flag wins over the file's value
    over, over_out = sweep(tmp_path, text, "--jobs", "1", "--set", "n_requests=50",
                           "--seeds", "0", name="over")
    assert over.exit_code == 0, over.output
    assert set(pd.read_parquet(over_out / "results.parquet")["requests"]) == {50}


def test_a_swept_option_the_config_leaves_out_is_still_a_column(tmp_path):
    """run records no answer-cache field with the cache off; the sweep's column still says so."""
    result, out = sweep(tmp_path, """
[base]
trace = "wiki-trivia"
n_requests = 60
[axes]
answer_cache = [true, false]
""", "--jobs", "1")
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "results.parquet")
    assert sorted(table["answer_cache"].tolist()) == [False, True]
