"""What a step pays when it begins after the engine sat idle: a cold start.

A profile times its steps back to back. At a moderate load most of a run's prefills begin
after the engine waited for work, and such a step runs longer than the same step right after
another. ``benchmarks/idle_steps.py`` (one process, shuffled pauses, 15 each; 2 cores,
2026-12-04) measured a prefill after a pause against one without:

* vLLM's CPU engine (one thread), 64 tokens: +0.3 ms after 3 ms idle, +1.0 after 10, +1.7
  after 30 and 100 (x1.46); 300 tokens: +0.85 ms after 30 ms (x1.10); 1,500 tokens: +0.3 to
  +1.0 ms (x1.01-1.02);
* the torch engine (two threads), 64 tokens: +0.5 ms after 3 ms, +1.0 after 30 (x1.16); 300
  tokens: +0.6 ms after 30 (x1.03).

The extra is about the same number of milliseconds at every size and grows with the pause
until about 30 ms: the machine's caches and clocks went cold, not the step's work. In a 50%
load validation of vLLM at rest the prefills that began after more than 5 ms idle ran 1.09-1.14x
their prices, those right after another step 1.03-1.08x.

``IdleStart`` records the extra at a few pauses (``idle_s``), the mean over the profiled step
sizes of (median step after the pause - median step without one), made non-decreasing in the
pause. A step that begins ``t`` seconds after its engine's last step ended pays the extra
interpolated at ``t`` (0 at 0, flat past the longest pause); the first step of a run, with no
step before it, pays the longest pause's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ragsim.errors import ProfileError
from ragsim.profiles.after_new_shapes import fit_object, running_seconds
from ragsim.profiles.steps import _check_model

IDLE_START_MODEL = "extra_after_idle_interpolated_in_the_pause"


@dataclass(frozen=True)
class IdleStart:
    """``extra_s[i]``: what a step pays beyond its price after ``idle_s[i]`` seconds idle."""

    idle_s: list[float]
    extra_s: list[float]
    fit: dict = field(default_factory=dict)

    def seconds(self, idle_s: float) -> float:
        """The extra of a step begun ``idle_s`` after the engine's last step ended (``inf``:
        no step before it)."""
        if not idle_s > 0:
            return 0.0
        if idle_s >= self.idle_s[-1]:
            return self.extra_s[-1]
        return float(np.interp(idle_s, [0.0, *self.idle_s], [0.0, *self.extra_s]))

    def scaled(self, factor: float) -> IdleStart:
        return IdleStart(self.idle_s, [s * factor for s in self.extra_s], self.fit)

    def describe(self) -> str:
        points = ", ".join(f"{e * 1e3:.2g} ms after {t * 1e3:.3g} ms" for t, e in
                           zip(self.idle_s, self.extra_s, strict=True))
        return f"a step after the engine sat idle: {points}"

    def to_dict(self) -> dict:
        return {"model": IDLE_START_MODEL, "idle_s": self.idle_s, "extra_s": self.extra_s,
                "fit": self.fit}


def fit_idle_start(rows: list[tuple[int, float, float]], *, against: str = "") -> IdleStart:
    """``IdleStart`` from ``(step_tokens, pause_s, seconds)`` timings, pause 0 being the step
    right after another: per size and pause the median; per pause the mean over sizes of its
    median less the size's median at pause 0, clipped at 0; then isotonic regression over
    the pauses (a longer pause does not cool the machine less; noise would say it does)."""
    from scipy.optimize import isotonic_regression

    by: dict[tuple[int, float], list[float]] = {}
    for tokens, pause, seconds in rows:
        by.setdefault((int(tokens), float(pause)), []).append(float(seconds))
    sizes = sorted({t for t, _ in by})
    pauses = sorted({p for _, p in by if p > 0})
    if not pauses or any((t, 0.0) not in by or any((t, p) not in by for p in pauses)
                         for t in sizes):
        raise ValueError("the idle-start extra needs every size timed without a pause and "
                         "after every pause")
    per_size = {t: [max(0.0, float(np.median(by[t, p])) - float(np.median(by[t, 0.0])))
                    for p in pauses] for t in sizes}
    mean = [float(np.mean([per_size[t][i] for t in sizes])) for i in range(len(pauses))]
    extra = [max(0.0, float(x)) for x in isotonic_regression(mean).x]
    return IdleStart(pauses, extra, {
        "statistic": "per pause, the mean over step sizes of (median step after the pause - "
                     "median step right after another), clipped at 0, made non-decreasing "
                     "in the pause by isotonic regression",
        "step_tokens": sizes, "extra_s_by_size": {str(t): per_size[t] for t in sizes},
        "against": against})


def idle_start_from_dict(data: object, *, source: str) -> IdleStart:
    where = "idle_start"
    _check_model(data, where, IDLE_START_MODEL, source)
    idle = data.get("idle_s")
    if not isinstance(idle, list) or not idle:
        raise ProfileError("missing, empty or not a list", file=source, field=f"{where}.idle_s")
    for i, t in enumerate(idle):
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) \
                or t <= 0 or (i and t <= idle[i - 1]):
            raise ProfileError(f"entry {i} is {t!r}; must be a finite number > 0 of seconds, "
                               "increasing strictly", file=source, field=f"{where}.idle_s")
    extra = running_seconds(data.get("extra_s"), len(idle), "idle_s", f"{where}.extra_s", source)
    return IdleStart([float(t) for t in idle], extra, fit_object(data, where, source))
