"""The ``ragsim`` command line: one module per command group, registered here.

``ragsim.cli:app`` is the console script. Each command imports its heavy modules (numpy, pandas,
simpy, torch) inside its body, so ``ragsim --help`` and a typo stay fast.
"""

from __future__ import annotations

import typer

from ragsim.cli import profiles, replay, run, trace
from ragsim.cli.common import CORPUS_NAMES, QUESTION_NAMES, TRACE_NAMES

__all__ = ["CORPUS_NAMES", "QUESTION_NAMES", "TRACE_NAMES", "app"]

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Simulate KV-cache and scheduling policies for RAG serving.")
app.add_typer(trace.app, name="trace")
app.add_typer(profiles.app, name="profiles")
app.command()(run.run)
app.command()(run.systems)
app.command()(replay.replay)
app.command()(replay.models)
app.command()(profiles.profile)
