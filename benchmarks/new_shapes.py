"""A step of a shape the engine has not run before, against the same step run again.

A profile times every grid point after a warm-up pass of the same shape, so it measures what a
step costs once the engine has seen its shape. A run's prompts have all lengths: most of its
steps are of a token count the engine has not run yet. On vLLM's CPU engine that first time
costs more (its matrix products are built per shape and kept in a cache of recent ones), and
the validation at rest predicted vLLM's idle prefills 25-45% short while its speed probes,
which repeat the profile's own shapes, said the machine was as fast as when profiled.

This times, in one process on one engine, in the order given:

1. ``--shapes`` prefills of fresh token counts (``--tokens``, +1, +2, ...), one pass each: the
   first time;
2. the same prefills again: the time a profile measures;
3. ``--between`` prefills of other token counts, then the first shapes a third time: whether
   the engine still has them (a cache of fewer shapes than ``--between`` forgets them);
4. a batch of ``--rows`` prompts of ``--tokens`` tokens, three times (the first full batch of
   a run against later ones).

It prints the medians and their ratios (first / again, after / again, batch 1 / batch 3),
measured in this one run: on a shared machine only the ratios mean anything.

    python benchmarks/new_shapes.py --engine torch
    .venv-vllm/bin/python benchmarks/new_shapes.py --engine vllm --rows 54 --tokens 300
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from ragsim.profiles.profile import load_profile


class TorchPrefills:
    """Single passes of the torch engine (``ragsim profile``'s timing code, no warm-up)."""

    def __init__(self, profile_name: str, threads: int | None) -> None:
        from ragsim.profiles.profiler import TorchEngine
        from ragsim.profiles.torch_model import TorchModel

        profile = load_profile(profile_name)
        model = TorchModel.build(profile.model, dtype=profile.model.dtype,
                                 threads=threads or profile.obtained.get("threads"))
        self.engine = TorchEngine.around(model, 0)
        self.name = f"torch {model.torch.__version__}, {profile.name}"

    def once(self, rows: int, tokens: int) -> float:
        if rows == 1:
            return self.engine.prefill(0, tokens, 0, 1).median_s
        return self.engine.prefill_batch([0] * rows, [tokens] * rows, 0, 1).median_s


class VllmPrefills:
    """Single prefills on vLLM's engine (``VllmTimer``, the vLLM profile's timing code)."""

    def __init__(self, profile_name: str, threads: int | None) -> None:
        from ragsim.realrun.vllm import require_engine

        require_engine("--engine vllm")
        from ragsim.realrun.vllm.profile import VllmTimer

        profile = load_profile(profile_name)
        self.timer = VllmTimer.build(profile.model, block_tokens=128, kv_cache_bytes=1 << 30,
                                     max_model_len=2048, max_batched_tokens=16384,
                                     threads=threads or profile.obtained.get("threads"))
        for n in (40, 24):  # the real harness's warm-up (VllmRun._warm_up)
            self.timer._pass([0], [n])
        self.name = f"{self.timer.engine_name()}, {profile.name}"

    def once(self, rows: int, tokens: int) -> float:
        return self.timer._pass([0] * rows, [tokens] * rows)


def engine_parser(description: str, engine: str) -> argparse.ArgumentParser:
    """The arguments every engine timing benchmark here takes: --engine and --profile."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--engine", choices=("torch", "vllm"), default=engine)
    parser.add_argument("--profile", default=None,
                        help="the profile whose model is built (default: the engine's shipped "
                             "CPU profile)")
    return parser


def prefills_for(args: argparse.Namespace) -> TorchPrefills | VllmPrefills:
    """The single-prefill timer of ``args.engine`` on ``args.profile``'s model."""
    from ragsim.backends import CPU_PROFILES

    return (TorchPrefills if args.engine == "torch" else VllmPrefills)(
        args.profile or CPU_PROFILES[args.engine], args.threads)


def minor_page_faults() -> int:
    """This process's minor page faults so far (memory touched for the first time, or again
    after the allocator gave it back): the count real runs keep (``realrun/page_faults.py``)."""
    from ragsim.realrun.page_faults import PageFaults

    return PageFaults.now().minor


def main() -> None:
    parser = engine_parser(__doc__.split("\n\n")[0], "torch")
    parser.add_argument("--tokens", type=int, default=300, help="the first fresh token count")
    parser.add_argument("--shapes", type=int, default=16, help="fresh token counts timed")
    parser.add_argument("--between", type=int, default=200,
                        help="other token counts run before the third look")
    parser.add_argument("--rows", type=int, default=54, help="prompts in the batch")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from ragsim.backends import CPU_PROFILES

    profile = args.profile or CPU_PROFILES[args.engine]
    prefills = (TorchPrefills if args.engine == "torch" else VllmPrefills)(profile,
                                                                            args.threads)
    load_before = os.getloadavg()[0]
    shapes = [args.tokens + k for k in range(args.shapes)]
    first = [prefills.once(1, n) for n in shapes]
    again = [prefills.once(1, n) for n in shapes]
    others = range(args.tokens + args.shapes + 7, args.tokens + args.shapes + 7 + args.between)
    started = time.perf_counter()
    for n in others:
        prefills.once(1, n)
    between_s = time.perf_counter() - started
    after = [prefills.once(1, n) for n in shapes]
    batches = [prefills.once(args.rows, args.tokens) for _ in range(3)]
    ms = lambda values: float(np.median(values) * 1e3)  # noqa: E731
    result = {
        "engine": prefills.name, "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "prefill_tokens": [shapes[0], shapes[-1]],
        "first_ms": ms(first), "again_ms": ms(again), "after_others_ms": ms(after),
        "first_over_again": ms(first) / ms(again),
        "after_others_over_again": ms(after) / ms(again), "others": args.between,
        "others_s": between_s,
        "batch": {"rows": args.rows, "tokens": args.tokens,
                  "ms": [v * 1e3 for v in batches],
                  "first_over_third": batches[0] / batches[2]},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['engine']}; load average {load_before:.2f} -> "
          f"{result['load_average_after']:.2f}")
    print(f"prefill of {shapes[0]}-{shapes[-1]} tokens, medians: first time "
          f"{result['first_ms']:.2f} ms, again {result['again_ms']:.2f} ms "
          f"(first / again {result['first_over_again']:.2f}); after {args.between} other "
          f"shapes {result['after_others_ms']:.2f} ms (/ again "
          f"{result['after_others_over_again']:.2f})")
    print(f"batch of {args.rows} x {args.tokens} tokens, three times: "
          + ", ".join(f"{v:.1f}" for v in result["batch"]["ms"])
          + f" ms (first / third {result['batch']['first_over_third']:.2f})")


if __name__ == "__main__":
    main()
