"""What a user should know about a run's figures before trusting them, as sentences.

A run can finish cleanly and still mislead: a queue that grew for the whole trace makes TTFT a
function of the trace's length, costs read outside the profile's grid are guesses, a trace
without retrieval gets no search, a synthetic trace longer than its corpus was sized for is
a different workload. Each check here turns one such case into a line of the summary's
``warnings`` (printed on stderr by the CLI, kept in ``--json`` and summary.json), with the
numbers that show it.
"""

from __future__ import annotations

import numpy as np

from ragsim.traces.synthetic import SyntheticSpec

# Overload: when the last request arrived, more than this share of the requests that had
# arrived (and at least MIN_BACKLOG of them) were still waiting or running. A system that keeps
# up holds about (arrival rate x latency) requests, a few per thousand of a long trace; one
# that does not holds a share that grows with the trace.
BACKLOG_SHARE = 0.05
MIN_BACKLOG = 20
# Durations shorter than this are lost where float64 times are spaced wider (decode steps of a
# few milliseconds need far better than this)
TIME_RESOLUTION_S = 1e-6


def overload(arrival_s: np.ndarray, finish_s: np.ndarray, completed: int,
             simulated_s: float) -> str | None:
    """Offered load above what the system served: the backlog when the last request arrived
    (or when the run stopped, if it was cut short) is a large share of the arrivals."""
    end_s = min(float(arrival_s.max()), simulated_s) if len(arrival_s) else 0.0
    first_s = float(arrival_s.min()) if len(arrival_s) else 0.0
    arrived = int(np.count_nonzero(arrival_s <= end_s))
    if arrived < MIN_BACKLOG or end_s <= first_s:
        return None
    ended = int(np.count_nonzero(finish_s <= end_s))  # NaN (never ended) compares False
    backlog = arrived - ended
    if backlog < max(MIN_BACKLOG, BACKLOG_SHARE * arrived):
        return None
    offered_rps = (arrived - 1) / (end_s - first_s)
    finished = finish_s[np.isfinite(finish_s)]
    served_rps = completed / (float(finished.max()) - first_s) if len(finished) and \
        finished.max() > first_s else 0.0
    return (f"overloaded: requests arrive at {offered_rps:.3g} req/s but the system completes "
            f"{served_rps:.3g} req/s; {backlog:,} of the {arrived:,} requests that had arrived "
            f"({backlog / arrived:.0%}) were still queued or running when the last one "
            "arrived, so queueing time (and TTFT) grows with the trace's length rather than "
            "settling: lower the rate (--rate) or shorten the trace to measure a steady state")


def extrapolated(count: int, profile: str) -> str | None:
    if not count:
        return None
    return (f"{count:,} cost lookups fell outside the grids of profile {profile} and were "
            "extrapolated: times for those batches and contexts are estimates beyond what was "
            "measured or derived")


def no_retrieval() -> str:
    return ("the trace's documents are prefix blocks with no vector search behind them "
            "(e.g. Mooncake): no search and no speculation were modelled (retrieval = \"off\" "
            "in the run's config); --retrieval on (or a search option) models them")


def synthetic_length(info: dict) -> str | None:
    """A synthetic trace run longer than its corpus was sized for."""
    params = info.get("parameters") or {}
    if info.get("source") != "synthetic" or "n_documents" not in params:
        return None
    sized_for = SyntheticSpec.n_requests
    n, documents = params.get("n_requests", sized_for), params["n_documents"]
    if n <= sized_for:
        return None
    return (f"synthetic {info.get('generator', 'trace')}: {n:,} requests over the generator's "
            f"fixed corpus of {documents:,} documents (sized for {sized_for:,} requests): the "
            "knowledge base does not grow with the traffic, so a longer trace revisits the "
            "same documents more and its hit rates are higher; compare runs of equal length")


def coarse_times(arrival_s: np.ndarray) -> str | None:
    """Arrival times so large that float64 cannot hold the simulation's short durations. A
    request that never arrived (a sequential run stopped before its turn: its time is inf) has
    no time to hold, and is not counted."""
    arrived = arrival_s[np.isfinite(arrival_s)]
    if not len(arrived):
        return None
    latest = float(np.max(np.abs(arrived)))
    step = float(np.spacing(latest))
    if step <= TIME_RESOLUTION_S:
        return None
    return (f"arrival times reach {latest:.3g} s, where consecutive float64 times are "
            f"{step:.3g} s apart: shorter durations (searches, prefills, decode steps) are "
            "rounded away; shift the trace's times to start near 0")


def second_system_prompt(trace_info: dict, system_prompt_tokens: int) -> str | None:
    """A trace whose paths carry their own system prompt (RAGPulse's segments), run with a
    configured one as well: both are counted, the configured one as a further shared root."""
    if not system_prompt_tokens or "system_prompt_doc_id_base" not in trace_info:
        return None
    return (f"the trace's paths begin with their own system-prompt segments, and "
            f"--system-prompt-tokens adds a shared prompt of {system_prompt_tokens:,} tokens "
            "before them: both are counted (leave it at 0 to count the trace's prompt once)")


def over_budget(count: int, max_batched_tokens: int) -> str | None:
    """Prefill-first iterations that computed more than the token budget: one request whose new
    tokens alone exceed it runs alone (the budget cannot split a prompt), so a budget below the
    prompts stops batching rather than capping an iteration's tokens."""
    if not count:
        return None
    return (f"{count:,} prefill(s) computed more new tokens than max_batched_tokens "
            f"({max_batched_tokens:,}) allows: a prompt larger than the budget runs alone in "
            "its iteration (vLLM v0.3 refuses a budget below its longest prompt; the mixed "
            "scheduler splits prompts into chunks instead)")


def run_warnings(*, arrival_s: np.ndarray, finish_s: np.ndarray, completed: int,
                 simulated_s: float, extrapolations: int, profile: str,
                 retrieval_turned_off: bool, trace_info: dict,
                 system_prompt_tokens: int = 0, prefills_over_budget: int = 0,
                 max_batched_tokens: int = 0, repeated_documents: int = 0) -> list[str]:
    found = [
        over_budget(prefills_over_budget, max_batched_tokens),
        repeated(repeated_documents),
        overload(arrival_s, finish_s, completed, simulated_s),
        extrapolated(extrapolations, profile),
        no_retrieval() if retrieval_turned_off else None,
        synthetic_length(trace_info),
        coarse_times(arrival_s),
        second_system_prompt(trace_info, system_prompt_tokens),
    ]
    return [w for w in found if w is not None]


def repeated(count: int) -> str | None:
    """Requests that list a document more than once (real logs do: RAGPulse has 64). The rule
    (docs/traces.md): the prompt holds the document each time it is listed, so the knowledge
    tree holds the second copy as a node of its own below the first (its KV follows the first
    copy's), and every token is counted once per copy, hits and computing alike."""
    if not count:
        return None
    return (f"{count:,} request(s) list a document more than once: each copy is part of the "
            "prompt (a node of its own in the knowledge tree, below the first), as the trace "
            "says; deduplicate the lists first if the service did")


def repeated_documents(doc_offsets: np.ndarray, doc_ids: np.ndarray,
                       top_k: int | None = None) -> int:
    """How many requests (CSR lists, cut to their first ``top_k``) name a document twice."""
    doc_offsets, doc_ids = np.asarray(doc_offsets), np.asarray(doc_ids)
    rows = np.repeat(np.arange(len(doc_offsets) - 1), np.diff(doc_offsets))
    if top_k is not None:
        keep = np.arange(len(doc_ids)) - doc_offsets[rows] < top_k
        rows, doc_ids = rows[keep], doc_ids[keep]
    if len(doc_ids) < 2:
        return 0
    order = np.lexsort((doc_ids, rows))
    same = (rows[order][1:] == rows[order][:-1]) & (doc_ids[order][1:] == doc_ids[order][:-1])
    return len(np.unique(rows[order][1:][same]))


def replay_warnings(*, extrapolations: int, profile: str | None, trace_info: dict,
                    system_prompt_tokens: int = 0, repeated_documents: int = 0) -> list[str]:
    """The checks that apply to a replay (no time, so no overload)."""
    found = [extrapolated(extrapolations, profile or "?"), synthetic_length(trace_info),
             second_system_prompt(trace_info, system_prompt_tokens),
             repeated(repeated_documents)]
    return [w for w in found if w is not None]
