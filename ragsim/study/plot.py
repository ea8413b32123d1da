"""Curves from a sweep's table: a metric against a swept option, one curve per value of another,
the mean over seeds with a 95% confidence band (Student's t over the seeds' results).

Columns carry their units in their names (``_s``, ``_bytes``, ``_rps``), so axis labels say the
unit without a table of names to keep up to date; sizes are drawn in GiB. Presets name the
paper's figures. A plot refuses to average over an option that varies but is neither the x
axis, the curves nor the seed: those points are different experiments, not repetitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.figures import plain
from ragsim.study.results import POINTS_DIR

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

GiB = 2**30
CONFIDENCE = 0.95
MAX_SEED_LINES = 8  # up to this many seeds, each is drawn as its own thin line
# curves closer than this share of their value are one line (see ``coincide``)
COINCIDE_RTOL = 0.01
CDF_LEVELS = np.linspace(0.01, 0.99, 99)  # the quantiles two CDFs are compared at
# metrics that cannot be negative (times, rates, sizes, counts of tokens) and those that are
# shares (hit rates, busy fractions): a band is cut at the range the metric can take
_NON_NEGATIVE = ("_s", "_ms", "_rps", "_bytes", "_tokens", "_rate", "_fraction")


@dataclass(frozen=True)
class Preset:
    """A named figure: its axes, its curves, and what the paper's figure shows."""

    x: str
    y: str
    by: str | None
    title: str
    kind: str = "curve"  # or "cdf": per-request TTFT from each point's records


PRESETS = {
    "hit-rate-vs-host-memory": Preset("host_cache_bytes", "token_hit_rate", "policy",
                                      "Token hit rate vs host memory (paper Fig. 17)"),
    "ttft-vs-rate": Preset("rate_rps", "ttft_mean_s", "system",
                           "TTFT vs request rate (paper Figs. 13, 14, 16)"),
    "ttft-vs-top-k": Preset("top_k", "ttft_mean_s", "system", "TTFT vs top-k (paper Fig. 15)"),
    "reorder-ablation": Preset("rate_rps", "ttft_mean_s", "reorder",
                               "Cache-aware reordering (paper Fig. 18)"),
    "speculation-ablation": Preset("rate_rps", "ttft_mean_s", "speculate",
                                   "Dynamic speculative pipelining (paper Fig. 19)"),
    "ttft-cdf": Preset("ttft_s", "cdf", "system", "TTFT distribution", kind="cdf"),
}
# replay names its memory columns after its own configuration
REPLAY_COLUMNS = {"host_cache_bytes": "host_capacity_bytes", "gpu_kv_bytes": "gpu_capacity_bytes"}
_UNITS = (("_bytes", "GiB"), ("_rps", "req/s"), ("_ms", "ms"), ("_s", "s"),
          ("_tokens", "tokens"))
_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end", "rps": "", "kv": "KV",
          "gpu": "GPU", "p50": "p50", "p90": "p90", "p99": "p99", "k": "k"}


def label(column: str) -> str:
    """``ttft_p90_s`` -> ``TTFT p90 (s)``, ``host_cache_bytes`` -> ``host cache (GiB)``."""
    unit = next((u for suffix, u in _UNITS if column.endswith(suffix)), None)
    stem = column
    if unit is not None:
        stem = column[: -len(next(s for s, u in _UNITS if column.endswith(s)))]
    words = [_WORDS.get(w, w) for w in stem.split("_")]
    text = plain(" ".join(w for w in words if w))
    return f"{text} ({unit})" if unit else text


def scale(column: str) -> float:
    """What a column's values are divided by to be drawn in its label's unit."""
    return float(GiB) if column.endswith("_bytes") else 1.0


def bounds(column: str) -> tuple[float, float]:
    """The values a metric can take. A Student-t band over 2 seeds is wide (+-12.7 standard
    errors): around a throughput of 0.95 req/s it ran from -1 to 3 req/s, a hit rate's past 1;
    drawn as is it shows values no run can have, so bands are cut to this range."""
    if "hit_rate" in column or column.endswith("_fraction"):
        return 0.0, 1.0
    if column.endswith(_NON_NEGATIVE):
        return 0.0, float("inf")
    return float("-inf"), float("inf")


def coincide(curves: np.ndarray) -> bool:
    """Whether curves (one per column, their values at the same points in rows) are one line:
    at every point they differ by at most ``COINCIDE_RTOL`` (1%) of their mean there.

    Exact equality is too strict: two systems that both keep up with the load serve every
    request, so both throughputs are the arrival rate and differ only in when the last request
    ended (0.9470 vs 0.9487 req/s). A gap under 1% is either hidden under the other line and
    its band or, on an axis scaled to the lines alone, blown up to fill the figure; neither
    tells the truth. The tables keep 4 significant digits, so such a gap is still there."""
    values = np.asarray(curves, dtype=float)
    if values.ndim != 2 or values.shape[1] < 2:
        return False
    missing = np.isnan(values)
    if (missing != missing[:, :1]).any():
        return False  # a curve with points the others lack is not drawn over by them
    rows = values[~missing.any(axis=1)]
    spread = rows.max(axis=1) - rows.min(axis=1)
    return bool((spread <= COINCIDE_RTOL * np.abs(rows).mean(axis=1)).all())


def _aliases() -> dict[str, list[str]]:
    """Names a user sweeps by -> the results' columns of that quantity: run's options
    (``host_mem`` -> ``host_cache_bytes``), replay's, and replay's own memory columns."""
    from ragsim.api.run import FIELD_OF_OPTION
    from ragsim.study.spec import REPLAY_ALIASES

    names: dict[str, list[str]] = {}
    for option, field in FIELD_OF_OPTION.items():
        if option != field:
            names.setdefault(option, []).append(field)
    for field, option in REPLAY_ALIASES.items():  # replay's options name run's fields too
        names.setdefault(option, []).append(field)
    for column, replay_column in REPLAY_COLUMNS.items():
        names.setdefault(column, []).append(replay_column)
    return names


def check_column(table: pd.DataFrame, column: str, flag: str) -> str:
    """The column, or the column of the same quantity under the name the user swept it by
    (``host_mem`` is ``host_cache_bytes``; replay's ``host_capacity_bytes``); else a clear error
    with the closest column."""
    import difflib

    if column in table.columns:
        return column
    for candidate in _aliases().get(column, []):
        if candidate in table.columns:
            return candidate
    names = sorted(c for c in table.columns if c not in ("point_id", "swept", "mode"))
    close = difflib.get_close_matches(column, names, n=3, cutoff=0.5)
    hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
            else f"the swept columns are {', '.join(_swept(table)) or 'none'}")
    raise RagsimInputError(f"no column {column!r} in the results; {hint} (all "
                           f"{len(names)} columns: the results table's)", field=flag)


def _swept(table: pd.DataFrame) -> list[str]:
    swept: list[str] = []
    for names in table.get("swept", []):
        swept += [n for n in str(names).split(",") if n and n not in swept]
    return swept


def select(table: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    """Rows matching every ``COLUMN=VALUE`` (values compared as the column's text)."""
    for condition in where:
        name, sep, value = condition.partition("=")
        if not sep:
            raise RagsimInputError(f"must be COLUMN=VALUE, got {condition!r}", field="--where")
        name = check_column(table, name.strip(), "--where")
        table = table[table[name].astype(str) == value.strip()]
        if table.empty:
            raise RagsimInputError(f"no row has {name} = {value.strip()}", field="--where")
    return table


def _check_repetitions(table: pd.DataFrame, x: str, by: str | None) -> None:
    swept = set()
    for names in table.get("swept", []):
        swept.update(n for n in str(names).split(",") if n)
    keep = {x, by, "seed"}  # x and by are the table's columns, as the swept names are
    varying = sorted(name for name in swept - keep
                     if name in table.columns and table[name].astype(str).nunique() > 1)
    if varying:
        raise RagsimInputError(
            f"{', '.join(varying)} also vary in these results: averaging over them would mix "
            f"experiments; pick one with --where {varying[0]}=VALUE or draw them with --by "
            f"{varying[0]}", field="--by" if by is None else "--where")


def aggregate(table: pd.DataFrame, x: str, y: str, by: str | None = None) -> pd.DataFrame:
    """Per curve and x: the mean of ``y`` over seeds, its 95% confidence interval (Student's t;
    none with a single seed: lo = hi = mean) and the number of seeds."""
    from pandas.api.types import is_numeric_dtype
    from scipy import stats

    if not is_numeric_dtype(table[y]):
        raise RagsimInputError(f"{y} is not a number column", field="--y")
    if not is_numeric_dtype(table[x]):
        raise RagsimInputError(f"{x} is not a number column", field="--x")
    keys = [by, x] if by is not None else [x]
    rows = []
    for key, group in table.groupby(keys, sort=True, dropna=False):
        values = group[y].dropna().to_numpy(dtype=float)
        n = len(values)
        mean = float(values.mean()) if n else float("nan")
        half = 0.0
        if n > 1:
            half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * values.std(ddof=1)
                         / np.sqrt(n))
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key, strict=True)), "mean": mean, "lo": mean - half,
                     "hi": mean + half, "n": n})
    import pandas as pd

    return pd.DataFrame(rows)


def draw_curves(table: pd.DataFrame, x: str, y: str, by: str | None = None,
                title: str | None = None, log_x: bool = False, log_y: bool = False) -> Figure:
    """The figure: a line of means per curve with its confidence band."""
    from ragsim.figures import new_figure

    _check_repetitions(table, x, by)
    stats = aggregate(table, x, y, by)
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    groups = stats.groupby(by, sort=True) if by is not None else [(None, stats)]
    seeds = int(stats["n"].max()) if len(stats) else 0
    # each seed's own line, thin, when there are few: curves that share seeds are compared
    # seed by seed (a gap every seed shows is real even where the bands overlap)
    per_seed = 1 < seeds <= MAX_SEED_LINES and "seed" in table.columns
    low, high = (b / scale(y) for b in bounds(y))
    cut = False
    for value, curve in groups:
        curve = curve.sort_values(x)
        xs = curve[x].to_numpy(dtype=float) / scale(x)
        name = None if by is None else f"{plain(by)} = {_shown(value)}"
        ys = {k: curve[k].to_numpy(dtype=float) / scale(y) for k in ("mean", "lo", "hi")}
        (line,) = ax.plot(xs, ys["mean"], marker="o", label=name)
        cut |= bool((ys["lo"] < low).any() or (ys["hi"] > high).any())
        ax.fill_between(xs, np.clip(ys["lo"], low, high), np.clip(ys["hi"], low, high),
                        alpha=0.2, color=line.get_color(), linewidth=0)
        if per_seed:
            rows = table if by is None else table[table[by].astype(str) == str(value)]
            for seed, one in rows.groupby("seed", sort=True):
                one = one.sort_values(x)
                ax.plot(one[x].to_numpy(dtype=float) / scale(x),
                        one[y].to_numpy(dtype=float) / scale(y), color=line.get_color(),
                        linewidth=0.7, alpha=0.45, label=f"_seed {seed} of {name}")
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(y))
    if log_x:
        ax.set_xscale("log")
    if log_y:  # a band reaching below zero is cut at the axis
        ax.set_yscale("log", nonpositive="clip")
    ax.set_title(title or f"{label(y)} vs {label(x)}", fontsize=10)
    note = (f"mean over {seeds} seeds; band: {CONFIDENCE:.0%} confidence interval of the mean "
            "(Student's t" + (", cut to the values the metric can take" if cut else "") + ")"
            + ("; thin lines: each seed" if per_seed else "") if seeds > 1
            else "one seed (no confidence band)")
    ax.text(0.99, 0.01, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
            color="0.4")
    if by is not None:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _shown(value) -> str:
    """A curve's value as its legend shows it (a path with ``$`` drawn as written)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return plain(value)


def cdf_samples(out_dir: Path, table: pd.DataFrame, by: str | None,
                column: str = "ttft_s") -> dict[object, np.ndarray]:
    """Per value of ``by`` (one ``None`` key without it), the per-request ``column`` of its
    points, the seeds' requests pooled: what ``draw_cdf`` draws and the report compares."""
    import pandas as pd

    _check_repetitions(table, "seed", by)
    groups = table.groupby(by, sort=True) if by is not None else [(None, table)]
    samples: dict[object, np.ndarray] = {}
    for value, rows in groups:
        values = []
        for point_id in rows["point_id"]:
            path = Path(out_dir) / POINTS_DIR / point_id / "requests.parquet"
            if not path.exists():
                raise RagsimInputError("has no per-request records (the sweep ran with "
                                       "--no-records)", file=str(path))
            values.append(pd.read_parquet(path, columns=[column])[column].dropna().to_numpy())
        samples[value] = np.concatenate(values)
    return samples


def cdf_quantiles(samples: dict[object, np.ndarray]) -> np.ndarray:
    """The CDFs at ``CDF_LEVELS``, one column per group (for ``coincide``: two CDFs that agree
    at every percentile are drawn one over the other)."""
    return np.column_stack([np.quantile(data, CDF_LEVELS) if len(data)
                            else np.full(len(CDF_LEVELS), np.nan)
                            for data in samples.values()])


def draw_cdf(out_dir: Path, table: pd.DataFrame, by: str | None,
             column: str = "ttft_s", samples: dict[object, np.ndarray] | None = None
             ) -> Figure:
    """Per-request ``column`` CDFs, one per value of ``by``, pooling the seeds' requests (from
    each point's ``requests.parquet``, or ``samples`` already read by ``cdf_samples``; a sweep
    run with --no-records has none)."""
    from ragsim.figures import new_figure

    if samples is None:
        samples = cdf_samples(out_dir, table, by, column)
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for value, data in samples.items():
        data = np.sort(data)
        ys = np.arange(1, len(data) + 1) / len(data)
        ax.step(data, ys, where="post",
                label=None if by is None else f"{plain(by)} = {_shown(value)}")
    ax.set_xlabel(label(column))
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{label(column)} CDF", fontsize=10)
    if by is not None:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_figure(out_dir: Path, table: pd.DataFrame, *, x: str | None, y: str | None,
                by: str | None, preset: str | None = None, where: list[str] | None = None,
                log_x: bool = False, log_y: bool = False) -> Figure:
    """The figure ``ragsim plot`` draws: a preset (whose axes the options may override) or
    ``x``/``y``/``by`` given."""
    chosen = None
    if preset is not None:
        if preset not in PRESETS:
            raise RagsimInputError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}",
                                   field="--preset")
        chosen = PRESETS[preset]
        by = by or chosen.by
    table = select(table, where or [])
    if by is not None:
        by = check_column(table, by, "--by")
    if chosen is not None and chosen.kind == "cdf":
        return draw_cdf(out_dir, table, by)
    x = x or (chosen.x if chosen else None)
    y = y or (chosen.y if chosen else None)
    if x is None or y is None:
        raise RagsimInputError("give --x and --y, or a --preset", field="--x" if x is None
                               else "--y")
    x, y = check_column(table, x, "--x"), check_column(table, y, "--y")
    return draw_curves(table, x, y, by, title=chosen.title if chosen else None, log_x=log_x,
                       log_y=log_y)

