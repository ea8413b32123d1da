"""The LLM engine as a SimPy process: iteration-level continuous batching over the policy core.

Each iteration is either a *prefill* iteration (requests taken from the pool, their uncached
tokens computed in one batch) or a *decode* iteration (one token for every running request);
waiting prefills go first, as in vLLM v0.3, which the paper's prototype extends. With
``scheduler="mixed"`` (vLLM >= 0.4, SGLang) every step decodes the running requests and fills
the rest of the token budget with prompt chunks (``_mixed_chunks``, docs/model.md section 6).

Memory: the knowledge tree owns the GPU's KV space. A request admitted to a batch pins its
cached path, places its computed documents in the tree, and reserves the rest of its KV (query,
output, documents past the cached depth) with ``reserve_gpu``; admission requires the request's
whole KV footprint to fit in what pinned nodes and other reservations leave (conservative: a
shared, already-pinned prefix is counted again). Output KV is reserved up front, so a running
request is never preempted.

What a request of a batch finds cached: the tree places computed documents in GPU at admission,
so a later request of the same batch would see them. ``batch_kv_sharing`` says whether the
engine lets it (vLLM v1: yes, it caches blocks when it schedules them; SGLang and RAGCache: no,
their trees take KV after the prefill): without it the hit prefix stops at the first document a
batch mate is computing, and the request computes it too (docs/model.md, section 1). Hits on
documents the request's own earlier speculation computed are counted apart from cross-request
hits (``self_hit_tokens``).

Host-tier hits are copied host->GPU before the prefill (``overlap_swap=False``, the default) or
while it computes (``overlap_swap=True``: the iteration takes the longer of the two); every
request of the batch waits for the copy (``swap_in_s``, the TTFT's swap-in component). Swap-outs
(GPU->host on eviction) run on the other PCIe direction, asynchronously; their bytes are counted.

Decode bookkeeping is O(finished requests) per iteration, not O(batch): a running request knows
the iteration at which it finishes, and the context length of the batch is kept as a sum.

What an iteration *costs* is not this module's: an ``Iterations`` object runs it. The simulator's
(``ragsim.sim.predicted``) waits the time the cost profile predicts; the real harness's
(``ragsim.realrun.iterations``) runs the forward pass on a real model and waits until it is
done. Every decision (admission, batching, memory, terminations, faults) is made here, once,
for both.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Generator
from time import perf_counter
from typing import Any, NamedTuple, Protocol

import simpy

from ragsim.cache.padded_batches import PassPrice, joining_is_cheaper
from ragsim.cache.reorder import RequestPool
from ragsim.cache.reuse import engine_reuse, own_hit_tokens
from ragsim.cache.tree import KnowledgeTree
from ragsim.serving.clock import exact_timeouts, redirect_wait


class Job:
    """One attempt to generate for a request with one document list (speculative or final)."""

    __slots__ = (
        "alpha",
        "attributed_s",
        "beta",
        "blend_recomputed",
        "computing",
        "context_tokens",
        "decision_s",
        "doc_tokens",
        "docs",
        "done",
        "finish_s",
        "first_token_s",
        "footprint_tokens",
        "free_hit_tokens",
        "free_nodes",
        "generated",
        "hit_gpu",
        "hit_host",
        "iter_at_join",
        "key",
        "output_tokens",
        "path",
        "prefill_start_s",
        "prefilled",
        "query_tokens",
        "recomputed",
        "request",
        "reserved_bytes",
        "self_hit_tokens",
        "slot_at_join",
        "speculative",
        "swap_in_bytes",
        "swap_in_s",
        "terminated",
    )

    def __init__(self, key: int, request: int, docs: list, doc_tokens: list, query_tokens: int,
                 output_tokens: int, speculative: bool, generated: int = 0) -> None:
        self.key = key
        self.request = request
        self.docs = docs
        self.doc_tokens = doc_tokens
        self.query_tokens = query_tokens  # plus tokens generated before a retry
        self.output_tokens = output_tokens  # still to generate
        self.speculative = speculative
        self.terminated = False
        self.done = False
        self.path: list | None = None
        self.reserved_bytes = 0
        self.alpha = self.beta = 0
        self.prefilled = 0  # of its beta new tokens, those computed (mixed steps: in chunks)
        self.computing: list = []  # the tree nodes its prefill computes
        self.context_tokens = 0
        self.generated = generated
        self.attributed_s = 0.0  # engine time spent on this job (for speculation waste)
        self.slot_at_join = 0.0
        self.iter_at_join = 0
        self.hit_gpu = self.hit_host = self.recomputed = self.swap_in_bytes = 0
        # position-free reuse: the nodes read outside the exact prefix (pinned with the path),
        # their tokens (in hit_gpu/hit_host) and the tokens of them recomputed (in beta)
        self.free_nodes: list = []
        self.free_hit_tokens = self.blend_recomputed = 0
        # hits on documents this request's own earlier speculation computed (not in hit_*)
        self.self_hit_tokens = 0
        # the host->GPU copy its prefill iteration waited for (the whole batch's, as every
        # request of the batch gets its first token when the iteration ends)
        self.swap_in_s = 0.0
        self.prefill_start_s = self.first_token_s = self.finish_s = -1.0
        self.decision_s = 0.0  # wall time the scheduler spent admitting it
        # KV the job needs at its peak: its context plus every generated token but the last
        self.footprint_tokens = sum(doc_tokens) + query_tokens + max(output_tokens - 1, 0)


class EngineHooks:
    """What the engine tells the rest of the simulation (implemented by the simulator)."""

    def prefilled(self, job: Job) -> None: ...
    def finished(self, job: Job) -> None: ...
    def aborted(self, job: Job, reason: str) -> None: ...
    def cannot_fit(self, job: Job) -> None: ...


class PrefillTiming(NamedTuple):
    """How long a prefill iteration took and what of it was the host->GPU copy.

    ``duration_s`` is the whole iteration; ``compute_s`` the forward pass; ``copy_s`` the
    host->GPU copy of the batch's host hits (overlapped with compute or before it, as the
    iterations object ran it)."""

    duration_s: float
    compute_s: float
    copy_s: float


Wait = Generator[simpy.Event, Any, Any]

DECODE_RUN_MAX_STEPS = 128


class Iterations(Protocol):
    """Runs the engine's iterations: predicted by a cost profile, or real on a model.

    ``prefill`` and ``decode`` are SimPy process bodies: they yield events until the iteration
    is over and return its timing. ``leave`` says a job stopped running (its private KV can
    go); ``gpu_failed`` says the GPU lost its state (after the tree dropped its GPU tier);
    ``recover`` waits until the GPU serves again (a restart of ``restart_s``, then the system
    prompt's KV copied back), and ``recovery_s`` says how long that is expected to take."""

    def prefill(self, jobs: list[Job]) -> Wait: ...
    def decode(self, jobs: set[Job], mean_context_tokens: float) -> Wait: ...
    # Optional (the simulator's): ``decode_durations(batch_size, context_sum_tokens, steps,
    # jobs)``, the durations of ``steps`` decode steps of an unchanging batch of ``jobs``
    # whose contexts sum to ``context_sum_tokens`` at the first, and
    # ``decode_run_ended(steps_run)``, how many of them ran. With them the engine runs such
    # steps as one event (``Engine._decode_run``);
    # without them (a real engine) it runs every step.
    def leave(self, job: Job) -> None: ...
    def gpu_failed(self) -> None: ...
    # Optional (the simulator's): ``mixed(chunks, decoding, mean_context_tokens)``, one step
    # of the mixed scheduler: prefill chunks ``(job, new tokens)`` (each over the job's
    # ``alpha + prefilled`` tokens) and a decode token for every job of ``decoding``.
    def recovery_s(self, restart_s: float, root_bytes: int) -> float: ...
    def recover(self, restart_s: float, root_bytes: int) -> Wait: ...


class Engine:
    def __init__(self, env: simpy.Environment, *, tree: KnowledgeTree, pool: RequestPool,
                 hooks: EngineHooks, iterations: Iterations, kv_bytes_per_token: int,
                 max_batch_size: int, max_prefill_bs: int, max_batched_tokens: int,
                 prefix_block_tokens: int, gpu_recovery_s: float,
                 batch_kv_sharing: bool = False, scheduler: str = "prefill-first",
                 padded_price_s: PassPrice | None = None) -> None:
        self.env = env
        self._timeout_at = exact_timeouts(env)
        self.tree = tree
        self.pool = pool
        self.hooks = hooks
        self.iterations = iterations
        self.kv = kv_bytes_per_token
        self.max_batch_size = max_batch_size
        self.max_prefill_bs = max_prefill_bs
        self.max_batched_tokens = max_batched_tokens
        self.block = prefix_block_tokens
        self.gpu_recovery_s = gpu_recovery_s
        self.batch_kv_sharing = batch_kv_sharing
        self.mixed = scheduler == "mixed"
        # an engine that pads its batches: the pass prices a prompt joins a batch by
        # (``padded_batches.joining_is_cheaper``); None: every prompt that fits joins
        self.padded_price_s = padded_price_s
        if self.mixed and not hasattr(iterations, "mixed"):
            raise ValueError("the mixed scheduler is modelled by the simulator only: this "
                             "engine runs prefill-first iterations")
        self._prefilling: list[Job] = []  # mixed: admitted, part of their prompt computed
        self._batch_computed: set = set()  # nodes the batch being formed computes
        self._speculated: dict = {}  # node -> the request whose speculation computed it
        self._speculated_by: dict[int, list] = {}  # request -> those nodes (to forget them)
        # running (decoding) requests
        self._decoding: set[Job] = set()
        self._finish_heap: list[tuple[int, int, Job]] = []
        self._decode_iter = 0
        self._slot_s = 0.0  # cumulative decode time per batch slot
        self._context_sum = 0  # sum of running requests' context lengths
        self._current: list[Job] = []  # jobs in the iteration under way
        self._parked: set[Job] = set()  # speculative jobs done before their search
        self._terminate: list[Job] = []
        self._iterating = False  # an iteration is under way: terminations wait for its end
        self._wakeup: simpy.Event | None = None
        # waiting in a decode run (``_decode_run``) that nothing has cut yet; its step ends;
        # the steps it runs once cut (0: not cut)
        self._in_decode_run = False
        self._run_ends: list[float] = []
        self._run_cut_steps = 0
        self._decode_durations = getattr(iterations, "decode_durations", None)
        self._recovering = False
        self.down_until_s = 0.0  # while recovering: the earliest it can serve again
        # counters
        self.iterations_prefill = 0
        self.iterations_decode = 0
        self.iterations_mixed = 0  # steps that prefilled and decoded together
        # prefill-first: requests whose new tokens alone exceed max_batched_tokens; each ran
        # alone in its iteration (the budget cannot split a prompt), said in the summary
        self.prefills_over_budget = 0
        # times a padded batch left the next prompt for a later step (cheaper apart than joined)
        self.padded_apart = 0
        self.busy_s = 0.0
        self.swap_in_s = 0.0
        self.scheduler_s = 0.0  # wall time spent choosing batches
        self.scheduler_decisions = 0
        self.gpu_failures = 0
        self.lost_bytes = 0
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ interface
    def notify(self) -> None:
        """A job entered the pool: wake the engine if it idles, or end its decode run at the
        next step (where a step-by-step engine would admit the job)."""
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        self._cut_decode_run()

    def _cut_decode_run(self) -> None:
        """End the decode run at the end of the step under way (once): the engine's wait moves
        from the run's last step to that step's end (or to now, if a step ends now)."""
        if not self._in_decode_run:
            return
        self._in_decode_run = False
        env = self.env
        ends = self._run_ends
        done = bisect_left(ends, env.now)  # steps over; the next ends at ends[done]
        self._run_cut_steps = done + 1
        wake = self._timeout_at(ends[done]) if ends[done] > env.now else self._timeout_at(
            env.now, urgent=True)
        redirect_wait(self.process, wake)

    @property
    def waiting_for_work(self) -> bool:
        """The engine idles until a job enters the pool (nothing running, nothing to admit)."""
        return self._wakeup is not None

    @property
    def n_running(self) -> int:
        return len(self._decoding)

    def terminate(self, job: Job) -> None:
        """Stop a speculative job: at once if it waits, after the current iteration if not."""
        if job.done or job.terminated:
            return
        job.terminated = True
        if self.pool.discard(job.key, self.env.now) is not None:
            job.done = True
            self.hooks.aborted(job, "speculation-terminated")
        elif job in self._parked:
            self._parked.discard(job)
            job.done = True
            self.hooks.aborted(job, "speculation-terminated")
        else:
            self._terminate.append(job)
            if not self._iterating:
                self._apply_terminations()
            else:
                self._cut_decode_run()  # the batch changes after the current step

    def confirm(self, job: Job) -> None:
        """The search confirmed a speculative job's list: its output stands."""
        job.speculative = False
        if job in self._parked:
            self._parked.discard(job)
            self.hooks.finished(job)

    def fail_gpu(self) -> None:
        """Called by the fault process: interrupt whatever the engine is doing."""
        if self.process.is_alive:
            self.process.interrupt("gpu-failure")

    # ------------------------------------------------------------------ the process
    def _run(self):
        env = self.env
        while True:
            try:
                if self._recovering:
                    yield from self.iterations.recover(self.gpu_recovery_s,
                                                       self.tree.root.size_bytes)
                    self._recovering = False
                    self.down_until_s = env.now
                    continue
                if self.mixed and (self._prefilling or self.pool):
                    chunks = self._mixed_chunks()
                    if chunks:
                        n = len(self._decoding)
                        self._current = [job for job, _ in chunks]
                        self._iterating = True
                        timing = yield from self.iterations.mixed(
                            chunks, self._decoding, self._context_sum / n if n else 0.0)
                        self._iterating = False
                        self._current = []
                        self._after_mixed(chunks, timing, n)
                        continue
                    batch = []
                else:
                    batch = self._admit()
                if batch:
                    self._current = batch
                    self._iterating = True
                    timing = yield from self.iterations.prefill(batch)
                    self._iterating = False
                    self._current = []
                    self._account_prefill(batch, timing)
                    self._after_prefill(batch, timing.duration_s)
                elif self._decoding:
                    n = len(self._decoding)
                    self._iterating = True
                    if (self._decode_durations is not None and not self.pool
                            and not self._prefilling
                            and self._finish_heap[0][0] - self._decode_iter > 1):
                        yield from self._decode_run(n)
                    else:
                        duration = yield from self.iterations.decode(self._decoding,
                                                                     self._context_sum / n)
                        self._after_decode(duration, n)
                    self._iterating = False
                else:
                    self._wakeup = env.event()
                    yield self._wakeup
                    self._wakeup = None
            except simpy.Interrupt:
                self._iterating = False
                self._wakeup = None
                self._on_gpu_failure()

    # ------------------------------------------------------------------ scheduling
    def _lengths(self, job: Job) -> tuple[int, int]:
        """(cached, to compute) tokens of the job's context now: reordering's two lengths.
        Documents a batch mate is computing count as cached only where the engine would let
        the job use them (``batch_kv_sharing``), so the ordering sees what the prefill will."""
        matched = self._visible_matched(job.docs)
        cached = self.tree.system_prompt_tokens + sum(job.doc_tokens[:matched])
        context = self.tree.system_prompt_tokens + sum(job.doc_tokens) + job.query_tokens
        return cached, context - cached

    def _visible_matched(self, docs: list) -> int:
        """Documents of ``docs`` cached now that the job could use in the batch being formed."""
        matched = self.tree.match_prefix(docs)[0]
        if matched and self._batch_computed and not self.batch_kv_sharing:
            node = self.tree.root
            for depth in range(matched):  # the cached path's nodes, as match_prefix found them
                node = node.children[docs[depth]]
                if node in self._batch_computed:
                    return depth
        return matched

    def _admit(self, budget: int | None = None, chunked: bool = False) -> list[Job]:
        """Take requests from the pool into one prefill batch (None fits: an empty list).
        ``chunked`` (the mixed scheduler): admit while ``budget`` tokens remain, the last job
        admitted possibly larger than what remains (its prompt is then computed in chunks)."""
        self._apply_terminations()
        pool = self.pool
        if not pool:
            return []
        started = perf_counter()
        self._batch_computed.clear()
        for job in self._prefilling:  # mixed: prompts still being computed, chunk by chunk
            self._batch_computed.update(job.computing)
        tree = self.tree
        kv = self.kv
        batch: list[Job] = []
        if budget is None:
            budget = self.max_batched_tokens
        lengths = self._lengths if pool.reorder else None
        now = self.env.now
        running = len(self._decoding) + len(self._prefilling)
        while (pool and len(batch) < self.max_prefill_bs
               and running + len(batch) < self.max_batch_size
               and (not chunked or budget > 0)):
            decided = perf_counter()
            key, job = pool.peek(lengths, now)
            need_bytes = job.footprint_tokens * kv
            if need_bytes > tree.gpu_available_bytes:
                if not batch and not self._decoding and not self._prefilling:
                    # nothing runs that could free memory: it can never fit
                    pool.take(key, now)
                    job.done = True
                    self.hooks.cannot_fit(job)
                    continue
                break
            cached, compute = self._lengths(job)
            if compute > budget and not chunked:
                if batch:
                    break
                self.prefills_over_budget += 1  # larger than the budget: it runs alone
            if (batch and self.padded_price_s is not None and not chunked
                    and not joining_is_cheaper(self.padded_price_s,
                                               [j.alpha for j in batch], [j.beta for j in batch],
                                               cached, compute)):
                self.padded_apart += 1  # heads the next batch instead
                break
            pool.take(key, now)
            self._start(job)
            # the policy core's time for this job: ordering, lookup, admission, eviction
            job.decision_s = perf_counter() - decided
            budget -= job.beta
            batch.append(job)
        self.scheduler_s += perf_counter() - started
        self.scheduler_decisions += len(batch)
        return batch

    def _start(self, job: Job) -> None:
        tree = self.tree
        n_hit = tree.match_prefix(job.docs)[0]  # documents cached before this access
        r = tree.access(job.docs, job.doc_tokens, job.query_tokens, request_index=job.request,
                        keep_pinned=True, now_s=self.env.now)
        path = r.path
        cached, new = r.cached_tokens, r.new_tokens
        hit_gpu, recomputed = r.hit_tokens_gpu, r.recomputed_tokens
        if not self.batch_kv_sharing:
            # documents an earlier request of this batch is computing are not there yet: the
            # tail of the hit prefix (their descendants were uncached too), all in GPU
            for depth in range(n_hit):
                if path[depth] in self._batch_computed:
                    unseen = sum(n.tokens for n in path[depth:n_hit])
                    cached, new = cached - unseen, new + unseen
                    hit_gpu, recomputed = hit_gpu - unseen, recomputed + unseen
                    n_hit = depth
                    break
        free_nodes = r.free_nodes
        free_gpu, free_host = r.free_hit_tokens_gpu, r.free_hit_tokens_host
        free_recompute = r.free_recompute_tokens
        if free_nodes and not self.batch_kv_sharing and self._batch_computed:
            # read position-free from a node a batch mate computes: not there yet, computed
            rule = tree.reuse
            kept = []
            for n, tokens in self._free_tokens(job, free_nodes):
                if n in self._batch_computed:
                    free_gpu -= tokens
                    free_recompute -= rule.recompute_tokens(tokens)
                    new, recomputed = new + tokens, recomputed + tokens
                else:
                    kept.append(n)
            if len(kept) < len(free_nodes):
                tree.release_read([n for n in free_nodes if n not in kept])
                free_nodes = kept
        swap_in_bytes = r.swap_in_bytes
        if free_nodes:
            # the nodes read stay pinned beside the request's own KV: if what is left cannot
            # also hold its private KV, it reads none of them and computes those documents
            in_gpu = sum(n.tokens for n in path if n.in_gpu)
            if (job.footprint_tokens - in_gpu) * self.kv > tree.gpu_available_bytes:
                tree.release_read(free_nodes)
                missed = free_gpu + free_host
                new, recomputed = new + missed, recomputed + missed
                swap_in_bytes -= sum(n.size_bytes for n in free_nodes if not n.in_gpu)
                free_nodes, free_gpu, free_host, free_recompute = [], 0, 0, 0
        u = engine_reuse(cached, new, hit_gpu, r.hit_tokens_host, recomputed, self.block,
                         free_gpu, free_host, free_recompute)
        job.free_nodes = free_nodes
        job.free_hit_tokens = u.position_free_hit_tokens
        job.blend_recomputed = u.blend_recomputed_tokens
        own = self._speculated
        own_gpu = own_host = 0
        if own and n_hit:  # (no speculation, no lookups)
            hit_path = path[:n_hit]
            mine = [own.get(n) == job.request for n in hit_path]
            if True in mine:
                own_gpu, own_host = own_hit_tokens([n.tokens for n in hit_path], mine,
                                                   u.hit_tokens_gpu, hit_gpu, u.hit_tokens_host)
        computed = job.computing = path[n_hit:]
        if computed:
            if not self.batch_kv_sharing:
                self._batch_computed.update(computed)
            if job.speculative:
                for n in computed:
                    own[n] = job.request
                self._speculated_by.setdefault(job.request, []).extend(computed)
            elif own:
                for n in computed:
                    own.pop(n, None)
        job.path = path
        job.alpha, job.beta = u.cached_tokens, u.new_tokens
        job.hit_gpu, job.hit_host = u.hit_tokens_gpu - own_gpu, u.hit_tokens_host - own_host
        job.self_hit_tokens = own_gpu + own_host
        job.recomputed = u.recomputed_tokens
        job.swap_in_bytes = swap_in_bytes
        job.context_tokens = job.alpha + job.beta
        in_gpu = sum(n.tokens for n in path if n.in_gpu)
        private = job.footprint_tokens - in_gpu
        job.reserved_bytes = private * self.kv
        if not tree.reserve_gpu(job.reserved_bytes):  # admission checked the whole footprint
            raise AssertionError("KV reservation failed after admission")
        job.prefill_start_s = self.env.now

    @staticmethod
    def _free_tokens(job: Job, free_nodes: list) -> list:
        """(node, the request's tokens of that document) for each position-free hit, in the
        request's order (the tree reads them for the documents after the exact prefix)."""
        ids = dict(zip(job.docs, job.doc_tokens, strict=True))
        return [(n, ids[n.key]) for n in free_nodes]

    def _mixed_chunks(self) -> list[tuple[Job, int]]:
        """One mixed step's prefill work: every running request decodes a token, partial
        prompts continue first (oldest first), then the pool's requests are admitted while
        the token budget lasts; a prompt larger than what is left is computed in chunks."""
        self._apply_terminations()
        budget = self.max_batched_tokens - len(self._decoding)
        chunks: list[tuple[Job, int]] = []
        for job in self._prefilling:
            if budget <= 0:
                break
            take = min(job.beta - job.prefilled, budget)
            chunks.append((job, take))
            budget -= take
        if budget > 0:
            for job in self._admit(budget, chunked=True):
                take = min(job.beta, budget)
                chunks.append((job, take))
                budget -= take
                self._prefilling.append(job)
        return chunks

    def _after_mixed(self, chunks: list[tuple[Job, int]], timing: PrefillTiming,
                     n: int) -> None:
        """Settle a mixed step: the running requests' decode token (as a decode step), the
        chunks' tokens, and the first token of every request whose prompt is now computed."""
        duration = timing.duration_s
        self.iterations_mixed += n > 0
        self.swap_in_s += timing.copy_s
        exposed_copy = duration - timing.compute_s
        total_new = sum(take for _, take in chunks) or 1
        for job, take in chunks:
            if job.prefilled == 0:  # its host hits were copied before this step's compute
                job.swap_in_s = exposed_copy
            job.prefilled += take
            job.attributed_s += duration * take / total_new
        if n:
            self._after_decode(duration, n)  # busy time, decode counters, finishes
        else:
            self.busy_s += duration
        done = [job for job, _ in chunks if job.prefilled >= job.beta]
        if done:
            self.iterations_prefill += 1
            self._prefilling = [j for j in self._prefilling if j.prefilled < j.beta]
            self._after_prefill(done, duration)

    def forget_request(self, request: int) -> None:
        """The request ended: documents its speculation computed are anybody's from now on."""
        own = self._speculated
        for n in self._speculated_by.pop(request, ()):
            if own.get(n) == request:
                del own[n]

    def _account_prefill(self, batch: list[Job], timing: PrefillTiming) -> None:
        """Charge a prefill iteration: its time to the jobs by their new tokens, and the copy
        the iteration waited for to every job of the batch (each gets its first token when the
        iteration ends)."""
        duration = timing.duration_s
        self.swap_in_s += timing.copy_s
        total_new = sum(j.beta for j in batch) or 1
        exposed_copy = duration - timing.compute_s  # overlapped: the part compute did not hide
        for j in batch:
            j.attributed_s += duration * j.beta / total_new
            j.swap_in_s = exposed_copy
        self.iterations_prefill += 1
        self.busy_s += duration

    def _after_prefill(self, batch: list[Job], duration: float) -> None:
        now = self.env.now
        for job in batch:
            if job.terminated:
                continue  # handled by _apply_terminations below
            job.first_token_s = now
            job.generated += 1
            self.hooks.prefilled(job)
            remaining = job.output_tokens - 1
            if remaining <= 0:
                self._release(job)
                self._finish(job)
            else:
                job.context_tokens += 1
                job.slot_at_join = self._slot_s
                job.iter_at_join = self._decode_iter
                self._decoding.add(job)
                self._context_sum += job.context_tokens
                heapq.heappush(self._finish_heap,
                               (self._decode_iter + remaining, job.key, job))
        self._apply_terminations()

    def _after_decode(self, duration: float, n: int) -> None:
        self._settle_decode_steps((duration,), n)
        heap = self._finish_heap
        while heap and heap[0][0] <= self._decode_iter:
            _, _, job = heapq.heappop(heap)
            if job.done or job not in self._decoding:
                continue
            self._leave_decoding(job)
            self._release(job)
            self._finish(job)
        self._apply_terminations()

    def _decode_run(self, n: int) -> Wait:
        """Decode steps of an unchanging batch as one event, with the same outcome as stepping.

        Between two changes of the batch (a request finishing or terminated, a job entering
        the pool) a step-by-step engine only repeats decode steps, whose durations are known in
        advance. So the run is priced at once, up to the first finish, and waited for as one
        timeout; a job entering the pool or a termination ends it at the end of the step under
        way, where the step-by-step engine would act (the cut moves the engine's wait to that
        step's end: ``_cut_decode_run``). Step ends are summed in the same order as stepping would,
        and the wait lands on them exactly (``ragsim.serving.clock``), so every time and counter
        equals the step-by-step run's (tested), up to the order of events that fall at the
        same instant. Most events of a moderately loaded simulation were decode steps (about
        60%)."""
        env = self.env
        # to the first finish, at most DECODE_RUN_MAX_STEPS (a cut run's later steps were
        # priced for nothing)
        steps = min(self._finish_heap[0][0] - self._decode_iter, DECODE_RUN_MAX_STEPS)
        durations = self._decode_durations(n, self._context_sum, steps, self._decoding)
        ends = []
        t = env.now
        for d in durations:
            t += d  # as SimPy adds each step's delay to its clock
            ends.append(t)
        self._in_decode_run = True  # until cut: a cut moves the wait (no event of its own)
        self._run_ends = ends
        self._run_cut_steps = 0
        try:
            yield self._timeout_at(ends[-1])
            done = self._run_cut_steps or steps
        except simpy.Interrupt:  # a GPU failure: the steps that ended before it count
            done = bisect_left(ends, env.now)
            self.iterations.decode_run_ended(min(done + 1, steps))  # as priced when stepping
            self._settle_decode_steps(durations[:done], n)
            raise
        finally:
            self._in_decode_run = False
        self.iterations.decode_run_ended(done)
        self._settle_decode_steps(durations[:done - 1], n)
        self._after_decode(durations[done - 1], n)

    def _settle_decode_steps(self, durations: list[float], n: int) -> None:
        """The counters of decode steps in which no request finished (``_after_decode``'s
        first half, step by step so that the float sums equal stepping's)."""
        busy_s, slot_s = self.busy_s, self._slot_s
        for duration in durations:  # (a loop: faster here than reduce over operator.add)
            busy_s += duration
            slot_s += duration / n
        self.busy_s, self._slot_s = busy_s, slot_s
        steps = len(durations)
        self.iterations_decode += steps
        self._decode_iter += steps
        self._context_sum += n * steps

    def _leave_decoding(self, job: Job) -> None:
        """Settle a job's decode bookkeeping when it stops decoding (finished, terminated or
        lost): the tokens it generated and the GPU time attributed to it."""
        self._decoding.discard(job)
        steps = self._decode_iter - job.iter_at_join  # one token per completed iteration
        self._context_sum -= job.context_tokens + steps
        job.generated += steps  # a retry after a GPU failure generates only the rest
        job.attributed_s += self._slot_s - job.slot_at_join

    def _release(self, job: Job) -> None:
        self.iterations.leave(job)
        if job.path is not None:
            self.tree.release(job.path)
            job.path = None
        if job.free_nodes:
            self.tree.release_read(job.free_nodes)
            job.free_nodes = []
        if job.reserved_bytes:
            self.tree.free_gpu(job.reserved_bytes)
            job.reserved_bytes = 0

    def _finish(self, job: Job) -> None:
        job.finish_s = self.env.now
        job.done = True
        if job.speculative:  # the search has not confirmed it yet: hold the result
            self._parked.add(job)
            return
        self.hooks.finished(job)

    def _apply_terminations(self) -> None:
        if not self._terminate:
            return
        for job in self._terminate:
            if job in self._decoding:
                self._leave_decoding(job)
            elif job in self._prefilling:
                self._prefilling.remove(job)
            self._release(job)
            if not job.done:
                job.done = True
                self.hooks.aborted(job, "speculation-terminated")
        self._terminate = []

    # ------------------------------------------------------------------ faults
    def _on_gpu_failure(self) -> None:
        """Every running job loses its KV; the tree loses its GPU tier; the GPU is down a while."""
        # in submission order: a set of jobs iterates in memory-address order, which would make
        # the retries' order (and so the run) differ between two runs with the same seed
        current = set(self._current)
        victims = (list(self._current) + [j for j in self._prefilling if j not in current]
                   + sorted(self._decoding, key=lambda job: job.key))
        self._current = []
        self._prefilling = []
        for job in victims:
            if job in self._decoding:
                self._leave_decoding(job)
            self._release(job)
        self._terminate = []
        self._finish_heap = []
        self._decoding.clear()
        self._context_sum = 0
        self.lost_bytes += self.tree.fail_gpu()
        self.iterations.gpu_failed()
        self.gpu_failures += 1
        # the engine restarts and copies the system prompt back (``Iterations.recover``); a
        # failure during a recovery starts it again
        self._recovering = True
        self.down_until_s = self.env.now + self.iterations.recovery_s(
            self.gpu_recovery_s, self.tree.root.size_bytes)
        for job in victims:
            if not job.done:
                job.done = True
                self.hooks.aborted(job, "gpu-failure")
