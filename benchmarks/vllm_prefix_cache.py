"""How far ``--system vllm-apc`` is from vLLM's own prefix cache under eviction.

Prints, for 1,000 ``mmlu`` requests served one at a time through several KV sizes, ragsim's
hit tokens over vLLM's and the share of requests that find exactly the same cached prefix:
the numbers the README quotes and ``tests/test_vllm_prefix_cache.py`` bounds. Needs vLLM
(installed --no-deps, as in the README's test command); it reuses that test's helpers, which
drive vLLM's KV-cache manager on the same token ids.

    python benchmarks/vllm_prefix_cache.py [--requests 1000] [--blocks 3000 800]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_vllm_prefix_cache import BLOCK, ragsim_hits, vllm_hits

from ragsim.traces import resolve_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--blocks", type=int, nargs="+", default=[3000, 800])
    parser.add_argument("--system-tokens", type=int, default=37)
    args = parser.parse_args()
    trace = resolve_trace("mmlu", n_requests=args.requests)
    print("| KV tokens | ragsim / vLLM hit tokens | requests with the same prefix |")
    print("|---|---|---|")
    for blocks in args.blocks:
        ours = ragsim_hits(trace, blocks, args.system_tokens)
        theirs = vllm_hits(trace, blocks, args.system_tokens)
        print(f"| {blocks * BLOCK:,} | {ours.sum() / theirs.sum():.3f}x | "
              f"{np.mean(ours == theirs):.1%} |", flush=True)


if __name__ == "__main__":
    main()
