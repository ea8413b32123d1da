"""What every command shares: the two consoles, the bad-input handler, progress bars, JSON
output and the writing of results.

Kept free of heavy imports (no numpy, pandas, torch): ``ragsim --help`` imports this module.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from ragsim.api.options import (  # noqa: F401 (re-exported: the commands import them from here)
    command_line_labels,
    cosine_distance,
    generator_settings,
)
from ragsim.errors import RagsimInputError
from ragsim.extras import (  # noqa: F401 (re-exported: the commands import them from here)
    EXTRA_MODULES,
    missing_extra,
    require_extra,
)
from ragsim.outputs import (  # noqa: F401 (re-exported: the commands import them from here)
    check_out_dir,
    check_out_file,
    claim_output_dir,
)
from ragsim.stopping import (  # noqa: F401 (re-exported: the commands import them from here)
    StopSignals,
    Terminated,
    sigterm_like_ctrl_c,
)

out = Console()
err = Console(stderr=True)
# built-in traces, corpora and question sets, for help texts (ragsim.traces.BUILTIN_TRACES and
# ragsim.traces.corpus.sources' BUILTIN_CORPORA / BUILTIN_QUESTIONS; not imported here, to keep
# start-up light: a test checks they agree)
TRACE_NAMES = "mmlu, nq, wiki-trivia, wiki-trivia-topics, ragpulse"
CORPUS_NAMES = "wiki-offline"
QUESTION_NAMES = "trivia, gsm8k, gpqa"


def _quiet_flags(params) -> list:
    """On/off flags take no value, so help shows no ``<bool>`` after them (typer labels every
    option with its type; for a flag the label reads as if it wanted one)."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


def _no_empty_paths(params) -> list:
    """A path given as ``""`` is refused: Python reads it as ``.``, so ``--out ""`` would write
    into the current folder, and ``--config ""`` would read a folder."""

    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if getattr(descriptor, "annotation", None) is not Path \
                or getattr(param, "_empty_refused", False):
            continue
        process = param.process_value

        def refusing(ctx, value, process=process, param=param):
            if isinstance(value, str) and value.strip() == "":
                raise typer.BadParameter("an empty path names no file or folder", ctx=ctx,
                                         param=param)
            return process(ctx, value)

        param.process_value = refusing
        param._empty_refused = True
    return params


class Command(TyperCommand):
    """Every ragsim command: flags without a type label in help, and defaults shown for options
    whose parameter default is None (see :meth:`help_defaults`)."""

    def get_params(self, ctx):
        return _no_empty_paths(_quiet_flags(super().get_params(ctx)))

    def help_defaults(self) -> dict[str, str]:
        """Option name -> the default help shows for it. Options default to None where a value
        is worked out later (a --config file, a preset, a generator's constant), so typer has
        nothing to show; a command says here what None becomes. Called only for --help, so the
        modules that know can be imported here without slowing every start."""
        return {}

    def format_help(self, ctx, formatter) -> None:
        shown = self.help_defaults()
        for param in self.params:
            if param.name in shown and param.help is not None:
                plain = getattr(param, "_help_without_default", param.help)
                param._help_without_default = plain
                param.help = f"{plain} \\[default: {shown[param.name]}]"
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """Every ragsim command group (``ragsim``, ``ragsim trace``, ``ragsim profiles``)."""

    def get_params(self, ctx):
        return _quiet_flags(super().get_params(ctx))

    def invoke(self, ctx):
        # errors raised below (the API's checks included) name options as flags: --host-mem
        with command_line_labels():
            return super().invoke(ctx)


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
        except Terminated:  # SIGTERM outside the part of a job that keeps results
            err.print("terminated (SIGTERM) before anything was kept", highlight=False)
            raise typer.Exit(128 + int(signal.SIGTERM)) from None

    return wrapper


def name_table(name_header: str, names: list[str], *headers: str, **table_args) -> Table:
    """A table whose first column holds names a user types back (profiles, models, systems): it
    is as wide as the longest name and never cut short (``a100-llama2-7…``); the other columns
    wrap instead (in an 80-column terminal or a pipe), and nothing ends in an ellipsis."""
    table = Table(**table_args)
    table.add_column(name_header, no_wrap=True, overflow="fold",
                     min_width=max((len(n) for n in names), default=0))
    for header in headers:
        table.add_column(header, overflow="fold")  # wrapped, even inside a word, never cut
    return table


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
    jobs (profiling, trace building) report through. Where stderr is no terminal (a log, CI, a
    pipe) the bars draw nothing, so each phase is one line there as it starts: a job of minutes
    is never silent."""
    progress = make_bar()
    tasks: dict[str, int] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
            if not err.is_terminal:
                err.print(f"{phase}: {total:,} steps", markup=False, highlight=False)
        progress.update(tasks[phase], completed=done)

    return progress, report


def print_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_warnings(summary: dict) -> None:
    """A run's or replay's warnings on stderr, with --json too (its object holds them)."""
    for line in summary.get("warnings", ()):
        err.print(f"[yellow]warning:[/] {line}", highlight=False)


def write_results(out_dir: Path, records, summary: dict, config_toml: str | None = None
                  ) -> RagsimInputError | None:
    """Per-request records (Parquet), the summary (JSON) and the configuration (TOML) of a run
    or replay, as one set (:func:`ragsim.outputs.write_run_result`). A full disk (or any write
    that fails) leaves none of the set's files and is returned as the one line to end with:
    the caller prints the summary first, so a finished run's figures are not lost with its
    files."""
    from ragsim.outputs import write_run_result

    try:
        write_run_result(out_dir, records, summary, config_toml)
    except OSError as exc:
        return RagsimInputError(f"the results could not be written ({exc.strerror or exc}): "
                                "the summary printed above is all that is kept of this run; "
                                "the folder holds none of its files", file=str(out_dir),
                                field="--out")
    return None


def exit_interrupted(what_ended: str, out_dir: Path | None,
                     signals: StopSignals | None = None) -> None:
    """After Ctrl-C or SIGTERM: say what the kept results cover, then exit with the shell's code
    for the signal (130, 143)."""
    kept = f"; their records are in {out_dir}" if out_dir is not None else ""
    how = "terminated (SIGTERM)" if signals is not None and signals.terminated else "interrupted"
    err.print(f"{how} {what_ended}{kept}", highlight=False, soft_wrap=True)
    raise typer.Exit(signals.exit_code if signals is not None else 130)


def ms(value: float | None) -> str:
    """Seconds shown as milliseconds; ``-`` when there is no value (nothing completed)."""
    return "-" if value is None else f"{value * 1e3:,.1f} ms"


