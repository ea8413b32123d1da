"""`ragsim run` and `ragsim systems` from the command line."""

from __future__ import annotations

import json

import pandas as pd
from helpers import interrupt_progress, lose_the_end_of
from typer.testing import CliRunner

from ragsim.cli import app

runner = CliRunner()
REQUIRED = ("requests_completed", "requests_failed", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
            "ttft_p99_s", "tpot_mean_s", "throughput_rps", "token_hit_rate", "simulated_s",
            "elapsed_s", "config")


def run_json(*args: str) -> dict:
    result = runner.invoke(app, ["run", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_run_json_has_the_documented_fields():
    s = run_json("--requests", "300", "--rate", "0.5")
    for key in REQUIRED:
        assert key in s, key
    assert s["requests_completed"] + s["requests_failed"] == 300
    assert s["config"]["system"] == "ragcache" and s["config"]["arrival"] == "poisson"
    assert s["profile"] == "a10g-mistral-7b"
    assert 0 < s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]


def test_out_dir_has_everything_to_rerun_exactly(tmp_path):
    out = tmp_path / "run1"
    first = run_json("--requests", "200", "--system", "sglang", "--policy", "pgdsf",
                     "--rate", "1", "--seed", "5", "--out", str(out))
    records = pd.read_parquet(out / "requests.parquet")
    assert len(records) == 200 and {"ttft_s", "status", "hit_tokens_host"} <= set(records)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["token_hit_rate"] == first["token_hit_rate"]
    again = run_json("--config", str(out / "config.toml"))
    for key in ("ttft_mean_s", "token_hit_rate", "throughput_rps", "simulated_s"):
        assert again[key] == first[key], key
    assert again["config"] == first["config"]
    # a flag overrides the file
    other = run_json("--config", str(out / "config.toml"), "--policy", "lru")
    assert other["config"]["policy"] == "lru" and other["config"]["system"] == "sglang"


def test_table_output_and_systems_listing():
    result = runner.invoke(app, ["run", "--requests", "100", "--system", "vllm"])
    assert result.exit_code == 0, result.output
    # the table shows what --json gives for the same (deterministic) run, in its units
    s = run_json("--requests", "100", "--system", "vllm")
    shown = " ".join(result.stdout.split())
    assert "run: mmlu · vllm · lru · a10g-mistral-7b" in shown
    assert f"│ {s['requests_completed']} / {s['requests_failed']} │" in shown
    assert f"TTFT mean / p50 / p90 / p99 │ {s['ttft_mean_s'] * 1e3:,.1f} ms /" in shown
    assert f"│ {s['recomputed_tokens']:,} │" in shown
    assert f"{s['throughput_rps']:.3f} req/s" in shown
    listing = runner.invoke(app, ["systems"])
    assert listing.exit_code == 0
    for name in ("vllm", "vllm-apc", "sglang", "ragcache"):
        assert name in listing.stdout


def test_systems_json_says_which_engine_version_and_source_files_todays_presets_follow():
    """Issue 26's interface: ``ragsim systems --json`` gives each preset with ``follows``
    (engine, version, source files), so a reader can check a preset against the code it
    claims to follow; today's host-tier systems name the files their rules were read from."""
    result = runner.invoke(app, ["systems", "--json"])
    assert result.exit_code == 0, result.output
    systems = json.loads(result.stdout)
    for name, engine, root in (("sglang-hicache", "SGLang", "python/sglang/srt/"),
                               ("vllm-offload", "vLLM", "vllm/")):
        follows = systems[name]["follows"]
        assert follows["engine"] == engine, name
        assert isinstance(follows["version"], str) and follows["version"].strip(), name
        assert follows["files"] and all(f.startswith(root) and f.endswith(".py")
                                        for f in follows["files"]), follows["files"]
    assert any("hiradix_cache" in f for f in systems["sglang-hicache"]["follows"]["files"])
    assert any("offloading_connector" in f for f in systems["vllm-offload"]["follows"]["files"])
    # the rest say what they follow too (the paper's baselines: its description, no files)
    for name, entry in systems.items():
        assert {"engine", "version", "files"} <= set(entry["follows"]), name


def test_bad_flags_and_files_give_one_clear_line(tmp_path):
    result = runner.invoke(app, ["run", "--system", "tgi"])
    assert result.exit_code == 2 and "system" in result.output
    bad = tmp_path / "c.toml"
    bad.write_text("[run]\nmax_batch_size = -1\n")
    result = runner.invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2 and "c.toml" in result.output and "max_batch_size" in result.output
    result = runner.invoke(app, ["run", "--arrival", "gamma"])
    assert result.exit_code == 2 and "rate" in result.output


def test_ctrl_c_writes_what_finished_and_exits_130(tmp_path, monkeypatch):
    interrupt_progress(monkeypatch, at_completed=1000)  # reported every 1,000 ended
    out = tmp_path / "o"
    result = runner.invoke(app, ["run", "--requests", "2000", "--json", "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert "interrupted at" in result.stderr and str(out) in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    records = pd.read_parquet(out / "requests.parquet")
    assert summary["interrupted"] and summary["requests_pending"] == 1000
    assert summary["requests_completed"] + summary["requests_failed"] == 1000
    assert (records.status == "pending").sum() == 1000 and len(records) == 2000


def test_help_names_every_built_in_trace():
    from ragsim.cli import TRACE_NAMES
    from ragsim.traces import BUILTIN_TRACES

    assert TRACE_NAMES.split(", ") == list(BUILTIN_TRACES)


def test_trace_build_help_names_every_built_in_corpus_and_question_set():
    from ragsim.cli import CORPUS_NAMES, QUESTION_NAMES
    from ragsim.traces.corpus.sources import BUILTIN_CORPORA, BUILTIN_QUESTIONS

    assert CORPUS_NAMES.split(", ") == list(BUILTIN_CORPORA)
    assert QUESTION_NAMES.split(", ") == list(BUILTIN_QUESTIONS)


def test_a_stalled_run_says_it_is_a_bug_keeps_what_ended_and_exits_1(tmp_path, monkeypatch):
    lose_the_end_of(monkeypatch, 7)
    out = tmp_path / "stalled"
    result = runner.invoke(app, ["run", "--requests", "50", "--rate", "1", "--out", str(out)])
    assert result.exit_code == 1
    assert "stalled" in result.stderr and "bug" in result.stderr and str(out) in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stalled"] and summary["pending_request_ids"] == [7]
    records = pd.read_parquet(out / "requests.parquet")
    assert (records.status == "completed").sum() == 49


def test_the_drift_a_run_used_is_in_its_config_and_reruns_the_same_traffic(tmp_path):
    from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

    for drift, expected in ((None, BUILTIN_DRIFT_PER_1K_REQUESTS), ("0", 0.0)):
        out = tmp_path / f"run-{expected}"
        first = run_json("--requests", "300", "--out", str(out),
                         *(["--drift", drift] if drift else []))
        assert first["config"]["trace_drift_per_1k_requests"] == expected
        assert first["trace_info"]["parameters"]["drift_per_1k_requests"] == expected
        assert f"trace_drift_per_1k_requests = {expected}" in (out / "config.toml").read_text()
        again = run_json("--config", str(out / "config.toml"))
        assert again["token_hit_rate"] == first["token_hit_rate"]
        assert again["trace_info"] == first["trace_info"]
    refused = runner.invoke(app, ["run", "--trace", "wiki-trivia", "--drift", "0"])
    assert refused.exit_code == 2 and "only apply to the synthetic traces" in refused.output


def test_window_start_and_stage_shape_flags_reach_the_config_and_change_the_run():
    """The settings the reordering ablation and the stage fit turn, as flags: each lands in
    the run's config, and the synthetic-stage ones reach the stage model (speculation wastes
    another amount of GPU time with another shape of wrong lists)."""
    base = ["run", "--requests", "300", "--rate", "2", "--json"]
    runs = {}
    for name, extra in {"default": [], "arrival": ["--reorder-window-start", "arrival"],
                        "stages": ["--stage-keeps-d1-p", "1", "--stage-other-found-p", "1"]
                        }.items():
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(result.stdout)
    assert runs["arrival"]["config"]["reorder_window_start"] == "arrival"
    assert runs["default"]["config"]["reorder_window_start"] == "head"
    assert runs["stages"]["config"]["stage_keeps_d1_p"] == 1.0
    assert runs["stages"]["config"]["stage_other_found_p"] == 1.0
    assert runs["stages"]["speculation_wasted_s"] != runs["default"]["speculation_wasted_s"]


def test_the_table_shows_the_answer_cache_and_warns_when_a_tier_is_off():
    result = runner.invoke(app, ["run", "--answer-cache", "--trace", "wiki-trivia",
                                 "--requests", "100"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "answer cache hits" in line)
    summary = run_json("--answer-cache", "--trace", "wiki-trivia", "--requests", "100")
    assert f"{summary['answer_cache_hit_rate']:.1%}" in row and "off" in row
    # wiki-trivia has neither its questions' text nor embeddings: the semantic tier is off
    assert not summary["answer_cache_semantic"]
    assert any("semantic tier is off" in w for w in summary["warnings"])


def test_a_real_runs_table_says_measured_and_names_a_cpus_kv_memory(capsys):
    from ragsim.cli.run import _print_run_summary

    summary = run_json("--requests", "50")
    _print_run_summary({**summary, "backend": "torch", "device": "cpu"})
    shown = capsys.readouterr().out
    assert "real run" in shown and "measured" in shown and "KV memory (CPU)" in shown
    assert "simulated" not in shown and "GPU KV" not in shown
    _print_run_summary(summary)
    shown = capsys.readouterr().out
    assert "simulated" in shown and "GPU KV" in shown
