"""``ragsim sweep``, ``ragsim plot``, ``ragsim report`` and ``ragsim plan``: studies of many
runs (ragsim/study does the work; this module reads the options and shows progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ragsim.cli.common import (
    check_out_dir,
    err,
    exit_interrupted,
    friendly_errors,
    make_bar,
    sigterm_like_ctrl_c,
)
from ragsim.errors import RagsimInputError


@friendly_errors
def sweep(
    sweep_file: Annotated[Path, typer.Argument(
        help="Sweep file (TOML): [base] (any run option, or mode = \"replay\"), [axes] "
             "(lists: the full grid), optional [[points]] and seeds = [...]; see docs/studies.md.",
        show_default=False)],
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for results.parquet, sweep.toml and points/; rerun into it to "
                      "resume.", show_default=False)],
    executor: Annotated[str, typer.Option(help="local (processes) or ray.")] = "local",
    jobs: Annotated[int | None, typer.Option(
        help="Points at once (local: processes; ray: CPUs of the local cluster started). "
             "[default: all cores]", show_default=False)] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray: the cluster's address (default: start a local one).")] = None,
    requests_files: Annotated[bool, typer.Option(
        "--requests/--no-requests", help="Keep each point's per-request records "
                                         "(points/<id>/requests.parquet; TTFT CDFs need them).")
    ] = True,
) -> None:
    """Run many configurations (a grid of run or replay options over seeds) into one table."""
    from rich.progress import TimeRemainingColumn

    from ragsim.study.executors import EXECUTORS, default_jobs
    from ragsim.study.results import RESULTS_FILE
    from ragsim.study.spec import load_sweep
    from ragsim.study.sweep import run_sweep

    if executor not in EXECUTORS:
        raise RagsimInputError(f"must be one of {', '.join(EXECUTORS)}, got {executor!r}",
                               field="--executor")
    if jobs is not None and jobs < 1:
        raise RagsimInputError(f"must be >= 1, got {jobs}", field="--jobs")
    if address is not None and executor != "ray":
        raise RagsimInputError("applies only to --executor ray", field="--address")
    check_out_dir(out_dir)
    spec = load_sweep(sweep_file)
    jobs = jobs or default_jobs()
    progress = make_bar(TimeRemainingColumn(compact=True, elapsed_when_finished=True))
    task = progress.add_task("sweep", total=len(spec.points))
    err.print(f"{len(spec.points)} point(s) ({spec.mode}) on {executor}, {jobs} at once",
              highlight=False)
    with sigterm_like_ctrl_c() as signals:
        try:
            with progress:
                outcome = run_sweep(spec, out_dir, executor=executor, jobs=jobs,
                                    address=address, keep_requests=requests_files,
                                    on_progress=lambda done, total: progress.update(
                                        task, completed=done))
        except KeyboardInterrupt:
            signals.disarm()
            from ragsim.study.results import read_results

            done = len(read_results(out_dir))
            exit_interrupted(f"with {done:,} of {len(spec.points):,} points finished (in "
                             f"{out_dir / RESULTS_FILE}); run the same command to resume",
                             None, signals)
    err.print(f"{outcome.finished} point(s) run, {outcome.skipped} already done"
              + (f", {len(outcome.failed)} failed" if outcome.failed else "")
              + f": {out_dir / RESULTS_FILE}", highlight=False)
    for point_id, why in outcome.failed:
        err.print(f"[red]failed:[/] point {point_id}: {why}", highlight=False)
    if outcome.failed:
        raise typer.Exit(1)


@friendly_errors
def plot(
    sweep_dir: Annotated[Path, typer.Argument(help="A sweep's --out folder.",
                                              show_default=False)],
    out_file: Annotated[Path, typer.Option(
        "--out", help="Figure file: .png, .svg or .pdf.", show_default=False)],
    x: Annotated[str | None, typer.Option(help="Column on the x axis (e.g. host_cache_bytes).")
                 ] = None,
    y: Annotated[str | None, typer.Option(help="Column on the y axis (e.g. ttft_p90_s).")
                 ] = None,
    by: Annotated[str | None, typer.Option(help="One curve per value of this column.")] = None,
    preset: Annotated[str | None, typer.Option(
        help="A paper figure: hit-rate-vs-host-memory, ttft-vs-rate, ttft-vs-top-k, "
             "reorder-ablation, speculation-ablation, ttft-cdf (--x/--y/--by override).")
    ] = None,
    where: Annotated[list[str] | None, typer.Option(
        help="Keep rows with COLUMN=VALUE (repeatable).")] = None,
) -> None:
    """Draw a sweep's results: mean over seeds with a 95% confidence band, per curve."""
    from ragsim.cli.common import check_out_file
    from ragsim.figures import check_plot_path, save_figure
    from ragsim.study.plot import plot_figure

    check_plot_path(out_file, field="--out")
    check_out_file(out_file)
    table = _read_table(sweep_dir)
    fig = plot_figure(sweep_dir, table, x=x, y=y, by=by, preset=preset, where=where)
    save_figure(fig, out_file)
    err.print(f"wrote {out_file}", highlight=False)


def _read_table(sweep_dir: Path):
    from ragsim.study.results import RESULTS_FILE, read_results

    if not (sweep_dir / RESULTS_FILE).exists():
        raise RagsimInputError(f"no {RESULTS_FILE} here (is it a `ragsim sweep --out` folder?)",
                               file=str(sweep_dir))
    return read_results(sweep_dir)


@friendly_errors
def report(
    folder: Annotated[Path, typer.Argument(
        help="A sweep's --out folder (or one run's --out folder).", show_default=False)],
    out_file: Annotated[Path, typer.Option(
        "--out", help="HTML file: one page, figures embedded, opens offline.",
        show_default=False)],
) -> None:
    """Write one self-contained HTML page of a sweep or run: figures, tables, configuration."""
    from ragsim.atomic import write_text_atomically
    from ragsim.cli.common import check_out_file
    from ragsim.study.report import build_report

    if out_file.suffix.lower() not in (".html", ".htm"):
        raise RagsimInputError(f"must end in .html, got {out_file.name!r}", field="--out")
    check_out_file(out_file)
    write_text_atomically(out_file, build_report(folder))
    err.print(f"wrote {out_file}", highlight=False)
