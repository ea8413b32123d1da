"""vLLM steps of one, two and three prompts, timed on a quiet engine against a profile's prices,
with the engine's decode steps timed alone and beside a trace's searches.

Why: in the loaded runs of validation (run W, 2026-12-06), steps that took two to four prompts
ran 1.06-1.15x their prices where steps of one prompt ran 0.98-1.03x, so the next fix named was
to profile mixed steps of several prompts. This asks first whether the profile misprices such
steps at all: each step is built as a run builds it (``--decode-rows`` running requests of
``--context`` tokens decoding, then the prompts handed over, each on a cached prefix of its own,
and the one step that prefills them and decodes the others timed, with the prompts' hand-over
as the profile's prices hold it) and priced by ``Profile.mixed_step_s``. A ratio that holds
from one prompt to three says the prices are right on a quiet engine, and what the runs show
is the run's doing (``--trace``: the same engine's decode steps timed in blocks alone and
beside that trace's searches, ``realrun/search_cost.py``, the run's arrangement).

It prints the median price / measured per prompt count, measured in this one run: on a shared
machine only the ratios between the counts mean anything.

    LD_PRELOAD=libtcmalloc_minimal.so.4 .venv-vllm/bin/python benchmarks/multi_prompt_steps.py \\
        --profile RUN/vllm-vllm-apc/profile.json --trace RUN/heldout
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    from ragsim.profiles.profile import load_profile
    from ragsim.realrun.vllm.profile import VllmTimer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu-vllm-mistral-7b-l2-h256")
    parser.add_argument("--trace", default=None, help="a trace built with text: time the "
                        "engine's decode steps beside its searches too")
    parser.add_argument("--shapes", type=int, default=6, help="steps per prompt count")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()

    profile = load_profile(args.profile)
    timer = VllmTimer.build(profile.model, block_tokens=args.block_tokens,
                            kv_cache_bytes=1 << 30, max_model_len=8192,
                            max_batched_tokens=16384, threads=1)
    rng = np.random.default_rng(args.seed)
    cases = []
    for prompts in (1, 2, 3):
        for _ in range(args.shapes):
            cases.append(([int(rng.choice([0, 256, 512, 1024, 1536])) for _ in range(prompts)],
                          [int(rng.integers(60, 320)) for _ in range(prompts)],
                          int(rng.choice([1, 2, 4, 8])), int(rng.integers(150, 400))))
    for cached, _, rows, context in cases:  # every prefix before the timings (mixed_step's)
        for k, a in enumerate(cached):
            timer.prefix(a, -k)
        for slot in range(1, rows + 1):
            timer.prefix(context, slot)
    times: list[list[float]] = [[] for _ in cases]
    for repeat in range(args.repeats + 1):  # the first round warms every shape up
        for k, (cached, new, rows, context) in enumerate(cases):
            try:
                took = timer.mixed_step(list(zip(cached, new, strict=True)), [context] * rows)
            except RuntimeError:  # not the step asked for (a prompt split, a row evicted)
                continue
            if repeat:
                times[k].append(took)
    print("prompts | steps | price / measured (median) | each step: price, measured (ms)")
    for prompts in (1, 2, 3):
        ratios, each = [], []
        for (cached, new, rows, context), timed in zip(cases, times, strict=True):
            if len(cached) != prompts or not timed:
                continue
            price = profile.mixed_step_s(cached, new, rows, context)
            ratios.append(price / float(np.median(timed)))
            each.append(f"{price * 1e3:.1f}/{np.median(timed) * 1e3:.1f}")
        print(f"{prompts} | {len(ratios)} | {np.median(ratios):.3f} | {' '.join(each)}")
    if args.trace:
        from ragsim.realrun.search_cost import SEARCH_COST_ROWS
        from ragsim.realrun.vllm.loop import search_cost_on_engine
        from ragsim.traces.io import read_trace

        cost = search_cost_on_engine(timer.llm, timer.vocab, 8192, read_trace(args.trace), 1, 1)
        print(f"a search beside {SEARCH_COST_ROWS}-row decode steps: "
              f"{cost['search_s'] * 1e3:.3f} ms of the engine's (95%: "
              f"{cost['search_s_low'] * 1e3:.3f}-{cost['search_s_high'] * 1e3:.3f}; "
              f"{cost['alone_step_s'] * 1e3:.2f} ms a step alone, "
              f"{cost['beside_step_s'] * 1e3:.2f} beside, {cost['searches']} searches); the "
              f"search threads' interpreter time {cost['interpreter_s'] * 1e3:.3f} ms a search")

if __name__ == "__main__":
    main()
