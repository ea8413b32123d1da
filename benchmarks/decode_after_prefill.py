"""A torch decode step right after a prefill, against the same step right after another decode.

The profile's decode grid times decode steps back to back. At a moderate load most decode
steps of the torch engine follow a prefill (the scheduler runs prefills first), and at 50% load
run X's decode-sized steps (64 tokens or fewer) ran 1.32x their price, 1.14x at idle, even
priced at their padded end (docs/validation.md). This times one decode step of ``rows`` rows
over ``context`` tokens (the profiler's path: ``TorchModel.decode`` then ``undo_decode``)
right after a prefill of each size, untimed, and right after the same decode step, shuffled,
and prints the medians and their ratio. One thread, as the profile's engine runs::

    LD_PRELOAD=libtcmalloc_minimal.so.4 python benchmarks/decode_after_prefill.py
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.profiles.torch_model import Row, TorchModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    spec = scaled_down(resolve_model("mistral-7b"), layers=args.layers, hidden=args.hidden)
    model = TorchModel(spec.with_dtype("fp32"), device="cpu", dtype="fp32",
                       threads=args.threads)
    before = ["decode", 64, 300, 1500]  # what ran right before the timed step
    print(f"{spec.name}, one decode step right after a prefill of N tokens or another decode "
          f"step (median of {args.repeats}, ms)")
    print("| rows | context | after a decode | after 64 | after 300 | after 1,500 | ratios |")
    print("|---|---|---|---|---|---|---|")
    for rows, context in ((1, 300), (1, 1500), (4, 500), (16, 500)):
        batch = model.prepare([Row(None, list(range(1, context + 1)), 0) for _ in range(rows)])
        model.forward(batch)
        ids = list(range(rows))
        prefills = {n: [Row(None, list(range(7, n + 7)), 0)] for n in before[1:]}
        for _ in range(2):  # warm every shape once
            model.decode(batch, ids)
            model.undo_decode(batch)
            for rows_of in prefills.values():
                model.prefill(rows_of)
        order = before * args.repeats
        random.Random(0).shuffle(order)
        times: dict = {kind: [] for kind in before}
        for kind in order:
            if kind == "decode":
                model.decode(batch, ids)
                model.undo_decode(batch)
            else:
                model.prefill(prefills[kind])
            model.sync()
            started = time.perf_counter()
            model.greedy(model.decode(batch, ids))
            model.sync()
            times[kind].append(time.perf_counter() - started)
            model.undo_decode(batch)
        medians = [float(np.median(times[kind])) * 1e3 for kind in before]
        ratios = " / ".join(f"{m / medians[0]:.2f}" for m in medians[1:])
        print(f"| {rows} | {context} | " + " | ".join(f"{m:.2f}" for m in medians)
              + f" | {ratios} |")


if __name__ == "__main__":
    main()
