"""What a request adds to the torch engine's batched prefill, by row count.

A batch of n rows is priced as the prefill grid's time for its tokens and query-key pairs plus
a per-request term for each row after the first (``profile.BatchedPrefill``). This times masked
batches (rows over a cached prefix, the path the runs' batches take) of 1-8 rows, on the
profiler's own engine, in the same sweeps, and prints for each row count what the rows cost
beyond the grid's price of their tokens and pairs, per extra request.

On this project's CPU (2 layers x 256 hidden, fp32, one thread; docs/profiles.md) 2-3 rows
took 3.2-4.3 ms a request and 4-8 rows 0.1-1.0 ms, on every shape: one term fitted on random
batches of 2-4 rows (3.7 ms) priced the overloaded runs' 8-row batches 20-25% high. Hence the
torch profiler's levels at every row count (``profiler.with_torch_row_levels``).

    LD_PRELOAD=libtcmalloc_minimal.so.4 python benchmarks/batch_rows.py PROFILE.json

PROFILE.json: a torch profile of the same model measured on this machine (its grid prices the
tokens and pairs; ``ragsim validate --profile-now`` writes one beside its results).
"""

from __future__ import annotations

import argparse

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.profiles.profile import load_profile
from ragsim.profiles.profiler import TorchEngine

# (new tokens a row, cached tokens a row): the profiler's level shape, a longer and a shorter
# row, and uncached rows of equal length (the unmasked causal path, for contrast)
SHAPES = [(128, 512), (256, 512), (96, 800), (128, 0)]
ROWS = [1, 2, 3, 4, 5, 6, 8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a torch profile measured on this machine")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=9)
    args = parser.parse_args()
    model = load_profile(args.profile).batched_prefill
    spec = scaled_down(resolve_model("mistral-7b"), layers=args.layers,
                       hidden=args.hidden).with_dtype("fp32")
    engine = TorchEngine(spec, "cpu", "fp32", 1, 0)
    cases = [(k, c, n) for k, c in SHAPES for n in ROWS]
    passes = [([c] * n, [k] * n) for k, c, n in cases]
    timed = engine.sweeps(passes, 2, args.repetitions)
    print("| new / cached a row | rows | measured (ms) | grid's tokens and pairs (ms) | "
          "profile's price (ms) | per extra request (ms) |")
    print("|---|---|---|---|---|---|")
    for (k, c, n), m, (cached, new) in zip(cases, timed.passes, passes, strict=True):
        base = model.tokens_and_pairs_s(cached, new) if n > 1 else model.iteration_s(cached, new)
        extra = f"{(m.median_s - base) / (n - 1) * 1e3:.2f}" if n > 1 else "-"
        print(f"| {k} / {c} | {n} | {m.median_s * 1e3:.1f} | {base * 1e3:.1f} | "
              f"{model.iteration_s(cached, new) * 1e3:.1f} | {extra} |")


if __name__ == "__main__":
    main()
