"""A burst's large steps on vLLM, timed apart: are they priced right as a shape?

At 90% load a validation's steps of 4,096+ tokens ran 1.19-1.41x their price (run W,
docs/validation.md). This times such steps on a fresh engine of a profile's model and
settings, in isolation: ``P`` fresh prompts of ``L`` tokens (three new token counts each,
L+1..L+3) taken in one step beside 0 or ``--decodes`` running requests, each step's measured
time against the profile's price for it (``Profile.mixed_step_s``, or its batched prefill
without decodes). Two warm-up steps first (an engine's first step that big pays the process's
memory growth). Only the ratios mean anything on a shared machine.

    LD_PRELOAD=libtcmalloc_minimal.so.4 .venv-vllm/bin/python benchmarks/burst_steps.py \
        OUT/vllm-vllm-apc/profile.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ragsim.api.loading import load_profile
from ragsim.realrun.vllm.profile import VllmTimer

SHAPES = ((12, 500), (8, 700), (6, 1000), (24, 250))  # prompts x tokens: 4,500-6,000 a step
CONTEXT_TOKENS = 480  # the running requests' prompts


def step_with(timer: VllmTimer, profile, prompts: int, tokens: int, decodes: int
              ) -> tuple[float, float]:
    """(measured, priced) seconds of one step taking ``prompts`` fresh prompts of ``tokens``
    beside ``decodes`` running requests; refused if a prompt was not done in the step."""
    llm = timer.llm
    running = [timer._add(timer._tokens(CONTEXT_TOKENS), 30) for _ in range(decodes)]
    if decodes:
        timer._until_first_tokens(decodes)
    keys = [timer._add(timer._tokens(tokens), 1) for _ in range(prompts)]
    started = time.perf_counter()
    outputs = llm.step()
    took = time.perf_counter() - started
    done = {o.request_id for o in outputs if o.outputs and o.outputs[0].token_ids}
    llm.abort_request(running + [k for k in keys if k not in done])
    timer._drain()
    if not all(k in done for k in keys):
        raise RuntimeError("the prompts did not fit one step: a larger token budget")
    cached, new = [0] * prompts, [tokens] * prompts
    priced = (profile.mixed_step_s(cached, new, decodes, CONTEXT_TOKENS) if decodes
              else profile.prefill_pass_s(cached, new))
    return took, priced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a vLLM profile (validate --profile-now writes one)")
    parser.add_argument("--decodes", type=int, default=20)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    timer = VllmTimer.build(profile.model, block_tokens=32,
                            kv_cache_bytes=int(profile.kv_capacity_bytes), max_model_len=2048,
                            max_batched_tokens=16384, threads=profile.obtained.get("threads"))
    for _ in range(2):
        step_with(timer, profile, 12, 500, 4)
    print("| prompts | tokens | decodes | measured / priced (median) | each (ms / ms) |")
    print("|---|---|---|---|---|")
    for prompts, tokens in SHAPES:
        for decodes in (0, args.decodes):
            runs = [step_with(timer, profile, prompts, tokens + k, decodes) for k in (1, 2, 3)]
            ratio = float(np.median([t / p for t, p in runs]))
            each = " ".join(f"{t * 1e3:.0f}/{p * 1e3:.0f}" for t, p in runs)
            print(f"| {prompts} | {tokens} | {decodes} | {ratio:.2f} | {each} |")


if __name__ == "__main__":
    main()
