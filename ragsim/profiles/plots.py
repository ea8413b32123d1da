"""The figure of ``ragsim profiles show --plot``: a profile's prefill surface T(cached, new)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragsim.figures import check_plot_path, new_figure, plain, save_figure
from ragsim.profiles.profile import Profile


def plot_prefill(profile: Profile, path: Path | str) -> Path:
    """One curve per cached-token row of the grid, over 200 log-spaced new-token counts, both
    axes logarithmic: the bilinear surface the policy core reads, as it reads it (``many``)."""
    path = check_plot_path(path)
    grid = profile.prefill
    new_tokens = np.geomspace(max(1.0, grid.y_axis[0]), grid.y_axis[-1], 200)
    fig = new_figure(7, 4.5)
    ax = fig.subplots()
    for cached_tokens in grid.x_axis:
        ax.plot(new_tokens, grid.many(np.full_like(new_tokens, cached_tokens), new_tokens),
                label=f"{cached_tokens:g} cached")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("new (uncached) tokens")
    ax.set_ylabel("prefill time (s)")
    ax.set_title(plain(f"T(cached, new): {profile.name} ({profile.kind})"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    return save_figure(fig, path)
