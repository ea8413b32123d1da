"""How PGDSF's hit-rate ratios to GDSF, LRU and LFU vary with the trace's seed.

One seed can make two policies look ordered when they tie; this runs the policy table of
``paper_comparison.py`` (its ``policy_hit_rates``: ragcache without speculation, 0.8 req/s) on
several traces and prints each ratio per trace and its range, and how much of the static
frequency bound PGDSF and LFU keep (``ragsim.cache.bounds``: no fixed contents of GPU KV + host
memory keep more, even knowing every node's count in advance; on stationary traffic, what
frequency policies leave on the table; not a ceiling for traffic whose topics move):

    python benchmarks/policy_seeds.py --synthetic mmlu --seeds 6           # as built in
    python benchmarks/policy_seeds.py --synthetic nq --seeds 6 --drift 0   # stationary: the
                                                                           # bound is a ceiling
    # real retrieval, reshuffled (needs the corpus extra; embeddings are cached after one build):
    for s in 0 1 2 3 4 5; do ragsim trace build --corpus wiki-offline --questions trivia \\
        --top-k 2 --index ivf --stages 4 --nprobe 64 --requests 5000 --order shuffle --rate 1 \\
        --seed $s --redact-text --out wt-$s; done
    python benchmarks/policy_seeds.py wt-0 wt-1 wt-2 wt-3 wt-4 wt-5 --host-gib 8 32 128
"""

from __future__ import annotations

import argparse

from paper_comparison import GiB, policy_hit_rates

from ragsim.cache.bounds import static_frequency_bound
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace
from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

BASELINES = ("gdsf", "lru", "lfu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="trace directories (or built-in names)")
    parser.add_argument("--synthetic", help="a built-in synthetic trace to generate per seed")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--frequency-scope", default="lifetime",
                        choices=("admission", "lifetime"),
                        help="how every frequency policy counts retrievals (the same for all)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--host-gib", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--drift", type=float, default=None,
                        help="with --synthetic: popularity drift per 1,000 requests (built-in: "
                             f"{BUILTIN_DRIFT_PER_1K_REQUESTS:g}; 0: stationary)")
    args = parser.parse_args()
    if not args.traces and not args.synthetic:
        parser.error("give trace directories or --synthetic NAME")
    if args.drift is not None and not args.synthetic:
        parser.error("--drift applies to --synthetic traces only")
    overrides = {} if args.drift is None else {"drift_per_1k_requests": args.drift}
    profile = load_profile("a10g-mistral-7b")
    runs = [(path, 0, None, {}) for path in args.traces]
    if args.synthetic:
        runs += [(args.synthetic, seed, args.requests, overrides) for seed in range(args.seeds)]
    ratios: dict[tuple[int, str], list[float]] = {}
    print("| trace | seed | host | " + " | ".join(f"pgdsf / {b}" for b in BASELINES)
          + " | static bound | pgdsf / bound | lfu / bound |")
    print("|---" * (6 + len(BASELINES)) + "|")
    for name, seed, n_requests, generator in runs:
        trace = resolve_trace(name, seed=seed, n_requests=n_requests, **generator)
        drift = trace.info.get("parameters", {}).get("drift_per_1k_requests")
        label = name if drift is None else f"{name} (drift {drift:g})"

        def summary(trace=trace, name=name, seed=seed, **settings) -> dict:
            config = build_config({"trace": name, "seed": seed,
                                   "frequency_scope": args.frequency_scope, **settings})
            return run_simulation(trace, config, profile).summary

        for host in args.host_gib:
            hit = policy_hit_rates(summary, host)
            # the bound gets all of the GPU's KV space (no system prompt, no running requests)
            capacity_tokens = (profile.kv_capacity_bytes + host * GiB) \
                / profile.model.kv_bytes_per_token
            bound = static_frequency_bound(trace.doc_offsets, trace.doc_ids,
                                           trace.doc_tokens_flat, capacity_tokens)
            row = {b: hit["pgdsf"] / hit[b] for b in BASELINES}
            row["pgdsf / bound"] = hit["pgdsf"] / bound
            row["lfu / bound"] = hit["lfu"] / bound
            for b, r in row.items():
                ratios.setdefault((host, b), []).append(r)
            print(f"| {label} | {seed if n_requests is not None else '-'} | {host} GiB | "
                  + " | ".join(f"{row[b]:.3f}" for b in BASELINES) + f" | {bound:.1%} | "
                  + f"{row['pgdsf / bound']:.3f} | {row['lfu / bound']:.3f} |", flush=True)
    columns = [f"pgdsf / {b}" for b in BASELINES] + ["pgdsf / bound", "lfu / bound"]
    keys = [*BASELINES, "pgdsf / bound", "lfu / bound"]
    print("\n| host | " + " | ".join(f"{c} (min-max)" for c in columns) + " |")
    print("|---" * (1 + len(columns)) + "|")
    for host in args.host_gib:
        print(f"| {host} GiB | " + " | ".join(
            f"{min(ratios[host, k]):.2f}-{max(ratios[host, k]):.2f}x" for k in keys) + " |")


if __name__ == "__main__":
    main()
