"""``ragsim run``: the serving pipeline on a virtual clock, each iteration costing what the cost
profile predicts (``ragsim.serving`` holds the pipeline; ``predicted.py`` the costs)."""

from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL, URGENT

from ragsim.profiles.profile import Profile
from ragsim.serving.config import SimConfig
from ragsim.serving.connector_costs import ConnectorCosts
from ragsim.serving.engine_loop import EngineLoop
from ragsim.serving.pipeline import Pipeline, Progress, RunResult, requests_to_run
from ragsim.serving.step_noise import StepTimeNoise
from ragsim.sim.predicted import predicted_iterations
from ragsim.traces.schema import Trace


class ExactClock(simpy.Environment):
    """SimPy's environment with ``timeout_at``: an event at an absolute time, to the last bit.

    The engine's decode runs and the pipeline's search-stage shortcut wait once for a time they
    summed step by step as SimPy would (``ragsim.serving.clock``); ``timeout(t - now)`` lands on
    ``now + (t - now)``, which rounding can make differ from ``t`` in the last bit, and then the
    shortcut would not give stepping's run exactly. This schedules the event at ``t`` as SimPy
    schedules a timeout (the same queue entry, with ``t`` in place of ``now + delay``)."""

    def timeout_at(self, t: float, urgent: bool = False) -> simpy.Event:
        if t < self._now:
            raise ValueError(f"timeout_at({t}) is before now ({self._now})")
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (t, URGENT if urgent else NORMAL, next(self._eid), event))
        return event

    def run_until_processed(self, until: simpy.Event) -> None:
        """Step until ``until`` has been processed: ``while not until.processed: step()``,
        each step as ``Environment.step`` takes it (the earliest event, its callbacks in order,
        a failed event that nobody defused raised), in one loop without a method call and a
        property per event; nothing here uses ``StopSimulation``. ``EmptySchedule`` as
        ``step`` raises it."""
        queue = self._queue
        while until.callbacks is not None:
            try:
                self._now, _, _, event = heappop(queue)
            except IndexError:
                raise simpy.core.EmptySchedule from None
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                # as SimPy crashes the run: a copy of the failure, caused by it
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc


class Simulation(Pipeline):
    """The pipeline in simulated time: as fast as the CPU can step it, deterministic per seed."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile,
                 progress: Progress | None = None) -> None:
        env = ExactClock()
        super().__init__(
            trace, config, profile, env=env,
            iterations=predicted_iterations(env, profile, config.overlap_swap,
                                            EngineLoop.of(config), StepTimeNoise.of(config),
                                            ConnectorCosts.of(config)),
            progress=progress)


def run_simulation(trace: Trace, config: SimConfig, profile: Profile,
                   progress: Progress | None = None) -> RunResult:
    """Simulate ``trace`` under ``config`` with ``profile``'s costs (deterministic per seed)."""
    return Simulation(requests_to_run(trace, config), config, profile, progress).run()
