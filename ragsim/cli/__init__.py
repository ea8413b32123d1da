"""The ``ragsim`` command line: one module per command group, registered here.

``ragsim.cli:app`` is the console script. Each command imports its heavy modules (numpy, pandas,
simpy, torch) inside its body, so ``ragsim --help`` and a typo stay fast.
"""

from __future__ import annotations

import typer

from ragsim.cli import answers, policies, profiles, replay, run, study, trace, validate
from ragsim.cli.common import CORPUS_NAMES, QUESTION_NAMES, TRACE_NAMES, Command, Group

__all__ = ["CORPUS_NAMES", "QUESTION_NAMES", "TRACE_NAMES", "app"]

app = typer.Typer(cls=Group, no_args_is_help=True, add_completion=False,
                  help="Simulate KV-cache and scheduling policies for RAG serving.")


def _version(value: bool) -> None:
    if value:
        from ragsim import __version__

        typer.echo(f"ragsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(
        False, "--version", help="Print ragsim's version and exit.", is_eager=True,
        callback=_version)) -> None:
    """Simulate KV-cache and scheduling policies for RAG serving."""


app.add_typer(trace.app, name="trace")
app.add_typer(profiles.app, name="profiles")
app.add_typer(answers.app, name="answers")
app.command(cls=run.RunCommand)(run.run)
app.command(cls=Command)(run.systems)
app.command(cls=replay.ReplayCommand)(replay.replay)
app.command(cls=Command)(replay.models)
app.command(cls=Command)(policies.policies)
app.command(cls=Command)(profiles.profile)
app.command(cls=validate.ValidateCommand)(validate.validate)
app.command(cls=Command)(study.sweep)
app.command(cls=Command)(study.plot)
app.command(cls=Command)(study.report)
app.command(cls=Command)(study.plan)
