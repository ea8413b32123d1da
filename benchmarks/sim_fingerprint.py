"""A fingerprint of the simulator's outputs over many configurations: the net under a speed-up.

A change meant to make the simulator faster without changing what it simulates must leave every
output identical, bit for bit. This runs ~50 configurations (3 traces x 4 systems x 3 loads,
plus the mixed scheduler, no speculation, no reordering, a contended search pool, injected and
random GPU failures, sequential arrivals, top-k, overlapped swaps with small caches, the answer
cache, batch KV sharing, bursty arrivals, measured search latency), 1,500 requests each, and
writes a hash of every per-request column and of the summary (less wall-clock fields) to a
JSON file; ``compare`` lists the configurations whose outputs differ and the fields that do.

    python benchmarks/sim_fingerprint.py write before.json     # on the old code
    python benchmarks/sim_fingerprint.py write after.json      # on the new code
    python benchmarks/sim_fingerprint.py compare before.json after.json

The property tests (tests/test_sim_shortcuts.py, tests/test_sim_pieces.py) check the shortcuts
against stepping on drawn cases; this checks a whole change on the built-in workloads. It is not
a test: a change that is meant to alter the model changes the fingerprint, by design.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

GiB = 2**30
# summary fields that measure the machine, not the simulation
WALL_CLOCK = ("elapsed", "wall", "scheduler_s", "decision", "per_wall")


def cases() -> list[dict]:
    grid = [dict(trace=trace, system=system, rate_rps=rate)
            for trace in ("mmlu", "nq", "wiki-trivia")
            for system in ("ragcache", "vllm", "vllm-apc", "sglang")
            for rate in (0.5, 1.5, 4.0)]
    return [
        *grid,
        dict(trace="mmlu", system="ragcache", rate_rps=2.0, scheduler="mixed",
             max_batched_tokens=1024),
        dict(trace="mmlu", system="vllm", rate_rps=2.0, scheduler="mixed",
             max_batched_tokens=512),
        dict(trace="mmlu", system="ragcache", rate_rps=1.0, speculate=False),
        dict(trace="mmlu", system="ragcache", rate_rps=3.0, reorder=False),
        dict(trace="mmlu", system="ragcache", rate_rps=1.0, search_workers=1),
        dict(trace="mmlu", system="ragcache", rate_rps=2.0, search_workers=2, search_s=0.5),
        dict(trace="mmlu", system="ragcache", rate_rps=2.0, fail_gpu_at_s=(100.0, 300.0),
             host_replicas=2),
        dict(trace="mmlu", system="ragcache", rate_rps=2.0, gpu_failure_rate_per_h=20.0),
        dict(trace="mmlu", system="ragcache", arrival="sequential"),
        dict(trace="mmlu", system="ragcache", rate_rps=1.0, top_k=1),
        dict(trace="mmlu", system="ragcache", rate_rps=1.0, overlap_swap=True,
             gpu_kv_bytes=2 * GiB, host_cache_bytes=4 * GiB),
        dict(trace="wiki-trivia", system="ragcache", rate_rps=1.0, answer_cache=True),
        dict(trace="mmlu", system="ragcache", rate_rps=1.0, batch_kv_sharing=True,
             policy="lru"),
        dict(trace="mmlu", system="ragcache", rate_rps=6.0, arrival="gamma", cv=3.0),
        dict(trace="wiki-trivia", system="ragcache", rate_rps=1.0, search_latency="trace"),
    ]


def fingerprint(case: dict, n_requests: int) -> dict:
    config = build_config(dict(case))
    result = run_simulation(resolve_trace(case["trace"], n_requests=n_requests), config,
                            load_profile(config.profile))
    hashes = {}
    for name, column in sorted(result.columns.items()):
        if name == "decision_s":  # the policy core's wall time per decision
            continue
        values = np.asarray(column)
        raw = values.tobytes() if values.dtype != object else repr(values.tolist()).encode()
        hashes[name] = hashlib.sha1(raw).hexdigest()[:12]
    summary = {k: v for k, v in result.summary.items()
               if not any(w in k for w in WALL_CLOCK)}
    hashes["summary"] = hashlib.sha1(
        json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {"hash": hashes, "summary": summary}


def write(path: str, n_requests: int) -> None:
    out = {}
    for case in cases():
        out[json.dumps(case, sort_keys=True)] = fingerprint(case, n_requests)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"{len(out)} configurations, {n_requests} requests each: {path}")


def compare(before_path: str, after_path: str) -> int:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    differ = 0
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            print(f"missing in {after_path}: {key}")
            differ += 1
            continue
        fields = [c for c in old["hash"] if old["hash"][c] != new["hash"].get(c)]
        if fields:
            differ += 1
            changed = {k: (v, new["summary"].get(k)) for k, v in old["summary"].items()
                       if v != new["summary"].get(k)}
            print(f"differ: {key}\n  columns: {fields}\n  summary: {list(changed.items())[:6]}")
    print(f"{differ} of {len(before)} configurations differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="run every configuration and write the fingerprint")
    w.add_argument("path")
    w.add_argument("--requests", type=int, default=1500)
    c = sub.add_parser("compare", help="list the configurations whose outputs differ")
    c.add_argument("before")
    c.add_argument("after")
    args = parser.parse_args()
    if args.command == "write":
        write(args.path, args.requests)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
