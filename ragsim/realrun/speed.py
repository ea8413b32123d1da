"""How fast this machine runs the model now, against when its profile was measured.

A shared machine drifts: on this project's 2-core VM the same forward pass ran 0.8-1.25x its
usual time from one minute to the next, and several times slower while other work ran. A real
run compared with a simulation priced by a profile measured minutes earlier then mixes the
model's error with the machine's drift. So a real run times a few of the profile's own grid
points right before its clock starts and right after it stops, with the profiler's own timing
code on the run's own model, and reports measured / profiled (``speed_ratio_before``/
``_after``; 1.0: as fast as when profiled, 1.2: 20% slower). The validator reports its errors
as measured and, beside them, against the profile scaled by the probes' ratio (``ragsim
validate``), and says when the machine changed speed during the run.

The probe points are grid points (the profile's measured values, no interpolation): a prefill
on the causal fast path, one over a cached prefix, and a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragsim.profiles.decode_after_prompt import DECODE_SETTLE_STEPS
from ragsim.profiles.profile import Profile
from ragsim.profiles.profiler import TorchEngine
from ragsim.profiles.torch_model import TorchModel

WARMUP = 1
REPETITIONS = 5
# a decode point settles first, as the profile's decode cells do (``decode_after_prompt``)
DECODE_WARMUP = DECODE_SETTLE_STEPS


@dataclass
class SpeedProbe:
    ratio: float  # median over the points of measured / profiled
    points: list[dict]  # per point: kind, x, y, profiled_s, measured_s, ratio

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "points": self.points}


def _nearest(axis: list, target: float, *, positive: bool = False) -> float:
    values = [float(v) for v in axis if not positive or v > 0]
    return min(values, key=lambda v: (abs(v - target), v)) if values else float(axis[0])


def probe_points(profile: Profile) -> list[tuple[str, float, float]]:
    """(kind, x, y) grid points: T(0, ~512), T(~1,024, ~256), decode(~4 requests, ~1,024)."""
    prefill, decode = profile.prefill, profile.decode
    return [("prefill", 0.0, _nearest(prefill.y_axis, 512)),
            ("prefill", _nearest(prefill.x_axis, 1024, positive=True),
             _nearest(prefill.y_axis, 256)),
            ("decode", _nearest(decode.x_axis, 4), _nearest(decode.y_axis, 1024))]


def probe_speed(model: TorchModel, profile: Profile, *, seed: int = 0) -> SpeedProbe:
    """Time the probe points now on ``model`` (the profiled model, built for the run)."""
    engine = TorchEngine.around(model, seed)
    points = probe_points(profile)
    prefills = [(x, y) for kind, x, y in points if kind == "prefill"]
    timed = engine.sweeps([([int(x)], [int(y)]) for x, y in prefills], WARMUP,
                          REPETITIONS).passes
    measured = iter(m.median_s for m in timed)
    rows = []
    for kind, x, y in points:
        if kind == "prefill":
            seconds, profiled = next(measured), profile.prefill.at(x, y)
        else:
            seconds = engine.decode(int(x), int(y), DECODE_WARMUP, REPETITIONS).median_s
            profiled = profile.decode.at(x, y)
        rows.append({"kind": kind, "x": x, "y": y, "profiled_s": profiled,
                     "measured_s": seconds, "ratio": seconds / profiled})
    return SpeedProbe(float(np.median([r["ratio"] for r in rows])), rows)
