"""vLLM's decode steps after a request's prefill, by position, against its steady ones.

The profile's decode grid (``VllmTimer.decode``) times a batch's steady decode steps. A served
request of the held-out trace decodes 2-6 tokens, so most of its decode steps are its first
ones after its prefill. This adds ``rows`` requests of ``prompt`` tokens, steps until their
first tokens (the prompts' step), then times the next steps one by one
(``VllmTimer.first_decode``): each position's median less the steady steps' median (the 17th
on); beside them the grid's cell of the same shape timed after one warm-up step (as profiles
did before 2026-12-05) and after ``DECODE_SETTLE_STEPS``, in the same process. ``--pause-ms``
also times the curve with a sleep and with a busy loop of that long between the prompts' step
and the first decode step (is the extra a matter of time?)::

    LD_PRELOAD=libtcmalloc_minimal.so.4 .venv-vllm/bin/python benchmarks/vllm_first_decode.py

On this project's CPU (2026-12-05, 2 layers x 256 hidden, one thread): after a 190-token
prompt, 1 row's decode steps ran +1.1, +0.5, +0.3, +0.2, +0.1 ms over a steady 3.5 ms; after
1,500 tokens +2.9, +2.0, +1.4, +1.0, +0.8, +0.5, +0.5, +0.3 ms; 2 rows more. 30 ms of sleep or
of a busy loop before the first decode step left the curve as it was (+2.8 to +3.6 ms at the
first position after 1,500 tokens): the decode steps wear it off, not time. The profile's
``decode_after_prompt`` charges it (ragsim/profiles/decode_after_prompt.py).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ragsim.profiles.decode_after_prompt import (
    DECODE_POSITIONS,
    DECODE_SETTLE_STEPS,
    FIRST_DECODE_STEPS,
    STEADY_FROM,
    fit_decode_after_prompt,
    positions_row,
)
from ragsim.profiles.models import resolve_model, scaled_down
from ragsim.realrun.vllm.profile import VllmTimer

SHOWN = 8  # positions printed


def _paused(timer: VllmTimer, rows: int, prompt: int, pause_s: float, busy: bool
            ) -> list[float]:
    """One repeat of ``first_decode`` with a pause (a sleep, or a busy loop) between the
    prompts' step and the first decode step."""
    for _ in range(rows):
        timer._add(timer._tokens(prompt), FIRST_DECODE_STEPS + 2)
    timer._until_first_tokens(rows)
    if busy:
        end = time.perf_counter() + pause_s
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(pause_s)
    times = []
    for _ in range(FIRST_DECODE_STEPS):
        started = time.perf_counter()
        timer.llm.step()
        times.append(time.perf_counter() - started)
    timer._drain()
    return positions_row(rows, prompt, times)


def _curve(timed: list[list[float]]) -> str:
    extra = fit_decode_after_prompt(timed).extra_s[0][:SHOWN]
    return " ".join(f"{x * 1e3:+.2f}" for x in extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--prompts", type=int, nargs="+", default=[190, 600, 1500])
    parser.add_argument("--pause-ms", type=float, default=30.0)
    args = parser.parse_args()
    spec = scaled_down(resolve_model("mistral-7b"), layers=args.layers,
                       hidden=args.hidden).with_dtype("fp32")
    timer = VllmTimer.build(spec, block_tokens=32, kv_cache_bytes=2**30, max_model_len=4096,
                            max_batched_tokens=16384, seed=0, threads=1)
    print(f"| rows | prompt | steady (ms, {STEADY_FROM}th on) | extra at positions 1-{SHOWN} "
          f"(ms; {DECODE_POSITIONS} charged) | cell after 1 warm-up step (ms) | cell after "
          f"{DECODE_SETTLE_STEPS} (ms) |")
    print("|---|---|---|---|---|---|")
    for prompt in args.prompts:
        for rows in (1, 2):
            timed = timer.first_decode(rows, prompt, args.repeats)
            steady = float(np.median([t[2] for t in timed]))
            warm1 = timer.decode(rows, prompt, 1, 7).median_s
            settled = timer.decode(rows, prompt, DECODE_SETTLE_STEPS, 7).median_s
            print(f"| {rows} | {prompt} | {steady * 1e3:.2f} | {_curve(timed)} | "
                  f"{warm1 * 1e3:.2f} | {settled * 1e3:.2f} |")
    if args.pause_ms > 0:
        prompt = max(args.prompts)
        print(f"\n1 row after {prompt} tokens, {args.pause_ms:g} ms between the prompts' step "
              "and the first decode step:")
        for label, busy in (("sleep", False), ("busy loop", True)):
            timed = [_paused(timer, 1, prompt, args.pause_ms / 1e3, busy)
                     for _ in range(args.repeats)]
            print(f"  {label}: {_curve(timed)}")


if __name__ == "__main__":
    main()
