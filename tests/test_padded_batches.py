"""A padded engine's batcher: a prompt joins a batch only where that costs less than apart.

Expected batches are worked out by hand from the rule (``padded_batches``) and the shapes: a
padded step costs every row what its longest prompt computes, so one long prompt beside five
short ones makes six long rows, while short prompts of one length share a step's fixed cost.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragsim.cache.padded_batches import joining_is_cheaper
from ragsim.errors import ConfigError
from ragsim.profiles.profile import load_profile
from ragsim.realrun.harness import RealRun
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

TORCH_PROFILE = "cpu-mistral-7b-l2-h256"  # the torch engine's: batches left-padded, masked
VARLEN_PROFILE = "a10g-mistral-7b"  # vLLM-like: every request its own tokens
LONG_TOKENS, SHORT_TOKENS = 1500, 60


def padded_price_s(cached: list[float], new: list[float]) -> float:
    """A padded step by hand: 10 ms fixed, 0.1 ms per padded token (rows x longest)."""
    return 0.010 + 1e-4 * len(new) * max(new)


def test_a_long_prompt_stays_apart_from_short_ones_and_a_like_one_joins():
    # together 0.010 + 3 x 2,000 x 1e-4 = 0.610 s; apart (0.010 + 0.020) + (0.010 + 0.200)
    assert not joining_is_cheaper(padded_price_s, [0, 0], [100, 100], 0, 2000)
    # together 0.010 + 0.030 = 0.040 s; apart 0.030 + 0.020 = 0.050 s
    assert joining_is_cheaper(padded_price_s, [0, 0], [100, 100], 0, 100)
    # an empty batch takes anything; a tie joins (the second row adds only its tokens)
    assert joining_is_cheaper(padded_price_s, [], [], 0, 10**6)
    assert joining_is_cheaper(lambda c, n: 1.0, [5], [7], 0, 9)


def burst(long_first: bool = True):
    """One long prompt and five short ones, ready at once (their searches end together)."""
    b = TraceBuilder("padded-burst")
    sizes = [LONG_TOKENS] + [SHORT_TOKENS] * 5
    if not long_first:
        sizes = sizes[1:] + sizes[:1]
    for i, tokens in enumerate(sizes):
        b.add(i, 0.0, 10, 1, [i], [tokens])
    return b.build({"name": "padded-burst"})


def config(join: str, **extra):
    return build_config({"system": "ragcache", "speculate": False, "reorder": False,
                         "search_s": 0.001, "search_workers": 8, "stage_source": "none",
                         "host_cache_bytes": 0, "host_replicas": 0, "padded_join": join,
                         **extra})


@pytest.mark.parametrize("long_first", [True, False])
def test_the_simulated_torch_engine_runs_the_long_prompt_in_a_step_of_its_own(long_first):
    profile = load_profile(TORCH_PROFILE)
    # the inputs behind the expectation: six padded long rows cost far more than apart
    assert (profile.prefill_pass_s([0] * 6, [LONG_TOKENS + 10] + [SHORT_TOKENS + 10] * 5)
            > 2 * (profile.prefill_pass_s([0], [LONG_TOKENS + 10])
                   + profile.prefill_pass_s([0] * 5, [SHORT_TOKENS + 10] * 5)))
    trace = burst(long_first)
    greedy = run_simulation(trace, config("always"), profile)
    apart = run_simulation(trace, config("if-cheaper"), profile)
    assert greedy.summary["iterations_prefill"] == 1
    assert greedy.summary["prompts_padded_apart"] == 0
    # the long prompt in its own step, the five short ones together in another
    assert apart.summary["iterations_prefill"] == 2
    assert apart.summary["prompts_padded_apart"] == 1
    starts = np.asarray(apart.columns["prefill_start_s"])
    long_row = 0 if long_first else 5
    short_rows = [r for r in range(6) if r != long_row]
    assert len(set(starts[short_rows].tolist())) == 1
    assert starts[long_row] != starts[short_rows[0]]
    ttft = np.asarray(apart.columns["ttft_s"])
    assert ttft.mean() < 0.5 * np.asarray(greedy.columns["ttft_s"]).mean()


def test_a_varlen_engine_batches_every_prompt_whatever_the_rule():
    profile = load_profile(VARLEN_PROFILE)
    for join in ("always", "if-cheaper"):
        result = run_simulation(burst(), config(join), profile)
        assert result.summary["iterations_prefill"] == 1
        assert result.summary["prompts_padded_apart"] == 0


def test_the_real_torch_engine_keeps_the_long_prompt_apart_too():
    """The same rule in the real harness (one serving pipeline): the long prompt never shares
    a step with a short one, and the run says how many prompts waited for a step apart."""
    trace = burst()
    run = RealRun(trace, config("if-cheaper", arrival="trace"), load_profile(TORCH_PROFILE))
    result = run.run()
    assert (result.columns["status"] == "completed").all()
    starts = np.asarray(result.columns["prefill_start_s"])
    assert all(starts[0] != starts[r] for r in range(1, 6))
    assert result.summary["prompts_padded_apart"] >= 1


def test_an_unknown_rule_is_refused_by_name():
    with pytest.raises(ConfigError, match="padded_join"):
        config("sometimes")


def test_a_prompt_left_apart_waits_no_longer_than_the_reordering_window():
    """Cache-aware order prefers short prompts on a cached document; the long uncached one,
    passed over by the order and kept out of their padded batches, still gets a step of its
    own once the window has run out, as any request would."""
    window_s = 0.1
    b = TraceBuilder("padded-window")
    b.add(0, 0.0, 10, 1, [1], [400])  # caches document 1 for the short prompts
    for row in range(1, 16):  # a queue of short prompts on document 1
        b.add(row, 0.03, 12, 1, [1], [400])
    long_row = 16
    b.add(long_row, 0.031, 10, 1, [2], [LONG_TOKENS])
    for row in range(17, 417):  # and more of them every millisecond
        b.add(row, 0.032 + 0.001 * (row - 17), 12, 1, [1], [400])
    trace = b.build({"name": "padded-window"})
    profile = load_profile(TORCH_PROFILE)
    run = run_simulation(trace, config("if-cheaper", reorder=True, order="cache-aware",
                                       reorder_window_s=window_s), profile)
    starts = np.asarray(run.columns["prefill_start_s"])
    wait_s = starts[long_row] - run.columns["search_end_s"][long_row]
    # the window ends during a step of short prompts: at most one such step after it
    step_s = profile.prefill_pass_s([400] * 8, [12] * 8)
    assert run.summary["reordered_decisions"] > 0
    assert window_s <= wait_s <= window_s + 2 * step_s
    assert run.summary["prompts_padded_apart"] >= 1
    assert np.sum(starts == starts[long_row]) == 1  # its step holds it alone


def test_a_join_weighed_past_the_grid_is_not_counted_as_the_runs_extrapolation():
    """The batcher prices batches that may never run; a run's ``cost_extrapolations`` counts
    the steps it priced outside the measured region, not the batcher's questions."""
    profile = load_profile(TORCH_PROFILE)
    rows = [0] * 8, [4 * int(max(profile.prefill.y_axis))] * 8  # far past the grid
    before = profile.extrapolated_queries
    quoted = profile.prefill_pass_quote_s(*rows)
    assert profile.extrapolated_queries == before
    assert quoted == profile.prefill_pass_s(*rows)
    assert profile.extrapolated_queries > before  # the same pass, priced as a step, counts
