"""A step that begins after the engine sat idle, against the same step right after another.

A profile times its steps back to back; at moderate load most of a run's prefills begin after
the engine waited for work. At rest on two cores, vLLM's idle-started prefills in a 50% run took
1.11x their price where back-to-back ones took 1.02x. This times one prefill shape (its token
count built beforehand) after each of ``--idle-ms`` pauses, in a shuffled order, ``--repeats``
times each, and prints each pause's median against no pause, measured in this one run.

    python benchmarks/idle_steps.py --engine torch
    .venv-vllm/bin/python benchmarks/idle_steps.py --engine vllm --profile PROFILE.json
"""

from __future__ import annotations

import json
import random
import time

import numpy as np

from benchmarks.new_shapes import engine_parser, prefills_for


def main() -> None:
    parser = engine_parser(__doc__.split("\n\n")[0], "torch")
    parser.add_argument("--tokens", type=int, default=300, help="the prefill's token count")
    parser.add_argument("--idle-ms", type=float, nargs="+", default=[0, 1, 3, 10, 30, 100])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    prefills = prefills_for(args)
    for _ in range(3):  # the shape built, the engine warm
        prefills.once(1, args.tokens)
    order = [pause for pause in args.idle_ms for _ in range(args.repeats)]
    random.Random(args.seed).shuffle(order)
    times: dict[float, list[float]] = {pause: [] for pause in args.idle_ms}
    for pause in order:
        prefills.once(1, args.tokens)  # the step before, so a pause is all that differs
        if pause:
            time.sleep(pause / 1e3)
        times[pause].append(prefills.once(1, args.tokens))
    base = float(np.median(times[args.idle_ms[0]]))
    rows = [{"idle_ms": pause, "median_ms": float(np.median(t)) * 1e3,
             "over_first": float(np.median(t)) / base} for pause, t in times.items()]
    if args.json:
        print(json.dumps({"engine": prefills.name, "tokens": args.tokens, "rows": rows}))
        return
    print(f"{prefills.name}: a {args.tokens}-token prefill after a pause "
          f"({args.repeats} each, shuffled)")
    for row in rows:
        print(f"  idle {row['idle_ms']:6.1f} ms: {row['median_ms']:7.2f} ms "
              f"(x{row['over_first']:.2f} of idle {args.idle_ms[0]:g} ms)")


if __name__ == "__main__":
    main()
