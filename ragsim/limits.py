"""The bounds of what a run can simulate: values past them are refused before the run.

Each guards against a run that would never end or never start: a search, recovery or retry
timeout longer than a month is a unit mistake (milliseconds written as seconds, or 1e300), and
every background tick (host replicas, GPU failures) through it costs wall time; replica ticks
more often than a millisecond, or a GPU that fails again before it recovers, leave nothing but
ticks; and a run or replay larger than the machine's memory fails with a MemoryError after
minutes instead of a line. A run that gets past these and still makes no progress is stopped by
the pipeline's watchdog (``NO_PROGRESS_WALL_S``), which says why.
"""

from __future__ import annotations

import os

MAX_DURATION_S = 30 * 86400.0  # one search, stage, GPU recovery, retry timeout or window
MIN_REPLICATE_EVERY_S = 1e-3
MAX_GPU_FAILURE_RATE_PER_H = 3600.0  # once a second on average
MAX_RETRIES = 1000
MAX_INSTANCES = 1024  # answer-cache service instances, each with its own L1
# any whole-number setting: at most the largest memory ragsim models (1 EiB, 2**60), 8x
# below the C integers (64-bit) the compiled core computes in, so that no setting overflows
# one with a traceback (tokens and counts: far past any real run)
MAX_INTEGER = 2**60
# documents of a request's path the tree may cache: past any request's length it is the same
# as no limit, and the compiled tree holds it in a C integer
MAX_CACHED_DEPTH = 2**31 - 1
# a request's search refines its list this many times at most: each stage is a drawn list
# per request, kept for the run (4 by default; RAGCache's figures use up to 8)
MAX_SEARCH_STAGES = 1024
# measured (issue of the reliability probe): a run keeps ~1.1 KB a request, a replay ~0.36 KB;
# the bound below allows for the trace and the records being built beside them
RUN_BYTES_PER_REQUEST = 2_000
REPLAY_BYTES_PER_REQUEST = 800
# a generated synthetic trace peaks at ~200 bytes a request (2 million mmlu requests)
TRACE_BYTES_PER_REQUEST = 400
# wall time during which only the background process woke (GPU failures, replica ticks) and no
# request arrived or ended: past it the run is making no progress. Wall time, not a count of
# ticks: a month-long search ticked through every 10 s takes a few seconds and ends; the same at
# every millisecond would take hours
NO_PROGRESS_WALL_S = 60.0


def physical_memory_bytes() -> int | None:
    """This machine's memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_problem(n_requests: int | None, bytes_per_request: int) -> str | None:
    """Why ``n_requests`` cannot fit in this machine's memory, or None."""
    memory = physical_memory_bytes()
    if n_requests is None or memory is None or n_requests * bytes_per_request <= memory:
        return None
    need_gib = n_requests * bytes_per_request / 2**30
    return (f"{n_requests:,} requests need about {need_gib:,.0f} GiB (~{bytes_per_request:,} "
            f"bytes a request), more than this machine's {memory / 2**30:,.0f} GiB")
