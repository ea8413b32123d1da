"""Routers with time, at equal total memory: hit rate, TTFT and imbalance of a simulated fleet.

    python benchmarks/fleet_table.py                       # ragpulse and mmlu, 4 and 16 replicas
    python benchmarks/fleet_table.py --traces mmlu --replicas 4 --requests-per-replica 2000

Each fleet of N replicas (``ragsim run --replicas N --router R``) shares one total memory
split evenly (``--gpu-mem`` and ``--host-mem`` are the totals, default 64 GiB and 256 GiB:
4 replicas of 16 GiB of KV each, about what an A10G holds for Mistral-7B, or 16 of 4 GiB),
each replica on its own GPU of the profile's kind, all at the same load per replica
(``--rate-per-replica``; the fleet's rate is N times it), so a router is judged on where it
sends requests, with the same memory, compute and traffic. Every router, least-loaded and
kv-aware included, runs on the fleet's one clock; ``kv-aware, 1 s late`` sees the replicas'
caches and loads a second late (``--router-staleness 1``). Printed per trace and fleet size:
token hit rate, mean and p90 TTFT, load imbalance (the most requests a replica was sent over
the mean) and GPU busy imbalance (the busiest replica's GPU time over the mean).
"""

from __future__ import annotations

import argparse

from ragsim.cache.routers import ROUTERS
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.fleet import run_fleet
from ragsim.traces import resolve_trace
from ragsim.units import format_bytes, parse_bytes

# per-replica load: each trace near where its engine queues (ragpulse's prompts are long: one
# a10g engine saturates past ~0.5 req/s; mmlu's past ~3)
RATE_PER_REPLICA = {"ragpulse": 0.4, "mmlu": 1.5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="ragpulse,mmlu")
    parser.add_argument("--replicas", default="4,16")
    parser.add_argument("--requests-per-replica", type=int, default=400)
    parser.add_argument("--gpu-mem", default="64GiB", help="the fleet's total")
    parser.add_argument("--host-mem", default="256GiB", help="the fleet's total")
    parser.add_argument("--rate-per-replica", type=float, default=None,
                        help="default: 0.4 req/s for ragpulse, 1.5 for mmlu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    profile = load_profile("a10g-mistral-7b")
    gpu, host = parse_bytes(args.gpu_mem), parse_bytes(args.host_mem)
    print(f"total memory {format_bytes(gpu)} GPU + {format_bytes(host)} host, split evenly; "
          f"{args.requests_per_replica} requests per replica")
    print(f"{'trace':9} {'N':>3} {'req/s':>6} {'router':22} {'hit rate':>8} {'TTFT mean':>9} "
          f"{'p90':>8} {'imbalance':>9} {'GPU busy':>8}")
    for name in args.traces.split(","):
        rate = args.rate_per_replica or RATE_PER_REPLICA.get(name, 1.0)
        for n in (int(r) for r in args.replicas.split(",")):
            trace = resolve_trace(name, seed=args.seed,
                                  n_requests=args.requests_per_replica * n)
            routers = [(r, r, 0.0) for r in ROUTERS] + [("kv-aware, 1 s late", "kv-aware", 1.0)]
            for label, router, late_s in routers:
                config = build_config({
                    "trace": name, "seed": args.seed, "rate_rps": rate * n, "replicas": n,
                    "router": router, "router_staleness_s": late_s,
                    "gpu_kv_bytes": gpu // n, "host_cache_bytes": host // n})
                s = run_fleet(trace, config, profile).summary
                print(f"{name:9} {n:>3} {rate * n:>6.1f} {label:22} "
                      f"{s['token_hit_rate']:>8.1%} {s['ttft_mean_s']:>8.3f}s "
                      f"{s['ttft_p90_s']:>7.3f}s {s['load_imbalance']:>9.2f} "
                      f"{s['gpu_busy_imbalance']:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
