"""What the answer cache does to the KV cache behind it, for every KV policy.

The answer cache answers the repeated questions before retrieval; the knowledge tree then sees
only the requests that reach the engine, without the most popular ones. For each policy this
runs the same trace with and without ``--answer-cache`` (default tiers; exact tiers only on the
built-in ``wiki-trivia``, whose question text is redacted but whose answer keys repeat) and
prints: the answer cache's hit rate, requests that never reached the engine, the KV token hit
rate of the requests that did (with) against all requests (without), GPU-seconds busy
(``gpu_busy_fraction`` × simulated seconds) and mean TTFT.

    python benchmarks/answer_cache_kv_policies.py [--trace wiki-trivia] [--rate 2.0]
        [--gpu-mem 1GiB] [--host-mem 4GiB]

With the default memories (192 GiB of host cache) nothing the trace retrieves is ever evicted,
so every policy gives the same figures; tight memories (``--gpu-mem``, ``--host-mem``) are where
the policies differ and where removing the popular questions changes what the tree keeps.
"""

from __future__ import annotations

import argparse

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

POLICIES = ("pgdsf", "gdsf", "lru", "lfu")


def one(trace, profile, policy: str, answer_cache: bool, rate: float | None,
        memory: dict) -> dict:
    settings = {"trace": "wiki-trivia", "policy": policy, "answer_cache": answer_cache,
                **memory}
    if rate is not None:
        settings["rate_rps"] = rate
    s = run_simulation(trace, build_config(settings), profile).summary
    engine = s.get("answer_cache_engine", {})
    return {"kv_token_hit_rate": engine.get("token_hit_rate", s["token_hit_rate"]),
            "engine_requests": engine.get("requests", s["requests_completed"]),
            "answer_hit_rate": s.get("answer_cache_hit_rate", 0.0),
            "gpu_busy_s": s["gpu_busy_fraction"] * s["simulated_s"],
            "ttft_mean_s": s["ttft_mean_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="wiki-trivia")
    parser.add_argument("--rate", type=float, default=None,
                        help="re-time arrivals as Poisson at this rate (default: the trace's)")
    parser.add_argument("--profile", default="a10g-mistral-7b")
    parser.add_argument("--gpu-mem", default=None, help="GPU memory for KV, e.g. 1GiB")
    parser.add_argument("--host-mem", default=None, help="host KV cache, e.g. 4GiB")
    args = parser.parse_args()
    from ragsim.units import parse_bytes

    memory = {}
    if args.gpu_mem:
        memory["gpu_kv_bytes"] = parse_bytes(args.gpu_mem)
    if args.host_mem:
        memory["host_cache_bytes"] = parse_bytes(args.host_mem)
    trace = resolve_trace(args.trace)
    profile = load_profile(args.profile)
    print(f"trace {args.trace} ({trace.n_requests} requests), profile {args.profile}, "
          f"memory {memory or 'default'}\n")
    print("| policy | answer-cache hits | requests to engine | KV token hit rate without -> "
          "with | GPU-s without -> with | TTFT mean without -> with |")
    print("|---|---|---|---|---|---|")
    for policy in POLICIES:
        a = one(trace, profile, policy, False, args.rate, memory)
        b = one(trace, profile, policy, True, args.rate, memory)
        print(f"| {policy} | {b['answer_hit_rate']:.1%} | {b['engine_requests']:,} of "
              f"{a['engine_requests']:,} | {a['kv_token_hit_rate']:.1%} -> "
              f"{b['kv_token_hit_rate']:.1%} | {a['gpu_busy_s']:,.0f} -> {b['gpu_busy_s']:,.0f} | "
              f"{a['ttft_mean_s'] * 1e3:.1f} ms -> {b['ttft_mean_s'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
