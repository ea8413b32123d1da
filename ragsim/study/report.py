"""One HTML page for a sweep (or a single run's --out folder): figures, tables, configuration.

The page is self-contained: figures are PNGs embedded as data URIs, the style is inline, there
is no script and no outside reference, so it opens from a file in any browser, offline, and can
be mailed or archived as one file. Which figures a sweep gets is read from what it swept: each
swept number becomes an x axis, the first other swept option the curves, and the metrics that
answer ragsim's question (TTFT, throughput, hit rate) the y axes.
"""

from __future__ import annotations

import base64
import html
import io
import json
import numbers
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.study.plot import (
    COINCIDE_RTOL,
    GiB,
    aggregate,
    cdf_quantiles,
    cdf_samples,
    coincide,
    draw_cdf,
    draw_curves,
    label,
    scale,
)
from ragsim.study.results import POINTS_DIR, RESULTS_FILE, SWEEP_FILE, read_results

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd
    from matplotlib.figure import Figure

RUN_METRICS = ("ttft_mean_s", "ttft_p90_s", "throughput_rps", "token_hit_rate")
REPLAY_METRICS = ("token_hit_rate", "token_hit_rate_host", "swap_in_bytes")
MAX_FIGURES = 24
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { width: 32em; max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; max-width: 38em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f3f3f3; } pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
"""


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return base64.b64encode(buffer.getvalue()).decode()


def _figure(fig: Figure, caption: str) -> str:
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
            f'{_png(fig)}"><figcaption>{html.escape(caption)}</figcaption></figure>')


def _varying(table: pd.DataFrame) -> list[str]:
    """Swept columns with more than one value here (the seed aside), in the sweep's order."""
    names: list[str] = []
    for text in table.get("swept", []):
        for name in str(text).split(","):
            if name and name not in names and name != "seed":
                names.append(name)
    return [n for n in names if n in table.columns and table[n].astype(str).nunique() > 1]


def _numeric(table: pd.DataFrame, name: str) -> bool:
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return is_numeric_dtype(table[name]) and not is_bool_dtype(table[name])


def sweep_figures(out_dir: Path, table: pd.DataFrame,
                  not_drawn: list[str] | None = None) -> list[tuple[Figure, str]]:
    """The sweep's figures with their captions (see the module's docstring for the choice);
    a figure whose curves all coincide is left out and named in ``not_drawn``."""
    not_drawn = [] if not_drawn is None else not_drawn
    varying = _varying(table)
    metrics = RUN_METRICS if (table["mode"] == "run").all() else REPLAY_METRICS
    figures: list[tuple[Figure, str]] = []
    for x in [n for n in varying if _numeric(table, n)]:
        others = [n for n in varying if n != x]
        by = others[0] if others else None
        rest = others[1:]
        groups = table.groupby(rest, sort=True) if rest else [((), table)]
        for values, part in groups:
            values = values if isinstance(values, tuple) else (values,)
            fixed = ", ".join(f"{n} = {_cell(n, v)}" for n, v in zip(rest, values, strict=True))
            for y in metrics:
                if len(figures) >= MAX_FIGURES:
                    return figures
                title = f"{label(y)} vs {label(x)}" + (f" ({fixed})" if fixed else "")
                if by is not None and _curves_coincide(part, x, y, by):
                    # one line hiding the others says nothing: said in words instead
                    not_drawn.append(f"{title}: every {by} gives the same values "
                                     f"(within {COINCIDE_RTOL:.0%})")
                    continue
                figures.append((draw_curves(part, x, y, by, title=title),
                                title + (f", one curve per {by}" if by else "")))
    if (table["mode"] == "run").all() and _has_records(out_dir, table):
        figures += _cdf_figure(out_dir, table, varying, not_drawn)
    return figures


def _cdf_figure(out_dir: Path, table: pd.DataFrame, varying: list[str],
                not_drawn: list[str]) -> list[tuple[Figure, str]]:
    """The TTFT CDF per the first swept option that is not a number, at the smallest value of
    every other; none (named in ``not_drawn``) when the CDFs agree at every percentile."""
    by = next((n for n in varying if not _numeric(table, n)), None)
    part = table
    fixed = []
    for name in [n for n in varying if n != by]:
        first = sorted(part[name].unique(), key=_order(table, name))[0]
        part = part[part[name] == first]
        fixed.append(f"{name} = {_cell(name, first)}")
    caption = "TTFT CDF" + (f" per {by}" if by else "") + (
        f" ({', '.join(fixed)})" if fixed else "")
    samples = cdf_samples(out_dir, part, by)
    if by is not None and coincide(cdf_quantiles(samples)):
        not_drawn.append(f"{caption}: every {by} gives the same percentiles "
                         f"(within {COINCIDE_RTOL:.0%})")
        return []
    return [(draw_cdf(out_dir, part, by, samples=samples),
             caption + ", requests of every seed pooled")]


def _order(table: pd.DataFrame, name: str) -> Callable[[object], object]:
    """Sort key of a swept column's values: numbers by value (as text, 10 GiB would come
    before 2 GiB), anything else by its text."""
    return float if _numeric(table, name) else str


def _curves_coincide(table: pd.DataFrame, x: str, y: str, by: str) -> bool:
    """Whether every curve has the same means at every x, to within ``COINCIDE_RTOL`` (see
    ``coincide`` for why not exactly)."""
    stats = aggregate(table, x, y, by)
    if stats[by].nunique() < 2:
        return False
    means = stats.pivot_table(index=x, columns=by, values="mean", dropna=False)
    return coincide(means.to_numpy(dtype=float))


def _has_records(out_dir: Path, table: pd.DataFrame) -> bool:
    return all((out_dir / POINTS_DIR / p / "requests.parquet").exists()
               for p in table["point_id"])


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per point (seeds pooled): the number of seeds, each metric's mean and 95% interval."""
    import pandas as pd

    varying = _varying(table) or ["trace"]
    metrics = RUN_METRICS if (table["mode"] == "run").all() else REPLAY_METRICS
    key = " | ".join(varying)
    shown = pd.DataFrame({n: [_cell(n, v) for v in table[n]] for n in varying}, index=table.index)
    work = table.assign(**{key: shown.agg(" | ".join, axis=1), "_x": 0})
    rows = None
    for metric in metrics:
        grouped = aggregate(work, "_x", metric, key)
        if rows is None:
            rows = pd.DataFrame({key: grouped[key], "seeds": grouped["n"]})
        unit = scale(metric)  # the header's unit (sizes in GiB)
        rows[label(metric)] = [f"{m:.4g} ± {h - m:.2g}" if n > 1 else f"{m:.4g}"
                               for m, h, n in zip(grouped["mean"] / unit, grouped["hi"] / unit,
                                                  grouped["n"], strict=True)]
    return rows


def _cell(column: str, value: object) -> str:
    """A swept value as the table shows it: sizes in GiB, as the figures draw them. Values
    taken from a column are numpy's numbers (not ``int``), so any real number counts."""
    if (column.endswith("_bytes") and isinstance(value, numbers.Real)
            and not isinstance(value, bool) and value == value):
        return f"{float(value) / GiB:g} GiB"
    return str(value)


def _table_html(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, escape=True, border=0)


def sweep_report(out_dir: Path) -> str:
    table = read_results(out_dir)
    if table.empty:
        raise RagsimInputError("the sweep has no finished point yet",
                               file=str(out_dir / RESULTS_FILE))
    spec = (out_dir / SWEEP_FILE).read_text() if (out_dir / SWEEP_FILE).exists() else ""
    shown = _sweep_file_without_points(spec)
    parts = [f"<h1>ragsim sweep: {html.escape(out_dir.name)}</h1>",
             f"<p>{_runs_line(table)}, mode {html.escape(str(table['mode'].iloc[0]))}. "
             "Bands and ± are 95% confidence intervals over seeds (Student's t).</p>",
             "<h2>Figures</h2>"]
    not_drawn: list[str] = []
    parts += [_figure(fig, caption) for fig, caption in sweep_figures(out_dir, table, not_drawn)]
    if not_drawn:
        parts.append("<p>Not drawn (their curves coincide): "
                     + "; ".join(html.escape(n) for n in not_drawn) + ".</p>")
    parts += ["<h2>Results (mean over seeds)</h2>", _table_html(summary_table(table)),
              "<h2>Configuration</h2>", f"<pre>{html.escape(shown)}</pre>"]
    return _page(f"ragsim sweep {out_dir.name}", parts)


def _runs_line(table: pd.DataFrame) -> str:
    """``8 runs: 4 points x 2 seeds`` (a point is a configuration; each ran once per seed)."""
    runs = len(table)
    seeds = table["seed"].nunique() if "seed" in table.columns else 1
    points = runs // seeds if seeds and runs % seeds == 0 else None
    if points is None:  # an unfinished sweep: not every point has every seed
        return f"{runs} run{'s' * (runs != 1)} of {seeds} seed{'s' * (seeds != 1)}"
    return (f"{runs} run{'s' * (runs != 1)}: {points} point{'s' * (points != 1)} x {seeds} "
            f"seed{'s' * (seeds != 1)}")


def _sweep_file_without_points(text: str) -> str:
    """The resolved sweep file without its per-point list (that is the table's job)."""
    if not text:
        return "(no sweep.toml)"
    import tomli_w

    data = tomllib.loads(text)
    data.pop("resolved", None)
    return tomli_w.dumps(data)


def run_report(out_dir: Path) -> str:
    """The page of one ``ragsim run --out`` (or replay) folder."""
    import pandas as pd

    from ragsim.outputs import check_result_set

    summary = json.loads((out_dir / "summary.json").read_text())
    check_result_set(out_dir, summary)  # never a page of new records beside an old summary
    config = summary.get("config", {})
    metrics = {k: v for k, v in summary.items()
               if not isinstance(v, dict | list) and k != "config"}
    parts = [f"<h1>ragsim run: {html.escape(out_dir.name)}</h1>"]
    records = out_dir / "requests.parquet"
    if records.exists() and "ttft_s" in pd.read_parquet(records).columns:
        from ragsim.figures import new_figure

        ttft = np.sort(pd.read_parquet(records, columns=["ttft_s"])["ttft_s"].dropna())
        fig = new_figure(6.4, 4.2)
        ax = fig.add_subplot()
        ax.step(ttft, np.arange(1, len(ttft) + 1) / max(len(ttft), 1), where="post")
        ax.set_xlabel(label("ttft_s"))
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        parts += ["<h2>Figures</h2>", _figure(fig, f"TTFT CDF over {len(ttft)} requests")]
    parts += ["<h2>Summary</h2>", _table_html(pd.DataFrame(
                  {"metric": list(metrics), "value": [str(v) for v in metrics.values()]})),
              *_uncertainty_html(summary),
              "<h2>Configuration</h2>", _table_html(pd.DataFrame(
                  {"setting": list(config), "value": [str(v) for v in config.values()]}))]
    return _page(f"ragsim run {out_dir.name}", parts)


def uncertainty_table(summary: dict) -> pd.DataFrame | None:
    """A run's intervals and ranges (``--seeds``, ``--sensitivity``) as one row per metric, a
    range that spans more than 2x marked UNSTABLE as ``run``'s table and findings.md mark it:
    a page that showed only the first seed's value would be the knife-edge headline the
    uncertainty options exist to prevent. None when the run has neither."""
    import pandas as pd

    intervals = summary.get("ci95") or {}
    ranges = summary.get("sensitivity") or {}
    if not intervals and not ranges:
        return None
    unstable = set(summary.get("sensitivity_unstable") or [])
    mean = summary.get("mean") or {}
    rows = []
    for metric in [*intervals, *(k for k in ranges if k not in intervals)]:
        row = {"metric": metric, "value": summary.get(metric)}
        if intervals:
            row["mean over seeds"] = mean.get(metric)
            row["95% interval"] = _pair(intervals.get(metric), "[{:.4g}, {:.4g}]")
        if ranges:
            row["range repriced"] = _pair(ranges.get(metric), "{:.4g}-{:.4g}")
            row["stability"] = "UNSTABLE (range > 2x)" if metric in unstable else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _pair(low_high: list[float] | None, form: str) -> str:
    return "" if low_high is None else form.format(*low_high)


def _uncertainty_html(summary: dict) -> list[str]:
    table = uncertainty_table(summary)
    if table is None:
        return []
    how = []
    if summary.get("seeds"):
        how.append(f"Student-t 95% intervals over seeds {summary['seeds'][0]}-"
                   f"{summary['seeds'][-1]}")
    if summary.get("sensitivity_perturbations"):
        names = ", ".join(str(p.get("name")) for p in summary["sensitivity_perturbations"])
        how.append(f"ranges over the run repriced as profiled and under {names}")
    return ["<h2>Uncertainty</h2>", f"<p>{html.escape('; '.join(how))}.</p>",
            _table_html(table)]


def build_report(out_dir: Path) -> str:
    """The HTML of a sweep folder (results.parquet) or a run folder (summary.json)."""
    from ragsim.outputs import check_result_set

    if (out_dir / RESULTS_FILE).exists():
        return sweep_report(out_dir)
    check_result_set(out_dir)  # records left without their summary by a cut write say so
    if (out_dir / "summary.json").exists():
        return run_report(out_dir)
    raise RagsimInputError(f"neither a sweep folder ({RESULTS_FILE}) nor a run folder "
                           "(summary.json)", file=str(out_dir))


def _page(title: str, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body>\n{body}\n</body></html>\n")
