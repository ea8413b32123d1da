"""The simulator's fast pieces against the slower things they replace.

Each piece exists only to save time, so each is checked against a second implementation that
does the same work the plain way: the search pool against SimPy's own ``Resource``, a priced
decode run against the grid's point lookup, a request's stage lists against asking stage by
stage, and a decode run's cut (the wait moved, not interrupted) against stepping in
``test_sim_shortcuts.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_stage_model import trace_of

from ragsim.profiles.grid import BilinearGrid
from ragsim.serving.pipeline import SearchWorkers
from ragsim.serving.retrieval import StagedSearch

# (arrival gap, search duration) per request; small integers so that releases and arrivals
# fall on the same instants often (the order SimPy gives same-instant events matters there)
searches = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=30)


def grant_times(pool_kind: str, capacity: int, plan: list[tuple[int, int]]) -> list:
    """What happened, in the order it happened (arrivals, grants with their times, ends), with
    SimPy's Resource or with SearchWorkers: equal logs mean equal grants in the same order
    among the other events of an instant."""
    env = simpy.Environment()
    log = []
    if pool_kind == "resource":
        pool = simpy.Resource(env, capacity=capacity)

        def search(i: int, duration: int):
            with pool.request() as worker:
                if not worker.triggered:  # (granted at once: the pipeline did not wait)
                    yield worker
                log.append(("granted", i, env.now))
                yield env.timeout(duration)
                log.append(("ended", i))
    else:
        pool = SearchWorkers(env, capacity)

        def search(i: int, duration: int):
            waiting = pool.take()
            if waiting is not None:
                yield waiting
            log.append(("granted", i, env.now))
            try:
                yield env.timeout(duration)
                log.append(("ended", i))
            finally:
                pool.give_back()

    def arrivals():
        for i, (gap, duration) in enumerate(plan):
            yield env.timeout(gap)
            log.append(("arrived", i))
            env.process(search(i, duration))

    env.process(arrivals())
    env.run()
    return log


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 4), plan=searches)
def test_search_workers_grant_as_simpy_resource_does(capacity, plan):
    assert grant_times("workers", capacity, plan) == grant_times("resource", capacity, plan)


def test_search_workers_by_hand():
    # one worker; searches of 2 s arriving at 0, 0 and 1: granted at 0, 2 and 4 (first come,
    # first served), and the worker is free again at the end
    env = simpy.Environment()
    pool = SearchWorkers(env, 1)
    granted = []

    def search():
        waiting = pool.take()
        if waiting is not None:
            yield waiting
        granted.append(env.now)
        yield env.timeout(2)
        pool.give_back()

    def arrivals():
        env.process(search())
        env.process(search())
        yield env.timeout(1)
        env.process(search())

    env.process(arrivals())
    env.run()
    assert granted == [0, 2, 4]
    assert pool.free == 1


GRID = BilinearGrid("decode", "batch_size", "context_tokens", [1, 4, 16],
                    [128, 1024, 4096], [[0.010, 0.012, 0.020], [0.011, 0.014, 0.026],
                                        [0.015, 0.020, 0.040]])


@settings(max_examples=300, deadline=None)
@given(batch=st.integers(1, 40), context_sum=st.integers(0, 300_000),
       steps=st.integers(0, 40))
def test_priced_decode_run_equals_each_step_priced(batch, context_sum, steps):
    # every step as the engine priced it one at a time: the batch's mean context, one token
    # longer per request and step (on and off the grid, with the extrapolations counted)
    each = GRID.at_steps(batch, context_sum, steps)
    counted = GRID.extrapolated_queries
    one_by_one = [GRID.at(batch, (context_sum + batch * k) / batch) for k in range(steps)]
    assert each == one_by_one  # bit for bit
    # and the run counted the same extrapolations as the steps did
    GRID.extrapolated_queries = 0
    GRID.at_steps(batch, context_sum, steps)
    run_count = GRID.extrapolated_queries
    GRID.extrapolated_queries = 0
    for k in range(steps):
        GRID.at(batch, (context_sum + batch * k) / batch)
    assert run_count == GRID.extrapolated_queries
    assert counted >= 0


def trace_with(finals: list[list[int]], stages=None):
    return trace_of(finals, stages, corpus=200)


def both_ways(trace, finals, source: str, stages: int = 4, seed: int = 0):
    def search():
        return StagedSearch(trace, lambda i: finals[i], stages=stages, search_s=1.0,
                            source=source, seed=seed, converge_p=0.4, keeps_d1_p=0.5,
                            other_found_p=0.7)
    at_once = search()
    stepped = search()
    for i in range(len(finals)):
        n = stepped.n_stages(i)
        asked = [stepped.stage_list(i, s) for s in range(1, n + 1)]
        assert at_once.stage_lists(i) == asked[:-1], (source, i)
        assert asked[-1] == finals[i]
    assert not stepped._open  # every request's lists dropped at its last stage


@settings(max_examples=60, deadline=None)
@given(finals=st.lists(st.lists(st.integers(0, 199), min_size=1, max_size=4, unique=True),
                       min_size=1, max_size=12),
       seed=st.integers(0, 2**32), stages=st.integers(1, 5))
def test_stage_lists_equal_asking_stage_by_stage(finals, seed, stages):
    trace = trace_with(finals)
    both_ways(trace, finals, "synthetic", stages=stages, seed=seed)
    both_ways(trace, finals, "none", stages=stages, seed=seed)


def test_stage_lists_of_a_recorded_search():
    finals = [[1, 2], [3, 4], [5]]
    stages = [[[1, 9, 7], [1, 2, 8], [1, 2, 3]], [[3, 4, 0]], [[6], [5]]]
    trace = trace_with(finals, stages)
    search = StagedSearch(trace, lambda i: finals[i], stages=4, search_s=1.0, source="trace",
                          seed=0)
    # cut to the final list's length, by hand; a one-stage search has no intermediate list
    assert search.stage_lists(0) == [[1, 9], [1, 2]]
    assert search.stage_lists(1) == []
    assert search.stage_lists(2) == [[6]]
    both_ways(trace, finals, "trace")


def test_the_search_hand_off_moves_every_stage_end_once():
    """``search_handoff_s`` is paid once a search, before its first stage's end: by hand,
    a 4 ms search in 4 stages with a 0.5 ms hand-off ends its stages at 1.5, 2.5, 3.5 and
    4.5 ms, and takes 4.5 ms whole."""
    finals = [[1, 2]]
    trace = trace_with(finals)
    search = StagedSearch(trace, lambda i: finals[i], stages=4, search_s=0.004,
                          source="synthetic", seed=0, handoff_s=0.0005)
    ends = np.cumsum([search.stage_duration_s(0, s) for s in range(1, 5)])
    assert ends.tolist() == pytest.approx([0.0015, 0.0025, 0.0035, 0.0045])
    assert search.total_s(0) == pytest.approx(0.0045)
    plain = StagedSearch(trace, lambda i: finals[i], stages=4, search_s=0.004,
                         source="synthetic", seed=0)
    assert plain.total_s(0) == pytest.approx(0.004)
