"""Traces: format v1, readers/writers, generators and statistics."""

from __future__ import annotations

from pathlib import Path

from ragsim.errors import TraceError
from ragsim.traces.io import read_jsonl, read_mooncake, read_trace, write_jsonl, write_trace
from ragsim.traces.schema import TRACE_VERSION, Trace
from ragsim.traces.stats import retrieval_skew, trace_stats
from ragsim.traces.synthetic import BUILTIN_SPECS, builtin_trace


def resolve_trace(name_or_path: str, *, seed: int = 0, n_requests: int | None = None) -> Trace:
    """A built-in name (``mmlu``, ``nq``) or a path to a trace directory / JSONL file."""
    if name_or_path in BUILTIN_SPECS and not Path(name_or_path).exists():
        return builtin_trace(name_or_path, seed=seed, n_requests=n_requests)
    if not Path(name_or_path).exists():
        raise TraceError(f"no such trace; built-in traces are {sorted(BUILTIN_SPECS)}",
                         file=name_or_path)
    trace = read_trace(name_or_path)
    return trace.head(n_requests) if n_requests is not None else trace


__all__ = ["TRACE_VERSION", "Trace", "builtin_trace", "read_jsonl", "read_mooncake",
           "read_trace", "resolve_trace", "retrieval_skew", "trace_stats", "write_jsonl",
           "write_trace"]
