"""Routers at equal total memory: what each timing-free router keeps of a fleet's traffic.

    python benchmarks/router_table.py                      # ragpulse and mmlu, 4 and 16 replicas
    python benchmarks/router_table.py --traces mmlu --requests 20000

A fleet of N replicas shares the memory of one server split evenly (``--gpu-mem`` and
``--host-mem`` are the totals; each replica gets 1/N), so a router is judged on where it sends
requests, not on more memory. The replay (``ragsim replay --replicas N --router R``) has no
clock: ``least-loaded``, ``kv-aware`` and prefix-affinity's load fallback need the simulator
(``benchmarks/fleet_table.py``); here prefix-affinity follows its cache rule alone. Printed
per trace and fleet size: token hit rate and load imbalance (the busiest replica's requests
over the mean).
"""

from __future__ import annotations

import argparse

from ragsim.cache.routers import TIMING_FREE_ROUTERS
from ragsim.profiles.profile import load_profile
from ragsim.sim.replay import ReplayConfig, run_replay
from ragsim.traces import resolve_trace
from ragsim.units import format_bytes, parse_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="ragpulse,mmlu")
    parser.add_argument("--replicas", default="4,16")
    parser.add_argument("--requests", type=int, default=10_000,
                        help="synthetic traces: requests generated (ragpulse: whole)")
    parser.add_argument("--gpu-mem", default="16GiB", help="the fleet's total")
    parser.add_argument("--host-mem", default="64GiB", help="the fleet's total")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    profile = load_profile("a10g-mistral-7b")
    gpu, host = parse_bytes(args.gpu_mem), parse_bytes(args.host_mem)
    print(f"total memory {format_bytes(gpu)} GPU + {format_bytes(host)} host, split evenly")
    print(f"{'trace':10} {'replicas':>8} {'router':16} {'token hit rate':>15} {'imbalance':>10}")
    for name in args.traces.split(","):
        synthetic = name in ("mmlu", "nq")
        trace = resolve_trace(name, seed=args.seed,
                              n_requests=args.requests if synthetic else None)
        one = run_replay(trace, ReplayConfig(trace=name, gpu_capacity_bytes=gpu,
                                             host_capacity_bytes=host, seed=args.seed), profile)
        print(f"{name:10} {1:>8} {'(one server)':16} {one.summary['token_hit_rate']:>15.1%} "
              f"{'-':>10}")
        for n in (int(r) for r in args.replicas.split(",")):
            for router in TIMING_FREE_ROUTERS:
                config = ReplayConfig(trace=name, replicas=n, router=router, seed=args.seed,
                                      gpu_capacity_bytes=gpu // n, host_capacity_bytes=host // n)
                s = run_replay(trace, config, profile).summary
                print(f"{name:10} {n:>8} {router:16} {s['token_hit_rate']:>15.1%} "
                      f"{s['load_imbalance']:>10.2f}")


if __name__ == "__main__":
    main()
