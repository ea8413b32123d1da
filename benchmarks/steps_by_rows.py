"""A validation's real steps against their prices, by decode rows, and what a search beside a
step adds to it.

Reads the ``steps.parquet`` every real run of a ``validate --replay-decisions`` writes (each
step: its kind, prompt and decode rows, tokens, start, measured and priced time) and prints two
tables per system folder (``OUT/vllm-ragcache``, ...):

1. **by decode rows**: per load and bin of decode rows, the steps' count, their median
   measured/priced ratio and median excess (ms), decode-only steps and steps with prompts
   apart. docs/validation.md's runs P and Q quote it (steps beside 4-64 running requests ran
   1.06-1.11x their price before the mixed grid reached 64 rows, 1.01-1.05x after).
2. **search overlap**: a least-squares fit of each step's excess (measured - priced) on the
   seconds of real search that overlapped it (the run's ``search_start_s`` to
   ``search_end_s``), its prompt rows, decode rows, new tokens (per 1,000) and whether it
   followed a step with prompts, with one constant per run (the machine's speed that run):
   seconds of step per second of search beside it (runs P and Q: 0.73-1.01 and 0.33-0.67).

    python benchmarks/steps_by_rows.py OUT/vllm-vllm-apc OUT/vllm-ragcache --loads 90,50,idle
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

ROW_BINS = [-1, 0, 1, 2, 4, 8, 16, 32, 64, 128, 256]


def steps_of(system: Path, loads: list[str]) -> pd.DataFrame:
    """Every real run's steps of the loads, each with its load, run and the seconds of search
    that overlapped it."""
    frames = []
    for load in loads:
        point = system / f"load-{load}"
        for run in sorted(point.glob("real*")):
            if not (run / "steps.parquet").exists():
                continue
            steps = pd.read_parquet(run / "steps.parquet")
            requests = pd.read_parquet(run / "requests.parquet")
            starts = steps["start_s"].to_numpy(float)
            ends = starts + steps["measured_s"].to_numpy(float)
            s0 = requests["search_start_s"].to_numpy(float)
            s1 = requests["search_end_s"].to_numpy(float)
            searched = np.isfinite(s0) & np.isfinite(s1)
            s0, s1 = s0[searched], s1[searched]
            steps["search_overlap_s"] = [
                float(np.clip(np.minimum(e, s1) - np.maximum(b, s0), 0, None).sum())
                for b, e in zip(starts, ends, strict=True)]
            steps["load"], steps["run"] = load, f"{load}/{run.name}"
            frames.append(steps)
    if not frames:
        raise SystemExit(f"{system}: no steps.parquet (validate --replay-decisions writes it)")
    return pd.concat(frames, ignore_index=True)


def by_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """Median ratio and excess per load, decode-row bin and whether the step had prompts."""
    steps = steps.assign(rows=pd.cut(steps["decode_rows"], ROW_BINS),
                         with_prompts=steps["prompt_rows"] > 0,
                         ratio=steps["measured_s"] / steps["priced_s"],
                         excess_ms=(steps["measured_s"] - steps["priced_s"]) * 1e3)
    grouped = steps.groupby(["with_prompts", "load", "rows"], observed=True)
    return grouped.agg(steps=("ratio", "size"), ratio=("ratio", "median"),
                       excess_ms=("excess_ms", "median")).round(3)


def overlap_fit(steps: pd.DataFrame) -> tuple[dict[str, float], dict[str, float]]:
    """The excess's least-squares terms (search overlap per second, per prompt row, per decode
    row, per 1,000 new tokens, after prompts) and each run's constant, in seconds."""
    runs = sorted(steps["run"].unique())
    terms = {"search_overlap (s/s)": steps["search_overlap_s"],
             "per prompt row": steps["prompt_rows"], "per decode row": steps["decode_rows"],
             "per 1,000 new tokens": steps["new_tokens"] / 1000,
             "after prompts": steps["after_prompts"].astype(float)}
    design = np.column_stack([*(v.to_numpy(float) for v in terms.values()),
                              *((steps["run"] == r).to_numpy(float) for r in runs)])
    excess = (steps["measured_s"] - steps["priced_s"]).to_numpy(float)
    fit = np.linalg.lstsq(design, excess, rcond=None)[0]
    return (dict(zip(terms, fit[:len(terms)], strict=True)),
            dict(zip(runs, fit[len(terms):], strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("systems", nargs="+", type=Path, help="a validation's system folders")
    parser.add_argument("--loads", default="90,50,idle")
    args = parser.parse_args()
    pd.set_option("display.width", 160)
    for system in args.systems:
        steps = steps_of(system, args.loads.split(","))
        print(f"== {system}: {len(steps):,} steps, measured / priced by decode rows")
        print(by_rows(steps).to_string())
        terms, runs = overlap_fit(steps)
        print(f"== {system}: each step's excess, least squares")
        print("   " + "; ".join(f"{name} {value * (1 if 's/s' in name else 1e3):+.3f}"
                                + ("" if "s/s" in name else " ms")
                                for name, value in terms.items()))
        print("   run constants (ms): " + " ".join(f"{run} {value * 1e3:+.2f}"
                                                  for run, value in runs.items()))


if __name__ == "__main__":
    main()
