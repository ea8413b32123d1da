"""Figures as files: drawn without pyplot, written whole, the same bytes for the same curves.

Every plot ragsim writes goes through here. A bare ``Figure`` on the Agg canvas opens no window,
switches no global backend or style under the caller and is not kept alive in pyplot's registry.
``save_figure`` writes atomically (an interrupted run leaves the previous file, never half a
PNG) and deterministically: SVG ids are salted with a constant and the date stamps SVG and PDF
would carry are left out, so a plot can live in a repository without changing on every rerun.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ragsim.atomic import write_atomically
from ragsim.errors import RagsimInputError

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.figure import Figure

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
_NO_DATES = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}, ".png": {}}


def check_plot_path(path: Path | str, field: str = "--plot") -> Path:
    """The path, if its suffix names a format we write; otherwise a clear error naming the flag.

    Call it before any slow work: a typo should cost nothing.
    """
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise RagsimInputError(f"cannot write {path.name!r}: the suffix picks the format, one of "
                               f"{', '.join(PLOT_SUFFIXES)}", field=field)
    return path


def plain(text: object) -> str:
    """Text from the user's data (a path, a trace's or a profile's name, a column's value) as
    matplotlib draws it literally: a ``$`` pair would start mathtext, which misdraws
    ``a$x$b`` and refuses ``run$^^$1`` (a legal folder name) with a parse error."""
    return str(text).replace("$", r"\$")


def new_figure(width_in: float, height_in: float) -> Figure:
    """A matplotlib ``Figure`` with its own Agg canvas (matplotlib is imported only here)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: Path | str) -> Path:
    """Write ``fig`` to ``path`` (PNG, SVG or PDF by suffix), atomically and reproducibly."""
    import matplotlib

    path = check_plot_path(path)
    metadata = _NO_DATES[path.suffix.lower()]
    try:
        with matplotlib.rc_context({"svg.hashsalt": "ragsim"}):  # the default salt is random
            # the temporary file keeps the suffix, so savefig picks the same format
            write_atomically(path, lambda tmp: fig.savefig(tmp, metadata=metadata))
    except OSError as exc:  # a full disk: the figure is lost, an earlier file is not
        raise RagsimInputError(f"the figure could not be written ({exc.strerror or exc}); "
                               "nothing was written there (an earlier file is as it was)",
                               file=str(path)) from None
    return path
