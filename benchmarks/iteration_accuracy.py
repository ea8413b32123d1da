"""One real run's iterations priced by several profiles: which cost model moves the error.

A validation's ``cost_model_error`` (``--replay-decisions``) depends on the real run, and two
real runs on a shared machine differ by more than a profile term does. This runs the real
engine once (``setup_validation`` with the first profile: its trace, system and configuration
as ``ragsim validate`` builds them) and replays that run's own decisions at each profile's
prices, so every profile is judged on the same iterations:

    python benchmarks/iteration_accuracy.py --profile OUT/profile.json \\
        --also cpu-mistral-7b-l2-h256 --strip-terms --requests 30 --rate 3 --out /tmp/ia

``--strip-terms`` adds the first profile without its ``mixed_steps`` and ``step_overhead``
(what the change adds, against the same grids). For each profile it prints the replay's
``cost_model_error`` and, per iteration kind, predicted / measured (median, p10, p90 and the
p90 of |ratio - 1|: the per-iteration targets are a median within 5% and p90 within 15%). It
prints the load average before and after: the numbers are this machine's at that load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np

from ragsim.api.validation import setup_validation
from ragsim.decisions import measured_s, priced_s, replay
from ragsim.profiles.decode_after_prompt import AfterPrompt
from ragsim.profiles.new_shapes import NewShapeCharge
from ragsim.profiles.profile import load_profile
from ragsim.profiles.steps import ratio_summary
from ragsim.validation import join_runs, run_pair


def iteration_kind(decision: dict) -> str:
    if decision["kind"] != "prefill":
        return decision["kind"]
    return "prefill_single" if len(decision["jobs"]) == 1 else "prefill_batch"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="the profile the real run uses")
    parser.add_argument("--also", action="append", default=[], help="more profiles to price")
    parser.add_argument("--strip-terms", action="store_true")
    parser.add_argument("--trace", default="mmlu")
    parser.add_argument("--system", default="ragcache")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    setup = setup_validation(args.out, backend="torch", trace=args.trace, system=args.system,
                             rate=args.rate, requests=args.requests, profile=args.profile,
                             threads=args.threads, replay_decisions=True)
    load_before = os.getloadavg()
    real, _sim = run_pair(setup.data, setup.config, setup.costs, backend="torch",
                          threads=setup.threads)
    load_after = os.getloadavg()
    kept = real.decisions
    iterations, submitted = kept["iterations"], kept["submitted_s"]
    overlap = bool(real.config.overlap_swap)
    joined, _ = join_runs(real.columns, real.columns)
    rows = {int(r): k for k, r in enumerate(np.asarray(real.columns["request_id"]).tolist())}
    served = np.array([rows[int(r)] for r in joined["request_id"].tolist()], dtype=np.int64)
    real_ttft = joined["ttft_s_real"].to_numpy(float)

    profiles = [(args.profile, setup.costs)]
    if args.strip_terms:
        profiles.append((f"{args.profile} without mixed_steps/step_overhead",
                         dataclasses.replace(setup.costs, mixed_steps=None,
                                             step_overhead=None)))
    profiles += [(name, load_profile(name)) for name in args.also]
    report = {"load_average_before": load_before, "load_average_after": load_after,
              "requests": len(real_ttft), "iterations": len(iterations), "profiles": {}}
    for name, profile in profiles:
        # the replay's first-time prices and first decode steps, as the simulator's
        shapes, after = NewShapeCharge(profile.new_shapes), AfterPrompt(
            profile.decode_after_prompt)
        replayed = replay(iterations, submitted, real.columns,
                          lambda d, p=profile, n=shapes, a=after: priced_s(d, p, overlap, n,
                                                                           a))[served]
        kinds: dict[str, tuple[list, list]] = {}
        shapes, after = NewShapeCharge(profile.new_shapes), AfterPrompt(
            profile.decode_after_prompt)
        for decision in iterations:
            predicted, measured = kinds.setdefault(iteration_kind(decision), ([], []))
            predicted.append(priced_s(decision, profile, overlap, shapes, after))
            measured.append(measured_s(decision))
        report["profiles"][name] = {
            "cost_model_error": float((replayed.mean() - real_ttft.mean()) / real_ttft.mean()),
            "iterations": {kind: ratio_summary(p, m) for kind, (p, m) in sorted(kinds.items())},
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
