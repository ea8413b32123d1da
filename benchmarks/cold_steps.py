"""A big step right after small ones or idle time, against the same step run back to back.

A profile times every shape after a warm-up pass of the same shape, one after another: it
prices a big step as the engine runs it when it has just run another. A run at moderate load
runs its big steps (a burst's prompts batched together) after many small ones or a pause: on
vLLM's CPU engine at 50% load, steps of 2,048 tokens and more took 1.39x their price
(docs/validation.md, run N), while the small ones were priced within a few percent. This times,
in one process on one engine, a batch of ``--rows`` prompts of ``--tokens`` tokens each:

1. back to back (``--times`` passes; the first is dropped as the shape's first time);
2. after 1, 5 and 30 small prefills (fresh token counts from ``--small`` on), and after 30 of
   one count (``--small``, built once before);
3. after 0.3 and 2 s with nothing to do;

with the process's minor page faults during each timed step (memory the allocator had given
back, touched again). It prints the medians, their ratios to back to back and the faults,
measured in this one run: on a shared machine only the ratios mean anything.

    .venv-vllm/bin/python benchmarks/cold_steps.py --engine vllm
    python benchmarks/cold_steps.py --engine torch
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from new_shapes import engine_parser, minor_page_faults, prefills_for  # the same timing code


def main() -> None:
    parser = engine_parser(__doc__.split("\n\n")[0], "vllm")
    parser.add_argument("--rows", type=int, default=12, help="prompts in the big step")
    parser.add_argument("--tokens", type=int, default=368, help="tokens of each prompt")
    parser.add_argument("--small", type=int, default=150, help="tokens of a small prefill")
    parser.add_argument("--times", type=int, default=7, help="timed passes per condition")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    prefills = prefills_for(args)
    load_before = os.getloadavg()[0]
    fresh = iter(range(args.small, args.small + 100_000))

    def big() -> tuple[float, int]:
        before = minor_page_faults()
        seconds = prefills.once(args.rows, args.tokens)
        return seconds, minor_page_faults() - before

    conditions: dict[str, list[tuple[float, int]]] = {}
    big()  # the shape's first time, not counted
    conditions["back to back"] = [big() for _ in range(args.times)]
    for small in (1, 5, 30):
        timed = []
        for _ in range(args.times):
            for _ in range(small):
                prefills.once(1, next(fresh))
            timed.append(big())
        conditions[f"after {small} small"] = timed
    # the same 30 small prefills, all of one token count (built once): what the fresh counts
    # add is theirs, what remains is the small steps' own
    prefills.once(1, args.small)
    timed = []
    for _ in range(args.times):
        for _ in range(30):
            prefills.once(1, args.small)
        timed.append(big())
    conditions["after 30 small, one count"] = timed
    for pause in (0.3, 2.0):
        timed = []
        for _ in range(args.times):
            time.sleep(pause)
            timed.append(big())
        conditions[f"after {pause:g} s idle"] = timed
    steady = float(np.median([s for s, _ in conditions["back to back"]]))
    result = {"engine": prefills.name, "rows": args.rows, "tokens_each": args.tokens,
              "step_tokens": args.rows * args.tokens, "load_average_before": load_before,
              "load_average_after": os.getloadavg()[0], "conditions": {
                  name: {"median_ms": float(np.median([s for s, _ in timed]) * 1e3),
                         "over_back_to_back": float(np.median([s for s, _ in timed]) / steady),
                         "page_faults_median": float(np.median([f for _, f in timed])),
                         "ms": [round(s * 1e3, 2) for s, _ in timed]}
                  for name, timed in conditions.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['engine']}; a step of {args.rows} x {args.tokens} tokens; load average "
          f"{load_before:.2f} -> {result['load_average_after']:.2f}")
    for name, row in result["conditions"].items():
        print(f"{name:>26}: {row['median_ms']:7.1f} ms ({row['over_back_to_back']:.2f}x), "
              f"page faults {row['page_faults_median']:,.0f}")


if __name__ == "__main__":
    main()
