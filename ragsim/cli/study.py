"""``ragsim sweep``, ``ragsim plot``, ``ragsim report`` and ``ragsim plan``: studies of many
runs (ragsim/study does the work; this module reads the options and shows progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ragsim.cli.common import (
    check_out_dir,
    err,
    exit_interrupted,
    friendly_errors,
    make_bar,
    sigterm_like_ctrl_c,
)
from ragsim.errors import RagsimInputError

# past this many points a sweep asks first: a typo in an axis (a list of a thousand values,
# five axes of ten) would otherwise start hours of work, or minutes just checking the points
LARGE_SWEEP_POINTS = 1_000


def _on_a_terminal() -> bool:
    import sys

    return sys.stdin.isatty() and sys.stderr.isatty()


def _ask_for_large(count: int) -> None:
    """A grid of more than LARGE_SWEEP_POINTS points runs only when the user says so: asked on
    a terminal, refused otherwise unless --yes."""
    if count <= LARGE_SWEEP_POINTS:
        return
    if not _on_a_terminal():
        raise RagsimInputError(f"the sweep has {count:,} points (more than "
                               f"{LARGE_SWEEP_POINTS:,}); give --yes to run them all",
                               field="--yes")
    if not typer.confirm(f"The sweep has {count:,} points. Run them all?", err=True):
        err.print("not started", highlight=False)
        raise typer.Exit(1)


@friendly_errors
def sweep(
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for results.parquet, sweep.toml and points/; rerun into it to "
                      "resume.", show_default=False)],
    sweep_file: Annotated[Path | None, typer.Argument(
        help="Sweep file (TOML): \\[base] (any run option, or mode = \"replay\"), \\[axes] "
             "(lists: the full grid), optional \\[\\[points]] and seeds = \\[...]; see "
             "docs/studies.md.",
        show_default=False)] = None,
    executor: Annotated[str, typer.Option(help="local (processes) or ray.")] = "local",
    jobs: Annotated[int | None, typer.Option(
        help="Points at once (local: processes; ray: CPUs of the local cluster started). "
             "\\[default: all cores]", show_default=False)] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray: the cluster's address (default: start a local one).")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="KEY=VALUE for every point (the file's \\[base]; repeatable).")] = None,
    axis: Annotated[list[str] | None, typer.Option(
        help="KEY=V1,V2,... swept (the file's \\[axes]; repeatable).")] = None,
    seeds: Annotated[str | None, typer.Option(
        help="Seeds to repeat every point with, e.g. 0,1,2.")] = None,
    requests_files: Annotated[bool, typer.Option(
        "--records/--no-records", help="Keep each point's per-request records "
                                         "(points/<id>/requests.parquet; TTFT CDFs need them).")
    ] = True,
    yes: Annotated[bool, typer.Option(
        "--yes", help=f"Run a grid of more than {LARGE_SWEEP_POINTS:,} points without asking "
                      "(needed when not on a terminal).")] = False,
) -> None:
    """Run many configurations (a grid of run or replay options over seeds) into one table."""
    from rich.progress import TimeRemainingColumn

    from ragsim.api.study import check_sweep_options
    from ragsim.progress import resetting_advance
    from ragsim.study.executors import default_jobs
    from ragsim.study.results import RESULTS_FILE
    from ragsim.study.spec import load_sweep
    from ragsim.study.sweep import run_sweep

    check_sweep_options(executor, jobs, address)
    check_out_dir(out_dir)
    spec = load_sweep(sweep_file, settings=set_ or [], axes=axis or [], seeds=seeds,
                      approve=None if yes else _ask_for_large)
    jobs = jobs or default_jobs()
    progress = make_bar(TimeRemainingColumn(compact=True, elapsed_when_finished=True))
    task = progress.add_task("sweep", total=len(spec.points))
    where = (f"the Ray cluster at {address}" if address is not None
             else f"{executor}, {jobs} at once")
    err.print(f"{len(spec.points)} point(s) ({spec.mode}) on {where}", highlight=False)
    with sigterm_like_ctrl_c() as signals:
        try:
            with progress:
                outcome = run_sweep(spec, out_dir, executor=executor, jobs=jobs,
                                    address=address, keep_requests=requests_files,
                                    on_progress=resetting_advance(progress, task))
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
        err.print(f"[red]failed:[/] point {point_id}: {escape(why)}", highlight=False)
    left = outcome.total - outcome.skipped - outcome.finished - len(outcome.failed)
    if left:
        err.print(f"{left} point(s) not run; run the same command to resume", highlight=False)
    if outcome.failed or left:
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
    log_x: Annotated[bool, typer.Option("--log-x", help="Logarithmic x axis.")] = False,
    log_y: Annotated[bool, typer.Option("--log-y", help="Logarithmic y axis.")] = False,
) -> None:
    """Draw a sweep's results: mean over seeds with a 95% confidence band, per curve."""
    from ragsim.cli.common import check_out_file
    from ragsim.figures import check_plot_path, save_figure
    from ragsim.study.plot import plot_figure

    check_plot_path(out_file, field="--out")
    check_out_file(out_file)
    table = _read_table(sweep_dir)
    fig = plot_figure(sweep_dir, table, x=x, y=y, by=by, preset=preset, where=where,
                      log_x=log_x, log_y=log_y)
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
    page = build_report(folder)
    try:
        write_text_atomically(out_file, page)
    except OSError as exc:  # a full disk: the page is lost, an earlier one is not
        raise RagsimInputError(f"the report could not be written ({exc.strerror or exc}); "
                               "nothing was written there (an earlier file is as it was)",
                               file=str(out_file), field="--out") from None
    err.print(f"wrote {out_file}", highlight=False)


@friendly_errors
def plan(
    trace: Annotated[str, typer.Option(help="Built-in name or trace path.")] = "mmlu",
    rate: Annotated[float, typer.Option(help="Request rate to serve, requests/s.")] = 1.0,
    slo: Annotated[str, typer.Option(
        help="Service objective on a summary field: METRIC<=VALUE, e.g. ttft_p90_s<=0.5.")
    ] = "ttft_p90_s<=0.5",
    model: Annotated[str, typer.Option(help="Model: the shipped profiles of it are the GPU "
                                            "types searched.")] = "mistral-7b",
    system: Annotated[str, typer.Option(help="System preset (see `ragsim systems`).")
                      ] = "ragcache",
    host_mem: Annotated[list[str] | None, typer.Option(
        help="Host memory per replica to try (repeatable). \\[default: 0, 32GiB, 192GiB]",
        show_default=False)] = None,
    replicas: Annotated[list[int] | None, typer.Option(
        help="Replica counts to try (repeatable). \\[default: 1, 2, 4, 8]", show_default=False)
    ] = None,
    requests: Annotated[int, typer.Option(
        help="Requests simulated per replica of a candidate.")] = 2000,
    router: Annotated[list[str] | None, typer.Option(
        help="How a fleet's replicas share the traffic, each tried (repeatable): round-robin, "
             "random, session, least-loaded, prefix-affinity, kv-aware. "
             "\\[default: round-robin]", show_default=False)] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per candidate (the SLO metric's mean).")
                     ] = 1,
    prices: Annotated[Path | None, typer.Option(
        help="TOML price table: gpu_usd_per_h = {a10g = 1.0, ...}, host_usd_per_gib_h = N. "
             "\\[default: rounded on-demand cloud prices, see docs/studies.md]",
        show_default=False)] = None,
    jobs: Annotated[int | None, typer.Option(help="Candidates at once. \\[default: all cores]",
                                             show_default=False)] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Keep the candidates' sweep here (results.parquet, plan.json).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace an earlier plan in --out (an interrupted one resumes without "
        "it).")] = False,
    plot_file: Annotated[Path | None, typer.Option(
        "--plot", help="Draw the margin curve (.png, .svg).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Find the cheapest GPU type, GPU count and host memory that meet a TTFT SLO at a rate.

    Searched with the simulator over the model's shipped profiles; see docs/studies.md."""
    from ragsim.api.study import plan as find_plan
    from ragsim.cli.common import print_json
    from ragsim.study.plan import parse_slo

    result = find_plan(trace=trace, rate=rate, slo=slo, model=model, system=system,
                       host_mem=host_mem, replicas=replicas, requests=requests, seeds=seeds,
                       router=router or "round-robin",
                       prices=prices, jobs=jobs, out_dir=out_dir, plot=plot_file,
                       progress=not json_output, force=force)
    if json_output:
        print_json(result)
        return
    _print_plan(result, parse_slo(slo))


def _print_plan(result: dict, goal) -> None:
    from rich.table import Table

    from ragsim.cli.common import out

    best = result["best"]
    if best is None:
        out.print(f"no candidate meets {goal} at {result['rate_rps']:g} req/s; try more "
                  "--replicas or --host-mem", highlight=False)
    else:
        out.print(f"cheapest meeting {goal} at {result['rate_rps']:g} req/s: "
                  f"{best['replicas']} x {best['profile']} ({best['gpus']} GPU(s))"
                  + (f" behind {best['router']}" if best["replicas"] > 1 else "") + ", "
                  f"{best['host_cache_bytes_per_replica'] / 2**30:g} GiB host memory each, "
                  f"${best['cost_usd_per_h']:.2f}/h; {goal.metric} = "
                  f"{best[goal.metric]:.3f} (margin {best['margin']:.0%})", highlight=False)
    table = Table(title="candidates, cheapest first (first 15)")
    routed = len(result["routers"]) > 1  # a router column only when routers were compared
    for header in ("profile", "replicas", *(("router",) if routed else ()), "host GiB", "$/h",
                   goal.metric, "meets"):
        table.add_column(header)
    for c in result["candidates"][:15]:
        table.add_row(c["profile"], str(c["replicas"]),
                      *((c["router"] if c["replicas"] > 1 else "-",) if routed else ()),
                      f"{c['host_cache_bytes_per_replica'] / 2**30:g}",
                      f"{c['cost_usd_per_h']:.2f}", f"{c[goal.metric]:.3f}",
                      "yes" if c["meets_slo"] else "no")
    out.print(table)
    if result["margin_curve"]:
        out.print("margin: " + ", ".join(
            f"{p['rate_rps']:g} req/s -> {p[goal.metric]:.3f}" for p in result["margin_curve"]),
            highlight=False)
