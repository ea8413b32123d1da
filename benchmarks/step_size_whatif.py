"""A validation point's simulation again, with only its large steps repriced.

A point's elasticity (``validate``'s ``cost_elasticity``) reprices every step by 5%; a burst's
few large steps may matter far more than that says. This reruns the simulation of a point
(the ``config.toml`` a validation wrote for it, on a profile) with the mixed steps of at least
``--from-tokens`` tokens (prompt tokens plus one a decode) priced ``--factor`` times, and every
mixed step so beside it (decode-only steps keep their price), on a fresh engine's prices (no
warm history).

    python benchmarks/step_size_whatif.py OUT/vllm-vllm/load-90/config.toml \
        OUT/vllm-vllm-apc/profile.json --factor 1.25 --from-tokens 4096

Run W (docs/validation.md): vllm's 90% mean 263 -> 893 ms with the 4,096+ steps at x1.25.
"""

from __future__ import annotations

import argparse

import numpy as np

import ragsim.sim.predicted as predicted
from ragsim.api.loading import load_profile, load_trace
from ragsim.serving.config import SimConfig, load_config_file
from ragsim.validation import run_sim


def repriced(factor: float, from_tokens: int):
    """``mixed_step_s`` with the steps of ``from_tokens`` tokens or more ``factor`` times."""
    original = predicted.mixed_step_s

    def price(profile, cached, new, decodes, context, new_shape=None):
        seconds = original(profile, cached, new, decodes, context, new_shape)
        return seconds * factor if sum(new) + decodes >= from_tokens else seconds
    return price


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a validation point's config.toml")
    parser.add_argument("profile")
    parser.add_argument("--factor", type=float, default=1.25)
    parser.add_argument("--from-tokens", type=int, default=4096)
    args = parser.parse_args()
    run = load_config_file(args.config)
    config = SimConfig(**run)
    trace = load_trace(run["trace"], requests=run["n_requests"])
    profile = load_profile(args.profile)
    print("| steps repriced | mean TTFT (ms) |\n|---|---|")
    for label, factor, edge in (("none", 1.0, 0),
                                (f"{args.from_tokens:,}+ tokens x{args.factor:g}", args.factor,
                                 args.from_tokens),
                                (f"every mixed step x{args.factor:g}", args.factor, 0)):
        predicted.mixed_step_s = repriced(factor, edge)
        sim = run_sim(trace, config, profile)
        print(f"| {label} | {np.nanmean(sim.columns['ttft_s']) * 1e3:,.1f} |")


if __name__ == "__main__":
    main()
