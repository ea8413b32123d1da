"""How many token counts an engine keeps built, and the big step while its cache grows.

vLLM's CPU engine builds oneDNN matrix products per step token count and keeps them in
oneDNN's process-wide primitive cache (1,024 primitives by default, least recently used out;
``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` sets it). This runs, in one process on one engine, ``--counts``
single prefills of fresh token counts (from ``--small`` on), and after every ``--every`` of
them a big prefill of ``--big`` tokens (built before), with its minor page faults; then every
count again in the same order (each last run ``--counts`` counts before: dropped from a cache
smaller than that), then the last 100 again twice (each last run 100 counts before). It
prints the big step's ratio to its steady time as the cache fills, and the medians of
(first run - the last pass), (run ``--counts`` ago - the last pass) and (run 100 ago - the
last pass): a count dropped from the cache pays its first-time price again.

    .venv-vllm/bin/python benchmarks/shape_cache.py
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=4096 .venv-vllm/bin/python benchmarks/shape_cache.py

Measured on this project's 2-core CPU (2026-12-03, one thread, tcmalloc, vLLM 0.32,
cpu-vllm-mistral-7b-l2-h256, 4 linear shapes a count, so 256 counts in the default cache; two
runs): the big step (66 ms steady) ran 1.7-2.5x its steady time after each 16 fresh counts up
to 256 of them, with 3,300-9,000 page faults, then 0.95-1.13x with none; a count last run 400
counts ago cost +2.2 and +4.0 ms again, one run 100 ago -0.02 and +1.5 ms. With a capacity of
4,096: 1.7-3.0x through all 400, and a count run 400 ago cost nothing (-1.4 ms).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from new_shapes import engine_parser, minor_page_faults, prefills_for  # the same timing code


def main() -> None:
    parser = engine_parser(__doc__.split("\n\n")[0], "vllm")
    parser.add_argument("--counts", type=int, default=400, help="fresh token counts run")
    parser.add_argument("--every", type=int, default=16,
                        help="fresh counts between two timed big steps")
    parser.add_argument("--small", type=int, default=150, help="the first fresh token count")
    parser.add_argument("--big", type=int, default=2000, help="tokens of the big step")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    prefills = prefills_for(args)
    for _ in range(3):
        prefills.once(1, args.big)
    steady = float(np.median([prefills.once(1, args.big) for _ in range(3)]))
    counts = list(range(args.small, args.small + args.counts))
    first, big = [], []
    for i, tokens in enumerate(counts):
        first.append(prefills.once(1, tokens))
        if (i + 1) % args.every == 0:
            before = minor_page_faults()
            seconds = prefills.once(1, args.big)
            big.append({"fresh_counts": i + 1, "over_steady": seconds / steady,
                        "page_faults": minor_page_faults() - before})
    again = np.array([prefills.once(1, t) for t in counts])
    recent = np.array([prefills.once(1, t) for t in counts[-100:]])
    last = np.array([prefills.once(1, t) for t in counts[-100:]])
    first_arr = np.array(first)
    result = {
        "engine": prefills.name, "capacity_env": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
        "big_tokens": args.big, "big_steady_ms": steady * 1e3, "big_as_the_cache_fills": big,
        "first_minus_last_ms": float(np.median(first_arr[-100:] - last)) * 1e3,
        "run_counts_ago_minus_last_ms": float(np.median(again[-100:] - last)) * 1e3,
        "run_100_ago_minus_last_ms": float(np.median(recent - last)) * 1e3}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['engine']}; ONEDNN_PRIMITIVE_CACHE_CAPACITY={result['capacity_env']}; "
          f"big step {args.big} tokens, {steady * 1e3:.1f} ms steady")
    for row in big:
        print(f"  after {row['fresh_counts']:4d} fresh counts: {row['over_steady']:.2f}x, "
              f"page faults {row['page_faults']:,}")
    print(f"first run - last pass: {result['first_minus_last_ms']:+.2f} ms (median)")
    print(f"run {args.counts} counts ago - last pass: "
          f"{result['run_counts_ago_minus_last_ms']:+.2f} ms")
    print(f"run 100 counts ago - last pass: {result['run_100_ago_minus_last_ms']:+.2f} ms")


if __name__ == "__main__":
    main()
