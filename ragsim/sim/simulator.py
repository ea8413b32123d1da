"""``ragsim run``: the serving pipeline on a virtual clock, each iteration costing what the cost
profile predicts (``ragsim.serving`` holds the pipeline; ``predicted.py`` the costs)."""

from __future__ import annotations

import simpy

from ragsim.profiles.profile import Profile
from ragsim.serving.config import SimConfig
from ragsim.serving.pipeline import Pipeline, Progress, RunResult, requests_to_run
from ragsim.sim.predicted import PredictedIterations
from ragsim.traces.schema import Trace


class Simulation(Pipeline):
    """The pipeline in simulated time: as fast as the CPU can step it, deterministic per seed."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile,
                 progress: Progress | None = None) -> None:
        env = simpy.Environment()
        super().__init__(
            trace, config, profile, env=env,
            iterations=lambda tree: PredictedIterations(env, profile, config.overlap_swap),
            progress=progress)


def run_simulation(trace: Trace, config: SimConfig, profile: Profile,
                   progress: Progress | None = None) -> RunResult:
    """Simulate ``trace`` under ``config`` with ``profile``'s costs (deterministic per seed)."""
    return Simulation(requests_to_run(trace, config), config, profile, progress).run()
