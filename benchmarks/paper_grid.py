"""Wall time of the paper's whole evaluation grid as one `ragsim sweep` (local executor).

The grid: 2 traces (mmlu, nq) x 2 7B models (Mistral-7B, LLaMA2-7B on the A10G profiles) x 3
systems (vllm, sglang, ragcache) x 8 Poisson rates x 5 seeds, 10,000 requests each (480 runs).
``--scale`` shrinks the requests and ``--seeds`` the repetitions, so a slice can be timed on a
busy machine and the whole grid's time estimated from it (runs scale about linearly with their
requests at a fixed load; the estimate says so and is not a measurement of the whole grid).

    python benchmarks/paper_grid.py --out /tmp/grid                       # the whole grid
    python benchmarks/paper_grid.py --out /tmp/grid --scale 0.1 --seeds 1  # a slice, estimated
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

TRACES = ("mmlu", "nq")
PROFILES = ("a10g-mistral-7b", "a10g-llama2-7b")
SYSTEMS = ("vllm", "sglang", "ragcache")
RATES = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
REQUESTS = 10_000
SEEDS = 5


def sweep_file(requests: int, seeds: int, rates=RATES) -> str:
    def listed(values) -> str:
        return "[" + ", ".join(repr(v).replace("'", '"') for v in values) + "]"

    return (f"seeds = {listed(range(seeds))}\n[base]\nn_requests = {requests}\n[axes]\n"
            f"trace = {listed(TRACES)}\nprofile = {listed(PROFILES)}\n"
            f"system = {listed(SYSTEMS)}\nrate_rps = {listed(rates)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="sweep folder (a fresh one)")
    parser.add_argument("--scale", type=float, default=1.0, help="share of 10,000 requests")
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES),
                        help="a subset of the grid's rates (a slice; the estimate scales up)")
    args = parser.parse_args()
    requests = max(1, round(REQUESTS * args.scale))
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.out / "paper_grid.toml"
    spec.write_text(sweep_file(requests, args.seeds, args.rates))
    command = [sys.executable, "-m", "ragsim", "sweep", str(spec), "--out",
               str(args.out / "results"), "--no-records"]
    if args.jobs:
        command += ["--jobs", str(args.jobs)]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall_s = time.perf_counter() - start
    # CPU time of the sweep and its workers: what the grid costs whatever else shares the cores
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = used.ru_utime + used.ru_stime
    jobs = args.jobs or len(os.sched_getaffinity(0))
    table = pd.read_parquet(args.out / "results" / "results.parquet")
    simulated = int(table["requests"].sum())
    runs = len(TRACES) * len(PROFILES) * len(SYSTEMS) * len(RATES)
    print(f"{len(table)} runs of {requests:,} requests ({simulated:,} simulated) in "
          f"{wall_s:,.1f} s wall: {simulated / wall_s:,.0f} simulated requests/s overall")
    print(f"CPU time {cpu_s:,.1f} s ({simulated / cpu_s:,.0f} simulated requests per CPU-s); "
          f"on {jobs} otherwise idle cores: {cpu_s / jobs:,.1f} s")
    whole = runs * SEEDS * REQUESTS
    if len(table) * requests < whole:
        scale = whole / simulated
        print(f"whole grid ({runs * SEEDS} runs x {REQUESTS:,} requests) estimated at "
              f"{wall_s * scale / 60:,.1f} min at this wall rate, {cpu_s * scale / jobs / 60:,.1f}"
              f" min on {jobs} idle cores (extrapolations)")


if __name__ == "__main__":
    main()
