"""How fast vLLM runs now against its profile: the torch backend's speed probes, on vLLM.

The same probe points as ``ragsim.realrun.speed`` (grid points of the run's profile: a prefill
on no cached prefix, one over a cached prefix, a decode step), timed by ``VllmTimer`` on the
run's own engine right before its clock starts and right after it stops; the summary's
``speed_ratio_before``/``_after`` then let ``validate`` report the errors against the profile
scaled to the machine's speed too. Without prefix caching there is no cached prefix to time
over: that point is left out.
"""

from __future__ import annotations

import numpy as np

from ragsim.profiles.profile import Profile
from ragsim.realrun.speed import (
    DECODE_WARMUP,
    REPETITIONS,
    WARMUP,
    SpeedProbe,
    probe_points,
)
from ragsim.realrun.vllm.profile import VllmTimer


def probe_vllm_speed(timer: VllmTimer, profile: Profile) -> SpeedProbe:
    """Time the probe points now with ``timer`` (on the run's engine)."""
    caching = timer.settings.prefix_caching
    longest = timer.settings.max_model_len - WARMUP - REPETITIONS - 2
    rows = []
    for kind, x, y in probe_points(profile):
        if kind == "prefill":
            if (x and not caching) or x + y > longest:
                continue
            passes = timer.sweeps([([int(x)], [int(y)])], WARMUP, REPETITIONS).passes
            seconds = passes[0].median_s
            profiled = profile.prefill.at(x, y)
        else:
            if y > longest - DECODE_WARMUP + WARMUP:
                continue
            seconds = timer.decode(int(x), int(y), DECODE_WARMUP, REPETITIONS).median_s
            profiled = profile.decode.at(x, y)
        rows.append({"kind": kind, "x": x, "y": y, "profiled_s": profiled,
                     "measured_s": seconds, "ratio": seconds / profiled})
    return SpeedProbe(float(np.median([r["ratio"] for r in rows])) if rows else float("nan"),
                      rows)
