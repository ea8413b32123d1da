"""Building traces from real corpora and questions (the ``ragsim[corpus]`` extra)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.traces.corpus.builder import BuildOptions, BuildResult, build_trace
from ragsim.traces.corpus.chunking import Chunking
from ragsim.traces.corpus.search import IndexSpec
from ragsim.traces.io import write_trace

REPORT_FILE = "build_report.json"
PASSAGES_FILE = "passages.parquet"


def write_build(result: BuildResult, directory: str | os.PathLike) -> Path:
    """The trace (``requests.parquet``, ``documents.parquet``), the build report and the map from
    each document back to the corpus passages it came from (``passages.parquet``)."""
    out = write_trace(result.trace, directory)
    write_atomically(out / PASSAGES_FILE, lambda tmp: pq.write_table(result.documents, tmp))
    write_text_atomically(out / REPORT_FILE,
                          json.dumps(result.report, indent=1, sort_keys=True) + "\n")
    return out


__all__ = ["PASSAGES_FILE", "REPORT_FILE", "BuildOptions", "BuildResult", "Chunking",
           "IndexSpec", "build_trace", "write_build"]
