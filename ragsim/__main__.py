"""``python -m ragsim``: the same command line as the ``ragsim`` script."""

from ragsim.cli import app

app(prog_name="ragsim")
