"""Measure popularity drift on real traces and find the generator drift that reproduces it.

The statistic (``ragsim.traces.stats.popularity_drift``): split a trace's requests into windows
of 1,000, take each window's 10 most frequent leading documents (a RAG request's top passage, a
Mooncake request's first block past the prefix every request shares, i.e. the one naming its
context) and count the share that is gone from the next window's top 10. A trace without drift
shows turnover too (1,000 requests estimate a top 10 with noise), so the same trace shuffled
(the same popularity, no order) gives the noise and the corrected share is (observed - noise) /
(1 - noise). The fit (``ragsim.traces.drift.fit_drift``) generates traces with the real one's
length, leading-document skew and document count at a grid of ``drift_per_1k_requests`` and
reads off the value whose traces show the measured corrected share, every trace measured by
the same function.

Real traces, none written here:

* ``ragpulse``: real RAG traffic (two weeks of a university Q&A service, its own arrival
  times), measured on its passages (``trace stats ragpulse`` does the same); also read on one
  clock (``--clock sorted``: its two weeks overlaid), to show what the clock changes;
* Mooncake's FAST'25 conversation trace (one hour of a chat service, recorded arrivals;
  ``tests/data``) and its synthetic trace (public datasets, Poisson arrivals);
* ``wiki-trivia-topics`` (real trivia questions in their file's topical order retrieving real
  Wikipedia passages: the proxy the default was measured on before) and ``wiki-trivia`` (the
  same kind of questions shuffled: the stationary control). Their arrivals are generated.

The built-in ``mmlu``/``nq`` default drift is the ``ragpulse`` fit: real RAG traffic in its
recorded order. The sensitivity table at the end shows how much it hangs on the window and on N.

    python benchmarks/measure_drift.py               # about three minutes on one core
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragsim.traces import packaged_trace_dir, read_mooncake, resolve_trace
from ragsim.traces.drift import FIT_SEEDS, fit_drift
from ragsim.traces.ragpulse import read_ragpulse
from ragsim.traces.stats import (
    DRIFT_WINDOW_REQUESTS,
    leading_documents,
    popularity_drift,
    shared_prefix_depth,
    top_n_turnover,
)
from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS
from ragsim.traces.traffic import retrieved_only, system_prompt_mask

TEST_DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
MOONCAKE_SAMPLE = TEST_DATA / "mooncake_synthetic_trace.jsonl.xz"
MOONCAKE_CONVERSATION = TEST_DATA / "mooncake_conversation_trace.jsonl.xz"
DEFAULT_SOURCE = "ragpulse"
SENSITIVITY = ((500, 1000, 2000), (5, 10, 20))  # windows of requests, top N


def read_mooncake_file(path: Path):
    """A Mooncake JSONL file, plain or compressed, labelled by its file name."""
    trace = read_mooncake(path)
    trace.info = {**trace.info, "file": path.name}
    return trace


def passages(trace):
    """A RAGPulse trace's retrieval alone: the popularity of what was retrieved, as
    ``trace stats`` measures it (its system prompt begins every path)."""
    return retrieved_only(trace, system_prompt_mask(trace))


def pair_turnovers(keys, window: int, top_n: int = 10) -> list[float]:
    """The observed top-N turnover of each pair of consecutive windows (their mean is the
    ``observed`` column): how much one pair can differ from the next, i.e. how coarse the
    mean of a few pairs is."""
    n_windows = len(keys) // window
    return [top_n_turnover(keys[i * window:(i + 2) * window], window, top_n)
            for i in range(n_windows - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mooncake", type=Path, default=MOONCAKE_SAMPLE,
                        help="Mooncake synthetic trace (.jsonl or .jsonl.xz)")
    parser.add_argument("--conversation", type=Path, default=MOONCAKE_CONVERSATION,
                        help="Mooncake conversation trace (.jsonl or .jsonl.xz)")
    parser.add_argument("--seeds", type=int, default=len(FIT_SEEDS),
                        help="generated traces per grid point")
    parser.add_argument("--no-fit", action="store_true",
                        help="only the statistic of the real traces (no fit, no built-in check)")
    args = parser.parse_args()

    traces = {"ragpulse": passages(resolve_trace("ragpulse")),
              "ragpulse, one clock": passages(read_ragpulse(packaged_trace_dir("ragpulse"),
                                                            clock="sorted")),
              f"mooncake ({args.conversation.name})": read_mooncake_file(args.conversation),
              f"mooncake ({args.mooncake.name})": read_mooncake_file(args.mooncake),
              "wiki-trivia-topics": resolve_trace("wiki-trivia-topics"),
              "wiki-trivia": resolve_trace("wiki-trivia")}
    w = DRIFT_WINDOW_REQUESTS
    print(f"top-10 turnover of leading documents between windows of {w:,} requests")
    print("| trace | requests | window (s) | observed | shuffled | corrected per 1k | "
          "corrected per hour | generator drift fit | observed per window pair |")
    print("|---|---|---|---|---|---|---|---|---|")
    fits = {}
    for name, trace in traces.items():
        d = popularity_drift(trace)
        keys = leading_documents(trace)
        n_windows = len(keys) // w
        arrivals = trace.arrival_s[trace.top_k > shared_prefix_depth(trace)]
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
              f"{d['top10_turnover_corrected_per_hour']:+.2f} | {fit_text} | "
              f"{', '.join(f'{v:.1f}' for v in pair_turnovers(keys, w))} |")
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
    windows, tops = SENSITIVITY
    print("\ncorrected turnover by window (requests) and top N ('-': fewer than two windows)")
    print("| trace | window | " + " | ".join(f"top {n}" for n in tops) + " |")
    print("|---|---|" + "---|" * len(tops))
    for name in (DEFAULT_SOURCE, f"mooncake ({args.conversation.name})"):
        for window in windows:
            cells = []
            for n in tops:
                value = popularity_drift(traces[name], window, n)[f"top{n}_turnover_corrected"]
                cells.append("-" if value is None else f"{value:+.3f}")
            print(f"| {name} | {window:,} | " + " | ".join(cells) + " |")
    if DEFAULT_SOURCE in fits:
        print(f"\nbuilt-in default ({DEFAULT_SOURCE} fit, 2 decimals): "
              f"{round(fits[DEFAULT_SOURCE].drift_per_1k_requests, 2)}; "
              f"BUILTIN_DRIFT_PER_1K_REQUESTS is {BUILTIN_DRIFT_PER_1K_REQUESTS}")

if __name__ == "__main__":
    main()
