"""vLLM's first decode step after a request's prefill, against its later ones and the profile's.

The profile's decode grid (``VllmTimer.decode``) times a batch's decode steps after one warm-up
step. A served request of the held-out trace decodes 2-6 tokens, so most of its decode steps
are its first ones after its prefill, and at 50% load and idle (run B, docs/validation.md)
vLLM's 1-row decode steps ran 1.22-1.32x their price. This adds ``rows`` requests of
``context`` tokens, steps until their first tokens (the prefill), then times the next six
steps one by one: the first decode step, and the median of the third to sixth (steady);
beside them the profiler's own decode timing of the same cell, in the same process::

    LD_PRELOAD=libtcmalloc_minimal.so.4 .venv-vllm/bin/python benchmarks/vllm_first_decode.py

On this project's CPU (2026-12-05, 2 layers x 256 hidden, one thread; two processes): the first
decode step took 4.0-5.6 ms, the steady ones 3.3-4.5 ms and the profiler's cell 3.2-4.2 ms
(the steady steps' time), at 1-2 rows over 256 and 768 tokens: the first step after a prefill
ran 1.14-1.36x a steady one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.realrun.vllm.profile import VllmTimer

STEPS_AFTER = 6  # decode steps timed after the prefill (the requests ask for 8 tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    spec = scaled_down(resolve_model("mistral-7b"), layers=args.layers,
                       hidden=args.hidden).with_dtype("fp32")
    timer = VllmTimer.build(spec, block_tokens=32, kv_cache_bytes=2**30, max_model_len=4096,
                            max_batched_tokens=16384, seed=0, threads=1)
    print("| rows | context | prefill (ms) | first decode step (ms) | steady steps (ms) | "
          "profiler's cell (ms) | first / steady |")
    print("|---|---|---|---|---|---|---|")
    for context in (256, 768):
        for rows in (1, 2):
            firsts, steadies, prefills = [], [], []
            for _ in range(args.repeats):
                for _ in range(rows):
                    timer._add(timer._tokens(context), STEPS_AFTER + 2)
                started = time.perf_counter()
                timer._until_first_tokens(rows)
                prefills.append(time.perf_counter() - started)
                times = []
                for _ in range(STEPS_AFTER):
                    started = time.perf_counter()
                    timer.llm.step()
                    times.append(time.perf_counter() - started)
                timer._drain()
                firsts.append(times[0])
                steadies.append(float(np.median(times[2:])))
            cell = timer.decode(rows, context, 1, 7).median_s
            first, steady = float(np.median(firsts)), float(np.median(steadies))
            print(f"| {rows} | {context} | {np.median(prefills) * 1e3:.2f} | {first * 1e3:.2f} | "
                  f"{steady * 1e3:.2f} | {cell * 1e3:.2f} | {first / steady:.2f} |")


if __name__ == "__main__":
    main()
