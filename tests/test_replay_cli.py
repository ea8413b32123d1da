"""``ragsim replay`` and the trace commands, end to end through the CLI."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers import interrupt_progress
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import builtin_trace

runner = CliRunner()

REQUIRED = {"requests", "doc_tokens", "hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens",
            "swap_in_bytes", "swap_out_bytes", "evictions_gpu", "evictions_host",
            "token_hit_rate", "elapsed_s", "requests_per_s", "config"}


def invoke_json(*args) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_replay_json_has_the_documented_fields_and_adds_up():
    s = invoke_json("replay", "--trace", "mmlu", "--requests", "3000", "--policy", "pgdsf",
                    "--gpu-mem", "2GiB", "--host-mem", "16GiB")
    assert s.keys() >= REQUIRED
    assert s["requests"] == 3000
    assert s["hit_tokens_gpu"] + s["hit_tokens_host"] + s["recomputed_tokens"] == \
        s["doc_tokens"]
    assert 0 < s["token_hit_rate"] < 1 and s["hit_tokens_host"] > 0
    assert s["config"]["kv_bytes_per_token"] == 131072
    assert s["config"]["gpu_capacity_bytes"] == 2 * 2**30


def test_replay_is_deterministic_for_a_seed():
    args = ("replay", "--trace", "nq", "--requests", "2000", "--seed", "5", "--policy", "lfu")
    a, b = invoke_json(*args), invoke_json(*args)
    for key in ("hit_tokens_gpu", "hit_tokens_host", "swap_out_bytes", "evictions_gpu"):
        assert a[key] == b[key]
    c = invoke_json("replay", "--trace", "nq", "--requests", "2000", "--seed", "6",
                    "--policy", "lfu")
    assert c["doc_tokens"] != a["doc_tokens"]


def test_llama2_kv_is_four_times_mistral_and_hits_less():
    mistral = invoke_json("replay", "--requests", "3000", "--model", "mistral-7b")
    llama = invoke_json("replay", "--requests", "3000", "--model", "llama2-7b")
    assert llama["config"]["kv_bytes_per_token"] == 4 * mistral["config"]["kv_bytes_per_token"]
    assert llama["token_hit_rate"] < mistral["token_hit_rate"]


def test_unbounded_capacity_recomputes_only_first_seen_pairs_and_zero_hits_nothing():
    trace = builtin_trace("mmlu", n_requests=3000)
    table = load_profile("a10g-mistral-7b")
    big = run_replay(trace, ReplayConfig(trace="mmlu", gpu_capacity_bytes=2**60,
                                         host_capacity_bytes=0), table).summary
    pairs = {}
    offsets = trace.doc_offsets.tolist()
    ids, toks = trace.doc_ids.tolist(), trace.doc_tokens_flat.tolist()
    for i in range(trace.n_requests):
        for d in range(offsets[i], offsets[i + 1]):
            pairs.setdefault(tuple(ids[offsets[i]: d + 1]), toks[d])
    assert big["recomputed_tokens"] == sum(pairs.values())
    assert big["evictions_gpu"] == 0
    for flat in (False, True):
        zero = run_replay(trace, ReplayConfig(trace="mmlu", gpu_capacity_bytes=0,
                                              host_capacity_bytes=0, flat=flat), table).summary
        assert zero["hit_tokens_gpu"] == zero["hit_tokens_host"] == 0
        assert zero["recomputed_tokens"] == zero["doc_tokens"]


def test_belady_bounds_the_online_policies_in_flat_mode():
    rates = {p: invoke_json("replay", "--requests", "4000", "--flat", "--gpu-mem", "8GiB",
                            "--host-mem", "0", "--policy", p)["token_hit_rate"]
             for p in ("belady", "lru", "lfu", "gdsf", "fifo", "pgdsf")}
    # Belady maximises object hits; token hits follow closely on this trace
    assert rates["belady"] >= max(v for k, v in rates.items() if k != "belady") * 0.98


def test_belady_tree_heuristic_runs_and_beats_lru():
    belady = invoke_json("replay", "--requests", "4000", "--policy", "belady")
    lru = invoke_json("replay", "--requests", "4000", "--policy", "lru")
    assert belady["token_hit_rate"] > lru["token_hit_rate"]


def test_replay_out_dir_and_human_output(tmp_path):
    result = runner.invoke(app, ["replay", "--requests", "500", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    records = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert len(records) == 500 and summary["requests"] == 500
    assert records["hit_tokens_gpu"].sum() == summary["hit_tokens_gpu"]
    # the table shows what the records add up to
    shown = " ".join(result.stdout.split())
    hit = records["hit_tokens_gpu"].sum() + records["hit_tokens_host"].sum()
    assert f"│ document tokens │ {records['doc_tokens'].sum():,} │" in shown
    assert f"│ token hit rate │ {hit / records['doc_tokens'].sum():.2%} │" in shown
    assert f"│ recomputed tokens │ {records['recomputed_tokens'].sum():,} │" in shown


@pytest.mark.parametrize("args,needle", [
    (["replay", "--policy", "arc"], "--policy"),
    (["replay", "--gpu-mem", "lots"], "--gpu-mem"),
    (["replay", "--trace", "missing.jsonl"], "missing.jsonl"),
    (["replay", "--model", "gpt-17"], "unknown model"),
    (["replay", "--profile", "h900-unknown"], "h900-unknown"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_trace_commands_round_trip(tmp_path, mooncake_sample):
    assert runner.invoke(app, ["trace", "generate", "nq", str(tmp_path / "nq"),
                               "--requests", "300"]).exit_code == 0
    assert runner.invoke(app, ["trace", "export-jsonl", str(tmp_path / "nq"),
                               str(tmp_path / "nq.jsonl")]).exit_code == 0
    assert runner.invoke(app, ["trace", "import-jsonl", str(tmp_path / "nq.jsonl"),
                               str(tmp_path / "nq2")]).exit_code == 0
    a = invoke_json("trace", "stats", str(tmp_path / "nq"))
    b = invoke_json("trace", "stats", str(tmp_path / "nq2"))
    for key in ("requests", "unique_documents_retrieved", "doc_tokens_retrieved",
                "top_3pct_share"):
        assert a[key] == b[key]
    result = runner.invoke(app, ["trace", "import-mooncake", str(mooncake_sample),
                                 str(tmp_path / "mc")])
    assert result.exit_code == 0, result.output
    s = invoke_json("replay", "--trace", str(tmp_path / "mc"), "--policy", "lru",
                    "--gpu-mem", "8GiB", "--host-mem", "64GiB")
    lines = [x for x in mooncake_sample.read_text().splitlines() if x.strip()]
    assert s["requests"] == len(lines)
    # Mooncake's blocks are the whole input: every input token is a document token
    assert s["doc_tokens"] == sum(json.loads(x)["input_length"] for x in lines)
    # with room for everything, worked out from the raw rows: a request hits the blocks of its
    # longest block-id prefix some earlier request had (512 tokens each, a partial last block
    # the first size seen), less the last token when that is its whole input (recomputed for
    # the first output token); a smaller LRU cache can only hit less
    unbounded = invoke_json("replay", "--trace", str(tmp_path / "mc"), "--gpu-mem", "1000TiB",
                            "--host-mem", "0")
    size, seen, expected = {}, set(), 0
    for row in map(json.loads, lines):
        blocks = row["hash_ids"]
        last = row["input_length"] - 512 * (len(blocks) - 1)
        for block, tokens in zip(blocks, [512] * (len(blocks) - 1) + [last], strict=True):
            size.setdefault(block, tokens)
        depth = 0
        while depth < len(blocks) and tuple(blocks[:depth + 1]) in seen:
            depth += 1
        expected += sum(size[b] for b in blocks[:depth]) - (depth == len(blocks))
        seen.update(tuple(blocks[:d + 1]) for d in range(len(blocks)))
    assert (unbounded["hit_tokens_gpu"], unbounded["hit_tokens_host"]) == (expected, 0)
    assert 0 < s["hit_tokens_gpu"] + s["hit_tokens_host"] <= expected


def test_trace_errors_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "query_tokens": 1, "output_tokens": 1, "doc_ids": []}\n')
    result = runner.invoke(app, ["trace", "import-jsonl", str(bad), str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "row 1" in result.output and "doc_ids" in result.output


def test_profiles_commands(tmp_path):
    listed = invoke_json("profiles", "list")["profiles"]
    assert any(p["name"] == "a10g-mistral-7b" for p in listed)
    p = invoke_json("profiles", "predict", "a10g-mistral-7b", "--cached", "0", "--new", "4000")
    # what the library prices, and inside the grid (its new-token axis ends at 16,384)
    profile = load_profile("a10g-mistral-7b")
    assert p["prefill_s"] == pytest.approx(profile.prefill_s(0, 4000), rel=1e-12)
    assert profile.prefill.y_axis[-1] == 16_384 and p["extrapolated"] is False
    far = invoke_json("profiles", "predict", "a10g-mistral-7b", "--cached", "0",
                      "--new", "100000")
    assert far["extrapolated"] is True
    assert far["prefill_s"] == pytest.approx(profile.prefill_s(0, 100_000), rel=1e-12)
    result = runner.invoke(app, ["profiles", "show", "a10g-mistral-7b", "--plot",
                                 str(tmp_path / "t.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "t.png").stat().st_size > 10_000
    assert "prefill seconds" in result.stdout
    bad = runner.invoke(app, ["profiles", "show", "no-such-profile"])
    assert bad.exit_code == 2 and "no-such-profile" in bad.output


@pytest.mark.parametrize("flat", [False, True])
def test_an_interrupted_replay_keeps_the_chunks_that_finished(flat):
    """Ctrl-C after the first chunk of 10,000 requests: the summary is exactly that of replaying
    those 10,000 alone (replay is deterministic and in trace order), marked interrupted."""
    profile = load_profile("a10g-mistral-7b")
    trace = builtin_trace("mmlu", n_requests=25_000)
    config = ReplayConfig(trace="mmlu", flat=flat, host_capacity_bytes=0 if flat else 8 * 2**30)

    def stop_after_first_chunk(done: int) -> None:
        raise KeyboardInterrupt

    cut = run_replay(trace, config, profile, stop_after_first_chunk)
    alone = run_replay(trace.head(10_000), config, profile)
    assert cut.summary["interrupted"] and not alone.summary["interrupted"]
    assert cut.summary["requests"] == alone.summary["requests"] == 10_000
    assert len(cut.records) == 10_000
    for key in ("doc_tokens", "hit_tokens_gpu", "hit_tokens_host", "token_hit_rate"):
        assert cut.summary[key] == alone.summary[key], key


def test_ctrl_c_in_replay_exits_130_with_what_finished(tmp_path, monkeypatch):
    interrupt_progress(monkeypatch)  # at the first report, after the first 10,000
    out = tmp_path / "o"
    result = runner.invoke(app, ["replay", "--requests", "25000", "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert "after the first 10,000 of 25,000 requests" in result.stderr
    assert json.loads((out / "summary.json").read_text())["requests"] == 10_000
    assert len(pd.read_parquet(out / "requests.parquet")) == 10_000


def test_trace_generate_records_the_built_in_drift_unless_told_otherwise(tmp_path):
    from ragsim.traces import read_trace
    from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

    for args, expected in (([], BUILTIN_DRIFT_PER_1K_REQUESTS), (["--drift", "0"], 0.0),
                           (["--drift", "0.3"], 0.3)):
        out = tmp_path / f"nq{len(args)}{expected}"
        result = runner.invoke(app, ["trace", "generate", "nq", str(out), "--requests", "300",
                                     *args])
        assert result.exit_code == 0, result.output
        assert read_trace(out).info["parameters"]["drift_per_1k_requests"] == expected
    bad = runner.invoke(app, ["trace", "generate", "nq", str(tmp_path / "x"), "--drift", "1.5"])
    assert bad.exit_code == 2 and "--drift" in bad.output
    shown = runner.invoke(app, ["trace", "generate", "--help"], env={"COLUMNS": "300"})
    drift_line = next(line for line in shown.stdout.splitlines() if "--drift" in line)
    assert f"[default: {BUILTIN_DRIFT_PER_1K_REQUESTS:g}]" in drift_line


def test_generator_settings_for_a_recorded_trace_are_refused():
    from ragsim.traces import resolve_trace

    with pytest.raises(ValueError, match="drift_per_1k_requests only apply to the synthetic"):
        resolve_trace("wiki-trivia", drift_per_1k_requests=0.0)
