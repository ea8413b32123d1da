"""What pricing a padded decode batch costs the simulator: one simulation priced at the rows'
mean against the same at the batch's end (``decode_padding = "common_end"``, the layout
followed), wall time in one process, alternated. docs/profiles.md quotes it (3,000 mmlu
requests at 1.5 req/s on ``cpu-mistral-7b-l2-h256``: 0.51-0.54 s against 0.21 s while padded
steps were priced one by one, 0.23 s since runs of an unchanging batch are laid out once)::

    python benchmarks/padded_sim_speed.py
"""

from __future__ import annotations

import dataclasses
import time

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

PROFILE = "cpu-mistral-7b-l2-h256"


def main() -> None:
    config = build_config({"trace": "mmlu", "system": "ragcache", "n_requests": 3000,
                           "profile": PROFILE, "arrival": "poisson", "rate_rps": 1.5})
    trace = resolve_trace(config.trace, seed=config.seed, n_requests=config.n_requests)
    base = load_profile(PROFILE)
    best: dict[str, float] = {}
    for padding in ("none", "common_end") * 3:
        profile = dataclasses.replace(base, decode_padding=padding)
        started = time.perf_counter()
        result = run_simulation(trace, config, profile)
        took = time.perf_counter() - started
        best[padding] = min(best.get(padding, took), took)
        steps = result.summary["iterations_decode"]
    print(f"{config.n_requests} requests, {steps:,} decode steps: "
          f"at the mean {best['none']:.2f} s, padded {best['common_end']:.2f} s "
          f"(x{best['common_end'] / best['none']:.1f}; the fastest of three each)")


if __name__ == "__main__":
    main()
