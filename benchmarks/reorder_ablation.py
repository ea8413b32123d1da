"""Cache-aware reordering's ablation (the paper's Figure 18) and TTFT against the request rate.

    python benchmarks/reorder_ablation.py            # 10,000 requests a run
    python benchmarks/reorder_ablation.py --quick    # 2,000 requests, fewer rates
    python benchmarks/reorder_ablation.py --traces ragpulse   # real RAG traffic, whole

1. The paper's setting: a saturated request queue, ``mmlu`` at 2.5 req/s and ``nq`` at 1.4 req/s,
   A10G + Mistral-7B, ``ragcache`` with and without ``--reorder`` (the paper: reordering cuts the
   mean TTFT 1.2-2.1x). Reordering runs with the default window counted from when a request is
   the oldest waiting one, and with the paper's literal rule (counted from arrival), to show
   what each does once requests wait longer than the window.
2. Mean TTFT of ``ragcache`` with and without reordering at rates up to and beyond
   saturation, per trace.

Above saturation the queue grows for as long as requests keep arriving, so TTFTs there depend
on the run's length (printed with every table). Deterministic for a seed.

``ragpulse`` (real RAG traffic: 7,106 requests, whole unless ``--requests`` is smaller) is not in
the paper; its "saturated queue" is 0.6 req/s, where ragcache serves ~0.6 req/s on this
profile (``paper_comparison.py --trace ragpulse``), and its sweep spans 0.4-1.0 req/s.
"""

from __future__ import annotations

import argparse

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

PROFILE = "a10g-mistral-7b"
PAPER_RATES = {"mmlu": 2.5, "nq": 1.4}  # the paper's saturated queue (Figure 18)
SWEEP_RATES = {"mmlu": (2.0, 2.5, 3.0, 3.5, 4.0, 5.0), "nq": (1.0, 1.4, 2.0, 2.5, 3.0, 4.0)}
QUICK_RATES = {"mmlu": (2.5, 3.5, 5.0), "nq": (1.4, 2.5, 4.0)}
# real traffic the paper did not measure: a queue near saturation, and a sweep across it
QUEUE_RATES = {**PAPER_RATES, "ragpulse": 0.6}
SWEEP_RATES["ragpulse"] = (0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
QUICK_RATES["ragpulse"] = (0.5, 0.6, 0.8)
VARIANTS = {  # label -> settings
    "no reorder": {"reorder": False},
    "reorder (window from head)": {"reorder": True, "reorder_window_start": "head"},
    "reorder (window from arrival)": {"reorder": True, "reorder_window_start": "arrival"},
}


def run(trace, name: str, profile, seed: int, **settings) -> dict:
    config = build_config({"trace": name, "system": "ragcache", "seed": seed, **settings})
    return run_simulation(trace, config, profile).summary


def row(label: str, s: dict, base_ttft: float | None) -> str:
    ratio = "" if base_ttft is None else f"{base_ttft / s['ttft_mean_s']:.2f}x"
    decisions = max(s["scheduler_decisions"], 1)
    return (f"  {label:<31} {s['ttft_mean_s']:8.2f} {s['ttft_p99_s']:8.2f} {ratio:>7} "
            f"{s['token_hit_rate']:6.1%} {s['throughput_rps']:6.2f} "
            f"{s['reordered_decisions'] / decisions:8.1%} "
            f"{s['window_forced_decisions'] / decisions:7.1%}")


HEADER = (f"  {'':<31} {'TTFT s':>8} {'p99 s':>8} {'gain':>7} {'hit':>6} {'req/s':>6} "
          f"{'reorder':>8} {'forced':>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per run (default 10,000; --quick: 2,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=None,
                        help="reordering window, seconds (default: ragsim run's)")
    parser.add_argument("--quick", action="store_true", help="fewer requests and rates")
    parser.add_argument("--traces", nargs="+", default=list(PAPER_RATES),
                        choices=list(QUEUE_RATES), help="default: the paper's mmlu and nq")
    args = parser.parse_args()
    n = args.requests or (2_000 if args.quick else 10_000)
    profile = load_profile(PROFILE)
    window = {} if args.window is None else {"reorder_window_s": args.window}
    default_window = build_config({}).reorder_window_s
    print(f"reordering window: {args.window if args.window is not None else default_window} s;"
          f" {n:,} requests a run (ragpulse: whole, or --requests); seed {args.seed}; {PROFILE}")
    print("gain: no-reorder TTFT / this TTFT; reorder: decisions that did not take the oldest"
          " request; forced: decisions the window forced")
    traces = {name: resolve_trace(name, seed=args.seed,
                                  n_requests=n if name in PAPER_RATES or args.requests else None)
              for name in args.traces}
    print("\n1. The paper's saturated queue (Figure 18: reordering 1.2-2.1x)")
    for name in args.traces:
        rate = QUEUE_RATES[name]
        print(f"{name} at {rate} req/s ({traces[name].n_requests:,} requests)")
        print(HEADER)
        base = None
        for label, settings in VARIANTS.items():
            s = run(traces[name], name, profile, args.seed, rate_rps=rate, **settings, **window)
            base = s["ttft_mean_s"] if base is None else base
            print(row(label, s, None if label == "no reorder" else base))
    print("\n2. Mean TTFT against the rate, with and without reordering (window from head and "
          "from arrival)")
    rates = QUICK_RATES if args.quick else SWEEP_RATES
    for name in args.traces:
        sweep = rates[name]
        print(f"{name}")
        print(f"  {'req/s':>6} {'no reorder s':>13} {'head s':>7} {'gain':>6} {'forced':>7} "
              f"{'arrival s':>10} {'gain':>6} {'forced':>7}")
        for rate in sweep:
            off = run(traces[name], name, profile, args.seed, rate_rps=rate, reorder=False)
            line = f"  {rate:6.1f} {off['ttft_mean_s']:13.2f}"
            for start, width in (("head", 7), ("arrival", 10)):
                on = run(traces[name], name, profile, args.seed, rate_rps=rate, reorder=True,
                         reorder_window_start=start, **window)
                forced = on["window_forced_decisions"] / max(on["scheduler_decisions"], 1)
                line += (f" {on['ttft_mean_s']:{width}.2f} "
                         f"{off['ttft_mean_s'] / on['ttft_mean_s']:5.2f}x {forced:7.1%}")
            print(line)


if __name__ == "__main__":
    main()
