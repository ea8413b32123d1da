"""The real harness: the serving pipeline in real time on a real (tiny) model.

What is checked does not depend on how fast this machine is: in sequential mode (one request at
a time) the simulator and the real run must make the same cache decisions, request by request
(the decisions are the policy core's, the timing is not involved); the real KV store must hold
exactly what the tree says is where, with every move a real copy and no budget exceeded; cached
generation must produce the tokens uncached generation does; a GPU failure must drop the GPU's
tensors and recover. Timing accuracy is the validator's business (``ragsim validate``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401 - [profile] is in [dev]: missing is a broken set-up, not a skip

from ragsim.profiles.profile import load_profile
from ragsim.realrun.harness import RealRun, run_real
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

PROFILE = "cpu-mistral-7b-l2-h256"
KV = load_profile(PROFILE).model.kv_bytes_per_token  # 2,048 B: 2 layers, 1 KV head, dim 128


def small_trace(n: int = 36, seed: int = 3, outputs=lambda i: 3):
    """Skewed retrieval over 10 documents of 30-120 tokens, 3 per request, short outputs
    (``outputs(i)`` tokens for request i): small enough that a few hundred kilobytes of GPU and
    host memory force evictions and swaps."""
    rng = np.random.default_rng(seed)
    sizes = {d: int(rng.integers(30, 121)) for d in range(10)}
    weights = 1.0 / np.arange(1, 11)
    weights /= weights.sum()
    b = TraceBuilder("harness-test")
    for i in range(n):
        docs = [int(d) for d in rng.choice(10, size=3, replace=False, p=weights)]
        b.add(i, 0.05 * i, int(rng.integers(4, 12)), outputs(i), docs,
              [sizes[d] for d in docs])
    return b.build({"name": "harness-test"})


def config(system: str, **flags):
    given = {"trace": "mmlu", "system": system, "profile": PROFILE, "arrival": "sequential",
             "speculate": False, "search_s": 0.002, **flags}
    return build_config(given)


def tiers_of_tree(tree) -> tuple[set, set]:
    """(nodes in GPU, nodes with a host copy), walking the tree."""
    gpu, host = set(), set()
    stack = [tree.root]
    while stack:
        node = stack.pop()
        for child in (node.children or {}).values():
            if child.in_gpu:
                gpu.add(child)
            if child.host_copy:
                host.add(child)
            stack.append(child)
    return gpu, host


def real_run(trace, cfg) -> RealRun:
    run = RealRun(trace, cfg, load_profile(PROFILE))
    run.result = run.run()
    return run


MEMORY = {"gpu_kv_bytes": 1_000 * KV, "host_cache_bytes": 500 * KV}


@pytest.mark.parametrize("policy", ["pgdsf", "lru"])
@pytest.mark.parametrize("system", ["ragcache", "sglang", "vllm-apc", "vllm"])
def test_sequential_real_and_simulated_runs_cache_the_same_tokens(system, policy):
    trace = small_trace()
    cfg = config(system, policy=policy, **MEMORY)
    real = real_run(trace, cfg)
    sim = run_simulation(trace, cfg, load_profile(PROFILE))
    r, s = real.result.columns, sim.columns
    assert (r["status"] == "completed").all()
    for column in ("cached_tokens", "hit_tokens_gpu", "hit_tokens_host", "recomputed_tokens",
                   "swap_in_bytes"):
        assert r[column].tolist() == s[column].tolist(), column
    # the case is not trivial: hits in both tiers, and the tree moved nodes between them
    if system == "ragcache":
        assert r["hit_tokens_gpu"].sum() > 0 and r["hit_tokens_host"].sum() > 0
        moves = real.result.summary["engine_moves"]
        assert moves.get("swap_out", 0) > 0 and moves.get("swap_in", 0) > 0
    # the real store holds what the tree says, where it says, in the tree's byte budgets
    gpu, host = tiers_of_tree(real.tree)
    store = real.iterations.store
    assert set(store.gpu) - {real.tree.root} == gpu
    assert set(store.host) == host
    assert store.gpu_bytes <= real.tree.gpu_capacity_bytes
    assert store.host_bytes <= real.tree.host_capacity_bytes
    assert store.gpu_bytes == sum(n.tokens for n in gpu) * KV + real.tree.root.size_bytes


def test_cached_generation_gives_the_tokens_of_uncached_generation():
    trace = small_trace(n=20)
    cached = real_run(trace, config("ragcache", **MEMORY))
    uncached = real_run(trace, config("vllm"))  # no cache: every token computed
    assert cached.result.columns["cached_tokens"].sum() > 0
    assert uncached.result.columns["hit_tokens_gpu"].sum() == 0
    assert cached.iterations.outputs == uncached.iterations.outputs
    assert all(len(tokens) == 3 for tokens in cached.iterations.outputs.values())


def test_a_gpu_failure_drops_the_gpu_tensors_and_the_run_recovers():
    trace = small_trace(n=24)
    cfg = config("ragcache", fail_gpu_at_s=[0.3], gpu_recovery_s=0.05, **MEMORY)
    run = real_run(trace, cfg)
    summary = run.result.summary
    assert summary["gpu_failures"] == 1
    assert summary["requests_completed"] == 24
    assert summary["engine_moves"].get("fail_gpu", 0) > 0
    gpu, host = tiers_of_tree(run.tree)
    assert set(run.iterations.store.gpu) - {run.tree.root} == gpu
    assert set(run.iterations.store.host) == host


def test_open_loop_real_run_writes_the_simulators_columns():
    trace = small_trace(n=12)
    cfg = build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                        "rate_rps": 20.0, "search_s": 0.002})
    real = run_real(trace, cfg, load_profile(PROFILE))
    sim = run_simulation(trace, cfg, load_profile(PROFILE))
    assert set(real.columns) == set(sim.columns)
    assert set(sim.summary) <= set(real.summary)
    assert real.summary["backend"] == "torch"
    assert real.summary["allocator"] in ("glibc", "tcmalloc", "jemalloc", "mimalloc")
    assert real.summary["requests_completed"] == 12
    ttft = real.columns["ttft_s"]
    assert np.isfinite(ttft).all() and (ttft > 0).all()
    # the same arrivals (re-timed with the same seed) in both
    assert real.columns["arrival_s"].tolist() == pytest.approx(sim.columns["arrival_s"].tolist())


def test_each_torch_run_knows_the_step_sizes_its_process_had_run_before_it():
    """What a step pays the first time stays paid for the process (``torch_model.
    step_tokens_run``), as vLLM's engines' sizes do: a run starts after its warm-up (prompts of
    32 and 16 tokens in one 48-token pass, then a decode step of their 2 rows), and a second
    run in the same process after every step of the first too (prefills counted by their new
    tokens, decode steps by their rows, as the simulator counts them), which validate's
    simulation of it is told (``validation.warmed_like``)."""
    from ragsim.validation import priced_step_table, warmed_like

    trace = small_trace(n=8)
    cfg = build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                        "rate_rps": 20.0, "search_s": 0.002})
    profile = load_profile(PROFILE)
    first = run_real(trace, cfg, profile)
    second = run_real(trace, cfg, profile)
    first_warm, second_warm = first.engine_warm_step_tokens, second.engine_warm_step_tokens
    assert {48, 2} <= set(first_warm)
    assert first.summary["engine_warm_step_tokens"] == len(first_warm)
    assert first.summary["engine_warm_step_token_counts"] == list(first_warm)
    assert len(set(second_warm)) == len(second_warm)  # each count once, at its last run
    steps = {int(row["step_tokens"]) for row in priced_step_table(first, profile)}
    assert steps and steps <= set(second_warm)
    assert warmed_like(profile, second).new_shapes.warm_step_tokens[-len(second_warm):] \
        == tuple(second_warm)


def test_batched_generation_gives_the_tokens_of_one_request_at_a_time():
    """All requests at once: prefills of mixed cached lengths share passes, and the decode
    batch changes at every join and leave (rows taken from the last step's cache, joiners
    copied in). Greedy tokens must be those of the same requests served one at a time. Outputs
    of 2-7 tokens keep rows in the batch while others leave and join."""
    trace = small_trace(n=16, outputs=lambda i: 2 + i % 6)
    burst = {"arrival": "poisson", "rate_rps": 1e6, "max_prefill_bs": 4}
    batched = real_run(trace, config("ragcache", **MEMORY, **burst))
    alone = real_run(trace, config("vllm"))
    summary = batched.result.summary
    assert summary["iterations_prefill"] < 16  # requests shared prefill passes
    assert summary["engine_decode_rebuilds"] >= 1 and summary["engine_decode_reshapes"] >= 1
    outputs = batched.iterations.outputs
    assert outputs == alone.iterations.outputs
    assert [len(outputs[i]) for i in range(16)] == [2 + i % 6 for i in range(16)]


def test_cost_model_errors_flag_iterations_past_the_profile():
    """The shipped CPU profile measured prefills up to 2,048 cached and 3,072 new tokens and
    decode steps up to 16 requests of 2,048 tokens: iterations past that are flagged."""
    from ragsim.realrun.harness import cost_model_errors

    profile = load_profile(PROFILE)
    assert (max(profile.prefill.x_axis), max(profile.prefill.y_axis)) == (2048, 3072)
    assert (max(profile.decode.x_axis), max(profile.decode.y_axis)) == (16, 2048)
    log = [("prefill", [0], [500], 0.05, 0.0, 0.0),             # inside
           ("prefill", [0, 0], [2000, 1900], 1.0, 0.0, 0.0),    # padded 2 x 2,000 > 3,072: past
           ("prefill", [3000], [100], 0.05, 0.0, 0.0),          # 3,000 cached > 2,048: past
           ("decode", 64, 500.0, 0.2, False, 0.0, 501),            # 64 requests > 16: past
           ("decode", 8, 1000.0, 0.01, False, 0.0, 1001)]           # inside
    errors = cost_model_errors(log, profile)
    assert errors["prefill_single"]["beyond_profile_iterations"] == 1
    assert errors["prefill_single"]["beyond_profile_measured_s"] == pytest.approx(0.05)
    assert errors["prefill_batch"]["beyond_profile_iterations"] == 1
    assert errors["decode"]["beyond_profile_iterations"] == 1
    assert errors["decode"]["beyond_profile_measured_s"] == pytest.approx(0.2)
    assert errors["decode"]["measured_s"] == pytest.approx(0.21)


class _SlowHandBack(RealRun):
    """A real run whose engine thread spends ``PAUSE_S`` handing each first token back, between
    two iterations (what a slow serving loop does)."""

    PAUSE_S = 0.04

    def prefilled(self, job) -> None:
        import time

        time.sleep(self.PAUSE_S)
        super().prefilled(job)


def test_the_torch_runs_clock_counts_the_engines_time_between_iterations():
    """Two requests arriving together, one prompt an iteration: the second waits for the first's
    prefill and for the 40 ms its engine thread then spends before the next iteration, on the
    wall as on the run's clock. A clock moved only by each iteration's own duration (before
    2026-12-07) gave the second a TTFT of the two prefills alone; by hand, the second's TTFT is
    at least the first's plus the pause, and the pause is the engine's time between steps."""
    b = TraceBuilder("loop-clock")
    for i in range(2):
        b.add(i, 0.0, 8, 2, [i], [40])
    trace = b.build({"name": "loop-clock"})
    cfg = build_config({"trace": "mmlu", "system": "vllm", "profile": PROFILE,
                        "max_prefill_bs": 1, "search_s": 0.001, "speculate": False,
                        "cache": False})
    run = _SlowHandBack(trace, cfg, load_profile(PROFILE), speed_probes=False)
    result = run.run()
    first, second = sorted(result.columns["ttft_s"])
    assert second - first >= _SlowHandBack.PAUSE_S
    iterations = run.iterations
    assert iterations.between_steps >= 1
    assert iterations.between_steps_s >= _SlowHandBack.PAUSE_S
    assert result.summary["engine_between_steps_s"] == iterations.between_steps_s
    # the second prompt's prefill began as the first's step ended: one request taken in while
    # busy, under the name vLLM's run counts its own by (what the loop's fit reads)
    assert iterations.requests_after_step == 1
    assert result.summary["engine_requests_while_busy"] == 1
    # the second prompt's step began after the pause, and each step's stamps hold its work
    prefills = [d for d in iterations.decisions if d["kind"] == "prefill"]
    assert len(prefills) == 2
    assert prefills[1]["start_s"] - prefills[0]["end_s"] >= _SlowHandBack.PAUSE_S
    logged = [entry[3] for entry in iterations.log if entry[0] == "prefill"]
    for decision, seconds in zip(prefills, logged, strict=True):
        assert decision["end_s"] - decision["start_s"] >= seconds
    # each step keeps the time of its timed passes, within its own: the rest is the engine's
    # work around them, which validate measures on its probe runs (``passes_s``)
    for decision in iterations.decisions:
        assert 0 < decision["passes_s"] <= decision["end_s"] - decision["start_s"]
    # the second began as the first ended (no wait for work between them): the time between
    # was the loop's, not a pause for the profile's cold start to price
    pauses = [entry[5] for entry in iterations.log if entry[0] == "prefill"]
    assert pauses[0] == float("inf") and pauses[1] == 0.0


class _GcWatched(RealRun):
    """A real run that notes whether the cyclic garbage collector could run as its clock
    starts and its front end begins searching."""

    def start_searches_at_arrivals(self) -> None:
        import gc

        self.gc_enabled_at_clock_start = gc.isenabled()
        super().start_searches_at_arrivals()


def test_no_garbage_collection_can_stall_a_run_once_its_clock_starts():
    """The collector is paused from before the clock starts to after the run, and back on after
    it: a full collection of a validation's heap took 273 ms in the search front end's thread
    at an overload run's start, every request waiting behind it, where the pipeline's own pause
    began only after the front end had begun."""
    import gc

    assert gc.isenabled()
    cfg = build_config({"trace": "mmlu", "system": "ragcache", "profile": PROFILE,
                        "rate_rps": 20.0, "search_s": 0.002})
    run = _GcWatched(small_trace(n=4), cfg, load_profile(PROFILE), speed_probes=False)
    run.run()
    assert run.gc_enabled_at_clock_start is False
    assert gc.isenabled()


def test_the_heap_is_grown_before_the_clock_by_the_largest_batch_the_run_can_hold():
    """Before its clock, a torch run on a CPU grows its heap by its largest decode batch's
    buffers (a serving engine sets its KV memory up at start). By hand, for three requests of
    10 document + 5 question + 4 output tokens, at most 2 running at once, on the profile's
    model (2 layers, 1 KV head of 128, fp32: 2 x 2 x 128 x 4 = 2,048 bytes a token): 2 rows
    + 4 spare = 6, 19 tokens + 64 spare = 83, grown once by a quarter + 64 -> 83 + 20 + 64 =
    167 tokens; 6 x 167 x 2,048 bytes."""
    from ragsim.profiles.decode_layout import GROWTH_EXTRA_TOKENS

    b = TraceBuilder("heap")
    for i in range(3):
        b.add(i, 0.0, 5, 4, [i], [10])
    trace = b.build({"name": "heap"})
    cfg = build_config({"trace": "mmlu", "system": "vllm", "profile": PROFILE,
                        "max_batch_size": 2, "search_s": 0.001, "cache": False})
    spec = load_profile(PROFILE).model
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype) == (2, 1, 128,
                                                                              "fp32")
    assert GROWTH_EXTRA_TOKENS == 64
    result = RealRun(trace, cfg, load_profile(PROFILE), speed_probes=False).run()
    assert result.summary["heap_grown_before_clock_bytes"] == 6 * 167 * 2048
    assert result.summary["heap_grown_before_clock_s"] >= 0
    # the pages faulted growing it and while serving: counted, whatever the allocator kept
    assert result.summary["heap_grown_before_clock_minor_page_faults"] >= 0
    assert result.summary["minor_page_faults_while_serving"] >= 0
    assert result.summary["major_page_faults_while_serving"] >= 0
