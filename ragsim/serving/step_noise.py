"""Each simulated step's time drawn around its price: one of the runs a real engine might have.

A simulation prices each step at its profile's median, so it is the one run with no step-time
noise. A real engine runs the same step a little faster or slower each time, and at moderate
to high load those differences reorder its queue: two real runs of the same requests and
arrivals give a request TTFTs tens of percent apart (``ragsim.engine_spread``). With a
configuration's ``step_time_sigma`` > 0 every step's time is its price times ``exp(e)``,
``e ~ N(0, step_time_sigma)`` (the price stays the median, as the profile's statistic is), from
a generator of its own seeded by ``seed`` and ``step_noise_seed`` (the trace, arrivals and
stages keep theirs). ``validate --sim-replicas`` averages such runs per request: an estimate of
each request's expected TTFT, as the real side's ``--repeats`` average estimates it.
``ragsim.profiles.repeat_spread`` measures the spread from a profile's repeated timings.
"""

from __future__ import annotations

import numpy as np


class StepTimeNoise:
    """The factor each step's priced time is multiplied by (one stream per engine)."""

    def __init__(self, sigma: float, seed: int, noise_seed: int, stream: int = 0) -> None:
        if not (sigma > 0 and np.isfinite(sigma)):
            raise ValueError(f"step_time_sigma must be a finite number > 0, got {sigma!r}")
        self.sigma = float(sigma)
        # the stream (a fleet's engine) and both seeds in one seed sequence: replicas of a
        # run differ in step_noise_seed alone, the engines of one fleet in their stream
        self._rng = np.random.default_rng([int(seed), int(noise_seed), int(stream)])

    @classmethod
    def of(cls, config, stream: int = 0) -> StepTimeNoise | None:
        """The configuration's noise for engine ``stream`` (None: steps at their prices)."""
        sigma = float(getattr(config, "step_time_sigma", 0.0))
        if not sigma:
            return None
        return cls(sigma, config.seed, getattr(config, "step_noise_seed", 0), stream)

    def factor(self) -> float:
        """One step's factor."""
        return float(np.exp(self._rng.normal(0.0, self.sigma)))

    def factors(self, steps: int) -> list[float]:
        """``steps`` steps' factors, in order (a decode run priced ahead)."""
        return np.exp(self._rng.normal(0.0, self.sigma, steps)).tolist()
