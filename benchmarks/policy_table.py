"""Replacement policies under equal terms: every frequency policy counts retrievals by the same
rule, each rule shown, with PGDSF's ablations.

    python benchmarks/policy_table.py --mooncake PATH            # the tables in docs/policies.md
    python benchmarks/policy_table.py --quick --mooncake PATH    # 2,000 requests, 32 GiB only
    python benchmarks/policy_table.py --mode run --traces mmlu   # the simulator instead
    python benchmarks/policy_table.py --cost-study --mooncake PATH   # where the cost matters

Equal terms: PGDSF, GDSF, LFU and the ablations (``pgdsf-const-cost``, ``pgdsf-no-size``)
count by one rule at a time -- ``admission`` (the count restarts when a node leaves the
cache), ``lifetime`` (every retrieval since the start) or ``window`` (the last
``--window-requests`` requests' worth of time: the trace's mean gap between requests times
that many, or that many over the rate in ``--mode run``; 1,000 by default, the unit in which
popularity drift is measured) -- with the same memory and the same requests. LRU does not
count, so it has one row per host size.

Setting: the README's policy table (host memory 8/32/128 GiB, A10G Mistral-7B, GPU KV space
from the profile, 10,000 requests of each synthetic trace, the recorded traces whole).
``--mode replay`` (the default) feeds the requests in trace order through the policy core
(``ragsim replay``'s machinery: no queueing, no reordering, no running requests' memory): hit
rates only, seconds per table. ``--mode run`` is ``ragsim run --system ragcache
--no-speculate --rate 0.8`` per cell (reordering and running requests included), minutes.

Traces: ``ragpulse`` (real RAG traffic, whole; in ``--mode run`` at 0.2 req/s, its own
``RUN_RATES_RPS``, since 0.8 req/s is past every system's saturation on its long requests),
the built-in synthetic ``mmlu`` and ``nq`` (their default drift), the real-retrieval
``wiki-trivia`` and ``wiki-trivia-topics``, and a Mooncake trace (``--mooncake``: its JSONL,
``.jsonl.xz``, or a folder written by ``ragsim trace import-mooncake``): long shared prefixes
of 512-token blocks.

``--cost-study`` (replay, with A10G Mistral-7B's memory for every profile, so only the
prefill costs differ): PGDSF against its two ablations (lifetime counts) across profiles -- the
derived A10G Mistral-7B, a large model on H800 (Llama-2-70B, TP2), and the measured CPU
profile -- on mmlu, mmlu with eight documents per request (``mmlu-top8``: long prefixes),
nq, wiki-trivia (short documents) and Mooncake, to find where the prefix-aware cost changes
what is kept.

Deterministic for ``--seed``; one seed per cell, so differences under ~0.5 points are within
what another seed moves (``policy_seeds.py``).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

GiB = 2**30
PROFILE = "a10g-mistral-7b"
COUNTING = ("pgdsf", "gdsf", "lfu", "pgdsf-const-cost", "pgdsf-no-size")
SCOPES = ("admission", "lifetime", "window")
TRACES = ("ragpulse", "mmlu", "nq", "wiki-trivia", "wiki-trivia-topics")
COST_PROFILES = ("a10g-mistral-7b", "h800-llama2-70b-tp2", "cpu-mistral-7b-l2-h256")
COST_POLICIES = ("pgdsf", "pgdsf-const-cost", "pgdsf-no-size", "gdsf")
RUN_RATE_RPS = 0.8
# ragpulse's requests are long (~2,600 path and ~280 output tokens): 0.8 req/s is past every
# system's saturation (~0.6), so its run-mode cells run at about a third of ragcache's throughput
RUN_RATES_RPS = {"ragpulse": 0.2}


def run_rate_rps(label: str) -> float:
    return RUN_RATES_RPS.get(label, RUN_RATE_RPS)
MOONCAKE_EXTRA_HOST_GIB = (512, 2048)
# --cost-study's extra trace: mmlu with eight documents per request (prefixes four times longer)
LONG_LISTS = {"mmlu-top8": ("mmlu", 8)}
COST_TRACES = ("mmlu", "mmlu-top8", "nq", "wiki-trivia")
SYNTHETIC = ("mmlu", "nq")
TIE_POINTS = 0.1  # hit rates this close (in points) are printed as a tie


def load_trace(name: str, n_requests: int | None, seed: int, drift: float | None = None):
    """A built-in trace (synthetic ones generated with ``n_requests`` and, if given, ``drift``
    per 1,000 requests), or Mooncake's."""
    from ragsim.traces import read_mooncake, resolve_trace

    path = Path(name)
    generator = {} if drift is None else {"drift_per_1k_requests": drift}
    if name in LONG_LISTS:  # a synthetic trace retrieving more documents: longer prefixes
        base, top_k = LONG_LISTS[name]
        return resolve_trace(base, seed=seed, n_requests=n_requests, top_k=top_k, **generator)
    if name in SYNTHETIC:
        return resolve_trace(name, seed=seed, n_requests=n_requests, **generator)
    if path.suffix in (".xz", ".jsonl"):  # the importer reads compressed JSONL as it is
        trace = read_mooncake(path)
    else:
        return resolve_trace(name, seed=seed, n_requests=n_requests)
    return trace.head(n_requests) if n_requests is not None else trace


def requests_of(name: str, args: argparse.Namespace) -> int | None:
    """Synthetic traces are generated with ``--requests``; recorded ones are used whole unless
    ``--requests`` is below the setting's 10,000 (``--quick``)."""
    if name in (*SYNTHETIC, *LONG_LISTS):
        return args.requests
    return None if args.requests >= 10_000 else args.requests


def hosts_for(label: str, args: argparse.Namespace) -> list[int]:
    """The host sizes of a trace's table: Mooncake's requests are ~15,000 tokens (2 GiB of
    Mistral-7B KV each, 7.3 TiB in all), so it also gets 512 GiB and 2 TiB."""
    if label == "mooncake" and not args.quick:
        return [*args.host_gib, *MOONCAKE_EXTRA_HOST_GIB]
    return args.host_gib


def window_s(trace, window_requests: int, mode: str, label: str = "") -> float:
    """The window scope's width: ``window_requests`` requests' worth of time."""
    if mode == "run":
        return window_requests / run_rate_rps(label)
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    return window_requests * span / max(1, trace.n_requests - 1)


def hit_rate(trace, label: str, policy: str, scope: str, window: float | None, host_gib: int,
             mode: str, profile_name: str, seed: int, memory_profile: str | None = None
             ) -> float:
    """One cell's token hit rate. ``memory_profile`` (replay only) takes the KV bytes per
    token and GPU KV space from another profile than the costs, so that only the cost's
    shape differs between profiles."""
    from ragsim.profiles.profile import load_profile

    profile = load_profile(profile_name)
    memory = load_profile(memory_profile or profile_name)
    if mode == "run":
        from ragsim.serving.config import build_config
        from ragsim.sim.simulator import run_simulation

        config = build_config({
            "trace": label, "system": "ragcache", "profile": profile_name, "seed": seed,
            "speculate": False, "rate_rps": run_rate_rps(label), "policy": policy,
            "host_cache_bytes": host_gib * GiB, "frequency_scope": scope,
            "frequency_window_s": window})
        return run_simulation(trace, config, profile).summary["token_hit_rate"]
    from ragsim.sim.replay import ReplayConfig, run_replay

    config = ReplayConfig(
        trace=label, policy=policy, model=memory.model.name,
        kv_bytes_per_token=memory.model.kv_bytes_per_token,
        gpu_capacity_bytes=memory.kv_capacity_bytes, host_capacity_bytes=host_gib * GiB,
        profile=profile_name, seed=seed, frequency_scope=scope, frequency_window_s=window)
    return run_replay(trace, config, profile).summary["token_hit_rate"]


def equal_terms_cell(name: str, label: str, host_gib: int, args: argparse.Namespace) -> dict:
    """Every counting policy under every scope, and LRU, at one host size (one process)."""
    trace = load_trace(name, requests_of(name, args), args.seed, args.drift)
    window = window_s(trace, args.window_requests, args.mode, label)
    rates = {}
    for scope in SCOPES:
        w = window if scope == "window" else None
        for policy in COUNTING:
            rates[scope, policy] = hit_rate(trace, label, policy, scope, w, host_gib,
                                            args.mode, PROFILE, args.seed)
    rates["lru"] = hit_rate(trace, label, "lru", "lifetime", None, host_gib, args.mode,
                            PROFILE, args.seed)
    return {"trace": label, "host": host_gib, "rates": rates, "window_s": window,
            "requests": trace.n_requests}


def cost_cell(name: str, label: str, profile_name: str, host_gib: int,
              args: argparse.Namespace) -> dict:
    trace = load_trace(name, requests_of(name, args), args.seed, args.drift)
    rates = {policy: hit_rate(trace, label, policy, "lifetime", None, host_gib, "replay",
                              profile_name, args.seed, memory_profile=PROFILE)
             for policy in COST_POLICIES}
    return {"trace": label, "profile": profile_name, "host": host_gib, "rates": rates}


def most(rate: dict[str, float]) -> str:
    """The policy that keeps the most, with every other within TIE_POINTS of it."""
    top = max(rate.values())
    close = [p for p in rate if 100 * (top - rate[p]) <= TIE_POINTS]
    if len(close) == len(rate):
        return "all tie"
    return " = ".join(sorted(close, key=lambda p: -rate[p]))


def print_equal_terms(results: list[dict], args: argparse.Namespace) -> None:
    policies = [*COUNTING, "lru"]
    by_trace: dict[str, list[dict]] = {}
    for r in results:
        by_trace.setdefault(r["trace"], []).append(r)
    for trace, rows in by_trace.items():
        first = rows[0]
        print(f"\n### {trace}: {first['requests']:,} requests, {args.mode}, {PROFILE}; window "
              f"{first['window_s']:,.0f} s ({args.window_requests:,} requests)\n")
        print("| host | counting | " + " | ".join(policies)
              + f" | keeps the most (ties: within {TIE_POINTS} points)"
              " | pgdsf - const-cost (points) |")
        print("|---" * (len(policies) + 4) + "|")
        for r in rows:
            for scope in SCOPES:
                rate = {p: r["rates"][scope, p] for p in COUNTING}
                rate["lru"] = r["rates"]["lru"]
                best = most(rate)
                gain = 100 * (rate["pgdsf"] - rate["pgdsf-const-cost"])
                print(f"| {r['host']} GiB | {scope} | "
                      + " | ".join(f"{rate[p]:.1%}" for p in policies)
                      + f" | {best} | {gain:+.2f} |", flush=True)


def prefix_factor(profile_name: str) -> float:
    """How much a 4,000-token cached prefix raises the prefill time of 500 new tokens: 1 for
    a cost that ignores the prefix (where PGDSF's cost per token cannot tell nodes apart by
    position)."""
    from ragsim.profiles.profile import load_profile

    cost = load_profile(profile_name).prefill.at
    return cost(4000, 500) / cost(0, 500)


def print_cost_study(results: list[dict], args: argparse.Namespace) -> None:
    print(f"\n### Prefix-aware cost: lifetime counts, replay, memory of {PROFILE} (GPU KV "
          "space, KV bytes per token) for every profile, so only the costs differ\n")
    for name in COST_PROFILES:
        print(f"- {name}: T(4000, 500) / T(0, 500) = {prefix_factor(name):.2f}")
    print()
    print("| trace | profile | host | " + " | ".join(COST_POLICIES)
          + " | pgdsf - const-cost (points) | pgdsf - no-size (points) |")
    print("|---" * (len(COST_POLICIES) + 5) + "|")
    for r in results:
        rate = r["rates"]
        print(f"| {r['trace']} | {r['profile']} | {r['host']} GiB | "
              + " | ".join(f"{rate[p]:.1%}" for p in COST_POLICIES)
              + f" | {100 * (rate['pgdsf'] - rate['pgdsf-const-cost']):+.2f}"
              f" | {100 * (rate['pgdsf'] - rate['pgdsf-no-size']):+.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("replay", "run"), default="replay")
    parser.add_argument("--traces", nargs="+", default=None,
                        help=f"default: {', '.join(TRACES)} (--cost-study: "
                             f"{', '.join(COST_TRACES)})")
    parser.add_argument("--mooncake", default=None,
                        help="Mooncake trace: JSONL, .jsonl.xz, or an imported trace folder")
    parser.add_argument("--requests", type=int, default=10_000,
                        help="requests of the synthetic traces (recorded ones: whole, or "
                             "fewer if this is smaller)")
    parser.add_argument("--host-gib", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--drift", type=float, default=None,
                        help="synthetic traces: popularity drift per 1,000 requests (default: "
                             "the built-in traces')")
    parser.add_argument("--window-requests", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="2,000 requests and 32 GiB only (a smoke run)")
    parser.add_argument("--cost-study", action="store_true",
                        help="only PGDSF against its ablations across profiles")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    if args.quick:
        args.requests, args.host_gib = 2_000, [32]
    names = args.traces or (COST_TRACES if args.cost_study else TRACES)
    traces = [(name, name) for name in names]
    if args.mooncake:
        traces.append((args.mooncake, "mooncake"))
    drift = "built-in" if args.drift is None else f"{args.drift:g}"
    print(f"policy_table.py: mode {args.mode}, seed {args.seed}, host "
          f"{', '.join(map(str, args.host_gib))} GiB, synthetic traces' drift {drift}")
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        if args.cost_study:
            futures = [pool.submit(cost_cell, name, label, profile, host, args)
                       for name, label in traces for profile in COST_PROFILES
                       for host in hosts_for(label, args)]
            print_cost_study([f.result() for f in futures], args)
            return
        futures = [pool.submit(equal_terms_cell, name, label, host, args)
                   for name, label in traces for host in hosts_for(label, args)]
        print_equal_terms([f.result() for f in futures], args)


if __name__ == "__main__":
    main()
