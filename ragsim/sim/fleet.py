"""``ragsim run --replicas N --router R``: a fleet of engines behind one router, on one clock.

Every replica is the whole pipeline (its own search workers, scheduler, knowledge tree, GPU and
host memory; GPU failures seeded ``seed + replica``) in one SimPy environment; one arrival
process, drawn once for the whole traffic (``--rate`` is the fleet's rate), hands each request
on its arrival to the replica the router (``ragsim.cache.routers``) chooses, seeing the
replicas' live state: their outstanding requests and tokens, their caches (kv-aware), as of
``router_staleness_s`` ago. What is known of a request is the fleet's, not a replica's: its
documents, its search (stages drawn with ``seed`` by its place in the trace, so every router
meets the same searches) and its records, one set shared by the replicas (``Pipeline
._share_requests``), so a fleet of 16 holds one request table, not 16.

A router that reads nothing of the replicas (round-robin, random, session) is decided ahead,
which is what it would decide at arrival; each replica then knows its own next request, and a
replica is exactly the one-engine run of its sub-trace (tested field by field: requests land
at the times the sub-trace's own arrival chain would give, to the last bit). For the others a
replica learns of a request when it arrives; a replica idle between requests sleeps until the
fleet's next arrival (the earliest its own can come).

The fleet's summary is the one-engine summary over every replica's records, with the engines'
counters summed (GPU busy fraction: the replicas' mean), ``gpu_kv_bytes`` the fleet's total,
``replicas``: each replica's own summary, ``load_imbalance``: the most requests a replica was
sent over the mean (1.0: even), and ``gpu_busy_imbalance``: the busiest replica's GPU busy time
over the mean.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque

import numpy as np
import simpy

from ragsim.cache.routers import (
    KV_BLOCK_TOKENS,
    STATELESS_ROUTERS,
    ActivePrompts,
    FleetState,
    RouteRequest,
    make_router,
    prompt_path,
)
from ragsim.profiles.profile import Profile
from ragsim.serving.answer_stage import AnswerStage
from ragsim.serving.config import SimConfig
from ragsim.serving.connector_costs import ConnectorCosts
from ragsim.serving.engine_loop import EngineLoop
from ragsim.serving.fleet import fleet_problem, fleet_summary, route
from ragsim.serving.gc_pause import cyclic_gc_paused
from ragsim.serving.pipeline import (
    COMPLETED,
    NoProgress,
    Pipeline,
    Progress,
    RunResult,
    requests_to_run,
    resolve_retrieval,
)
from ragsim.serving.step_noise import StepTimeNoise
from ragsim.sim.predicted import predicted_iterations
from ragsim.sim.simulator import ExactClock
from ragsim.traces.schema import Trace

# the residency moves that leave a node cached (GPU or host) after them, and those that do not
_CACHED_AFTER = {"admit_gpu": (1, None), "swap_in": (1, 1), "swap_out": (None, 1),
                 "free_gpu": (0, None), "free_host": (None, 0), "drop": (0, 0),
                 "replicate": (None, 1), "fail_gpu": (0, None)}


class FleetReplica(Pipeline):
    """One engine of the fleet: the pipeline on the fleet's clock and request table, told of
    each request by the fleet's router and telling it when a request is prefilled or ends."""

    def __init__(self, fleet: FleetSimulation, index: int, trace: Trace, config: SimConfig,
                 profile: Profile, requests_of: Pipeline | None, record_moves: bool) -> None:
        env = fleet.env
        super().__init__(
            trace, config, profile, env=env,
            iterations=predicted_iterations(env, profile, config.overlap_swap,
                                            EngineLoop.of(config),
                                            StepTimeNoise.of(config, stream=index),
                                            ConnectorCosts.of(config)),
            record_moves=record_moves, requests_of=requests_of)
        self.fleet = fleet
        self.index = index
        self.own: list[int] | None = None  # its requests, when the router decided ahead

    def _upcoming(self) -> tuple[bool, float]:
        own = self.own
        if own is not None:
            if self.arrived < len(own):
                return True, self.arrival_s[own[self.arrived]]
            return False, math.inf
        fleet = self.fleet
        looking_up = fleet.looking_up  # misses of the answer cache, handed over at these times
        if fleet.arrived < fleet.n:
            next_s = self.arrival_s[fleet.arrived]
            return True, min(next_s, looking_up[0]) if looking_up else next_s
        if looking_up:
            return True, looking_up[0]
        return False, math.inf

    def _record_hits(self, job) -> None:
        super()._record_hits(job)
        self.fleet.prefilled(self.index, job.request)

    def _end(self, i: int, status: int, reason: int = 0) -> None:
        answers = self.fleet.answers
        if answers is not None and status == COMPLETED:  # its answer, for the fleet's cache
            answers.write_back(i, self.env.now)
        super()._end(i, status, reason)
        self.fleet.ended_at(self.index, i)


class LateCache:
    """A replica's cache as a router learns of it, ``staleness_s`` late: the tree's residency
    moves (``KnowledgeTree.drain_moves``, Dynamo's KV events) are collected at each routing
    decision, stamped with its time, and applied once that time is ``staleness_s`` past, so a
    change is seen between ``staleness_s`` and ``staleness_s`` plus one gap between arrivals
    late. The tree's shape is read live (nodes are never removed; only where KV lives moves)."""

    def __init__(self, tree, staleness_s: float) -> None:
        self.tree = tree
        self.staleness_s = staleness_s
        self._pending: deque = deque()  # (stamp, moves)
        self._state: dict = {}  # node -> [in GPU, host copy], as seen

    def collect(self, now_s: float) -> None:
        moves = self.tree.drain_moves()
        if moves:
            self._pending.append((now_s, moves))

    def cached_tokens(self, now_s: float, docs, tokens) -> int:
        pending, state = self._pending, self._state
        seen_by = now_s - self.staleness_s
        while pending and pending[0][0] <= seen_by:
            for kind, node in pending.popleft()[1]:
                gpu, host = _CACHED_AFTER[kind]
                held = state.setdefault(node, [0, 0])
                if gpu is not None:
                    held[0] = gpu
                if host is not None:
                    held[1] = host
        tree = self.tree
        limit = len(docs) if tree.max_cached_depth is None else min(len(docs),
                                                                     tree.max_cached_depth)
        node, total = tree.root, tree.system_prompt_tokens
        for doc, n in zip(docs[:limit], tokens[:limit], strict=True):
            children = node.children
            child = children.get(doc) if children is not None else None
            held = state.get(child) if child is not None else None
            if held is None or not (held[0] or held[1]):
                break
            total += n
            node = child
        return total


class FleetSimulation:
    """The fleet on one clock (see the module's docstring)."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile,
                 progress: Progress | None = None) -> None:
        self.env = ExactClock()
        self.config = config = resolve_retrieval(config, trace)  # recorded as one engine's
        self.trace = trace
        self.profile = profile
        self.progress = progress
        n = self.n = trace.n_requests
        replicas = config.replicas
        self.router = make_router(config.router, replicas, seed=config.seed)
        # decided ahead unless an answer cache in front takes some requests from the replicas
        self.ahead = config.router in STATELESS_ROUTERS and not config.answer_cache
        self.staleness_s = config.router_staleness_s
        kv_aware = config.router == "kv-aware"
        late_cache = kv_aware and self.staleness_s > 0
        self.extrapolated_before = profile.extrapolated_queries
        self.replicas: list[FleetReplica] = []
        for r in range(replicas):  # (the answer cache is the fleet's, in front of them)
            self.replicas.append(FleetReplica(
                self, r, trace, config.replace(replicas=1, router_staleness_s=0.0,
                                               answer_cache=False, seed=config.seed + r),
                profile, self.replicas[0] if self.replicas else None, late_cache))
        self.answers = AnswerStage(trace, config) if config.answer_cache else None
        self.looking_up: list[float] = []  # when the answer cache's misses reach the router
        first = self.replicas[0]
        self._times = first.arrival_s.tolist()
        self.routed = np.full(n, -1, dtype=np.int64)
        self.arrived = self.ended = 0
        self.all_ended = self.env.event()
        self._last_delivery = [self.env.now] * replicas
        if self.ahead:
            chosen = route(trace, self.router)  # in trace order, which is arrival order
            self._chosen = chosen.tolist()
            for r, replica in enumerate(self.replicas):
                replica.own = np.flatnonzero(chosen == r).tolist()
                replica.n = len(replica.own)
        else:
            self._chosen = None
            self._sessions = (trace.session_id.to_pylist() if trace.session_id is not None
                              else [None] * n)
            self._work = (trace.query_tokens + trace.output_tokens).tolist()
            self._requests = [0] * replicas
            self._tokens = [0] * replicas
            self._routed_tokens: dict[int, int] = {}
            self._history: deque = deque()  # (time, requests, tokens) when the router is late
            self._active = [ActivePrompts() for _ in range(replicas)] if kv_aware else []
            self._late = [LateCache(p.tree, self.staleness_s) for p in self.replicas] \
                if late_cache else None
            self._state = FleetState(requests=self._requests, tokens=self._tokens,
                                     cached_tokens=self._cached_tokens if kv_aware else None,
                                     active=self._active,
                                     system_prompt_tokens=config.system_prompt_tokens)
            block = config.prefix_block_tokens
            if kv_aware:
                self.router.block_tokens = block if block > 1 else KV_BLOCK_TOKENS

    # ------------------------------------------------------------------ what the router sees
    def _cached_tokens(self, replica: int, docs, tokens) -> int:
        if self._late is not None:
            return self._late[replica].cached_tokens(self.env.now, docs, tokens)
        return self.replicas[replica].tree.cached_prefix_tokens(docs, tokens)

    def _noted(self) -> None:
        """Keep the outstanding work as it is now, for a router that sees it late."""
        if self.staleness_s > 0:
            self._history.append((self.env.now, tuple(self._requests), tuple(self._tokens)))

    def _seen_state(self) -> FleetState:
        if self.staleness_s <= 0:
            return self._state
        seen_by = self.env.now - self.staleness_s
        history = self._history
        while len(history) > 1 and history[1][0] <= seen_by:
            history.popleft()
        if history and history[0][0] <= seen_by:
            _, requests, tokens = history[0]
        else:  # nothing had happened yet, as far as the router knows
            requests = tokens = (0,) * len(self.replicas)
        s = self._state
        return FleetState(requests=requests, tokens=tokens, cached_tokens=s.cached_tokens,
                          active=s.active, system_prompt_tokens=s.system_prompt_tokens)

    def _route(self, i: int) -> int:
        first = self.replicas[0]
        docs = first._final_docs(i)
        tokens = first._doc_tokens_of(i, docs)
        query = first._query[i]
        request = RouteRequest(i, docs, tokens, self._sessions[i], query)
        if self._late is not None:
            for late in self._late:
                late.collect(self.env.now)
        state = self._seen_state()
        r = self.router.choose(request, loads=state.requests, state=state)
        self._requests[r] += 1
        work = sum(tokens) + self._work[i]
        self._tokens[r] += work
        self._routed_tokens[i] = work
        if self._active:
            path, path_tokens = prompt_path(request, self.config.system_prompt_tokens)
            isl = sum(path_tokens) + query
            block = self.router.block_tokens
            cached = min(self._cached_tokens(r, docs, tokens), isl) // block * block
            self._active[r].add(i, path, path_tokens, query, isl - cached)
        self._noted()
        return r

    # ------------------------------------------------------------------ arrivals
    def _arrivals(self, _event: simpy.Event | None = None) -> None:
        """The fleet's open loop, as one engine's (``Pipeline._open_arrivals``): each arrival
        scheduled when the previous one is handled. A request decided ahead is scheduled from
        its replica's previous arrival, as that replica's own loop would (the same float)."""
        if _event is not None:
            self._deliver(self.arrived)
        env = self.env
        times = self._times
        while self.arrived < self.n:
            t = times[self.arrived]
            if t > env.now:
                since = (self._last_delivery[self._chosen[self.arrived]] if self.ahead
                         else env.now)
                env.timeout_at(max(since + (t - since), env.now)).callbacks.append(
                    self._arrivals)
                return
            self._deliver(self.arrived)

    def _first_arrivals(self, _event: simpy.Event) -> None:
        """The open loop's start, as one engine's (``Pipeline._first_arrivals``): nothing has
        arrived yet, so the first request waits for its own planned time like every other (a
        trace whose clock starts late, at an epoch timestamp say, must not have its first
        request served at t = 0). A router decided ahead times it from its replica's start."""
        self._arrivals(None)

    def _deliver(self, i: int) -> None:
        if self.answers is not None:  # the fleet's answer cache first: a hit meets no replica
            answered, lookup_s = self.answers.lookup(i, self.env.now)
            self.arrived += 1
            lookup = self.env.timeout(lookup_s)
            if answered:
                lookup.callbacks.append(lambda _event: self._answered(i))
            else:
                heapq.heappush(self.looking_up, self.env.now + lookup_s)
                lookup.callbacks.append(lambda _event: self._missed(i))
            return
        self.arrived += 1
        self._hand_over(i)

    def _answered(self, i: int) -> None:
        """Request ``i`` answered by the fleet's answer cache, after its lookups."""
        first = self.replicas[0]
        now = self.env.now
        first.r_first_token[i] = first.r_finish[i] = now
        first.r_status[i] = COMPLETED
        self.ended_at(-1, i)

    def _missed(self, i: int) -> None:
        heapq.heappop(self.looking_up)
        self._hand_over(i)

    def _hand_over(self, i: int) -> None:
        r = self._chosen[i] if self.ahead else self._route(i)
        self.routed[i] = r
        self._last_delivery[r] = self.env.now
        self.replicas[r]._admit(i)
        if not self.ahead:  # the others sleep until the fleet's next arrival: it is later now
            for replica in self.replicas:
                wakeup = replica._arrival_wakeup
                if wakeup is not None:
                    replica._arrival_wakeup = None
                    wakeup.succeed()

    # ------------------------------------------------------------------ replicas' reports
    def prefilled(self, replica: int, i: int) -> None:
        if not self.ahead and self._active:
            self._active[replica].prefilled(i)

    def ended_at(self, replica: int, i: int) -> None:
        """Request ``i`` ended at ``replica`` (-1: the answer cache answered it)."""
        if not self.ahead and replica >= 0:
            self._requests[replica] -= 1
            self._tokens[replica] -= self._routed_tokens.pop(i)
            if self._active:
                self._active[replica].remove(i)
            self._noted()
        self.ended += 1
        if self.progress is not None and (self.ended % 1000 == 0 or self.ended == self.n):
            self.progress(self.ended, self.env.now)
        if self.ended == self.n:
            self.all_ended.succeed()

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        started = time.perf_counter()
        interrupted = stalled = False
        no_progress = None
        if self.n:
            env = self.env
            env.timeout_at(env.now, urgent=True).callbacks.append(self._first_arrivals)
            for replica in self.replicas:
                env.process(replica._background())
            with cyclic_gc_paused():
                try:
                    env.run_until_processed(self.all_ended)
                except KeyboardInterrupt:  # keeps what finished, as one engine does
                    interrupted = True
                except NoProgress as exc:
                    stalled, no_progress = True, str(exc)
                except simpy.core.EmptySchedule:
                    stalled = True
        elapsed = time.perf_counter() - started
        return self._result(elapsed, interrupted, stalled, no_progress)

    def _result(self, elapsed_s: float, interrupted: bool, stalled: bool,
                no_progress: str | None) -> RunResult:
        columns = self.replicas[0]._columns()
        columns["replica"] = self.routed  # -1: answered by the answer cache (or not arrived)
        answers = self.answers
        if answers is not None:
            answers.adjust(columns)
        summary = fleet_summary(self.replicas, columns, self.config, self.trace, self.profile,
                                self.extrapolated_before, self.env.now, elapsed_s,
                                interrupted, stalled, no_progress)
        if answers is not None:
            summary.update(answers.summary(columns))
            summary["warnings"].extend(answers.warnings())
            answers.close()
        return RunResult(config=self.config, columns=columns, summary=summary)


def run_fleet(trace: Trace, config: SimConfig, profile: Profile,
              progress: Progress | None = None) -> RunResult:
    problem = fleet_problem(config, "sim")
    if problem is not None:
        raise ValueError(problem)
    return FleetSimulation(requests_to_run(trace, config), config, profile, progress).run()
