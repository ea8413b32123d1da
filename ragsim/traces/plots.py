"""The skew figure of ``ragsim trace stats --plot``: retrieval skew and document sizes.

Drawn and written through ``ragsim.figures``: no pyplot, written whole, and the same curves
give the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragsim.figures import check_plot_path, new_figure, plain, save_figure
from ragsim.traces.skew import MARKER_FRACTION, TraceSkew

MAX_POINTS_PER_LINE = 2000  # a million-document curve drawn in full makes a 100 MB SVG


def _log_thinned(n: int, max_points: int) -> np.ndarray:
    """Indices into a curve of ``n`` points, evenly spaced on a log axis, first and last kept."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.geomspace(1, n, max_points).round().astype(np.int64) - 1)


def plot_skew(skews: Sequence[TraceSkew], path: Path | str) -> list[str]:
    """Write the two-panel skew figure of ``skews`` to ``path`` (PNG, SVG or PDF by suffix).

    Left, the paper's Figure 5: cumulative share of retrievals against the fraction of retrieved
    documents, most retrieved first, on a log axis, with a faint marker at the top 3%. Right, the
    paper's Figure 3: the empirical CDF of the sizes of the distinct retrieved documents. A trace
    with no retrievals has no curve: it is left out and named in the notes returned (the figure
    is still written, so a batch of traces never fails on one empty one).
    """
    path = check_plot_path(path)
    notes = [f"{s.name}: no retrievals, left out of the plot" for s in skews
             if not s.has_retrievals]
    drawn = [s for s in skews if s.has_retrievals]

    fig = new_figure(12, 4.5)
    share_ax, size_ax = fig.subplots(1, 2)
    for skew in drawn:
        keep = _log_thinned(skew.n_documents_retrieved, MAX_POINTS_PER_LINE)
        share_ax.plot(skew.rank_fraction[keep], skew.cumulative_share[keep],
                      label=f"{plain(skew.name)} (top 3%: {skew.top_3pct_share:.0%})")
        # the CDF has one point per distinct size: integers, so short enough to draw in full
        size_ax.plot(skew.size_tokens, skew.size_cdf, drawstyle="steps-post",
                     label=f"{plain(skew.name)} (median {skew.median_doc_tokens:,.0f} tokens)")

    share_ax.axvline(MARKER_FRACTION, color="grey", alpha=0.35, linestyle="--", linewidth=1)
    share_ax.set_xscale("log")
    if drawn:
        share_ax.set_xlim(min(1.0 / s.n_documents_retrieved for s in drawn), 1.0)
        size_ax.set_xscale("log")
    share_ax.set_ylim(0.0, 1.0)
    share_ax.set_xlabel("fraction of retrieved documents, most retrieved first")
    share_ax.set_ylabel("cumulative share of retrievals")
    share_ax.set_title("Retrieval skew")
    size_ax.set_ylim(0.0, 1.0)
    size_ax.set_xlabel("document size (tokens)")
    size_ax.set_ylabel("fraction of retrieved documents")
    size_ax.set_title("Sizes of retrieved documents")
    for ax in (share_ax, size_ax):
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
    if not drawn:
        for ax in (share_ax, size_ax):
            ax.text(0.5, 0.5, "no retrievals in any trace", ha="center", va="center",
                    transform=ax.transAxes)
    fig.tight_layout()
    save_figure(fig, path)
    return notes

