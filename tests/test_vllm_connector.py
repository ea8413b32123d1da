"""``--backend vllm --system ragcache``: the knowledge tree as vLLM's host tier, on vLLM's engine.

Every request here is served with vLLM's own prefix cache emptied before it (the fast tier
cold), so every hit must come from the connector's host tier: the KV it copied out of vLLM's
blocks while an earlier request ran, copied back into new blocks. Checked against a plain
vLLM run (no cache at all): greedy outputs token for token, and the hits against the documents'
prefixes worked by hand. Needs vLLM's engine (``bash .ci/run-vllm``), like test_vllm_backend.py.
"""

from __future__ import annotations

import pytest
from greedy_ties import TIE_LOGPROB, parting
from test_vllm_backend import _engine_here

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.traces import resolve_trace

pytestmark = pytest.mark.vllm_engine

PROFILE = "cpu-mistral-7b-l2-h256"
BLOCK = 32
N = 16
SYSTEM = 40  # a system prompt of one whole block and a part: the root's copy is tested too
MiB = 2**20


@pytest.fixture(autouse=True, scope="module")
def _the_engine_is_here():
    assert _engine_here(), "needs vLLM's engine (its CPU build: bash .ci/run-vllm, docs/vllm.md)"


def _config(system: str, **more):
    flags = {"trace": "mmlu", "system": system, "n_requests": N, "arrival": "sequential",
             "gpu_kv_bytes": 64 * MiB, "profile": PROFILE, "system_prompt_tokens": SYSTEM,
             **more}
    if system == "ragcache":
        flags.update(speculate=False, reorder=False, prefix_block_tokens=BLOCK)
    return build_config(flags)


def _serve(config, cold_gpu: bool):
    from ragsim.realrun.vllm.harness import VllmRun
    from ragsim.serving.pipeline import requests_to_run

    class Run(VllmRun):
        """With ``cold_gpu``, vLLM's prefix cache is emptied after each request (sequential:
        none is running), so that every hit comes from the connector's host tier."""

        logprobs_top = 2  # the best two tokens' log-probabilities, at every step
        # vLLM's dummy weights (+-0.001) leave the output nearly blind to the context: a test
        # on them passes with every loaded block halved; these make it see the KV
        weights_std = 0.1

        def _on_output(self, output) -> None:
            super()._on_output(output)
            if output.finished and cold_gpu:
                assert self.llm.reset_prefix_cache()

    trace = requests_to_run(resolve_trace("mmlu", seed=0, n_requests=N), config)
    run = Run(trace, config, load_profile(PROFILE), seed=0, speed_probes=False)
    return run, run.run(), trace


@pytest.fixture(scope="module")
def runs():
    return {
        "plain": _serve(_config("vllm"), cold_gpu=False),
        # room for everything: the tree keeps every document it saw (its GPU tier)
        "roomy": _serve(_config("ragcache", host_cache_bytes=256 * MiB), cold_gpu=True),
        # a GPU tier of 3,584 tokens (documents: 401-1,290 tokens, prompts up to 3,042) and a
        # host tier of 1,536: swap-outs, drops of what the host cannot take, host evictions
        "tight": _serve(_config("ragcache", gpu_kv_bytes=7 * MiB, host_cache_bytes=3 * MiB),
                        cold_gpu=True),
    }


def _until_parting(first: list[int], second: list[int]) -> list[int]:
    """``first``'s tokens up to the first step where ``second`` has another."""
    cut = next((k for k, (a, b) in enumerate(zip(first, second, strict=True)) if a != b),
               len(first))
    return first[:cut]


def _docs(trace, i):
    lo, hi = trace.doc_offsets[i], trace.doc_offsets[i + 1]
    return [int(d) for d in trace.doc_ids[lo:hi]], [int(t) for t in trace.doc_tokens_flat[lo:hi]]


def test_greedy_outputs_are_identical_with_and_without_the_host_tier(runs):
    plain = runs["plain"][0]
    # the outputs depend on the prompt (else this test could not fail)
    assert len({tuple(plain.outputs[i]) for i in range(N)}) > N // 2
    for name in ("roomy", "tight"):
        run, result, _ = runs[name]
        assert run.prompts == plain.prompts
        assert (result.columns["hit_tokens_host"] > 0).sum() >= 3  # loads were exercised
        for i in range(N):  # token for token, up to a tie (tests/greedy_ties.py)
            said = parting(plain.outputs[i], run.outputs[i], plain.logprobs[i],
                           run.logprobs[i])
            assert said is None, f"{name}: request {i}: {said}"
        # and the chosen tokens' log-probabilities agree to float rounding (measured: 9e-6;
        # with the loaded blocks scaled by 0.99 the greedy tokens themselves change), up to
        # where two runs part at a tie
        worst = max(abs(run.logprobs[i][k][t] - plain.logprobs[i][k][t])
                    for i in range(N)
                    for k, t in enumerate(_until_parting(plain.outputs[i], run.outputs[i])))
        assert worst < TIE_LOGPROB, name


def test_host_hits_are_the_documents_prefixes_worked_by_hand(runs):
    """Nothing is evicted: request i hits the longest document path an earlier request
    retrieved (after the system prompt, cached by the first request), in whole blocks of 32,
    never its last token."""
    run, result, trace = runs["roomy"]
    cols = result.columns
    seen: set[tuple[int, ...]] = set()
    expected, expected_tree = [], []
    for i in range(N):
        docs, tokens = _docs(trace, i)
        k = max((j for j in range(len(docs) + 1) if tuple(docs[:j]) in seen), default=0)
        prefix = SYSTEM + sum(tokens[:k]) if i else 0  # the first computes the system prompt
        expected.append(min(prefix, len(run.prompts[i]) - 1) // BLOCK * BLOCK)
        expected_tree.append(sum(tokens[:k]))
        seen.update(tuple(docs[:j]) for j in range(1, len(docs) + 1))
    assert sum(e > 0 for e in expected) >= 3
    assert cols["hit_tokens_host"].tolist() == expected
    assert cols["hit_tokens_gpu"].tolist() == [0] * N  # vLLM's own cache was emptied
    assert cols["cached_tokens"].tolist() == expected  # vLLM's num_cached_tokens
    tree = (cols["tree_hit_tokens_gpu"] + cols["tree_hit_tokens_host"]).tolist()
    assert tree == expected_tree
    summary = result.summary
    assert summary["vllm_counters"]["external_prefix_cache_hits"] == sum(expected)
    assert summary["host_tier"]["blocks_loaded"] == sum(expected) // BLOCK
    assert summary["evictions_gpu"] == 0 and summary["host_tier"]["copies_freed"] == 0


def test_the_connectors_work_is_timed_and_each_steps_saves_recorded(runs):
    """Nothing is evicted: the worker saves, once, the whole blocks that end inside the
    documents each request is the first to retrieve (in their prefix context), and the system
    prompt's one whole block; worked by hand from the trace. Each recorded step carries the
    tokens its worker saved (what the replay prices: ``decisions.priced_s``), and the
    connector's timers have seen every request, save and load (``loop.connector_costs``)."""
    from ragsim.realrun.vllm.loop import connector_costs

    _, result, trace = runs["roomy"]
    seen: set[tuple[int, ...]] = set()
    saved_blocks = SYSTEM // BLOCK
    for i in range(N):
        docs, tokens = _docs(trace, i)
        k = max((j for j in range(len(docs) + 1) if tuple(docs[:j]) in seen), default=0)
        start, end = SYSTEM + sum(tokens[:k]), SYSTEM + sum(tokens)
        saved_blocks += end // BLOCK - start // BLOCK
        seen.update(tuple(docs[:j]) for j in range(1, len(docs) + 1))
    tier = result.summary["host_tier"]
    assert tier["blocks_saved"] == tier["blocks_copied_out"] == saved_blocks
    assert tier["blocks_copied_in"] == tier["blocks_loaded"] > 0
    steps = result.decisions["iterations"]
    assert sum(s["saved_tokens"] for s in steps) == saved_blocks * BLOCK
    assert sum(s["requests_started"] for s in steps) == N
    assert tier["requests_served"] == N
    assert tier["scheduler_s"] > tier["tree_access_s"] > 0
    costs = connector_costs([result.summary])
    assert costs["tokens_saved"] == saved_blocks * BLOCK
    assert costs["request_s"] > 0 and costs["save_s_per_token"] > 0
    assert costs["load_s_per_token"] > 0


def test_under_eviction_vllm_loads_exactly_what_the_tree_holds(runs):
    """The tree swaps documents out to its host tier and drops them from there (PGDSF);
    each request loads the whole blocks of the prefix the tree reports cached, no more."""
    run, result, _ = runs["tight"]
    cols, summary = result.columns, result.summary
    assert summary["evictions_gpu"] > 0 and summary["evictions_host"] > 0
    assert summary["host_tier"]["copies_freed"] > 0
    assert cols["tree_hit_tokens_host"].sum() > 0
    for i in range(N):
        # the tree holds the system prompt from the start; vLLM computes it with request 0
        tree = (SYSTEM if i else 0) + int(cols["tree_hit_tokens_gpu"][i]
                                          + cols["tree_hit_tokens_host"][i])
        hit = min(tree, len(run.prompts[i]) - 1) // BLOCK * BLOCK
        assert int(cols["hit_tokens_host"][i]) == hit, f"request {i}"
    # the worker holds the tree's two tiers, no more
    held = summary["host_tier"]["peak_bytes_held"]
    kv = summary["kv_bytes_per_token"]
    assert held <= 7 * MiB + 3 * MiB + SYSTEM * kv


def test_cli_run_ragcache_on_vllm(tmp_path):
    import json

    import pandas as pd
    from typer.testing import CliRunner

    from ragsim.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", "--backend", "vllm", "--system", "ragcache", "--no-speculate", "--no-reorder",
        "--block-tokens", str(BLOCK), "--requests", "6", "--rate", "4", "--gpu-mem", "16MiB",
        "--host-mem", "64MiB", "--profile", PROFILE, "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["backend"] == "vllm" and summary["requests_completed"] == 6
    assert summary["vllm_engine"]["kv_connector"] == "RagsimTreeConnector"
    assert summary["host_tier"]["blocks_saved"] > 0
    assert summary["config"]["host_cache_bytes"] == 64 * MiB
    records = pd.read_parquet(out / "requests.parquet")
    assert {"tree_hit_tokens_gpu", "tree_hit_tokens_host"} <= set(records.columns)
    # vLLM's hits (its cache, then the connector's) add up to what vLLM reports cached
    assert (records["hit_tokens_gpu"] + records["hit_tokens_host"]
            == records["cached_tokens"]).all()
