"""The command line prints what it printed before its commands became parsing and printing
over ``ragsim.api``: 37 commands (runs, replays, validations, sweeps, a plan, and their bad
input) against a transcript written by the command line as it was (commit bfd5cba, with the
RAGPulse branch's drift of 0.51 merged; see ``tests/cli_transcript.py``), every byte but
wall-clock numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_transcript import COMMANDS, transcript

EXPECTED = json.loads((Path(__file__).parent / "data" / "cli_transcript.json").read_text())


@pytest.fixture(scope="module")
def now() -> dict:
    return transcript()


def test_the_transcript_covers_every_command():
    assert sorted(EXPECTED) == sorted(name for name, _ in COMMANDS)


@pytest.mark.parametrize("name", [name for name, _ in COMMANDS])
def test_each_command_prints_what_it_printed(now, name):
    assert now[name] == EXPECTED[name]
