"""Fit the synthetic generators' co-retrieval model to real retrieval, and show what differs.

Real top-k lists are not independent draws from a popularity law: the second document is
usually a neighbour of the first, so the same ordered pair recurs, which is what a knowledge
tree caches. This script measures that on a recorded trace (default ``wiki-trivia``: real
staged faiss search over Wikipedia summaries), then fits ``co_retrieval_p``, ``neighbours`` and
``neighbour_decay`` by grid search: each candidate generates a synthetic trace with the real
trace's request count, catalogue size and top-3% share, and the candidate whose
``stats.co_retrieval`` (pair repeats; pair repeats given a seen first document; favourite second
document's share) is nearest in squared error wins. It prints the fit and a table of the
synthetic built-ins against the real traces. The generator's defaults are this script's output.

    python benchmarks/calibrate_synthetic.py              # ~1 minute
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

from ragsim.traces import resolve_trace
from ragsim.traces.stats import co_retrieval, retrieval_skew, stage_convergence
from ragsim.traces.synthetic import BUILTIN_SPECS, generate

KEYS = ("pair_repeat_share", "pair_repeat_given_first_share", "favourite_second_share")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", default="wiki-trivia")
    args = parser.parse_args()

    real = resolve_trace(args.real)
    target = co_retrieval(real)
    skew = retrieval_skew(real.doc_ids)["top_3pct_share"]
    # the real trace's questions are shuffled (stationary), so the generator is too
    base = replace(BUILTIN_SPECS["nq"], n_requests=real.n_requests,
                   n_documents=real.n_documents, top_k=int(real.top_k.max()),
                   target_top3_share=skew, drift_per_1k_requests=0.0)
    fits = []
    for m, p, decay in itertools.product((2, 4, 8, 16, 32), (0.6, 0.7, 0.8, 0.9, 1.0),
                                         (0.3, 0.5, 0.7, 1.0)):
        got = co_retrieval(generate(replace(base, co_retrieval_p=p, neighbours=m,
                                            neighbour_decay=decay)))
        error = sum((got[k] - target[k]) ** 2 for k in KEYS)
        fits.append((error, p, m, decay, got))
    fits.sort(key=lambda f: f[0])
    error, p, m, decay, got = fits[0]
    independent = co_retrieval(generate(replace(base, co_retrieval_p=0.0)))
    print(f"real: {args.real} ({real.n_requests:,} requests, {real.n_documents:,} documents, "
          f"top-3% share {skew:.1%})")
    print(f"fit: co_retrieval_p={p}, neighbours={m}, neighbour_decay={decay} "
          f"(squared error {error:.4f})")
    print(f"{'statistic':<32} {'real':>7} {'fitted':>7} {'independent':>12}")
    for k in KEYS:
        print(f"{k:<32} {target[k]:>7.3f} {got[k]:>7.3f} {independent[k]:>12.3f}")
    print()
    names = ("mmlu", "nq", "wiki-trivia", "wiki-trivia-topics")
    rows = {name: resolve_trace(name) for name in names}
    print("| | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    stats = {n: {**retrieval_skew(t.doc_ids), **co_retrieval(t), **stage_convergence(t)}
             for n, t in rows.items()}
    for key in ("top_1pct_share", "top_3pct_share", "top_10pct_share", *KEYS,
                "stage_converge_p"):
        cells = []
        for n in names:
            v = stats[n][key]
            cells.append("—" if v is None else f"{v:.1%}" if key != "stage_converge_p"
                         else f"{v:.2f}")
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
