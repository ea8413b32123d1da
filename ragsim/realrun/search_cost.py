"""What a search beside a busy engine costs the engine, timed on the engine's own steps.

A real run's search workers and its front end are threads of the engine's process. faiss lets
the interpreter go while it searches, but a search's Python (its hand-over, each stage's
list, its ends) takes the interpreter back several times, and each time the engine's thread,
which gives the interpreter up around each of its kernels and its scheduler's waits, waits to
get it back. So a search costs the engine more than the search's own interpreter time:
measured on the project's 2-core CPU (2026-12-06, vLLM's engine alone on one core, one search
worker on the other, the held-out trace's searches), a search handed over at a decode step's
start made the step 1.0 ms longer (7.5 -> 8.5 ms, medians of 33 blocks) and a prompt step
0.8 ms, where the search's threads spent 0.14 ms of interpreter time. In run W's 90% runs a
decode step with a search under way when it began ran 1.15-1.18x its price, against
1.00-1.03x without.

``engine_time_per_search`` measures it on the run's own arrangement: the engine's steps of a
steady workload (``step``, a decode step of a few rows) in blocks, each block without searches
beside one in which the run's front-end thread hands one search to the worker pool per step
(``RealSearch.start_at``, as a loaded run begins its searches at arrival), the two orders
alternating so that a drifting machine lands on both alike. What a search costs the engine is
the blocks' difference over the searches that ran beside them; validate charges it as
``engine_loop_search_s`` (``serving.engine_loop``), in place of the interpreter time alone,
which it reports beside.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

# the blocks timed: pairs of (steps alone, steps beside one search each), each block this many
# steps; ~11 s for vLLM's 7 ms decode steps on two cores. 96 pairs, not the 24 first used: at 24
# the figure's 95% interval (``cost_interval``) was 0.32-1.10 ms around 0.71 (run AB,
# 2026-12-06), as wide as everything four sittings' figures disagreed on (0.09-1.03 ms); four
# times the pairs halve it
SEARCH_COST_PAIRS = 96
SEARCH_COST_STEPS = 8
# the workload, the same on either engine: decode steps of this many rows, each over a prompt
# of this many tokens (a search cost vLLM's 1-row steps 0.35 ms, 4-row 0.70 ms, 16-row 0.83 ms
# and its prompt steps ~0.8 ms: four rows, a loaded run's usual decode batch, is not an end)
SEARCH_COST_ROWS = 4
SEARCH_COST_CONTEXT_TOKENS = 256


def charged_search_s(interpreter_s: float, search_cost: dict | None) -> float:
    """What the simulation charges a search beside a busy engine (``engine_loop_search_s``):
    the timed cost where the probe ran (``measure_search_cost``), else the search threads'
    interpreter time (a run without real search: 0)."""
    return interpreter_s if search_cost is None else float(search_cost["search_s"])


def cost_per_search(alone_s: Sequence[float], beside_s: Sequence[float],
                    searches: Sequence[int]) -> float:
    """Seconds of engine time a search costs: the blocks beside searches less the blocks
    without, summed over the pairs, over the searches that ran beside them (never below 0:
    noise cannot make a search a refund; 0 where none ran)."""
    ran = int(sum(searches))
    if not ran:
        return 0.0
    return max(0.0, (float(sum(beside_s)) - float(sum(alone_s))) / ran)


def cost_interval(alone_s: Sequence[float], beside_s: Sequence[float],
                  searches: Sequence[int], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval on ``cost_per_search`` from the pairs' spread: the cost is a
    ratio of sums (the blocks' extra time over the searches), so its standard error is the
    ratio estimator's, ``sqrt(sum((d_i - c n_i)^2) P / (P - 1)) / sum(n_i)`` over the P pairs'
    differences ``d_i`` and searches ``n_i``, with Student's t on P - 1 degrees of freedom.
    Why: the probe's figure moved 0.33 to 0.89 ms on one engine between two sittings an hour
    apart (runs Z and AA); its interval says whether such a move is the probe's noise or the
    machine's. Never below zero, as the cost; (0, 0) where no search ran, and (c, c) from one
    pair (no spread to read)."""
    from scipy.stats import t

    differences = np.asarray(beside_s, float) - np.asarray(alone_s, float)
    counts = np.asarray(searches, float)
    ran = float(counts.sum())
    if not ran:
        return 0.0, 0.0
    cost = cost_per_search(alone_s, beside_s, searches)
    pairs = len(differences)
    if pairs < 2:
        return cost, cost
    raw = float(differences.sum()) / ran
    spread = float(np.sum((differences - raw * counts) ** 2)) * pairs / (pairs - 1)
    half = float(t.ppf(0.5 + level / 2, pairs - 1)) * np.sqrt(spread) / ran
    return max(raw - half, 0.0), max(raw + half, 0.0)


def engine_time_per_search(step: Callable[[], object], search, requests: Sequence[tuple[int, int]],
                           *, pairs: int = SEARCH_COST_PAIRS, steps: int = SEARCH_COST_STEPS,
                           renew: Callable[[], object] | None = None) -> dict:
    """Time ``pairs`` pairs of blocks of ``steps`` calls of ``step`` (one engine step each, on
    the calling thread, which should be the engine's core: ``cores.EngineCore``), one block
    alone and one beside searches of ``requests`` (``(row, stages)`` on ``search``, a
    ``RealSearch``; cycled, each search begun afresh), handed over one per step by the
    front-end thread. ``renew``, where given, is called before each pair, untimed: a workload
    that drifts as it runs (vLLM's decode rows grow a token a step: over 96 pairs from 256
    tokens to 1,800) is set back to its shape, so that every pair times the same steps.

    Returns ``search_s`` (``cost_per_search``) with its 95% interval over the pairs
    (``search_s_low``, ``search_s_high``: ``cost_interval``), the searches it comes from, the
    blocks' mean step times, and the searches' own interpreter time per search (what the
    search threads held: ``interpreter_s``) for comparison."""
    if steps < 1 or pairs < 1:
        raise ValueError("the search-cost probe needs at least one pair of one-step blocks")
    rows = list(requests)
    if len(rows) < steps:
        raise ValueError(f"the search-cost probe needs {steps} rows to search (a block's "
                         f"steps), got {len(rows)}")
    step()  # the workload's first step (a new shape, a cold cache) is nobody's
    alone, beside, ran = [], [], []
    rows = [rows[k % len(rows)] for k in range(pairs * steps)]
    step_s = _block(step, steps) / steps
    for pair in range(pairs):
        if renew is not None:
            renew()
        mine = rows[pair * steps:(pair + 1) * steps]
        if pair % 2:
            beside_s, searched = _beside(step, steps, search, mine, step_s)
            alone_s = _block(step, steps)
        else:
            alone_s = _block(step, steps)
            beside_s, searched = _beside(step, steps, search, mine, step_s)
        alone.append(alone_s)
        beside.append(beside_s)
        ran.append(searched)
        step_s = alone_s / steps
    report = search.report
    interpreter = (report.interpreter_s_total / report.searches_run
                   if report.searches_run else 0.0)
    low, high = cost_interval(alone, beside, ran)
    return {"search_s": cost_per_search(alone, beside, ran), "searches": int(sum(ran)),
            "search_s_low": low, "search_s_high": high,  # its 95% interval over the pairs
            "pairs": pairs, "steps": steps,
            "alone_step_s": float(np.sum(alone)) / (pairs * steps),
            "beside_step_s": float(np.sum(beside)) / (pairs * steps),
            "interpreter_s": float(interpreter)}


def _block(step: Callable[[], object], steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - started


def _beside(step: Callable[[], object], steps: int, search, rows: list[tuple[int, int]],
            step_s: float) -> tuple[float, int]:
    """A block with one search handed over per step (at the instants the steps should begin,
    from the last block's step time) by a front-end thread; returns the block's time and how
    many of its searches ran during it (their spans overlap it). Waits for them all to end
    before returning, so that the next block runs alone."""
    for i, _ in rows:
        search.forget(i)
    first = time.monotonic() + 0.2 * step_s
    search.start_at([(first + k * step_s, i, stages) for k, (i, stages) in enumerate(rows)])
    started = time.perf_counter()
    began = time.monotonic()
    for _ in range(steps):
        step()
    took = time.perf_counter() - started
    ended = time.monotonic()
    for i, stages in rows:  # every search to its end (one the block outran begins now)
        search.run_all(i, stages).result()
    spans = [search.span(i) for i, _ in rows]
    overlapping = sum(1 for span in spans if span is not None and span[0] < ended
                      and span[1] > began)
    return took, overlapping


def measure_search_cost(trace, workers: int, step: Callable[[], object], threads: int | None,
                        renew: Callable[[], object] | None = None) -> dict | None:
    """``engine_time_per_search`` on the arrangement of a real run of ``trace``: the calling
    thread (the engine's) on a core of its own where the run keeps one (``EngineCore`` with
    ``threads``), ``workers`` search workers and the front end off it, the trace's own staged
    searches (``renew``: ``engine_time_per_search``'s). None where the trace has no real search
    (nothing for its runs to pay)."""
    from ragsim.realrun.cores import EngineCore
    from ragsim.realrun.search import RealSearch, search_stages

    search, _ = RealSearch.for_trace(trace, workers)
    if search is None:
        return None
    rows = [(i, search_stages(trace, i)) for i in range(trace.n_requests)]
    try:
        with EngineCore(threads) as core:
            measured = engine_time_per_search(step, search, rows, renew=renew)
    finally:
        search.close()
    measured["engine_core"] = core.as_dict()
    return measured
