"""Real vector search in a real run: the trace's own staged faiss search, on a worker pool.

A trace built from a corpus (``ragsim trace build``) records the staged search it ran: the index
(kind, lists, probes, stages, seed), the embedder and the text of every document and question.
For such a trace the real run rebuilds that index from the same embeddings and, for every
request, runs the search stage by stage on a thread pool of ``search_workers`` workers, as a
serving system's search tier would: the request's intermediate top-k comes from the real stage
(so speculative pipelining acts on real lists), its time is the real search's on this machine,
and the search competes with the engine for the same cores. faiss releases the GIL while it
searches, so workers run beside the engine's forward passes.

The index is built with the trace's parameters and seed, so its lists are the recorded ones:
``final_lists_differing`` counts requests whose real final top-k is not the trace's (the engine
serves the trace's, so that decisions stay comparable with the simulator's). Embedding is not
part of the search (the trace's stage times do not include it either): documents and queries are
embedded before the clock starts, from the embedding cache ``trace build`` filled when it can.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.realrun.cores import EngineCore, off_engine_core
from ragsim.realrun.page_faults import PageFaults
from ragsim.serving.gc_pause import cyclic_gc_paused
from ragsim.traces.schema import Trace


@dataclass
class SearchReport:
    """What the real search did (in the run's summary as ``search``)."""

    mode: str = "modelled"  # "faiss": real staged search; else the stage times were waited
    why_not_real: str | None = None
    index: dict | None = None
    workers: int = 0
    stages_run: int = 0
    stage_seconds_total: float = 0.0
    final_lists_differing: int = 0
    intermediate_lists_differing: int = 0  # stages whose real list is not the recorded one
    setup_s: float = 0.0  # embedding and index building, before the clock started
    begun_at_arrival: int = 0  # searches the front end began at their request's arrival
    searches_run: int = 0  # searches whose every stage ran
    # the search threads' CPU time outside faiss (the worker's, less its stages' own, and the
    # front end's): Python that holds the process's interpreter, which an engine in the same
    # process waits for (``serving.engine_loop``: ``engine_loop_search_s``)
    interpreter_s_total: float = 0.0
    _stage_s: list[float] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        if self._stage_s:
            out["stage_mean_s"] = float(np.mean(self._stage_s))
            out["stage_p90_s"] = float(np.percentile(self._stage_s, 90))
        if self.searches_run:
            out["interpreter_mean_s"] = self.interpreter_s_total / self.searches_run
        return out


def _why_not(trace: Trace) -> str | None:
    info = trace.info or {}
    if trace.document_text is None or trace.query_text is None:
        return "the trace carries no document or question text (built with --redact-text)"
    if trace.stages is None or not isinstance(info.get("index"), dict):
        return "the trace records no staged search (not built with ragsim trace build)"
    if info.get("embedder") is None or info.get("seed") is None:
        return "the trace does not record its embedder and seed"
    return None


class RealSearch:
    """The trace's staged search, run for real on ``workers`` threads."""

    def __init__(self, trace: Trace, workers: int, *, cache_dir: Path | None = None) -> None:
        import faiss

        from ragsim.traces.corpus.embedding import DEFAULT_EMBEDDER, Embedder, default_cache_dir
        from ragsim.traces.corpus.search import IndexSpec, StagedIndex

        why = _why_not(trace)
        if why is not None:
            raise RagsimInputError(f"no real search: {why}", field="--search-latency")
        started = time.perf_counter()
        info = trace.info
        embedder = Embedder(DEFAULT_EMBEDDER, cache_dir=cache_dir or default_cache_dir())
        if embedder.model_name != info["embedder"]:
            raise RagsimInputError(f"the trace was embedded with {info['embedder']}, not the "
                                   f"built-in {embedder.model_name}", field="--search-latency")
        # documents are the index's rows in id order (``trace build`` numbers them so)
        order = np.argsort(trace.document_ids)
        if not np.array_equal(trace.document_ids[order], np.arange(len(order))):
            raise RagsimInputError("the trace's document ids are not its index's rows",
                                   field="--search-latency")
        texts = trace.document_text.to_pylist()
        doc_vectors = embedder.embed([texts[i] for i in order])
        questions = trace.query_text.to_pylist()
        unique, self._query_of = np.unique(np.array(questions, dtype=object),
                                           return_inverse=True)
        self._query_vectors = embedder.embed(list(unique))
        known = {f.name for f in fields(IndexSpec)}
        spec = IndexSpec(**{k: v for k, v in info["index"].items() if k in known})
        self.index = StagedIndex(doc_vectors, spec, seed=int(info["seed"]))
        self.top_k = int(info.get("top_k") or max(len(trace.docs_of(0)), 1))
        # each request's recorded lists, stage by stage (None: not recorded), as Python
        # lists before the clock starts: read per stage from Arrow they were interpreter
        # time on the search threads, which an engine in this process waits for
        self._recorded: list[list[list[int]] | None] = trace.stages.to_pylist()
        # one worker, one core, as trace build measured: set in each worker thread, since
        # OpenMP's thread count is the calling thread's and faiss shares torch's runtime (set
        # on the pipeline's thread it put the engine on one thread: vLLM's CPU engine served
        # every validation ~1.6x slower than its profile, measured at rest)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers),
                                       thread_name_prefix="search",
                                       initializer=_search_worker_begins, initargs=(faiss,))
        self._open: dict[int, Any] = {}  # request -> its search, between stages
        self._lists: dict[tuple[int, int], list[int]] = {}  # (request, stage) -> its list
        # request -> each stage's end, kept for the run: whoever comes second (the front end
        # or the pipeline) finds the search begun, however late
        self._stage_ends: dict[int, list[Future]] = {}
        self._lock = threading.Lock()  # the front end and the pipeline both begin searches
        # request -> when its search was begun (handed to the pool), and when it ran: from the
        # instant a worker was free for it to the end of its last stage (``span``)
        self._begun: dict[int, float] = {}
        self._ran: dict[int, tuple[float, float]] = {}
        self._worker = threading.local()  # each worker's last search's end
        self._closing = threading.Event()
        self._warm_workers(max(1, workers))
        self.report = SearchReport(mode="faiss", index=self.index.spec.describe(),
                                   workers=max(1, workers),
                                   setup_s=time.perf_counter() - started)

    def _warm_workers(self, workers: int) -> None:
        """Every worker thread started and through one whole search before any request's: a
        search tier that serves has its threads up and its index read, and a run's first
        search was otherwise the pool's cold start, 0.4-5 ms at rest on two cores where a
        later one took 0.1-0.2 ms, and 6-11 ms as an overload run's burst began beside the
        engine (docs/validation.md, "The torch run's clock"). The simulation's searches are
        warm."""
        started = threading.Barrier(workers)  # each on its own thread: all held until all ran
        query = self._query_vectors[:1]

        def search() -> None:
            try:
                for _ in self.index.stages(query, self.top_k):
                    pass
            except BaseException:
                started.abort()  # the others' wait ends (BrokenBarrierError), not the pool
                raise
            started.wait()

        try:
            for done in [self.pool.submit(search) for _ in range(workers)]:
                done.result()
        except BaseException:
            self.pool.shutdown(wait=True)  # no worker left behind by a pool that never served
            raise

    @classmethod
    def for_trace(cls, trace: Trace, workers: int) -> tuple[RealSearch | None, str | None]:
        """The real search when the trace allows one, else None and why not."""
        why = _why_not(trace)
        if why is not None:
            return None, why
        try:
            return cls(trace, workers), None
        except (RagsimInputError, ImportError) as exc:
            return None, getattr(exc, "message", str(exc))

    def begin(self, i: int, stages: int, *, at_arrival: bool = False) -> list[Future]:
        """Start request ``i``'s ``stages``-stage search (once: a second call finds it
        started): its stages run one after another on one worker, as a search tier runs them
        (and as the simulator times them: each from the end of the one before). Returns each
        stage's end."""
        with self._lock:
            ends = self._stage_ends.get(i)
            if ends is None:
                self.report.begun_at_arrival += at_arrival
                query = self._query_vectors[self._query_of[i]:self._query_of[i] + 1]
                self._open[i] = self.index.stages(query, self.top_k)
                ends = self._stage_ends[i] = [Future() for _ in range(stages)]
                self._begun[i] = time.monotonic()
                self.pool.submit(self._stages_in_turn, i, ends)
            return ends

    def run_stage(self, i: int, stage: int, stages: int) -> Future:
        """The end of stage ``stage`` (1-based) of request ``i``'s ``stages``-stage search,
        begun now unless the front end began it at its arrival. The pipeline looks at a stage
        between the engine's forward passes; had the next stage waited for that look, every
        stage would have lasted an engine iteration (measured at rest on two cores: a 0.05 ms
        search seen as 430 ms at 90% load)."""
        return self.begin(i, stages)[stage - 1]

    def start_at(self, planned: list[tuple[float, int, int]]) -> None:
        """Begin each search at its planned instant, from a thread of its own: ``planned`` is
        (``time.monotonic()`` instant, request, its stages) in time order."""
        threading.Thread(target=self._front_end, args=(planned,), daemon=True,
                         name="search-front-end").start()

    def _front_end(self, planned: list[tuple[float, int, int]]) -> None:
        off_engine_core()  # begun by the engine's thread: not on its core (``cores.py``)
        for at, i, stages in planned:
            if self._closing.wait(max(0.0, at - time.monotonic())):
                return
            cpu = time.thread_time()  # its waking and its hand-over: the interpreter's
            self.begin(i, stages, at_arrival=True)
            self._add_interpreter_s(time.thread_time() - cpu)

    def _add_interpreter_s(self, seconds: float, searches: int = 0) -> None:
        """Interpreter time of the search threads (``SearchReport.interpreter_s_total``), and
        ``searches`` run to their end, counted together under the lock both threads take."""
        with self._lock:
            self.report.interpreter_s_total += max(0.0, seconds)
            self.report.searches_run += searches

    def _stages_in_turn(self, i: int, ends: list[Future]) -> None:
        # it could start once begun and once this worker was free: the wake-up that handed it
        # over is the search's, the time it queued behind others' searches is not
        start = max(self._begun[i], getattr(self._worker, "free_since", -np.inf))
        cpu, in_faiss = time.thread_time(), 0.0
        for stage, end in enumerate(ends, 1):
            try:
                found, seconds = self._stage(i, stage)
            except BaseException as exc:  # the pipeline's poll raises it, at every stage left
                for left in ends[stage - 1:]:
                    left.set_exception(exc)
                self._open.pop(i, None)
                return
            in_faiss += seconds
            if stage == len(ends):  # recorded before the pipeline can see the end
                self._open.pop(i, None)  # its generator is done with
                self._worker.free_since = finished = time.monotonic()
                self._ran[i] = (start, finished)
                # the worker's CPU time on it less faiss's own (which lets the interpreter go)
                self._add_interpreter_s(time.thread_time() - cpu - in_faiss, searches=1)
            end.set_result(found)

    def span(self, i: int) -> tuple[float, float] | None:
        """When request ``i``'s search ran (``time.monotonic()`` instants): from the moment it
        could start (begun, with a worker free for it) to the end of its last stage on the
        worker; None if it has not run to its end.

        A run's pipeline sees a search end only between the engine's steps, and looks at a
        request only then, so the instants it saw are not the search's: with the searches
        begun at arrival (a loaded run), most searches were over before the pipeline looked
        at their request, their time read 0 and the step under way was counted as waiting
        for a search worker (vLLM at rest, 90% load: median 0, 1.7 ms of such wait)."""
        return self._ran.get(i)

    def forget(self, i: int) -> None:
        """Drop request ``i``'s finished search, so that it can be begun again (a probe that
        searches the same rows many times: ``search_cost.py``)."""
        with self._lock:
            ends = self._stage_ends.get(i)
            if ends is not None and not all(end.done() for end in ends):
                raise RuntimeError(f"request {i}'s search is still running")
            self._stage_ends.pop(i, None)
            self._begun.pop(i, None)
            self._ran.pop(i, None)
            for key in [k for k in self._lists if k[0] == i]:
                del self._lists[key]

    def run_all(self, i: int, stages: int) -> Future:
        """The end of request ``i``'s whole search (every stage, one after another)."""
        return self.begin(i, stages)[-1]

    def _stage(self, i: int, stage: int) -> tuple[list[int], float]:
        """Stage ``stage`` of request ``i``'s search, run now: its list and faiss's seconds."""
        ids, seconds = next(self._open[i])
        found = [int(d) for d in ids if d >= 0]
        stages = self._recorded[i] or []
        if stage < len(stages):  # the pipeline reads intermediate stages' lists
            self._lists[i, stage] = found
        report = self.report
        report.stages_run += 1
        report.stage_seconds_total += seconds
        report._stage_s.append(seconds)
        recorded = stages[stage - 1] if stage <= len(stages) else None
        if recorded is not None and found != recorded[: len(found)]:
            if stage == len(stages):
                report.final_lists_differing += 1
            else:
                report.intermediate_lists_differing += 1
        return found, seconds

    def stage_list(self, i: int, stage: int) -> list[int] | None:
        """The list stage ``stage`` of request ``i``'s search found (read once: then dropped)."""
        return self._lists.pop((i, stage), None)

    def close(self) -> None:
        self._closing.set()
        self.pool.shutdown(wait=True, cancel_futures=True)


def _search_worker_begins(faiss) -> None:
    """A search worker's first work: faiss on one OpenMP thread, and off the engine's core
    where a run keeps one apart (``cores.py``)."""
    faiss.omp_set_num_threads(1)
    off_engine_core()


def search_stages(trace: Trace, i: int) -> int:
    """How many stages request ``i``'s recorded search has (at least one): what a probe that
    runs the trace's own searches outside a pipeline hands the pool."""
    return max(1, len(trace.stages[i]) if trace.stages[i].is_valid else 1)


# searches the hand-off probe times (a few seconds on two cores, once per validation)
HANDOFF_PROBE_SEARCHES = 60
HANDOFF_PROBE_GAP_S = 0.002  # between searches: each starts with idle workers, as at idle


def measure_handoff(trace: Trace, workers: int, searches: int = HANDOFF_PROBE_SEARCHES
                    ) -> dict:
    """The search hand-off on this machine: ``searches`` of the trace's own searches, one
    after another, through the path a real run takes (``RealSearch`` on ``workers`` threads,
    seen by the run's clock, ``clock.WakeableClock``), each timed from its hand-over to the
    instant the clock sees its last stage, less the stage times the trace recorded at build.

    The difference is what a real run's search costs past the stages the simulation waits:
    the thread wake-ups each way, the clock's look, and the stages running slower beside other
    threads than in the build's tight loop. Measured on two cores at rest (2026-12-03): a
    median of 0.3-0.6 ms a search, where the real runs' searches took 0.8-1.0 ms (vLLM) and
    1.5-1.8 ms (torch) more than recorded at idle: the rest is the engine's own loop, which
    keeps the thread the clock runs on while a search ends, and is not in this probe.

    Returns the median hand-off (``handoff_s``, at least 0), the medians it comes from, the
    median of the searches as a run records them (``ran_median_s``: begun to the last stage's
    end on the worker, without the clock's look back, which a run counts in the queue) and
    the number of searches; the first request's search warms the index and is not counted."""
    import simpy

    from ragsim.realrun.clock import WakeableClock

    search = RealSearch(trace, workers)
    count = min(searches + 1, trace.n_requests)
    env = WakeableClock()
    seen_s: list[float] = []
    recorded_s: list[float] = []
    ran_s: list[float] = []  # the same searches as a run records them (``RealSearch.span``)

    def searching(env: simpy.Environment):
        for i in range(count):
            stages = search_stages(trace, i)
            started = time.monotonic()
            for stage in range(1, stages + 1):
                yield env.when_done(search.run_stage(i, stage, stages))
            took = time.monotonic() - started
            times = trace.stage_times_s[i].as_py() if trace.stage_times_s is not None else None
            if i > 0:
                seen_s.append(took)
                recorded_s.append(float(sum(times or [])))
                begun, ended = search.span(i)
                ran_s.append(ended - begun)
            yield env.timeout(HANDOFF_PROBE_GAP_S)

    try:
        env.process(searching(env))
        env.run()
    finally:
        search.close()
    differences = np.subtract(seen_s, recorded_s)
    return {"searches": len(seen_s), "workers": search.report.workers,
            "seen_median_s": float(np.median(seen_s)) if seen_s else 0.0,
            "recorded_median_s": float(np.median(recorded_s)) if recorded_s else 0.0,
            "ran_median_s": float(np.median(ran_s)) if ran_s else 0.0,
            "handoff_s": max(0.0, float(np.median(differences))) if seen_s else 0.0}


class RealSearchDriving:
    """A real run's pipeline searching for real (``RealSearch``) where the trace allows it and
    the configuration asks (``search_latency = "trace"``): the pipeline's modelled search
    events become events that fire when a worker finished the stage. Shared by the torch and
    the vLLM drivers (``start_real_search`` sets ``real_search`` and ``search_not_real``), so
    both sides of a validation search the same index on the same pool."""

    real_search: RealSearch | None = None
    search_not_real: str | None = None

    def start_real_search(self) -> None:
        self.real_search = None
        self.search_not_real = "--search-latency fixed: the modelled stage times are waited"
        if not self.retrieval:
            self.search_not_real = "no retrieval behind the trace"
        elif self.config.search_latency == "trace":
            self.real_search, self.search_not_real = RealSearch.for_trace(
                self.trace, self.config.search_workers)

    def start_searches_at_arrivals(self) -> None:
        """Open loop: each request's search begins on the worker pool at its arrival's wall
        time, from a thread of its own, as a serving system's front end hands a question to
        its search tier the moment it comes. Call once the clock has started (``sync``).

        The pipeline handles an arrival between the engine's forward passes; a search begun
        then starts up to an iteration late, and the next iteration starts before it ends, so
        it loses an iteration the simulator's search does not (torch ragcache at rest, 90%
        load: a 0.05 ms search measured 94 ms). Not for sequential arrivals (not known ahead),
        nor behind an answer cache (a hit never searches)."""
        if (self.real_search is None or self.config.arrival == "sequential"
                or self.answers is not None):
            return
        env = self.env
        n_stages = self.search.n_stages
        planned = sorted((env.wall_time(float(at)), i, n_stages(i))
                         for i, at in enumerate(self.arrival_s))
        self.real_search.start_at(planned)

    def stop_real_search(self) -> None:
        if self.real_search is not None:
            self.real_search.close()

    def serve_on_engine_core(self, core: EngineCore):
        """The run itself: the clock started, the searches begun at their arrivals, the
        pipeline run and the searches stopped, with the engine's thread on a core of its own
        meanwhile (``core``: ``realrun/cores.py``); the summary says where (``engine_core``),
        and how many pages the process faulted in meanwhile (``realrun/page_faults.py``:
        ``minor_page_faults_while_serving``, ``major_...``): a run that paid fresh pages
        inside its clock shows it there."""
        # the cyclic garbage collector paused from before the clock starts (the pipeline's
        # own pause begins after the front end has begun searching): a full collection of a
        # validation's heap took 273 ms in the front end's thread at an overload run's start,
        # holding the interpreter while every request waited (docs/validation.md, "The torch
        # run's clock")
        with core, cyclic_gc_paused():
            faults_before = PageFaults.now()
            self.env.sync()  # the clock starts now, not when the engine was built
            self.start_searches_at_arrivals()
            try:
                result = super().run()  # the pipeline's
            finally:
                self.stop_real_search()
            faults = PageFaults.now().since(faults_before)
        result.summary["engine_core"] = core.as_dict()
        result.summary.update(minor_page_faults_while_serving=faults.minor,
                              major_page_faults_while_serving=faults.major)
        return result

    def search_fields(self) -> dict:
        """The summary's ``search``: what the real search did, or why it was modelled."""
        if self.real_search is not None:
            return self.real_search.report.as_dict()
        return {"mode": "modelled", "why_not_real": self.search_not_real}

    def _whole_search(self, i: int):
        if self.real_search is None:
            return super()._whole_search(i)
        return self._when_done(self.real_search.run_all(i, self.search.n_stages(i)))

    def _search_dispatch(self):
        # a real search's hand-over is the run's own (its front end, on the wall clock)
        return super()._search_dispatch() if self.real_search is None else None

    def _search_stage(self, i: int, stage: int):
        if self.real_search is None:
            return super()._search_stage(i, stage)
        return self._when_done(self.real_search.run_stage(i, stage, self.search.n_stages(i)))

    def _stages_known_ahead(self) -> bool:
        return self.real_search is None  # a real search's lists are known when it has them

    def _record_search_span(self, i: int) -> None:
        """The search's own start and end on the run's clock (``RealSearch.span``): the
        pipeline's view of them waits for the engine's step under way, which is the queue's
        time, as in the simulation (a search ending mid-step waits for the step's end there
        too)."""
        span = self.real_search.span(i) if self.real_search is not None else None
        if span is None:
            return
        to_env = self.env.env_time
        self.r_search_start[i] = max(to_env(span[0]), float(self.arrival_s[i]))
        self.r_search_end[i] = max(to_env(span[1]), self.r_search_start[i])

    def _stage_list(self, i: int, stage: int) -> list | None:
        if self.real_search is None:
            return super()._stage_list(i, stage)
        return list(self.real_search.stage_list(i, stage))

    def _when_done(self, future: Future):
        """An event that fires once a search worker finished ``future``: the run's clock
        (``clock.WakeableClock``) is woken by the worker, so a stage that ends while the clock
        waits is seen at once, and one that ends during a forward pass or an engine step right
        after it, as an engine loop would see it."""
        return self.env.when_done(future)
