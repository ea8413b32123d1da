"""Traces: format v1, readers/writers, generators and statistics."""

from __future__ import annotations

import copy
import functools
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from ragsim.errors import TraceError
from ragsim.traces.io import read_jsonl, read_mooncake, read_trace, write_jsonl, write_trace
from ragsim.traces.schema import TRACE_VERSION, Trace
from ragsim.traces.stats import retrieval_skew, trace_stats
from ragsim.traces.synthetic import BUILTIN_SPECS, builtin_trace

# Traces shipped with the package (data/NAME/), their request order and timing fixed (--seed
# does not change them): two recorded by `ragsim trace build` (real retrieval over real text,
# stored as trace folders), and RAGPulse's published files, read by their importer.
RECORDED_TRACES = ("wiki-trivia", "wiki-trivia-topics")
IMPORTED_TRACES = ("ragpulse",)
PACKAGED_TRACES = (*RECORDED_TRACES, *IMPORTED_TRACES)
BUILTIN_TRACES = (*BUILTIN_SPECS, *PACKAGED_TRACES)


def packaged_trace_dir(name: str) -> Path:
    return Path(str(resources.files("ragsim.traces") / "data" / name))


def _looks_like_path(name: str) -> bool:
    """A folder separator or a suffix (``traces/x``, ``x.jsonl``): meant as a path, not a name."""
    path = Path(name)
    return len(path.parts) > 1 or bool(path.suffix)


def resolve_trace(name_or_path: str, *, seed: int = 0, n_requests: int | None = None,
                  **generator_overrides) -> Trace:
    """A built-in name (``mmlu``, ``nq`` synthetic; ``wiki-trivia``, ``wiki-trivia-topics``
    recorded; ``ragpulse`` real traffic) or a path to a trace directory / JSONL file.

    ``generator_overrides`` (``drift_per_1k_requests=0.0``, ``co_retrieval_p=...``: any
    ``SyntheticSpec`` field) change how a synthetic trace is generated; anything else has no
    generator, and giving them for it is an error rather than silently ignored."""
    local = Path(name_or_path).exists()
    if name_or_path in BUILTIN_SPECS and not local:
        return builtin_trace(name_or_path, seed=seed, n_requests=n_requests,
                             **generator_overrides)
    if generator_overrides:
        raise ValueError(f"{', '.join(sorted(generator_overrides))} only apply to the synthetic "
                         f"traces ({', '.join(BUILTIN_SPECS)}), not to {name_or_path!r}")
    if name_or_path in IMPORTED_TRACES and not local:
        kept = _imported(name_or_path)
        trace = replace(kept, info={**copy.deepcopy(kept.info), "builtin": name_or_path})
    elif name_or_path in PACKAGED_TRACES and not local:
        trace = read_trace(packaged_trace_dir(name_or_path))
        trace.info = {**trace.info, "builtin": name_or_path}
    elif not local:
        if _looks_like_path(name_or_path):  # a path: the file is missing, whatever built-ins exist
            raise TraceError("no such file or folder", file=name_or_path)
        raise TraceError(f"no such trace; built-in traces are {', '.join(BUILTIN_TRACES)}, or "
                         "give a trace folder or JSONL file", file=name_or_path)
    else:
        trace = read_trace(name_or_path)
    return trace.head(n_requests) if n_requests is not None else trace


@functools.lru_cache(maxsize=len(IMPORTED_TRACES))
def _imported(name: str) -> Trace:
    """A shipped trace read by its importer (ragpulse: 34,000 JSON lines, ~0.6 s), kept for
    the next run of this process (a sweep runs dozens of points on one trace), its arrays
    read-only so that no run can change what the next one gets."""
    from ragsim.traces.ragpulse import read_ragpulse

    trace = read_ragpulse(packaged_trace_dir(name))
    for value in vars(trace).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    return trace


__all__ = ["BUILTIN_TRACES", "IMPORTED_TRACES", "PACKAGED_TRACES", "RECORDED_TRACES",
           "TRACE_VERSION", "Trace", "builtin_trace", "packaged_trace_dir", "read_jsonl",
           "read_mooncake", "read_trace", "resolve_trace", "retrieval_skew", "trace_stats",
           "write_jsonl", "write_trace"]
