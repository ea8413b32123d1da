"""A validation point's prefill steps timed again apart from their run: does the batch model
misprice their shapes, or did the run's process run them at another speed?

Run AI (2026-12-07, docs/validation.md): the torch engine's 8-row prefills ran 0.93x their
prices at overload (0.95x at 90% load, 0.93-0.95x at 50%), where the profile measured minutes
before in the same process priced its own held-out batches at 0.996 and the runs' single-row
prefills ran 1.01-1.03x theirs. This reads each prefill step's prompt rows from the point's
``steps.parquet`` (``row_cached_tokens``, ``row_new_tokens``: ``validate --replay-decisions``
writes them), times a seeded sample of them again on the profiler's engine of the same model,
in interleaved sweeps as the profiler times its batches, and prints by row count: the run's
time against its price as the replay charges it, the run's and the re-timed against the pass's
price alone (``Profile.prefill_pass_s``, what the profiler's sweeps time), and the re-timed
against the run's. Re-timed near the run's: the model misprices these shapes. Re-timed near
the price: the run's process ran them at another speed.

    LD_PRELOAD=libtcmalloc_minimal.so.4 python benchmarks/run_batches.py \\
        OUT/torch-ragcache/load-over --profile OUT/torch-ragcache/profile.json

Only ratios measured in this one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ragsim.profiles.allocator import memory_allocator
from ragsim.profiles.profile import load_profile
from ragsim.profiles.profiler import TorchEngine

ROW_CLASSES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 10**6))


def prefill_steps(point: Path) -> pd.DataFrame:
    """Every prefill step of the point's real runs with its prompt rows, one row each."""
    files = sorted(point.glob("real*/steps.parquet"))
    if not files:
        raise SystemExit(f"{point}: no real*/steps.parquet (validate --replay-decisions writes it)")
    steps = pd.concat([pd.read_parquet(f).assign(run=f.parent.name) for f in files],
                      ignore_index=True)
    if "row_new_tokens" not in steps:
        raise SystemExit(f"{point}: its steps.parquet has no row_new_tokens (written since "
                         "2026-12-07): validate the point again")
    return steps[steps["kind"] == "prefill"].reset_index(drop=True)


def sample(steps: pd.DataFrame, per_class: int, seed: int) -> pd.DataFrame:
    """Up to ``per_class`` steps of each row-count class, drawn with ``seed`` (a run's first
    steps, which pay its process's first-time prices, are as likely as any)."""
    rng = np.random.default_rng(seed)
    parts = []
    for low, high in ROW_CLASSES:
        rows = steps[steps["prompt_rows"].between(low, high)]
        if len(rows):
            take = rng.choice(len(rows), size=min(per_class, len(rows)), replace=False)
            parts.append(rows.iloc[np.sort(take)])
    return pd.concat(parts, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("point", type=Path, help="a validation point's folder (OUT/S/load-over)")
    parser.add_argument("--profile", required=True, help="the profile the point was priced on")
    parser.add_argument("--per-class", type=int, default=24, help="steps timed per row class")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write each timed step (its rows, the run's "
                        "time, the re-timed, the prices) to this Parquet file")
    args = parser.parse_args()

    profile = load_profile(args.profile)
    # the profile's own model (its spec is the one it was measured on), on the allocator it
    # was measured on: re-timed on another, every ratio would read the allocator's difference
    spec = profile.model
    measured_on = profile.obtained.get("allocator")
    here = memory_allocator()
    if measured_on not in (None, "unknown", here):
        raise SystemExit(f"the profile was measured on {measured_on}, this process runs on "
                         f"{here}: run it as the profile was (LD_PRELOAD=...)")
    chosen = sample(prefill_steps(args.point), args.per_class, args.seed)
    passes = [([int(c) for c in cached], [int(n) for n in new]) for cached, new in
              zip(chosen["row_cached_tokens"], chosen["row_new_tokens"], strict=True)]
    engine = TorchEngine(spec, "cpu", profile.dtype, 1, args.seed)
    timed = engine.sweeps(passes, 1, args.repetitions)
    chosen = chosen.assign(
        retimed_s=[m.median_s for m in timed.passes],
        pass_s=[profile.prefill_pass_s(c, n) for c, n in passes])

    if args.out is not None:
        chosen.to_parquet(args.out, index=False)
    print(f"{args.point}: {len(chosen)} prefill steps of {chosen['run'].nunique()} runs timed "
          f"again ({args.repetitions} sweeps); sums over each class")
    print("| prompt rows | steps | tokens (median) | run / replay's price | run / pass price | "
          "re-timed / pass price | re-timed / run |")
    print("|---|---|---|---|---|---|---|")
    for low, high in ROW_CLASSES:
        group = chosen[chosen["prompt_rows"].between(low, high)]
        if not len(group):
            continue
        label = str(low) if low == high else (f"{low}-{high}" if high < 10**6 else f">={low}")
        run, retimed = group["measured_s"].sum(), group["retimed_s"].sum()
        print(f"| {label} | {len(group)} | {group['step_tokens'].median():,.0f} | "
              f"{run / group['priced_s'].sum():.3f} | {run / group['pass_s'].sum():.3f} | "
              f"{retimed / group['pass_s'].sum():.3f} | {retimed / run:.3f} |")


if __name__ == "__main__":
    main()
