"""A stored validation point simulated again, against the same real runs: what-ifs on the model.

A validation point's folder (``OUT/<system>/load-90``: its ``config.toml``, its real runs
``real``, ``real-2``, ...) keeps everything the simulated side needs, so a change to the model
can be judged on the real runs already measured, with the machine's drift between validations
out of the comparison. For each point this prints the real runs' own numbers (their p90 |error|
floor, and one run against the others' average: ``ragsim.sim_ensemble``), then each variant's
raw errors against the runs' per-request average: the noise-free simulation, and with
``--sim-replicas K`` the per-request average of K simulations with each step's time drawn
around its price (``validate --sim-replicas``), with the replicas' own one-against-the-others
p90. Variants: ``--profile`` (another profile), ``--term-from new_shapes=OTHER.json`` (one of the
profile's terms from another profile), ``--set name=value`` (a configuration field, e.g.
``engine_loop_search_s=0.00015``), ``--drop-decode-batch N`` (the profile's decode grid without
its batch-N row), ``--sigma`` and ``--correlation`` (the steps' draws: by default the probe
runs' spread where the point's report has it, else the profile's with no correlation),
``--real-runs N`` (against the first N real runs only: a protocol of fewer repeats).

Two readings request by request: ``--by-run`` prints each real run's steps against their
prices (``steps.parquet``) beside that run's own errors against the noise-free simulation, so
a point whose runs ran at different machine speeds shows it run by run; ``--requests-out DIR``
writes each variant's per-request table (``requests.parquet`` as a run writes it) to compare
with the real runs' own (docs/validation.md, "Run V, request by request").

    python benchmarks/resimulate_point.py OUT/vllm-ragcache/load-90 OUT/vllm-ragcache/load-50 \\
        --sim-replicas 16
    python benchmarks/resimulate_point.py OUT/torch-ragcache/load-90 \\
        --set engine_loop_search_s=0 --drop-decode-batch 32

A vLLM run records the step sizes its engine process had run before it began
(``engine_warm_step_token_counts``), which validate's simulation charges no first-time price
for; a run stored before that field existed is simulated with every size warm, and said so
(its noise-free errors then differ from the stored report's). Each real run is simulated from
its own engine's starting state and the simulations averaged as the runs are
(``validation.run_sim_like_runs``; before 2026-12-07 the first run's state stood for all, so a
point stored before then reads other noise-free errors here than in its report).
docs/validation.md quotes its tables (runs Q and R).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from ragsim.api.loading import load_profile, load_trace
from ragsim.engine_spread import p90_abs_error_floor, pooled_join, pooled_throughput_error
from ragsim.profiles.grid import BilinearGrid
from ragsim.profiles.repeat_spread import step_time_sigma
from ragsim.serving.config import SimConfig, load_config_file
from ragsim.serving.pipeline import RunResult
from ragsim.sim_ensemble import p90_abs_error_one_run
from ragsim.validation import (
    joined_to_reals,
    run_sim_ensemble,
    run_sim_like_runs,
    ttft_errors,
    warmed_like,
)


def stored_runs(point: Path) -> list[RunResult]:
    """The point's real runs as ``RunResult``s (their records and summaries)."""
    runs = []
    for folder in sorted(point.glob("real*"), key=lambda p: (len(p.name), p.name)):
        columns = {name: values.to_numpy()
                   for name, values in pd.read_parquet(folder / "requests.parquet").items()}
        summary = json.loads((folder / "summary.json").read_text())
        runs.append(RunResult(config=None, columns=columns, summary=summary))
    if not runs:
        raise SystemExit(f"{point}: no real run (real/requests.parquet)")
    return runs


def without_decode_batch(profile, batch: int):
    """``profile`` with its decode grid's batch-``batch`` row left out."""
    grid = profile.decode
    keep = [i for i, b in enumerate(grid.x_axis) if b != batch]
    if len(keep) == len(grid.x_axis):
        raise SystemExit(f"the decode grid has no batch {batch} (batches {grid.x_axis})")
    return replace(profile, decode=BilinearGrid(
        grid.name, grid.x_name, grid.y_name, [grid.x_axis[i] for i in keep],
        list(grid.y_axis), [list(grid.values[i]) for i in keep],
        monotone_x=getattr(grid, "monotone_x", True)))


def warmed_as_run(profile, real: RunResult) -> tuple[object, str]:
    """``profile`` as validate priced the point (``validation.warmed_like``), from what the
    stored run's summary kept."""
    summary = real.summary
    warm = summary.get("engine_warm_step_token_counts")
    how = "the run's warm step sizes" if warm is not None else "as stored"
    if warm is None and summary.get("engine_warm_step_tokens"):
        warm = range(1, 1 + int(1e5))  # stored before the sizes were: their count alone
        how = "every step size warm (the run kept only their count)"
    kept = SimpleNamespace(engine_warm_step_tokens=warm,
                           engine_built_capacity_counts=summary.get(
                               "engine_built_capacity_counts"))
    return warmed_like(profile, kept), how


def errors_of(reals: list[RunResult], sim: RunResult) -> tuple[float, float]:
    """(TTFT mean error, p90 |error|) against the runs' per-request average, as validate
    computes them."""
    errors = ttft_errors(joined_to_reals(reals, sim.columns))
    return errors["ttft_mean_error"], errors["ttft_p90_abs_error"]


def by_run_rows(point: Path, reals: list[RunResult], sim: RunResult) -> list[str]:
    """One table row per real run: its steps' measured over priced time (where it kept
    ``steps.parquet``) and its own TTFT mean error and p90 |error| against ``sim``."""
    rows = []
    folders = sorted(point.glob("real*"), key=lambda p: (len(p.name), p.name))
    for folder, real in zip(folders, reals, strict=False):
        steps = folder / "steps.parquet"
        ratio = "-"
        if steps.exists():
            table = pd.read_parquet(steps, columns=["measured_s", "priced_s"])
            ratio = f"{table['measured_s'].sum() / table['priced_s'].sum():.3f}"
        mean_error, p90 = errors_of([real], sim)
        rows.append(f"| {point} | {folder.name} | {ratio} | "
                    f"{float(np.mean(real.columns['ttft_s'])) * 1e3:.1f} | {mean_error:+.1%} | "
                    f"{p90:.1%} |")
    return rows


def write_requests(folder: Path, point: Path, label: str, sim: RunResult) -> Path:
    """``sim``'s per-request table under ``folder``, named by the point and the variant."""
    name = f"{point.parent.name}-{point.name}-{label.split(',')[0].replace(' ', '-')}"
    path = folder / f"{name}.parquet"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(sim.columns).to_parquet(path)
    return path


def probe_spread(point: Path) -> dict | None:
    """The step spread validate measured on the point's probe runs (``probes.step_spread``
    in its report; None for a point stored before it did)."""
    report = point / "validation.json"
    if not report.exists():
        return None
    return (json.loads(report.read_text()).get("probes") or {}).get("step_spread")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", type=Path, help="validation point folders")
    parser.add_argument("--profile", help="price with this profile instead of the point's")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a configuration field (repeatable)")
    parser.add_argument("--term-from", action="append", default=[], metavar="TERM=PROFILE",
                        help="one of the profile's terms (new_shapes, idle_start, "
                        "mixed_steps, decode, ...) taken from another profile (repeatable)")
    parser.add_argument("--drop-decode-batch", type=int)
    parser.add_argument("--real-runs", type=int, help="judge against the point's first N real "
                        "runs only (default: all it kept)")
    parser.add_argument("--sim-replicas", type=int, default=1)
    parser.add_argument("--sigma", type=float, help="step-time spread (default: the probe "
                        "runs' where the point's report has them, else the profile's)")
    parser.add_argument("--correlation", type=float, help="lag-1 correlation of the steps' "
                        "draws (default: the probe runs' where the report has them, else 0)")
    parser.add_argument("--by-run", action="store_true", help="each real run's steps against "
                        "their prices and its own errors against the noise-free simulation")
    parser.add_argument("--requests-out", type=Path, help="write each variant's per-request "
                        "table here (POINT-VARIANT.parquet)")
    args = parser.parse_args()
    by_run: list[str] = []
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = json.loads(value) if value[:1] in "-0123456789.[{tf\"" else value
    print("| point | real mean (ms) | floor | one real run | variant | sim mean (ms) | "
          "mean error | p90 abs error | one replica | throughput error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for point in args.points:
        run = load_config_file(point / "config.toml")
        # the noise-free run (a point stored while config.toml kept an ensemble's replica 0
        # has its step_time_sigma); --set step_time_sigma=... makes it one noisy run
        config = SimConfig(**{**run, "step_time_sigma": 0.0, **overrides})
        trace = load_trace(run["trace"], requests=run["n_requests"])
        reals = stored_runs(point)[:args.real_runs]
        profile = load_profile(args.profile or run["profile"])
        for item in args.term_from:
            term, _, other = item.partition("=")
            if not hasattr(profile, term):
                raise SystemExit(f"a profile has no term {term!r}")
            profile = replace(profile, **{term: getattr(load_profile(other), term)})
        if args.drop_decode_batch is not None:
            profile = without_decode_batch(profile, args.drop_decode_batch)
        measured = probe_spread(point)
        sigma = args.sigma if args.sigma is not None else (
            measured["sigma"] if measured else step_time_sigma(profile))
        correlation = args.correlation if args.correlation is not None else (
            measured["correlation"] if measured else 0.0)
        # each real run's engine began in its own state (vLLM's repeats share a process):
        # one simulation per state, averaged as the runs are (validation.run_sim_like_runs)
        states = [warmed_as_run(profile, real)[0] for real in reals]
        how = warmed_as_run(profile, reals[0])[1]
        pooled = pooled_join(reals, reals[0].columns)[2]
        real_ttft = np.array([frame["ttft_s_real"].to_numpy(float) for frame in pooled])
        head = (f"| {point} | {real_ttft.mean(axis=1).mean() * 1e3:.1f} | "
                f"{p90_abs_error_floor(real_ttft):.1%} | {p90_abs_error_one_run(real_ttft):.1%}")
        variants = [("noise-free", run_sim_like_runs(trace, config, states)[0], None)]
        if args.sim_replicas > 1:
            if not sigma:
                raise SystemExit("the profile keeps no repeated timings: give --sigma")
            ensemble = run_sim_ensemble(trace, config, states, args.sim_replicas, sigma,
                                        correlation)
            variants.append((f"{args.sim_replicas} replicas, sigma {sigma:.3f}, "
                             f"rho {correlation:.2f}", ensemble,
                             ensemble.summary["ttft_p90_abs_error_one_run"]))
        if args.by_run:
            by_run += by_run_rows(point, reals, variants[0][1])
        for label, sim, one in variants:
            if args.requests_out is not None:
                write_requests(args.requests_out, point, label, sim)
            mean_error, p90 = errors_of(reals, sim)
            print(f"{head} | {label} | {sim.summary['ttft_mean_s'] * 1e3:.1f} | "
                  f"{mean_error:+.1%} | {p90:.1%} | {'-' if one is None else f'{one:.1%}'} | "
                  f"{pooled_throughput_error(reals, sim.summary)[1]:+.1%} |")
        print(f"<!-- {point}: profile {how}; overrides {overrides or 'none'}; terms from "
              f"{args.term_from or 'none'} -->")
    if by_run:
        print("\n| point | real run | its steps: measured / priced | its mean TTFT (ms) | "
              "mean error against the noise-free simulation | p90 abs error |")
        print("|---|---|---|---|---|---|")
        print("\n".join(by_run))


if __name__ == "__main__":
    main()
