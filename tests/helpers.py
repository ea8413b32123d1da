"""Helpers several test files share: planted faults (Ctrl-C, a lost ``finished``) and replays of
the four online policies, each distinct one run once per session."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest

from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace
from ragsim.traces.schema import Trace

FOUR_POLICIES = ("pgdsf", "gdsf", "lru", "lfu")

_SCRATCH_ROOT: Path | None = None


def scratch_dir(prefix: str) -> Path:
    """A fresh folder per hypothesis example (pytest's ``tmp_path`` is one per test, not per
    example), inside one folder per test process that is removed when the process exits: the
    fuzz tests make hundreds of folders a run, and left ~10,000 in the temporary folder of a
    machine that ran the suite a few dozen times."""
    global _SCRATCH_ROOT
    if _SCRATCH_ROOT is None:
        _SCRATCH_ROOT = Path(tempfile.mkdtemp(prefix="ragsim-tests-"))
        atexit.register(shutil.rmtree, _SCRATCH_ROOT, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH_ROOT))


def interrupt_progress(monkeypatch: pytest.MonkeyPatch, at_completed: int | None = None) -> None:
    """Ctrl-C from inside the CLI's progress bar: ``Progress.update`` raises KeyboardInterrupt at
    its first call, or, with ``at_completed``, once it is told that many requests are done."""
    from rich.progress import Progress

    update = Progress.update

    def interrupting_update(self, task, *args, completed=None, **kwargs):
        if at_completed is None or (completed is not None and completed >= at_completed):
            raise KeyboardInterrupt
        return update(self, task, *args, completed=completed, **kwargs)

    monkeypatch.setattr(Progress, "update", interrupting_update)


def lose_the_end_of(monkeypatch: pytest.MonkeyPatch, request: int) -> None:
    """Plant a bug: the engine's report that ``request`` finished goes missing."""
    from ragsim.sim.simulator import Simulation

    finished = Simulation.finished

    def forgetful(self, job):
        if job.request != request:
            finished(self, job)

    monkeypatch.setattr(Simulation, "finished", forgetful)


def shared_trace(name: str, n_requests: int | None = None,
                 drift_per_1k_requests: float | None = None) -> Trace:
    """``resolve_trace(name, n_requests=..., drift_per_1k_requests=...)`` (the drift only when
    given); built once and shared between tests, so read it, never change it."""
    # one cache key however the arguments are passed (functools.cache keys on the call's form)
    return _trace(name, n_requests, drift_per_1k_requests)


@cache
def _trace(name: str, n_requests: int | None, drift_per_1k_requests: float | None) -> Trace:
    drift = {} if drift_per_1k_requests is None else {
        "drift_per_1k_requests": drift_per_1k_requests}
    return resolve_trace(name, n_requests=n_requests, **drift)


@cache
def _profile():
    return load_profile("a10g-mistral-7b")


@cache
def _token_hit_rate(trace_name: str, policy: str, n_requests: int | None,
                    drift_per_1k_requests: float | None, config: tuple) -> float:
    trace = shared_trace(trace_name, n_requests, drift_per_1k_requests)
    replay = ReplayConfig(trace=trace_name, policy=policy, **dict(config))
    return run_replay(trace, replay, _profile()).summary["token_hit_rate"]


def token_hit_rates(trace_name: str, *, n_requests: int | None = None,
                    drift_per_1k_requests: float | None = None,
                    policies: tuple[str, ...] = FOUR_POLICIES, **config) -> dict[str, float]:
    """Each policy's token hit rate replaying ``shared_trace(trace_name, ...)`` with
    ``ReplayConfig(trace=trace_name, policy=..., **config)`` and the A10G Mistral-7B profile.
    Replay is deterministic, so each distinct replay runs once and later asks reuse its rate."""
    key = tuple(sorted(config.items()))
    return {policy: _token_hit_rate(trace_name, policy, n_requests, drift_per_1k_requests, key)
            for policy in policies}
