"""Probe runs: real runs of a trace's requests past the ones a validation judges, at two loads,
that measure what the simulation of such a run must charge and a profile cannot hold.

Two probes run on them: vLLM's engine loop (``realrun/vllm/loop.py``: the time between its
steps and each request's intake) and, on either engine, the search tier's share of the serving
process's interpreter (``search_beside_engine``). A serving process whose search workers run
Python beside an in-process engine shares one interpreter with it, and the engine's Python
waits while they hold it (docs/validation.md, "The search tier in the engine's interpreter").
The probe measures it as what a search costs the engine's steps (``realrun/search_cost.py``:
steps timed alone and beside searches, several times the searches' own interpreter time), with
the CPU time the run's search threads spent outside faiss (``RealSearch``:
``interpreter_s_total``) per search beside it, on requests the validation does not serve, so
that no judged run sets a parameter of its own simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from ragsim.profiles.profile import Profile
from ragsim.realrun.search_cost import (
    SEARCH_COST_CONTEXT_TOKENS,
    SEARCH_COST_ROWS,
    charged_search_s,
    measure_search_cost,
)
from ragsim.serving.config import SimConfig
from ragsim.traces.schema import Trace

# requests in each probe run, and the loads (shares of the simulated burst capacity) it runs at:
# two, so that the time a step costs and the time a request costs can be told apart
LOOP_PROBE_REQUESTS = 120
LOOP_PROBE_LOADS = (0.5, 0.9)


def probe_rows(n_trace: int, served: int, wanted: int = LOOP_PROBE_REQUESTS) -> tuple[range, bool]:
    """The rows a probe runs: the ``wanted`` past the ``served`` ones where the trace has them
    (True), else its last ``wanted`` (False: some are the validation's own)."""
    if n_trace >= served + wanted:
        return range(served, served + wanted), True
    return range(max(0, n_trace - wanted), n_trace), False


def probe_configs(config: SimConfig, capacity_rps: float) -> list[tuple[float, SimConfig]]:
    """Each probe run's load and configuration: Poisson arrivals at ``LOOP_PROBE_LOADS`` x
    ``capacity_rps``, every request of the probe's trace."""
    return [(share, config.replace(arrival="poisson", rate_rps=share * capacity_rps,
                                   n_requests=None)) for share in LOOP_PROBE_LOADS]


def interpreter_per_search(summaries: Iterable[dict]) -> tuple[float, int]:
    """``(seconds a search, searches)``: the search threads' interpreter time per search over
    the runs' summaries (0 where none searched a real index)."""
    seconds, searches = 0.0, 0
    for summary in summaries:
        search = summary.get("search") or {}
        seconds += float(search.get("interpreter_s_total", 0.0))
        searches += int(search.get("searches_run", 0))
    return (seconds / searches if searches else 0.0), searches


def search_beside_engine(trace: Trace, config: SimConfig, profile: Profile, *, served: int,
                         capacity_rps: float,
                         run: Callable[[Trace, SimConfig, Profile], object],
                         engine_step: Callable[[], Callable[[], object]] | None = None,
                         threads: int | None = None) -> dict:
    """What a search beside a busy engine costs it in real runs of ``config`` (``run``: one
    real run on a fresh engine, returning its ``RunResult``), on the trace's requests past the
    ``served`` ones, at each of ``LOOP_PROBE_LOADS`` x ``capacity_rps``: the search threads'
    interpreter time per search there (``interpreter_s``) and, given ``engine_step`` (called
    after the runs: one step of the last run's engine, on ``threads``, as vLLM's probe steps
    its run's engine after the run), the engine's steps timed beside the trace's searches
    (``search_cost``: ``realrun/search_cost.py``), which is ``search_s`` where measured (what
    ``EngineLoop.search_s`` charges), else the interpreter time. Also the searches and each
    run's own figure."""
    rows, held_aside = probe_rows(trace.n_requests, served)
    probe = trace.select(np.asarray(rows))
    runs, summaries = [], []
    for share, cfg in probe_configs(config, capacity_rps):
        summary = run(probe, cfg, profile).summary
        summaries.append(summary)
        search = summary.get("search") or {}
        runs.append({"load": share, "rate_rps": cfg.rate_rps,
                     "gpu_busy_fraction": summary.get("gpu_busy_fraction"),
                     "search_interpreter_mean_s": search.get("interpreter_mean_s")})
    interpreter_s, searches = interpreter_per_search(summaries)
    search_cost = None
    if engine_step is not None and config.search_latency == "trace":
        search_cost = measure_search_cost(probe, config.search_workers, engine_step(), threads)
    search_s = charged_search_s(interpreter_s, search_cost)
    return {"search_s": search_s, "searches": searches, "interpreter_s": interpreter_s,
            "search_cost": search_cost, "runs": runs, "requests": len(rows),
            "held_aside": held_aside}


def torch_decode_step(model, seed: int) -> Callable[[], None]:
    """One decode step of the reference engine's ``model`` (a ``TorchModel``, a run's:
    ``SEARCH_COST_ROWS`` rows of ``SEARCH_COST_CONTEXT_TOKENS``, the workload vLLM's probe
    steps too), undone after so that it can be run again: the torch engine's search-cost
    workload, on the engine that served the probe runs (its own rows, apart from any run's)."""
    from ragsim.profiles.torch_model import Row

    rng = np.random.default_rng(seed)
    vocab = model.spec.vocab_size
    state = model.prepare([Row(None, rng.integers(0, vocab, SEARCH_COST_CONTEXT_TOKENS), 0)
                           for _ in range(SEARCH_COST_ROWS)])
    model.forward(state)
    ids = rng.integers(0, vocab, SEARCH_COST_ROWS)

    def step() -> None:
        model.decode(state, ids)
        model.undo_decode(state)
        model.sync()

    return step
