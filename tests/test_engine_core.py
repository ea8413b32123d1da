"""The engine's thread on a core of its own during a real run (``ragsim.realrun.cores``): where
it goes, where the process's other threads go (those begun before, and those that move off as
they begin), that everything is put back, and where nothing is done and why."""

from __future__ import annotations

import os
import threading

import pytest

from ragsim.realrun.cores import EngineCore, off_engine_core

ALLOWED = sorted(os.sched_getaffinity(0))


def _affinity_of(thread_ready: threading.Event, seen: dict, go: threading.Event,
                 move: bool) -> None:
    thread_ready.set()
    go.wait()
    if move:
        off_engine_core()
    seen["cores"] = os.sched_getaffinity(0)


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one core: nothing to keep apart")
def test_the_engine_keeps_the_first_core_and_the_other_threads_the_rest():
    before, go_before = {}, threading.Event()
    ready = threading.Event()
    waiting = threading.Thread(target=_affinity_of, args=(ready, before, go_before, False))
    waiting.start()
    ready.wait()
    with EngineCore(1) as core:
        assert os.sched_getaffinity(0) == {ALLOWED[0]}
        go_before.set()
        waiting.join()
        later, go_later = {}, threading.Event()
        go_later.set()
        begun = threading.Thread(target=_affinity_of,
                                 args=(threading.Event(), later, go_later, True))
        begun.start()
        begun.join()
    assert before["cores"] == set(ALLOWED[1:])  # moved off while it waited
    assert later["cores"] == set(ALLOWED[1:])  # begun on the engine's core, moved as it began
    assert core.as_dict()["core"] == ALLOWED[0] and core.as_dict()["other_threads_moved"] >= 1
    assert os.sched_getaffinity(0) == set(ALLOWED)  # put back
    off_engine_core()  # no run keeps a core apart now: nothing moves
    assert os.sched_getaffinity(0) == set(ALLOWED)


@pytest.mark.parametrize("threads", [None, 2])
def test_an_engine_on_more_threads_is_left_where_it_is(threads):
    with EngineCore(threads) as core:
        assert os.sched_getaffinity(0) == set(ALLOWED)
    assert core.engine_core is None and "thread" in core.why_not
    assert core.as_dict() == {"core": None, "other_threads_moved": 0,
                              "why_not": core.why_not}


def test_a_caller_with_a_reason_leaves_the_cores_as_they_are():
    """A fleet's replicas share the process: none takes a core for itself."""
    with EngineCore(1, why_not="a fleet's replicas share the process's cores") as core:
        assert os.sched_getaffinity(0) == set(ALLOWED)
    assert core.engine_core is None and core.why_not.startswith("a fleet's")


@pytest.mark.skipif(len(ALLOWED) < 2, reason="one core: nothing to keep apart")
def test_a_thread_keeps_the_cores_it_chose_after_the_run():
    """A thread the process had put on one core of its own choosing (the last) is moved off
    the engine's core during the run and gets that core back after it, not every core."""
    chosen, ready, go = {}, threading.Event(), threading.Event()

    def own_choice() -> None:
        os.sched_setaffinity(0, {ALLOWED[-1]})
        ready.set()
        go.wait()
        chosen["after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=own_choice)
    thread.start()
    ready.wait()
    with EngineCore(1):
        pass
    go.set()
    thread.join()
    assert chosen["after"] == {ALLOWED[-1]}
