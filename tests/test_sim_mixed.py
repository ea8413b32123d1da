"""The mixed scheduler (``scheduler = "mixed"``: chunked prefill, as vLLM >= 0.4 and SGLang
run it) on hand-worked examples. Expected times are priced from the profile's grids directly,
step by step as the docstrings work them out, not read from the engine."""

from __future__ import annotations

import pytest
from test_sim import PROFILE

from ragsim.backends import runner
from ragsim.errors import RagsimInputError
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces.io import TraceBuilder

SEARCH_S = 0.05


def trace_of(rows: list[tuple[float, int, int, int]]):
    """rows: (arrival_s, document tokens, query tokens, output tokens), one document each."""
    b = TraceBuilder("mixed")
    for i, (t, doc, query, output) in enumerate(rows):
        b.add(i, t, query, output, [100 + i], [doc])
    return b.build({"name": "mixed"})


def config(scheduler: str, **overrides):
    return build_config({"system": "vllm", "scheduler": scheduler, "search_s": SEARCH_S,
                         "stage_source": "none", "max_batched_tokens": 2048, **overrides})


def test_a_long_prompt_alone_is_computed_in_chunks_of_the_token_budget():
    """5,000 + 100 tokens, no cache, a 2,048-token budget: chunks of 2,048, 2,048 and 1,004,
    each over what the earlier chunks computed; the first token comes after the last."""
    trace = trace_of([(0.0, 5000, 100, 3)])
    records = run_simulation(trace, config("mixed"), PROFILE).records
    at = PROFILE.prefill.at
    expected = SEARCH_S + at(0, 2048) + at(2048, 2048) + at(4096, 1004)
    assert records["first_token_s"][0] == pytest.approx(expected, rel=1e-12)
    prefill_first = run_simulation(trace, config("prefill-first"), PROFILE).records
    assert prefill_first["first_token_s"][0] == pytest.approx(SEARCH_S + at(0, 5100),
                                                              rel=1e-12)


def test_running_requests_keep_decoding_while_a_long_prompt_is_chunked():
    """A (320-token prompt) decodes 200 tokens; B (12,050-token prompt) arrives at 1 s while A
    decodes. Mixed steps give A a token in every step of B's prefill: B's prompt goes in six
    steps of 2,047 tokens (the budget less A's decode token), each costing B's chunk over
    what B computed before plus A's decode step at A's context then. Prefill-first runs B's
    prompt as one 12,050-token prefill, during which A gets no token."""
    trace = trace_of([(0.0, 300, 20, 200), (1.0, 12000, 50, 2)])
    mixed = run_simulation(trace, config("mixed"), PROFILE)
    prefill, decode = PROFILE.prefill.at, PROFILE.decode.at
    # A alone: its prompt in one step, then decode steps until B's search has ended (1.05 s)
    t = SEARCH_S + prefill(0, 320)
    assert mixed.records["first_token_s"][0] == pytest.approx(t, rel=1e-12)
    a_context = 321
    while t < 1.0 + SEARCH_S:
        t += decode(1, a_context)
        a_context += 1
    assert mixed.records["prefill_start_s"][1] == pytest.approx(t, rel=1e-12)
    done = 0
    for _ in range(6):
        take = min(2047, 12050 - done)
        t += prefill(done, take) + decode(1, a_context)
        done, a_context = done + take, a_context + 1
    assert done == 12050
    assert mixed.records["first_token_s"][1] == pytest.approx(t, rel=1e-12)
    assert mixed.summary["iterations_mixed"] == 6
    first = run_simulation(trace, config("prefill-first"), PROFILE)
    assert first.summary["iterations_mixed"] == 0
    b_start = first.records["prefill_start_s"][1]
    assert first.records["first_token_s"][1] == pytest.approx(b_start + prefill(0, 12050),
                                                              rel=1e-12)


def test_the_torch_engine_refuses_the_mixed_scheduler_with_a_clear_error():
    trace = trace_of([(0.0, 100, 10, 2)])
    with pytest.raises(RagsimInputError, match="prefill-first"):
        runner("torch")(trace, config("mixed"), PROFILE, None)


def test_an_unknown_scheduler_names_the_field():
    with pytest.raises(Exception, match="scheduler"):
        config("chunky")
