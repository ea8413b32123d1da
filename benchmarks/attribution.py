"""What each RAGCache technique earns, on equal terms, with intervals (issue 26).

    python benchmarks/attribution.py --trace mmlu --requests 2000            # the ladder
    python benchmarks/attribution.py --trace mmlu --requests 2000 --table orders
    python benchmarks/attribution.py --trace mmlu --requests 2000 --table systems
    python benchmarks/attribution.py --trace mmlu --requests 2000 --table speculation
    ... --seeds 5 --sensitivity      # (the defaults) intervals over 5 seeds, ranges repriced

1. **The ladder** (default): from a baseline (the GPU radix tree with LRU and FCFS, no host
   tier, no speculation: the ``sglang`` preset), add one technique at a time in the order the
   paper builds RAGCache (host tier, PGDSF, cache-aware reordering, speculation, host
   replicas); the last rung is the ``ragcache`` preset. Every rung runs on the same GPU memory
   (the profile's); the host tier's 192 GiB is the second rung's technique.
2. **Orders** (``--table orders``): ragcache with each pool order, FCFS, cache-aware
   (OrderPriority), SJF (fewest tokens to compute) and LPM (most tokens cached), under the same
   window, where a queue builds.
3. **Speculation** (``--table speculation``): ragcache never speculating, speculating as the
   paper does (dynamic), and an oracle bound: every search stage already finds the final list
   (``stage_converge_p`` 1), so every speculative prefill is right and none is wasted.
4. **Systems** (``--table systems``): the paper's 2024 baselines (vllm, vllm-apc, sglang,
   sglang-lpm) and today's engines with host tiers (vllm-offload, sglang-hicache) against
   ragcache, each on the same GPU memory and, where it has a host tier, the same host memory.

Each cell is a mean over ``--seeds`` seeds with its Student-t 95% interval (a seed draws the
trace, the arrivals and the stage lists); a gain is a ratio paired by seed (the same traffic),
its interval over the seeds' ratios. ``--sensitivity`` reprices the first seed under the
profile's held-out error, compute x0.8 / x1.2 and copies at half bandwidth
(``ragsim.api.uncertainty``) and gives each gain's range: a range spanning more than 2x is
marked UNSTABLE (the load sits at the knee of a queue). At the saturation load the offered rate
is above every system's capacity: throughput is the capacity, and mean TTFT grows with the
run's length (quote the throughput there, not the TTFT).
"""

from __future__ import annotations

import argparse
import math
import sys

from ragsim.api.uncertainty import (
    UNSTABLE_SPAN,
    perturbations,
    ratio_range,
    repriced,
    spans,
    student_t_interval,
)
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

GiB = 2**30
PROFILE = "a10g-mistral-7b"
# (moderate, saturation) offered rates, req/s. Saturation is past every system's capacity on
# this profile (paper_comparison.py's overload rates); ragpulse's requests are ~3x longer.
LOADS = {"mmlu": (1.0, 6.0), "nq": (1.0, 6.0), "ragpulse": (0.2, 2.0)}
# where a queue builds and reordering has something to order (reorder_ablation.py's rates)
ORDER_LOADS = {"mmlu": (2.5, 4.0), "nq": (1.4, 3.0), "ragpulse": (0.6, 1.0)}
ORDERS = ("fcfs", "cache-aware", "sjf", "lpm")
SYSTEMS = ("vllm", "vllm-apc", "vllm-offload", "sglang", "sglang-lpm", "sglang-hicache",
           "ragcache")
# rung -> what it turns off of ragcache (each rung turns one more technique back on)
LADDER = (
    ("baseline: GPU radix tree, LRU, FCFS", dict(host_cache_bytes=0, policy="lru",
                                                  order="fcfs", speculate=False,
                                                  host_replicas=0)),
    ("+ host tier (192 GiB)", dict(policy="lru", order="fcfs", speculate=False,
                                   host_replicas=0)),
    ("+ PGDSF", dict(order="fcfs", speculate=False, host_replicas=0)),
    ("+ cache-aware reordering", dict(speculate=False, host_replicas=0)),
    ("+ speculation", dict(host_replicas=0)),
    ("+ host replicas (= ragcache)", dict()),
)


class Runs:
    """Runs of one trace, its traces generated once per seed."""

    def __init__(self, trace: str, requests: int | None, seeds: list[int], sensitivity: bool):
        self.name = trace
        self.seeds = seeds
        self.profile = load_profile(PROFILE)
        self.traces = {s: resolve_trace(trace, seed=s, n_requests=requests) for s in seeds}
        self.costs = [("as profiled", self.profile)]
        if sensitivity:
            self.costs += [(p["name"], repriced(self.profile, p))
                           for p in perturbations(self.profile)]

    def run(self, settings: dict, rate: float) -> dict:
        """``{"seeds": [summary per seed], "repriced": [summary per repricing, seed 0]}``."""
        by_seed = []
        for seed in self.seeds:
            config = build_config({"trace": self.name, "seed": seed, "rate_rps": rate,
                                   **settings})
            by_seed.append(run_simulation(self.traces[seed], config, self.profile).summary)
        first = self.seeds[0]
        config = build_config({"trace": self.name, "seed": first, "rate_rps": rate,
                               **settings})
        others = [run_simulation(self.traces[first], config, costs).summary
                  for _, costs in self.costs[1:]]
        return {"seeds": by_seed, "repriced": [by_seed[0], *others]}


def mean_ci(values: list[float], shown) -> str:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return shown(mean)
    low, high = student_t_interval(values)
    return f"{shown(mean)} [{shown(low)}, {shown(high)}]"


def gain(numer: dict, denom: dict, metric: str, sensitivity: bool) -> str:
    """numer / denom of ``metric``: mean and interval over the seeds' paired ratios, and the
    range over the repricings (UNSTABLE when it spans more than 2x)."""
    ratios = [a[metric] / b[metric] if b[metric] else math.inf
              for a, b in zip(numer["seeds"], denom["seeds"], strict=True)]
    text = mean_ci(ratios, lambda v: f"{v:.2f}x")
    if sensitivity:
        r = ratio_range([s[metric] for s in numer["repriced"]],
                        [s[metric] for s in denom["repriced"]])
        low, high = r["range"]
        text += f"; repriced {low:.2f}-{high:.2f}x" + (" UNSTABLE" if r["unstable"] else "")
    return text


def seconds(v: float) -> str:
    return f"{v:.3f}"


def rps(v: float) -> str:
    return f"{v:.2f}"


def share(v: float) -> str:
    return f"{v:.1%}"


def cells(result: dict) -> list[str]:
    s = result["seeds"]
    return [mean_ci([x["ttft_mean_s"] for x in s], seconds),
            mean_ci([x["throughput_rps"] for x in s], rps),
            mean_ci([x["token_hit_rate"] for x in s], share)]


def ttft_range(result: dict) -> str:
    values = [s["ttft_mean_s"] for s in result["repriced"]]
    low, high = min(values), max(values)
    return f"{low:.3f}-{high:.3f}" + (" UNSTABLE" if spans(low, high) > UNSTABLE_SPAN else "")


def header(title: str, runs: Runs, rate: float) -> None:
    trace = runs.traces[runs.seeds[0]]
    print(f"\n### {title}: {runs.name} at {rate:g} req/s ({trace.n_requests:,} requests, "
          f"{PROFILE}, seeds {runs.seeds[0]}-{runs.seeds[-1]}, mean [95% CI])\n", flush=True)


def ladder(runs: Runs, sensitivity: bool) -> None:
    for load, rate in zip(("moderate load", "saturation"), LOADS[runs.name], strict=True):
        header(f"Attribution ladder, {load}", runs, rate)
        extra = " | TTFT s repriced" if sensitivity else ""
        print("| rung | TTFT mean s | TTFT gain over the rung above | throughput req/s | "
              f"throughput gain | token hit rate{extra} |")
        print("|---" * (7 if sensitivity else 6) + "|")
        previous = None
        for name, off in LADDER:
            result = runs.run({"system": "ragcache", **off}, rate)
            ttft, thr, hit = cells(result)
            ttft_gain = thr_gain = "-"
            if previous is not None:
                ttft_gain = gain(previous, result, "ttft_mean_s", sensitivity)
                thr_gain = gain(result, previous, "throughput_rps", sensitivity)
            row = [name, ttft, ttft_gain, thr, thr_gain, hit]
            if sensitivity:
                row.append(ttft_range(result))
            print("| " + " | ".join(row) + " |", flush=True)
            previous = result


def orders(runs: Runs, sensitivity: bool) -> None:
    for rate in ORDER_LOADS[runs.name]:
        header("Pool orders (ragcache)", runs, rate)
        extra = " | TTFT s repriced" if sensitivity else ""
        print(f"| order | TTFT mean s | TTFT p99 s | gain over FCFS (TTFT) | throughput req/s | "
              f"token hit rate{extra} |")
        print("|---" * (7 if sensitivity else 6) + "|")
        fcfs = None
        for order in ORDERS:
            result = runs.run({"system": "ragcache", "order": order}, rate)
            fcfs = fcfs or result
            ttft, thr, hit = cells(result)
            p99 = mean_ci([x["ttft_p99_s"] for x in result["seeds"]], seconds)
            row = [order, ttft, p99, "-" if result is fcfs else
                   gain(fcfs, result, "ttft_mean_s", sensitivity), thr, hit]
            if sensitivity:
                row.append(ttft_range(result))
            print("| " + " | ".join(row) + " |", flush=True)


def systems(runs: Runs, sensitivity: bool) -> None:
    for load, rate in zip(("moderate load", "saturation"), LOADS[runs.name], strict=True):
        header(f"Systems on equal memory, {load}", runs, rate)
        print("| system | host GiB | TTFT mean s | system / ragcache TTFT | throughput req/s | "
              "ragcache / system throughput | token hit rate |")
        print("|---" * 7 + "|")
        results = {name: runs.run({"system": name}, rate) for name in SYSTEMS}
        rag = results["ragcache"]
        for name, result in results.items():
            host = build_config({"system": name}).host_cache_bytes / GiB
            ttft, thr, hit = cells(result)
            same = result is rag
            print(f"| {name} | {host:g} | {ttft} | "
                  f"{'-' if same else gain(result, rag, 'ttft_mean_s', sensitivity)} | {thr} | "
                  f"{'-' if same else gain(rag, result, 'throughput_rps', sensitivity)} | "
                  f"{hit} |", flush=True)


SPECULATION = (("never", dict(speculate=False)), ("dynamic (the paper's)", dict()),
               ("oracle bound: every stage final", dict(stage_converge_p=1.0)))


def speculation(runs: Runs, sensitivity: bool) -> None:
    for load, rate in zip(("moderate load", "saturation"), LOADS[runs.name], strict=True):
        header(f"Speculation (ragcache), {load}", runs, rate)
        print("| speculation | TTFT mean s | TTFT gain over never | throughput req/s | "
              "token hit rate |")
        print("|---" * 5 + "|")
        never = None
        for name, settings in SPECULATION:
            result = runs.run({"system": "ragcache", **settings}, rate)
            never = never or result
            ttft, thr, hit = cells(result)
            cell = "-" if result is never else gain(never, result, "ttft_mean_s", sensitivity)
            print(f"| {name} | {ttft} | {cell} | {thr} | {hit} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mmlu", choices=list(LOADS))
    parser.add_argument("--requests", type=int, default=2_000,
                        help="requests per run (default 2,000; ragpulse has 7,106)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--sensitivity", action=argparse.BooleanOptionalAction, default=True,
                        help="reprice the first seed and give each gain's range (default on)")
    parser.add_argument("--table", choices=("ladder", "orders", "systems", "speculation"),
                        default="ladder")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.requests < 1:
        sys.exit("error: --seeds and --requests must be >= 1")
    runs = Runs(args.trace, args.requests, list(range(args.seed, args.seed + args.seeds)),
                args.sensitivity)
    tables = {"ladder": ladder, "orders": orders, "systems": systems, "speculation": speculation}
    tables[args.table](runs, args.sensitivity)


if __name__ == "__main__":
    main()
