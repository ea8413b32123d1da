"""What every command shares: the two consoles, the bad-input handler, progress bars, JSON
output and the writing of results.

Kept free of heavy imports (no numpy, pandas, torch): ``ragsim --help`` imports this module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.errors import RagsimInputError

out = Console()
err = Console(stderr=True)
# built-in traces, corpora and question sets, for help texts (ragsim.traces.BUILTIN_TRACES and
# ragsim.traces.corpus.sources' BUILTIN_CORPORA / BUILTIN_QUESTIONS; not imported here, to keep
# start-up light: a test checks they agree)
TRACE_NAMES = "mmlu, nq, wiki-trivia, wiki-trivia-topics"
CORPUS_NAMES = "wiki-offline"
QUESTION_NAMES = "trivia, gsm8k, gpqa"


def friendly_errors(fn: Callable) -> Callable:
    """Bad input ends with one clear line (file, row, field) and exit code 2, not a traceback.
    The message is printed as text (an id like ``[/b]`` is not markup) and never wrapped."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RagsimInputError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except ValueError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def make_bar(*extra_columns, enabled: bool = True) -> Progress:
    """The one progress display every long command shows on stderr: what runs, a bar, done of
    total, anything ``extra_columns`` add, elapsed time; gone when the job ends."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    *extra_columns, TimeElapsedColumn(), console=err, transient=True,
                    disable=not enabled)


def counting_progress(total: int, label: str, enabled: bool):
    """A one-bar display and the ``done -> None`` callback that advances it."""
    progress = make_bar(enabled=enabled)
    task = progress.add_task(label, total=total)
    return progress, (lambda done: progress.update(task, completed=done))


def phased_progress():
    """A progress display with one bar per phase, and the ``(phase, done, total)`` callback long
    jobs (profiling, trace building) report through."""
    progress = make_bar()
    tasks: dict[str, int] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done)

    return progress, report


def generator_settings(drift: float | None) -> dict:
    """``resolve_trace``'s generator overrides for a ``--drift`` (none when not given)."""
    return {} if drift is None else {"drift_per_1k_requests": drift}


def print_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def write_results(out_dir: Path, records, summary: dict) -> None:
    """Per-request records (Parquet) and the summary (JSON) of a run or replay."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "requests.parquet",
                     lambda tmp: records.to_parquet(tmp, index=False))
    write_text_atomically(out_dir / "summary.json",
                          json.dumps(summary, indent=2, default=str) + "\n")


def exit_interrupted(what_ended: str, out_dir: Path | None) -> None:
    """After Ctrl-C: say what the kept results cover, then exit 130 (the shell's SIGINT code)."""
    kept = f"; their records are in {out_dir}" if out_dir is not None else ""
    err.print(f"interrupted {what_ended}{kept}", highlight=False)
    raise typer.Exit(130)


def ms(value: float | None) -> str:
    """Seconds shown as milliseconds; ``-`` when there is no value (nothing completed)."""
    return "-" if value is None else f"{value * 1e3:,.1f} ms"
