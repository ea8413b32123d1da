"""vLLM's first decode step after a request's prefill, against its later ones and the profile's.

The profile's decode grid (``VllmTimer.decode``) times a batch's decode steps after one warm-up
step. A served request of the held-out trace decodes 2-6 tokens, so most of its decode steps
are its first ones after its prefill, and at 50% load and idle (run B, docs/validation.md)
vLLM's 1-row decode steps ran 1.22-1.32x their price. This adds ``rows`` requests of
``context`` tokens, steps until their first tokens (the prefill), then times the next six
steps one by one (``VllmTimer.first_decode``): the first decode step, and the median of the
third to sixth (steady); beside them the profiler's own decode timing of the same cell, in
the same process::

    LD_PRELOAD=libtcmalloc_minimal.so.4 .venv-vllm/bin/python benchmarks/vllm_first_decode.py

On this project's CPU (2026-12-05, 2 layers x 256 hidden, one thread; two processes): the first
decode step took 4.0-5.6 ms, the steady ones 3.3-4.5 ms and the profiler's cell 3.2-4.2 ms
(the steady steps' time), at 1-2 rows over 256 and 768 tokens: the first step after a prefill
ran 1.14-1.36x a steady one. The profiler now times this itself (``VllmTimer.first_decode``, the
profile's ``decode_after_prompt``: ragsim/profiles/decode_after_prompt.py).
"""

from __future__ import annotations

import argparse

import numpy as np

from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.realrun.vllm.profile import VllmTimer


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
    print("| rows | context | first decode step (ms) | steady steps (ms) | profiler's cell (ms) "
          "| first / steady |")
    print("|---|---|---|---|---|---|")
    for context in (256, 768):
        for rows in (1, 2):
            timed = timer.first_decode(rows, context, args.repeats)
            first = float(np.median([t[2] for t in timed]))
            steady = float(np.median([t[3] for t in timed]))
            cell = timer.decode(rows, context, 1, 7).median_s
            print(f"| {rows} | {context} | {first * 1e3:.2f} | {steady * 1e3:.2f} | "
                  f"{cell * 1e3:.2f} | {first / steady:.2f} |")

if __name__ == "__main__":
    main()
