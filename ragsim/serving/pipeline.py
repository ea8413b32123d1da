"""The whole RAG serving stack as SimPy processes over the policy core.

    arrival ─► vector search (CPU pool, in stages) ─► request pool (FCFS / reordering)
            ─► engine (continuous batching; knowledge tree in GPU + host) ─► answer

One process per request walks the pipeline: it arrives, waits for a search worker, searches
stage by stage (starting and stopping speculative generations as Algorithm 2 says), then hands
its final job to the pool; the engine process (``engine.py``) serves the pool. A fault process
fails the GPU at given times or at a rate. Every request ends exactly once, completed or failed
with a reason; per-request records are kept in flat lists and turned into columns at the end.

The pipeline is driver-neutral: it is given a SimPy environment and the engine's
``Iterations``. The simulator (``ragsim.sim``) gives it a virtual clock and predicted
iteration times; the real harness (``ragsim.realrun``) a wall clock and a real model, so both
make the same decisions by the same code and differ only in what an iteration costs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from ragsim import limits
from ragsim.cache import speculation
from ragsim.cache.policies import make_policy
from ragsim.cache.reorder import RequestPool
from ragsim.cache.tree import KnowledgeTree
from ragsim.profiles.profile import Profile
from ragsim.serving.answer_stage import AnswerStage
from ragsim.serving.clock import exact_timeouts
from ragsim.serving.config import SimConfig
from ragsim.serving.engine import Engine, EngineHooks, Iterations, Job
from ragsim.serving.gc_pause import cyclic_gc_paused
from ragsim.serving.retrieval import StagedSearch
from ragsim.serving.summary import summarize
from ragsim.traces.retime import arrival_times
from ragsim.traces.schema import Trace

Progress = Callable[[int, float], None]  # (requests ended, simulated seconds)

PENDING, COMPLETED, FAILED = 0, 1, 2
FAIL_REASONS = ("", "gpu-failure-retries-exhausted", "exceeds-kv-capacity")


class NoProgress(Exception):
    """Raised by the background process when, for a long stretch of wall time, it alone woke
    and no request arrived or ended (a GPU that fails faster than it can serve, replica ticks
    through an endless search): the run stops and says why instead of ticking for hours."""


@dataclass
class RunResult:
    config: SimConfig
    columns: dict[str, np.ndarray]
    summary: dict

    @property
    def records(self) -> pd.DataFrame:
        return pd.DataFrame(self.columns)


def planned_arrivals(trace: Trace, config: SimConfig) -> np.ndarray:
    """When each request arrives: the trace's timestamps or a re-timed process; for
    ``sequential`` (each request arrives when the previous one ended) they are not known in
    advance and are ``inf`` until they happen."""
    if config.arrival == "trace":
        return trace.arrival_s.astype(float)
    if config.arrival == "sequential":
        return np.full(trace.n_requests, math.inf)
    return arrival_times(trace.n_requests, config.rate_rps, process=config.arrival,
                         cv=config.cv, seed=config.seed)


class Pipeline(EngineHooks):
    """One run of the serving stack: ``env`` is its clock, ``iterations(tree)`` builds what runs
    the engine's iterations (``ragsim.serving.engine.Iterations``); ``record_moves`` has the
    tree record its residency moves for it (a real KV store follows them)."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile, *,
                 env: simpy.Environment, iterations: Callable[[KnowledgeTree], Iterations],
                 record_moves: bool = False, progress: Progress | None = None,
                 answers: Callable[[Trace, SimConfig], AnswerStage] = AnswerStage,
                 requests_of: Pipeline | None = None) -> None:
        asked = config.retrieval
        self.config = config = resolve_retrieval(config, trace)
        self.retrieval = config.retrieval == "on"
        self.retrieval_turned_off = asked == "auto" and not self.retrieval  # said in warnings
        self.trace = trace
        self.profile = profile
        # the profile's grids count extrapolations over their lifetime; this run reports its own
        self.extrapolated_before = profile.extrapolated_queries
        self.progress = progress
        self.env = env
        self._timeout_at = exact_timeouts(env)
        self.n = trace.n_requests
        kv = profile.model.kv_bytes_per_token
        self.kv = kv
        gpu_kv = config.gpu_kv_bytes or profile.kv_capacity_bytes
        policy = make_policy(config.policy)
        self.tree = KnowledgeTree(
            policy, gpu_capacity_bytes=gpu_kv,
            host_capacity_bytes=config.host_cache_bytes if config.cache else 0,
            kv_bytes_per_token=kv,
            prefill_cost_s=profile.prefill.at if policy.needs_cost else None,
            system_prompt_tokens=config.system_prompt_tokens,
            max_cached_depth=config.max_cached_depth if config.cache else 0,
            frequency_scope=config.frequency_scope,
            frequency_window_s=config.frequency_window_s,
            record_moves=record_moves, host_write=config.host_write,
            host_evicts_gpu_copies=config.host_evicts_gpu_copies, reuse=config.reuse)
        self.pool: RequestPool[Job] = RequestPool(
            reorder=config.reorder, window_s=config.reorder_window_s,
            start=config.reorder_window_start,
            scan_limit=config.reorder_scan, order=config.order)
        self.engine = Engine(
            self.env, tree=self.tree, pool=self.pool, hooks=self,
            iterations=iterations(self.tree), kv_bytes_per_token=kv,
            max_batch_size=config.max_batch_size,
            max_prefill_bs=config.max_prefill_bs, max_batched_tokens=config.max_batched_tokens,
            prefix_block_tokens=config.prefix_block_tokens,
            gpu_recovery_s=config.gpu_recovery_s, batch_kv_sharing=config.batch_kv_sharing,
            scheduler=config.scheduler, padded_price_s=padded_price(config, profile))
        self.workers = SearchWorkers(self.env, config.search_workers)
        if requests_of is None:
            self._request_tables(trace, config)
        else:  # a replica of a fleet: the fleet's requests, searches and records, shared
            self._share_requests(requests_of)
        # the answer cache's stage: modelled stores here, the real ones in a real run
        self.answers = answers(trace, config) if config.answer_cache else None
        self._previous_ended: simpy.Event | None = None  # sequential: the one in the system
        self._active_spec: dict[int, Job] = {}  # request -> its live speculative job
        self._next_key = 0
        self.ended = 0
        self.arrived = 0
        self.unseen_failures = 0  # rate failures of an already failed, empty system (counted)
        # set while the background sleeps until the next arrival (nothing else can happen)
        self._arrival_wakeup: simpy.Event | None = None
        self.all_ended = self.env.event()
        self.spec_wasted_tokens = 0
        self.retries = 0

    def _request_tables(self, trace: Trace, config: SimConfig) -> None:
        """What is known and recorded per request: its documents, its search, its arrival
        and its records. A fleet's replicas share one set (``_share_requests``): a request is
        served by one replica and meets the same search whichever it is."""
        n = trace.n_requests
        # the requests' documents, CSR: slicing flat lists is cheaper than n small lists
        self._ids = trace.doc_ids.tolist()
        self._toks = trace.doc_tokens_flat.tolist()
        self._offsets = trace.doc_offsets.tolist()
        self._query = trace.query_tokens.tolist()
        self._tokens_by_id: dict[int, int] | None = None  # for speculative lists, once needed
        self._output = trace.output_tokens.tolist()
        self.search = StagedSearch(trace, self._final_docs, stages=config.search_stages,
                                   search_s=config.search_s,
                                   source=config.stage_source if self.retrieval else "none",
                                   seed=config.seed, converge_p=config.stage_converge_p,
                                   keeps_d1_p=config.stage_keeps_d1_p,
                                   other_found_p=config.stage_other_found_p,
                                   latency=config.search_latency,
                                   time_scale=config.search_time_scale,
                                   handoff_s=config.search_handoff_s)
        self.arrival_s = planned_arrivals(trace, config)
        # per-request records: preallocated columns (numpy), so a 1M-request run stays small
        self.r_search_start = np.full(n, np.nan)
        self.r_search_end = np.full(n, np.nan)
        self.r_prefill_start = np.full(n, np.nan)
        self.r_first_token = np.full(n, np.nan)
        self.r_finish = np.full(n, np.nan)
        self.r_status = np.full(n, PENDING, dtype=np.int8)
        self.r_reason = np.zeros(n, dtype=np.int8)
        self.r_attempts = np.zeros(n, dtype=np.int64)
        self.r_cached = np.zeros(n, dtype=np.int64)
        self.r_hit_gpu = np.zeros(n, dtype=np.int64)
        self.r_hit_host = np.zeros(n, dtype=np.int64)
        self.r_self_hit = np.zeros(n, dtype=np.int64)  # hits its own speculation paid for
        self.r_recomputed = np.zeros(n, dtype=np.int64)
        # position-free reuse (--reuse blend/epic): hits outside the exact prefix, and the
        # tokens of them recomputed (columns and summary fields only when it is on)
        self.r_free_hit = np.zeros(n, dtype=np.int64)
        self.r_blend_recomputed = np.zeros(n, dtype=np.int64)
        self.r_swap_in = np.zeros(n, dtype=np.int64)
        self.r_swap_in_s = np.zeros(n)  # host->GPU copy time its prefill iteration waited for
        self.r_decision_s = np.full(n, np.nan)  # policy core's wall time admitting it
        self.r_spec_started = np.zeros(n, dtype=np.int64)
        self.r_spec_kept = np.zeros(n, dtype=bool)
        self.r_spec_wasted_s = np.zeros(n)
        self.r_generated: dict[int, int] = {}  # tokens generated before a retry (rare)

    # shared by a fleet's replicas (``_request_tables`` makes them)
    _SHARED = ("_ids", "_toks", "_offsets", "_query", "_output", "search", "arrival_s",
               "r_search_start", "r_search_end", "r_prefill_start", "r_first_token",
               "r_finish", "r_status", "r_reason", "r_attempts", "r_cached", "r_hit_gpu",
               "r_hit_host", "r_self_hit", "r_recomputed", "r_free_hit", "r_blend_recomputed",
               "r_swap_in", "r_swap_in_s",
               "r_decision_s", "r_spec_started", "r_spec_kept", "r_spec_wasted_s",
               "r_generated")

    def _share_requests(self, other: Pipeline) -> None:
        for name in self._SHARED:
            setattr(self, name, getattr(other, name))
        self._tokens_by_id = None

    # ------------------------------------------------------------------ helpers
    def _final_docs(self, i: int) -> list:
        lo, hi = self._offsets[i], self._offsets[i + 1]
        k = self.config.top_k
        if k is not None and hi - lo > k:
            hi = lo + k
        return self._ids[lo:hi]

    def _doc_tokens_of(self, i: int, docs: list) -> list:
        lo, hi = self._offsets[i], self._offsets[i + 1]
        final = self._ids[lo:hi]
        if docs == final[:len(docs)]:
            return self._toks[lo:lo + len(docs)]
        tokens = self._tokens_by_id  # a speculative list
        if tokens is None:
            tokens = self._tokens_by_id = self.trace.tokens_by_id
        return [tokens[d] for d in docs]

    def _new_job(self, i: int, docs: list, speculative: bool) -> Job:
        self._next_key += 1
        generated = self.r_generated.get(i, 0)
        return Job(self._next_key, i, docs, self._doc_tokens_of(i, docs),
                   self._query[i] + generated, max(self._output[i] - generated, 1),
                   speculative, generated)

    def _submit(self, job: Job) -> None:
        self.pool.add(job.key, job, self.env.now)
        self.engine.notify()

    def _end(self, i: int, status: int, reason: int = 0) -> None:
        assert self.r_status[i] == PENDING, f"request {i} ended twice"
        self.r_status[i] = status
        self.r_reason[i] = reason
        self.r_finish[i] = self.env.now
        self.engine.forget_request(i)
        self.ended += 1
        if self.progress is not None and (self.ended % 1000 == 0 or self.ended == self.n):
            self.progress(self.ended, self.env.now)
        if self.ended == self.n:
            self.all_ended.succeed()
        if self._previous_ended is not None and not self._previous_ended.triggered:
            self._previous_ended.succeed()

    # ------------------------------------------------------------------ processes
    def _sequential_arrivals(self):
        """Closed loop: each request arrives when the one before it has ended."""
        env = self.env
        for i in range(self.n):
            if self._previous_ended is not None:
                yield self._previous_ended
            self.arrival_s[i] = env.now
            self._previous_ended = env.event()
            self._arrive()

    def _open_arrivals(self, _event: simpy.Event | None = None) -> None:
        """Open loop: the requests arrive at their planned times. A chain of timeouts whose
        callbacks start the requests, rather than a process resumed at every arrival: the
        same events in the same order (each timeout made when the previous arrival is handled,
        with SimPy's ``now + (t - now)``), without a generator resumed per request."""
        if _event is not None:  # a planned arrival's time has come
            self._arrive()
        env = self.env
        times = self._arrival_list
        while self.arrived < self.n:
            t = times[self.arrived]
            if t > env.now:
                env.timeout(t - env.now).callbacks.append(self._open_arrivals)
                return
            self._arrive()  # due now (arrivals at one instant)

    def _first_arrivals(self, _event: simpy.Event) -> None:
        """The open loop's start: nothing has arrived yet, so the first request waits for its
        own planned time like every other (a trace whose clock starts late, at an epoch
        timestamp say, must not have its first request served at t = 0)."""
        self._open_arrivals(None)

    def _arrive(self) -> None:
        """The next request enters the system: its process starts (at once, before the other
        events of this instant), and a background process sleeping until an arrival wakes."""
        self._admit(self.arrived)

    def _admit(self, i: int) -> None:
        """Request ``i`` enters this engine's system (a fleet's router calls it too)."""
        self.arrived += 1
        self.env.process(self._request(i))
        wakeup = self._arrival_wakeup
        if wakeup is not None:
            self._arrival_wakeup = None
            wakeup.succeed()

    # the search's stages: modelled here; a real run's driver runs them on real workers
    def _whole_search(self, i: int) -> simpy.Event:
        """The event of request ``i``'s whole search ending (no speculation: no stage is
        looked at before the end)."""
        return self.env.timeout(self.search.total_s(i))

    def _search_dispatch(self) -> simpy.Event | None:
        """The front end's hand-over of a search to the search tier (``search_dispatch_s``),
        before it takes a worker; None where it costs nothing."""
        seconds = self.config.search_dispatch_s
        return self.env.timeout(seconds) if seconds > 0 else None

    def _search_stage(self, i: int, stage: int) -> simpy.Event:
        """The event of stage ``stage`` (1-based) of request ``i``'s search ending."""
        return self.env.timeout(self.search.stage_duration_s(i, stage))

    def _stage_list(self, i: int, stage: int) -> list | None:
        """The top-k request ``i``'s search holds after ``stage`` (None: not known)."""
        return self.search.stage_list(i, stage)

    def _request(self, i: int):
        env = self.env
        config = self.config
        if self.answers is not None:  # the answer cache first: a hit never reaches retrieval
            answered, lookup_s = self.answers.lookup(i, env.now)
            yield env.timeout(lookup_s)
            if answered:
                self.r_first_token[i] = env.now
                self._end(i, COMPLETED)
                return
        if not self.retrieval:  # no search behind the trace's documents: straight to the pool
            self.r_search_start[i] = self.r_search_end[i] = env.now
            self._submit(self._new_job(i, self._final_docs(i), speculative=False))
            return
        dispatched = self._search_dispatch()
        if dispatched is not None:  # the front end handing it over: no worker held yet
            yield dispatched
        waiting = self.workers.take()
        if waiting is not None:  # every worker busy: wait for one
            yield waiting
        try:
            self.r_search_start[i] = env.now
            stages = self.search.n_stages(i)
            if not config.speculate or stages <= 1:
                yield self._whole_search(i)
            elif self._stages_known_ahead():
                # the model knows every stage's list and end when the search starts: wait only
                # for the stages whose list changes (the others decide nothing), landing on the
                # times stepping through every stage would give
                changes, end_s = self._changing_stages(i, stages)
                current: list | None = None
                for found, at_s in changes:
                    yield self._timeout_at(at_s)
                    current = self._on_stage_list(i, current, found)
                yield self._timeout_at(end_s)
            else:
                current = None
                for stage in range(1, stages):
                    yield self._search_stage(i, stage)
                    found = self._stage_list(i, stage)
                    if found is not None and speculation.list_changed(current, found):
                        current = self._on_stage_list(i, current, found)
                yield self._search_stage(i, stages)
        finally:  # the worker is free again, whatever ended the search
            self.workers.give_back()
        self.r_search_end[i] = env.now
        self._record_search_span(i)
        final = self._final_docs(i)
        active = self._active_spec.pop(i, None)
        d = speculation.on_final_result(None if active is None else active.docs, final)
        if d.keep_speculation:
            self.r_spec_kept[i] = True
            if active.first_token_s >= 0:  # its first token waited for the search
                self.r_first_token[i] = env.now
                self._record_hits(active)
            self.engine.confirm(active)
            return
        if d.terminate_running:
            self._stop_speculation(i, active)
        self._submit(self._new_job(i, final, speculative=False))

    def _record_search_span(self, i: int) -> None:
        """Where a search's start and end are recorded other than when this pipeline saw them
        (a real run's driver: when the search ran on its worker); here they are."""

    def _stages_known_ahead(self) -> bool:
        """Whether the search's stages are modelled (their lists and durations known when the
        search starts); a real run's driver says no when it runs the search for real."""
        return True

    def _changing_stages(self, i: int, stages: int) -> tuple[list[tuple[list, float]], float]:
        """Request ``i``'s intermediate stages whose list changes, as (list, end time), and the
        end of its last stage: each end summed from now stage by stage, as stepping would."""
        t = self.env.now
        duration_s = self.search.stage_duration_s
        list_changed = speculation.list_changed
        changes = []
        current = None
        for stage, found in enumerate(self.search.stage_lists(i), 1):
            t += duration_s(i, stage)
            if found is not None and list_changed(current, found):
                changes.append((found, t))
                current = found
        return changes, t + duration_s(i, stages)

    def _on_stage_list(self, i: int, current: list | None, found: list) -> list:
        """Algorithm 2 at an intermediate stage whose list changed from ``current`` to
        ``found``: stop the speculation on the old list, start one on the new if the pool has
        room. Returns the list now current."""
        active = self._active_spec.get(i)
        d = speculation.on_intermediate_stage(current, found, active is not None,
                                              len(self.pool), self.config.max_prefill_bs)
        if d.terminate_running and active is not None:
            self._stop_speculation(i, active)
        if d.start_new:
            job = self._new_job(i, found, speculative=True)
            self._active_spec[i] = job
            self.r_spec_started[i] += 1
            self._submit(job)
        return found

    def _stop_speculation(self, i: int, job: Job) -> None:
        if self._active_spec.get(i) is job:
            del self._active_spec[i]
        self.engine.terminate(job)

    def _background(self):
        """Everything that happens to the system rather than to a request, for as long as the
        run lasts: GPU failures at the given times (``--fail-gpu-at``) and at a rate
        (``--gpu-failure-rate``, Poisson), and host replicas of the most retrieved upper nodes
        (the GPU->host copies run beside compute; their bytes are reported).

        One process, so that it can tell when it is all that is left: when nothing else is
        scheduled, no request can ever end (the pool, the engine and the searches are all waiting
        on nothing), and it stops instead of ticking forever; ``run`` then reports a stall. (A
        second process for the given failure times kept the queue alive, and injected failures
        after a stall.)

        It never steps through empty time: a trace whose next request comes a day (or 1e308 s)
        later costs nothing. While no request is in the system and the engine waits, the cache
        cannot change, so once a replica tick in that state has copied and evicted nothing,
        every later tick would do the same: the process sleeps until the next arrival and then
        resumes the ticks on their grid (results are those of ticking through). Rate failures
        of an empty system that has already failed in this stretch would change nothing but
        the failure count, unless one falls within a recovery time of the next arrival; as a
        Poisson process has no memory, the failure clock restarts there instead of stepping
        through the stretch; the failures skipped are counted (drawn, Poisson) in
        ``gpu_failures``, not simulated."""
        env = self.env
        config = self.config
        rng = np.random.default_rng([config.seed, 0xFA17])
        given_failures_s = sorted(config.fail_gpu_at_s or ())
        failures = config.gpu_failure_rate_per_h > 0
        mean_failure_gap_s = 3600.0 / config.gpu_failure_rate_per_h if failures else math.inf
        replicas = bool(config.host_replicas and self.tree.host_capacity_bytes)
        every_s = config.replicate_every_s
        next_failure = env.now + float(rng.exponential(mean_failure_gap_s)) if failures \
            else math.inf
        next_replica = env.now + every_s if replicas else math.inf
        settled = False  # the last replica tick found an empty system and changed nothing
        # the watchdog: wake-ups in a row with no request arriving or ending, and when (wall
        # clock, simulated) that stretch began; checked every 10,000 wake-ups (one clock read)
        progress_mark, idle_wakeups, idle_wall_s, idle_since_s = -1, 0, 0.0, 0.0
        failed_empty_at = -1  # arrivals so far when an empty system last failed (this stretch)
        recovery_s = 0.0  # how long that failure kept the GPU down
        while True:
            next_given = given_failures_s[0] if given_failures_s else math.inf
            more, next_arrival = self._upcoming()
            if (failed_empty_at == self.arrived and self.ended == self.arrived and more
                    and next_arrival < math.inf):  # (sequential: the next one comes now)
                restart_s = next_arrival - recovery_s
                if next_failure < restart_s:
                    # counted, not simulated: the one due, and those after it before the restart
                    mean_more = (restart_s - next_failure) / mean_failure_gap_s
                    self.unseen_failures += 1 + (int(rng.poisson(mean_more)) if mean_more < 1e12
                                                 else round(mean_more))
                    next_failure = restart_s + float(rng.exponential(mean_failure_gap_s))
            wake_s = min(next_given, next_failure, math.inf if settled else next_replica)
            if settled and more and wake_s >= next_arrival:
                self._arrival_wakeup = env.event()
                yield self._arrival_wakeup
                settled = False
                next_replica = _tick_at_or_after(next_replica, every_s, env.now)
                continue
            if wake_s == math.inf:
                return  # nothing (more) happens to the system in this run
            yield env.timeout(max(0.0, wake_s - env.now))
            if env.peek() == math.inf:
                # checked before acting: a failure always wakes the engine (an event), so a
                # check after it would never see the queue empty, and a stall would get a
                # failure, or a replica, that did not happen
                return
            if self.arrived + self.ended != progress_mark:
                progress_mark, idle_wakeups = self.arrived + self.ended, 0
            else:
                idle_wakeups += 1
                if idle_wakeups % 10_000 == 0:
                    if idle_wakeups == 10_000:
                        idle_wall_s, idle_since_s = time.perf_counter(), env.now
                    elif time.perf_counter() - idle_wall_s > limits.NO_PROGRESS_WALL_S:
                        raise NoProgress(self._no_progress(idle_wakeups, idle_since_s))
            failed = False
            if env.now >= next_given:
                given_failures_s.pop(0)
                self.engine.fail_gpu()
                failed = True
            if env.now >= next_failure:
                self.engine.fail_gpu()
                next_failure = env.now + float(rng.exponential(mean_failure_gap_s))
                failed = True
            if failed:
                if settled:  # the cache changed: ticks resume where the grid is now
                    settled = False
                    next_replica = _tick_at_or_after(next_replica, every_s, env.now)
                if self.ended == self.arrived:
                    yield env.timeout(0)  # the engine takes the failure: its recovery is known
                    failed_empty_at = self.arrived
                    recovery_s = max(self.engine.down_until_s - env.now, 0.0)
                continue  # the engine handles its failure first; a replica due now follows
            if env.now >= next_replica:
                tree = self.tree
                before = (tree.evictions_host, tree.host_used_bytes)
                copied = tree.replicate_upper_nodes(config.host_replicas)
                next_replica = env.now + every_s
                # the engine waits for work (nothing in its pool, nothing running) and no
                # request is in the system: nothing but an arrival or a failure changes the
                # cache, so a tick that changed nothing will change nothing until then
                settled = (not copied and before == (tree.evictions_host, tree.host_used_bytes)
                           and self.ended == self.arrived and self.engine.waiting_for_work)

    def _upcoming(self) -> tuple[bool, float]:
        """Whether a request is still to arrive, and when the next one does (a fleet's
        replica that does not know its own next request gives the fleet's next: the earliest
        it can come)."""
        if self.arrived < self.n:
            return True, self.arrival_s[self.arrived]
        return False, math.inf

    def _no_progress(self, wakeups: int, since_s: float) -> str:
        """Why the watchdog stopped the run, in the flags' terms."""
        config = self.config
        what = (f"no request arrived or ended from {since_s:,.6g} to {self.env.now:,.6g} "
                f"simulated s ({wakeups:,} GPU failures and host-replica ticks, over "
                f"{limits.NO_PROGRESS_WALL_S:g} s of wall time)")
        if config.gpu_failure_rate_per_h > 0:
            gap_s = 3600.0 / config.gpu_failure_rate_per_h
            why = (f"the GPU fails every ~{gap_s:.3g} s (--gpu-failure-rate) and is down "
                   f"{config.gpu_recovery_s:g} s each time (--gpu-recovery): too little time "
                   "to serve anything")
        else:
            why = (f"a request waits longer than the run can tick through every "
                   f"{config.replicate_every_s:g} s (replicate_every_s): look at --search-s, "
                   "--gpu-recovery, --retry-timeout and the trace's stage times")
        return f"{what}: {why}"

    def _retry(self, i: int):
        yield self.env.timeout(self.config.retry_timeout_s)
        self._submit(self._new_job(i, self._final_docs(i), speculative=False))

    # ------------------------------------------------------------------ engine hooks
    def _record_hits(self, job: Job) -> None:
        i = job.request
        self.r_cached[i] = job.alpha
        self.r_hit_gpu[i] = job.hit_gpu
        self.r_hit_host[i] = job.hit_host
        self.r_self_hit[i] = job.self_hit_tokens
        self.r_recomputed[i] = job.recomputed
        self.r_free_hit[i] = job.free_hit_tokens
        self.r_blend_recomputed[i] = job.blend_recomputed
        self.r_swap_in[i] = job.swap_in_bytes
        self.r_swap_in_s[i] = job.swap_in_s
        self.r_decision_s[i] = job.decision_s
        self.r_prefill_start[i] = job.prefill_start_s

    def prefilled(self, job: Job) -> None:
        i = job.request
        if job.speculative:
            return  # its token is held until the search confirms the list
        if math.isnan(self.r_first_token[i]):
            self.r_first_token[i] = job.first_token_s
            self._record_hits(job)

    def finished(self, job: Job) -> None:
        i = job.request
        if job.speculative:
            return
        if math.isnan(self.r_first_token[i]):  # a parked speculation confirmed just now
            self.r_first_token[i] = self.env.now
            self._record_hits(job)
        self.r_attempts[i] += 1
        if self.answers is not None:
            self.answers.write_back(i, self.env.now)
        self._end(i, COMPLETED)

    def aborted(self, job: Job, reason: str) -> None:
        i = job.request
        if job.speculative or reason == "speculation-terminated":
            if self._active_spec.get(i) is job:
                del self._active_spec[i]
            self.r_spec_wasted_s[i] += job.attributed_s
            if job.prefill_start_s >= 0:
                self.spec_wasted_tokens += job.beta
            return
        # a final job lost to a GPU failure: retry after the timeout, or give up
        self.r_attempts[i] += 1
        self.r_generated[i] = max(self.r_generated.get(i, 0), job.generated)
        if self.r_attempts[i] > self.config.max_retries:
            self._end(i, FAILED, 1)
            return
        self.retries += 1
        self.env.process(self._retry(i))

    def cannot_fit(self, job: Job) -> None:
        if job.speculative:
            if self._active_spec.get(job.request) is job:
                del self._active_spec[job.request]
            return
        self._end(job.request, FAILED, 2)

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        started = time.perf_counter()
        interrupted = stalled = False
        no_progress = None
        if self.n:
            env = self.env
            if self.config.arrival == "sequential":
                env.process(self._sequential_arrivals())
            else:  # starts as a process would: urgently, now (the same place in the queue)
                self._arrival_list = self.arrival_s.tolist()
                self._timeout_at(env.now, urgent=True).callbacks.append(self._first_arrivals)
            env.process(self._background())
            with cyclic_gc_paused():
                try:
                    # stepped here rather than env.run(until=...), which turns SimPy's
                    # documented EmptySchedule into a bare RuntimeError
                    run_until = getattr(env, "run_until_processed", None)
                    if run_until is not None:
                        run_until(self.all_ended)
                    else:
                        step = env.step
                        ended = self.all_ended
                        while not ended.processed:
                            step()
                except KeyboardInterrupt:
                    # Ctrl-C keeps what finished: every request that ended has its final
                    # record; the rest stay "pending" and the summary says it was cut short
                    interrupted = True
                except NoProgress as exc:  # the watchdog: what ended is kept, and why
                    stalled, no_progress = True, str(exc)
                except simpy.core.EmptySchedule:
                    # no event left before every request ended: a request is waiting on
                    # something that will never happen (a bug). Keep what ended and say so,
                    # rather than lose the run or spin forever; any other error keeps its
                    # traceback
                    stalled = True
        elapsed = time.perf_counter() - started
        columns = self._columns()
        if self.answers is not None:
            self.answers.adjust(columns)
        summary = summarize(self, columns, elapsed, interrupted, stalled, no_progress)
        if self.answers is not None:
            summary.update(self.answers.summary(columns))
            summary["warnings"].extend(self.answers.warnings())
            self.answers.close()
        return RunResult(config=self.config, columns=columns, summary=summary)

    def _columns(self) -> dict[str, np.ndarray]:
        cols = {
            "request_id": self.trace.request_id,
            "arrival_s": self.arrival_s,
            "search_start_s": self.r_search_start,
            "search_end_s": self.r_search_end,
            "prefill_start_s": self.r_prefill_start,
            "first_token_s": self.r_first_token,
            "finish_s": self.r_finish,
            "status": np.array(["pending", "completed", "failed"])[self.r_status],
            "fail_reason": np.array(FAIL_REASONS)[self.r_reason],
            "attempts": self.r_attempts,
            "doc_tokens": np.zeros(self.n, dtype=np.int64),
            "query_tokens": self.trace.query_tokens,
            "output_tokens": self.trace.output_tokens,
            "cached_tokens": self.r_cached,
            "hit_tokens_gpu": self.r_hit_gpu,
            "hit_tokens_host": self.r_hit_host,
            "speculative_self_hit_tokens": self.r_self_hit,
            "recomputed_tokens": self.r_recomputed,
            "swap_in_bytes": self.r_swap_in,
            "swap_in_s": self.r_swap_in_s,
            "decision_s": self.r_decision_s,
            "speculations": self.r_spec_started,
            "speculation_kept": self.r_spec_kept,
            "speculation_wasted_s": self.r_spec_wasted_s,
        }
        if self.tree.reuse.position_free:
            cols["position_free_hit_tokens"] = self.r_free_hit
            cols["blend_recomputed_tokens"] = self.r_blend_recomputed
        offsets = self.trace.doc_offsets
        ends = offsets[1:]
        if self.config.top_k is not None:
            ends = np.minimum(ends, offsets[:-1] + self.config.top_k)
        cumulative = np.concatenate(([0], np.cumsum(self.trace.doc_tokens_flat)))
        cols["doc_tokens"] = (cumulative[ends] - cumulative[offsets[:-1]]).astype(np.int64)
        cols["ttft_s"] = cols["first_token_s"] - cols["arrival_s"]
        cols["e2e_s"] = np.where(cols["status"] == "completed",
                                 cols["finish_s"] - cols["arrival_s"], np.nan)
        decode_tokens = np.maximum(self.trace.output_tokens - 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["tpot_s"] = np.where(
                (cols["status"] == "completed") & (decode_tokens > 0),
                (cols["finish_s"] - cols["first_token_s"]) / np.maximum(decode_tokens, 1),
                np.nan)
        return cols


class SearchWorkers:
    """The vector search's CPU pool: ``capacity`` workers, taken first come, first served.

    SimPy's ``Resource`` models the same pool at the price of two events and four objects per
    search, even when a worker is free, as it nearly always is below saturation. Here a free
    worker is taken at once, without an event; only a search that finds every worker busy, or
    others waiting, waits (an event). Workers are handed to waiting searches exactly when
    ``Resource`` hands them (tested against it): a request or a release's processing gives
    a free worker to the oldest waiting search, one per occasion."""

    def __init__(self, env: simpy.Environment, capacity: int) -> None:
        self.env = env
        self.free = capacity
        self._waiting: deque[simpy.Event] = deque()

    def take(self) -> simpy.Event | None:
        """A worker at once (None), or the event of one being handed over later."""
        if self.free and not self._waiting:
            self.free -= 1
            return None
        handed = self.env.event()
        self._waiting.append(handed)
        self._hand_over()  # (a worker freed this instant may go to an older search)
        return handed

    def give_back(self) -> None:
        self.free += 1
        if self._waiting:  # the release's own event hands the worker over, as SimPy's does
            release = self.env.event()
            release.callbacks.append(self._hand_over)
            release.succeed()

    def _hand_over(self, _release: simpy.Event | None = None) -> None:
        if self.free and self._waiting:
            self.free -= 1
            self._waiting.popleft().succeed()


def padded_price(config: SimConfig, profile: Profile):
    """The pass prices a padded engine's batcher decides joins by (``config.padded_join``), or
    None: a varlen engine (its profile's batched prefill pads nothing) or ``always``."""
    if config.padded_join != "if-cheaper" or profile.batched_prefill.padding == "none":
        return None
    return profile.prefill_pass_quote_s


def trace_has_retrieval(trace: Trace) -> bool:
    """Whether a vector search chose the trace's documents. Mooncake's traces carry prefix
    blocks of conversations (``hash_ids``), with no search behind them: their importer marks
    them (``retrieval: false`` in the trace info; traces imported before that are known by
    their source)."""
    info = trace.info or {}
    return info.get("retrieval", True) is not False and info.get("source") != "mooncake"


def resolve_retrieval(config: SimConfig, trace: Trace) -> SimConfig:
    """The configuration with ``retrieval`` decided (``auto``: on if the trace's documents were
    retrieved), and speculation off where there is no search to speculate on. Without this a
    Mooncake trace got synthetic search stages and speculative prefills of lists no search
    produced (255 GPU-s wasted at 0.8 req/s); the run records what it used."""
    retrieval = config.retrieval
    if retrieval == "auto":
        retrieval = "on" if trace_has_retrieval(trace) else "off"
    if retrieval == "off" and config.speculate:
        return config.replace(retrieval=retrieval, speculate=False)
    return config if retrieval == config.retrieval else config.replace(retrieval=retrieval)


def _tick_at_or_after(tick_s: float, every_s: float, now_s: float) -> float:
    """The first tick of the periodic grid ``tick_s, tick_s + every_s, ...`` at or after
    ``now_s``, summed one period at a time as the ticking loop sums it (so the ticks after a
    sleep fall exactly where they would have); past a million periods, or where a period no
    longer moves the clock (times near 1e308), the grid's phase is kept by a remainder."""
    if tick_s >= now_s:
        return tick_s
    if (now_s - tick_s) / every_s > 1e6 or tick_s + every_s == tick_s:
        return now_s + (tick_s - now_s) % every_s
    while tick_s < now_s:
        tick_s += every_s
    return tick_s


def requests_to_run(trace: Trace, config: SimConfig) -> Trace:
    """The trace cut to ``config.n_requests`` (``--requests``)."""
    if config.n_requests is not None and trace.n_requests > config.n_requests:
        return trace.head(config.n_requests)
    return trace

