"""Fit the synthetic stage model's wrong-list shape on traces with recorded stages.

    python benchmarks/fit_stage_model.py [TRACE ...]    # default: wiki-trivia wiki-trivia-topics

Prints, per stage, how many requests' intermediate lists are final, keep the final D1, start
with another final document, or hold none of them; then the model's fit (first wrong list of
each request, ``ragsim/traces/stage_stats.py``): ``stage_keeps_d1_p`` and
``stage_other_found_p``, the defaults of ``ragsim run`` (fitted on ``wiki-trivia``), and the
convergence fit ``stage_converge_p`` from ``ragsim trace stats``.
"""

from __future__ import annotations

import sys

from ragsim.traces import resolve_trace
from ragsim.traces.stage_stats import stage_convergence, stage_shapes

SHAPES = ("final", "keeps_d1", "other_first", "none_found")


def main(names: list[str]) -> None:
    for name in names or ["wiki-trivia", "wiki-trivia-topics"]:
        trace = resolve_trace(name)
        fit = stage_shapes(trace)
        if not fit:
            print(f"{name}: no recorded stages")
            continue
        print(f"{name} ({trace.n_requests:,} requests)")
        print(f"  {'stage':>5} " + " ".join(f"{s:>11}" for s in SHAPES)
              + f" {'wrong keep D1':>14}")
        for stage, counts in fit["per_stage"].items():
            wrong = sum(v for k, v in counts.items() if k != "final")
            keep = counts.get("keeps_d1", 0) / wrong if wrong else float("nan")
            print(f"  {stage:>5} " + " ".join(f"{counts.get(s, 0):>11}" for s in SHAPES)
                  + f" {keep:>14.1%}")
        print(f"  stage_keeps_d1_p    {fit['stage_keeps_d1_p']:.3f}")
        print(f"  stage_other_found_p {fit['stage_other_found_p']:.3f}")
        print(f"  stage_converge_p    {stage_convergence(trace)['stage_converge_p']:.3f}")
        print(f"  consecutive wrong lists unchanged: {fit['wrong_list_unchanged_share']:.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
