"""Each simulated step's time drawn around its price: one of the runs a real engine might have.

A simulation prices each step at its profile's median, so it is the one run with no step-time
noise. A real engine runs the same step a little faster or slower each time, and at moderate
to high load those differences reorder its queue: two real runs of the same requests and
arrivals give a request TTFTs tens of percent apart (``ragsim.engine_spread``). With a
configuration's ``step_time_sigma`` > 0 every step's time is its price times ``exp(e)``, from a
generator of its own seeded by ``seed`` and ``step_noise_seed`` (the trace, arrivals and stages
keep theirs). ``e`` is an AR(1) over the engine's steps in their order:
``e_1 = sigma z_1``, ``e_t = rho e_(t-1) + sqrt(1 - rho^2) sigma z_t`` (``z`` standard normal,
``rho`` the configuration's ``step_time_correlation``), so every step's ``e`` has spread
``sigma`` and the price stays the median, the profile's statistic; ``rho`` is how much of a
step's deviation the next step keeps. Why a correlation: a real engine's slow steps come in
runs (the lag-1 correlation of its steps' deviations from their prices was 0.1-0.6 on the
2-core CPU, docs/validation.md), and a run of slow steps queues more requests than the same
steps' spread drawn one by one. ``validate --sim-replicas`` averages such runs per request: an
estimate of each request's expected TTFT, as the real side's ``--repeats`` average estimates
it. ``ragsim.step_spread`` measures sigma and rho on real runs' steps (validate's probe runs),
``ragsim.profiles.repeat_spread`` sigma from a profile's repeated timings.
"""

from __future__ import annotations

import math

import numpy as np


class StepTimeNoise:
    """The factor each step's priced time is multiplied by (one stream per engine)."""

    def __init__(self, sigma: float, seed: int, noise_seed: int, stream: int = 0,
                 correlation: float = 0.0) -> None:
        if not (sigma > 0 and np.isfinite(sigma)):
            raise ValueError(f"step_time_sigma must be a finite number > 0, got {sigma!r}")
        if not 0.0 <= correlation < 1.0:
            raise ValueError(f"step_time_correlation must lie in [0, 1), got {correlation!r}")
        self.sigma = float(sigma)
        self.correlation = float(correlation)
        # what a step's own draw adds: the rest of the spread, past what the last one carried
        self._fresh = self.sigma * math.sqrt(1.0 - self.correlation ** 2)
        self._last: float | None = None  # the previous step's e (None: no step yet)
        # the stream (a fleet's engine) and both seeds in one seed sequence: replicas of a
        # run differ in step_noise_seed alone, the engines of one fleet in their stream
        self._rng = np.random.default_rng([int(seed), int(noise_seed), int(stream)])

    @classmethod
    def of(cls, config, stream: int = 0) -> StepTimeNoise | None:
        """The configuration's noise for engine ``stream`` (None: steps at their prices)."""
        sigma = float(getattr(config, "step_time_sigma", 0.0))
        if not sigma:
            return None
        return cls(sigma, config.seed, getattr(config, "step_noise_seed", 0), stream,
                   float(getattr(config, "step_time_correlation", 0.0)))

    def _next(self, z: float) -> float:
        """The next step's ``e`` from its standard normal draw ``z``."""
        if self._last is None:
            e = self.sigma * z
        else:
            e = self.correlation * self._last + self._fresh * z
        self._last = e
        return e

    def factor(self) -> float:
        """One step's factor."""
        return float(math.exp(self._next(float(self._rng.standard_normal()))))

    def factors(self, steps: int) -> list[float]:
        """``steps`` steps' factors, in order (a decode run priced ahead)."""
        if not self.correlation:  # independent draws: one call
            return np.exp(self.sigma * self._rng.standard_normal(steps)).tolist()
        return [math.exp(self._next(float(z))) for z in self._rng.standard_normal(steps)]
