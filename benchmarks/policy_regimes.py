"""Where PGDSF keeps the most, and where LFU or LRU do: token hit rate against popularity drift
and trace length.

The paper reports PGDSF ahead of GDSF, LRU and LFU at every host size (Figure 17). Whether a
simulation reproduces that depends on the traffic, not only on the policy: on stationary
popularity counting every retrieval is the best estimate of the future (LFU's best case), when
popular documents move quickly recency is (LRU's), and PGDSF's GDS clock sits in between. This
replays the built-in synthetic traces at several drifts (the generator's
``drift_per_1k_requests``: the share of popularity ranks that trade documents after every 1,000
requests) and lengths, and prints each policy's token hit rate and PGDSF's ratio to the best
baseline and to LFU:

    python benchmarks/policy_regimes.py                      # mmlu and nq, 10k and 100k requests
    python benchmarks/policy_regimes.py --traces mmlu --requests 20000 --drifts 0 0.3

``ragsim replay`` (requests one at a time, in trace order: hit rates without queueing), GPU KV
4 GiB plus the host sizes, A10G Mistral-7B costs, every policy counting retrievals by one rule
(``--frequency-scope``, lifetime by default). Deterministic for ``--seed``; one seed per
cell, so ratios within ~1% of 1 are ties (``policy_seeds.py`` shows the spread over seeds).
"""

from __future__ import annotations

import argparse
import itertools
import os
from concurrent.futures import ProcessPoolExecutor

from paper_comparison import POLICIES, GiB


def cell(trace_name: str, drift: float, n_requests: int, seed: int, host_gib: tuple[int, ...],
         frequency_scope: str = "lifetime") -> list[dict]:
    """Every policy at every host size on one generated trace (one process per trace)."""
    from ragsim.profiles.profile import load_profile
    from ragsim.sim.replay import ReplayConfig, run_replay
    from ragsim.traces import builtin_trace

    trace = builtin_trace(trace_name, seed=seed, n_requests=n_requests,
                          drift_per_1k_requests=drift)
    profile = load_profile("a10g-mistral-7b")
    rows = []
    for host in host_gib:
        hit = {policy: run_replay(trace, ReplayConfig(trace=trace_name, policy=policy,
                                                      host_capacity_bytes=host * GiB,
                                                      frequency_scope=frequency_scope),
                                  profile).summary["token_hit_rate"]
               for policy in POLICIES}
        rows.append({"trace": trace_name, "drift": drift, "requests": n_requests, "host": host,
                     **hit})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["mmlu", "nq"])
    parser.add_argument("--drifts", type=float, nargs="+", default=[0.0, 0.01, 0.03, 0.1, 0.3])
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--host-gib", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frequency-scope", default="lifetime",
                        choices=("admission", "lifetime"),
                        help="how every frequency policy counts retrievals (the same for all)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    cells = list(itertools.product(args.traces, args.requests, args.drifts))
    print("| trace | requests | drift | host | " + " | ".join(POLICIES)
          + " | best baseline | pgdsf / best baseline | pgdsf / lfu |")
    print("|---" * (7 + len(POLICIES)) + "|")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(cell, name, drift, n, args.seed, tuple(args.host_gib),
                               args.frequency_scope)
                   for name, n, drift in cells]
        for future in futures:  # in submission order, so the table reads top to bottom
            for row in future.result():
                best = max(POLICIES[1:], key=lambda p: row[p])
                print(f"| {row['trace']} | {row['requests']:,} | {row['drift']:g} | "
                      f"{row['host']} GiB | "
                      + " | ".join(f"{row[p]:.1%}" for p in POLICIES)
                      + f" | {best} | {row['pgdsf'] / row[best]:.2f}x | "
                      f"{row['pgdsf'] / row['lfu']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
