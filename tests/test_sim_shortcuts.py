"""The simulator's two shortcuts change how fast it steps, never what it simulates: every
record and counter equals stepping's, to the last bit.

* Decode runs (``Engine._decode_run``): decode steps of an unchanging batch waited for as one.
* Search stages that change nothing are not stopped at (``Pipeline._changing_stages``).

The second implementation is the same simulator stepping through everything, as it does with
a real engine and a real search: the iterations object's ``decode_durations`` taken away (the
engine prices and waits for every decode step) and the stages observed one by one."""

from __future__ import annotations

import contextlib
import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import KV, PROFILE, _comparable, _modelled, knobs, make_trace, rows

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.predicted import PredictedIterations
from ragsim.sim.simulator import Simulation
from ragsim.traces import resolve_trace
from ragsim.traces.io import TraceBuilder

SQRT_5 = math.sqrt(5)
# the same profile for an engine that pads its decode batch to a common end (the torch
# engine's ``decode_padding``): its runs are laid out once, their end a token further a step
PADDED = dataclasses.replace(PROFILE, decode_padding="common_end")


@contextlib.contextmanager
def stepping_through_everything():
    # on the simulation's own classes (the compiled pipeline's class cannot be patched)
    durations = PredictedIterations.decode_durations
    del PredictedIterations.decode_durations
    Simulation._stages_known_ahead = lambda self: False
    try:
        yield
    finally:
        PredictedIterations.decode_durations = durations
        del Simulation._stages_known_ahead


def run_counting_events(trace, config, profile=PROFILE):
    sim = Simulation(trace, config, profile)
    env = sim.env
    env.run_until_processed = None  # the run steps through env.step, counted here
    step = env.step
    count = [0]

    def counted():
        count[0] += 1
        step()

    env.step = counted
    return sim.run(), count[0]


def assert_same_run(trace, config, profile=PROFILE) -> tuple[int, int]:
    with stepping_through_everything():
        stepped, stepped_events = run_counting_events(trace, config, profile)
    fast, fast_events = run_counting_events(trace, config, profile)
    assert _modelled(fast.records).equals(_modelled(stepped.records))
    assert _comparable(fast.summary) == _comparable(stepped.summary)
    return stepped_events, fast_events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows, knobs, st.booleans())
def test_the_shortcuts_give_the_stepped_run_exactly(rows, knobs, padded):
    """Arrivals during runs, speculations terminated mid-run, GPU failures mid-run, retries,
    tiny batches and memory, on a paged or a padded decode batch: the fast run is the stepped
    run.

    Events at the same instant are taken in the order they were scheduled, which the shortcuts
    change (they schedule fewer, at other moments): with requests arriving together and equal
    search times, two equally valid runs can then differ. Real arrivals never tie, so each
    drawn arrival is moved by a distinct irrational fraction of a millisecond."""
    rows = [(t + 1e-3 * (i + 1) / SQRT_5, *rest)
            for i, (t, *rest) in enumerate(sorted(rows, key=lambda r: r[0]))]
    trace = make_trace(rows)
    config = build_config({**knobs, "stage_source": "synthetic", "retry_timeout_s": 0.2,
                           "gpu_recovery_s": 0.5, "replicate_every_s": 0.5})
    assert_same_run(trace, config, PADDED if padded else PROFILE)


def test_on_a_built_in_trace_the_run_is_the_same_with_far_fewer_events():
    trace = resolve_trace("mmlu", n_requests=400)
    for system, rate in (("ragcache", 0.8), ("ragcache", 3.0), ("vllm", 2.0)):
        config = build_config({"system": system, "rate_rps": rate, "seed": 5,
                               "gpu_failure_rate_per_h": 100.0})
        stepped, fast = assert_same_run(trace, config)
        # ~32 output tokens a request: most steps of a light load are decode steps
        if rate < 1:
            assert fast < 0.6 * stepped, (system, rate, stepped, fast)


def test_a_padded_batch_runs_as_fast_as_a_paged_one_and_the_same_as_stepped():
    """The shipped torch CPU profile (``decode_padding`` common_end) on a built-in trace, with
    GPU failures: the same run as stepping through every decode step, in far fewer events (its
    decode steps were priced one by one before: 0.51-0.54 s against 0.21 s for 3,000 mmlu
    requests, ``benchmarks/padded_sim_speed.py``)."""
    profile = load_profile("cpu-mistral-7b-l2-h256")
    assert profile.decode_padding == "common_end"
    trace = resolve_trace("mmlu", n_requests=300)
    for rate in (0.8, 5.0):
        config = build_config({"system": "ragcache", "rate_rps": rate, "seed": 5,
                               "profile": "cpu-mistral-7b-l2-h256",
                               "gpu_failure_rate_per_h": 100.0})
        stepped, fast = assert_same_run(trace, config, profile)
        if rate < 1:
            assert fast < 0.6 * stepped, (rate, stepped, fast)


def test_steps_priced_ahead_but_never_run_are_not_counted_as_extrapolations():
    """Contexts that grow past the decode grid's end (32,768 tokens) while other requests
    arrive and cut the runs (a 32k prefill takes ~13 s on this profile, a request decodes for
    ~100 s), with a GPU failure mid-run: the cost model's extrapolation count is that of the
    steps run, as stepping counts them."""
    b = TraceBuilder("long")
    for i in range(6):
        b.add(i, 25.0 * i + 0.01 * i / SQRT_5, 50, 700, [10 + i], [32_300])
    trace = b.build({"name": "long"})
    for failures in ((), (170.123,)):
        config = build_config({"system": "vllm", "search_s": 0.05, "stage_source": "none",
                               "max_batch_size": 8, "gpu_kv_bytes": 300_000 * KV,
                               "fail_gpu_at_s": failures, "gpu_recovery_s": 1.0})
        assert_same_run(trace, config)
        assert run_counting_events(trace, config)[0].summary["cost_extrapolations"] > 0


def test_the_clocks_own_loop_steps_as_simpy_steps():
    """``ExactClock.run_until_processed`` (one loop, no method call per event) against SimPy's
    ``Environment.step`` called until the run's end: the same records and counters, on
    configurations that reach its every path (failures thrown into the engine, sequential
    arrivals, the mixed scheduler; a trace with queries for the answer cache)."""
    trace = resolve_trace("mmlu", n_requests=300)
    for knobs_ in ({"system": "ragcache", "rate_rps": 2.0, "gpu_failure_rate_per_h": 100.0},
                   {"system": "ragcache", "arrival": "sequential"},
                   {"system": "vllm", "rate_rps": 3.0, "scheduler": "mixed"}):
        config = build_config({**knobs_, "seed": 3})
        own = Simulation(trace, config, PROFILE).run()
        stepped, _ = run_counting_events(trace, config)
        assert _modelled(own.records).equals(_modelled(stepped.records)), knobs_
        assert _comparable(own.summary) == _comparable(stepped.summary), knobs_
    trace = resolve_trace("wiki-trivia", n_requests=300)
    config = build_config({"system": "ragcache", "trace": "wiki-trivia", "rate_rps": 1.0,
                           "answer_cache": True, "seed": 3})
    own = Simulation(trace, config, PROFILE).run()
    stepped, _ = run_counting_events(trace, config)
    assert _modelled(own.records).equals(_modelled(stepped.records))
    assert own.summary["answer_cache_hits"]["l2"] > 0 and _comparable(own.summary) == _comparable(
        stepped.summary)
