"""How fast the simulator runs a fleet: simulated requests per CPU-second for 1, 4 and 16 replicas.

    python benchmarks/fleet_scale.py                          # 200,000 requests per fleet size
    python benchmarks/fleet_scale.py --requests 1000000 --replicas 16   # the issue's fleet

Every fleet gets the same load per replica (``--rate-per-replica``, default 2 req/s, each
replica the profile's GPU and 32 GiB of host memory), so the work per request is alike and the
number measures the fleet's machinery (one clock, one request table, the router) rather than
queueing. CPU time is the process's (``time.process_time``: what the run cost this machine,
whatever else runs on it); the trace's generation is not counted, the fleet's set-up is.
Printed per fleet size: requests, CPU seconds, simulated requests per CPU-second, simulated
seconds, and what a 16-replica fleet over a million requests would take at that speed.
"""

from __future__ import annotations

import argparse
import time

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.fleet import run_fleet
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

MILLION = 1_000_000


def measure(trace, replicas: int, router: str, rate_per_replica: float, profile) -> dict:
    config = build_config({"trace": "mmlu", "rate_rps": rate_per_replica * replicas,
                           "replicas": replicas, "router": router,
                           "host_cache_bytes": 32 * 2**30})
    started_cpu, started_wall = time.process_time(), time.perf_counter()
    run = run_fleet if replicas > 1 else run_simulation
    summary = run(trace, config, profile).summary
    cpu_s = time.process_time() - started_cpu
    return {"replicas": replicas, "requests": trace.n_requests, "cpu_s": cpu_s,
            "wall_s": time.perf_counter() - started_wall,
            "requests_per_cpu_s": trace.n_requests / cpu_s,
            "simulated_s": summary["simulated_s"],
            "completed": summary["requests_completed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--replicas", default="1,4,16")
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--rate-per-replica", type=float, default=2.0)
    args = parser.parse_args()
    profile = load_profile("a10g-mistral-7b")
    trace = resolve_trace("mmlu", n_requests=args.requests)
    print(f"mmlu, {args.requests:,} requests, {args.rate_per_replica:g} req/s per replica, "
          f"router {args.router}")
    print(f"{'replicas':>8} {'CPU s':>8} {'wall s':>8} {'req/CPU-s':>10} {'simulated s':>12} "
          f"{'16 x 1M would take':>19}")
    for n in (int(r) for r in args.replicas.split(",")):
        m = measure(trace, n, args.router if n > 1 else "round-robin", args.rate_per_replica,
                    profile)
        assert m["completed"] == m["requests"], m
        print(f"{n:>8} {m['cpu_s']:>8.1f} {m['wall_s']:>8.1f} {m['requests_per_cpu_s']:>10,.0f} "
              f"{m['simulated_s']:>12,.0f} {MILLION / m['requests_per_cpu_s'] / 60:>15.1f} min")


if __name__ == "__main__":
    main()
