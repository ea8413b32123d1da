"""Lookup latency of each answer-cache tier on the real stores, against the issue's targets.

Starts the embedded server (valkey + RediSearch; or give ``--redis-url``), fills L2 and the
semantic tier (HNSW, M 16, EF_CONSTRUCTION 200, EF_RUNTIME 200, EPSILON 0.1) with N random unit
384-d vectors for each N, and times lookups that end in each tier: an L1 hit (in-process), an
L2 exact hit (one GET), a semantic hit (GET miss + redisvl range query), a full miss. Vectors
are given, so the embedder's time is not part of a lookup (all-MiniLM-L6-v2 adds ~5 ms on one
CPU thread). Targets: L1 hit < 50 us, L2 hit < 1 ms, semantic lookup < 5 ms at 100k (p50).

    python benchmarks/answer_cache_latency.py [--entries 1000 10000 100000] [--samples 200]
"""

from __future__ import annotations

import argparse
import json

from ragsim.realrun.answers.golden import answer_server, run_bench
from ragsim.realrun.answers.stores import VectorIndex

TARGETS_US = {"l1": 50.0, "l2": 1000.0, "semantic": 5000.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--algorithm", default="hnsw")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--json", dest="json_out", default=None, help="write results here")
    args = parser.parse_args()
    index = VectorIndex(algorithm=args.algorithm)
    results = []
    with answer_server(args.redis_url) as (url, description):
        for n in args.entries:
            results.append(run_bench(url, entries=n, samples=args.samples, index=index))
    print(f"server: {description}; index: {vars(index)}\n")
    print("| entries | tier | p50 us | p99 us | mean us | ended in this tier | target (p50) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for tier, row in r["lookup"].items():
            target = TARGETS_US.get(tier)
            verdict = "" if target is None else (
                f"< {target:g} us: {'met' if row['p50_us'] < target else 'MISSED'}")
            print(f"| {r['entries']:,} | {tier} | {row['p50_us']:.1f} | {row['p99_us']:.1f} | "
                  f"{row['mean_us']:.1f} | {row['expected_tier_rate']:.0%} | {verdict} |")
    for r in results:
        print(f"\nfill of {r['entries']:,} entries: {r['fill_s']:.1f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"server": description, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
