"""Measure popularity drift on real traces and find the generator drift that reproduces it.

The statistic (``ragsim.traces.stats.popularity_drift``): split a trace's requests into windows
of 1,000, take each window's 10 most frequent leading documents (a RAG request's top passage, a
Mooncake request's first block, i.e. its prefix) and count the share that is gone from the next
window's top 10. A trace without drift shows turnover too (1,000 requests estimate a top 10
with noise), so the same trace shuffled (the same popularity, no order) gives the noise and the
corrected share is (observed - noise) / (1 - noise). The fit
(``ragsim.traces.drift.fit_drift``) generates traces with the real one's length, leading-document
skew and document count at a grid of ``drift_per_1k_requests`` and reads off the value whose
traces show the measured corrected share, every trace measured by the same function.

Real traces, none written here: ``wiki-trivia-topics`` (real trivia questions in their file's
topical order retrieving real Wikipedia passages), ``wiki-trivia`` (the same kind of questions
shuffled: the stationary control), and Mooncake's public FAST'25 trace (default: the copy in
``tests/data``; timestamps recorded, so its rate per hour is real; the wiki traces' arrivals are
generated at 1 request/s). The built-in ``mmlu``/``nq`` default drift is the ``wiki-trivia-topics``
fit: it is documents retrieved by questions, what RAG serves.

    python benchmarks/measure_drift.py               # about a minute on one core
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragsim.traces import read_mooncake, resolve_trace
from ragsim.traces.drift import FIT_SEEDS, fit_drift
from ragsim.traces.stats import DRIFT_WINDOW_REQUESTS, leading_documents, popularity_drift
from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

MOONCAKE_SAMPLE = (Path(__file__).resolve().parents[1] / "tests" / "data"
                   / "mooncake_synthetic_trace.jsonl.xz")


def read_mooncake_file(path: Path):
    """A Mooncake JSONL file, plain or compressed, labelled by its file name."""
    trace = read_mooncake(path)
    trace.info = {**trace.info, "file": path.name}
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mooncake", type=Path, default=MOONCAKE_SAMPLE,
                        help="Mooncake trace (.jsonl or .jsonl.xz)")
    parser.add_argument("--seeds", type=int, default=len(FIT_SEEDS),
                        help="generated traces per grid point")
    parser.add_argument("--no-fit", action="store_true",
                        help="only the statistic of the real traces (no fit, no built-in check)")
    args = parser.parse_args()

    traces = {"wiki-trivia-topics": resolve_trace("wiki-trivia-topics"),
              "wiki-trivia": resolve_trace("wiki-trivia"),
              f"mooncake ({args.mooncake.name})": read_mooncake_file(args.mooncake)}
    w = DRIFT_WINDOW_REQUESTS
    print(f"top-10 turnover of leading documents between windows of {w:,} requests")
    print("| trace | requests | window (s) | observed | shuffled | corrected per 1k | "
          "corrected per hour | generator drift fit |")
    print("|---|---|---|---|---|---|---|---|")
    fits = {}
    for name, trace in traces.items():
        d = popularity_drift(trace)
        keys = leading_documents(trace)
        n_windows = len(keys) // w
        arrivals = trace.arrival_s[trace.top_k > 0]
        window_s = (arrivals[n_windows * w - 1] - arrivals[0]) / n_windows
        fit = "" if args.no_fit else fit_drift(trace, seeds=tuple(range(args.seeds)))
        if fit:
            fits[name] = fit
            fit_text = f"{fit.drift_per_1k_requests:.2f}" + (" (grid end)" if fit.at_edge
                                                             else "")
        else:
            fit_text = "-"
        print(f"| {name} | {trace.n_requests:,} | {window_s:.0f} | {d['top10_turnover']:.3f} | "
              f"{d['top10_turnover_shuffled']:.3f} | {d['top10_turnover_corrected']:+.3f} | "
              f"{d['top10_turnover_corrected_per_hour']:+.2f} | {fit_text} |")
    for name, fit in fits.items():
        curve = ", ".join(f"{g:g}: {c:+.3f}" for g, c in zip(fit.grid, fit.curve, strict=True))
        print(f"\n{name}: generated twins ({fit.spec.n_requests:,} requests, "
              f"{fit.spec.n_documents:,} documents, leading top-3% share "
              f"{fit.spec.target_top3_share:.3f}, {args.seeds} seeds), corrected turnover at "
              f"each drift: {curve}")
    # the check: the built-in traces at their default drift show what was measured
    for name in () if args.no_fit else ("mmlu", "nq"):
        values = [popularity_drift(resolve_trace(name, seed=seed))["top10_turnover_corrected"]
                  for seed in range(4)]
        print(f"\nbuilt-in {name} at drift {BUILTIN_DRIFT_PER_1K_REQUESTS:g} (seeds 0-3): "
              f"corrected turnover {sum(values) / len(values):+.3f} "
              f"({', '.join(f'{v:+.3f}' for v in values)})")
    if "wiki-trivia-topics" in fits:
        print(f"\nbuilt-in default (wiki-trivia-topics fit, 2 decimals): "
              f"{round(fits['wiki-trivia-topics'].drift_per_1k_requests, 2)}; "
              f"BUILTIN_DRIFT_PER_1K_REQUESTS is {BUILTIN_DRIFT_PER_1K_REQUESTS}")


if __name__ == "__main__":
    main()
