"""``ragsim run --backend vllm``: the serving pipeline on a wall clock, vLLM as the engine.

The pipeline (arrivals, staged search, answer cache, records, summary) is the one the simulator
and the torch backend run; only the engine differs. A request whose search ended is added to
vLLM's engine instead of ragsim's request pool, and a SimPy process steps the engine while it
has work: each ``step()`` is one of vLLM's iterations (its own scheduler, batching, paged KV and
prefix cache), after which the clock (``simpy.rt``, not strict) moves to the wall time the step
ended at (so vLLM's timestamps of a step never lie ahead of the clock). Requests that arrive
during a step are added after it, as an engine loop would see them.

Per request, vLLM's own metrics give the times (``scheduled_ts`` -> ``prefill_start_s``,
``first_token_ts`` -> ``first_token_s``, ``last_token_ts`` -> ``finish_s``; vLLM's monotonic
clock is the one ``simpy.rt`` runs on) and ``num_cached_tokens`` the cache hit (``vllm``,
``vllm-apc``: vLLM's prefix cache is the only tier, ``hit_tokens_gpu``). ragsim's own engine
gets no work: its counters stay zero and the summary's engine fields are vLLM's.

``ragcache`` runs the pipeline's knowledge tree (PGDSF) inside vLLM as its host tier, a KV
connector (``connector.py``): ``hit_tokens_gpu`` is then vLLM's own prefix-cache hit,
``hit_tokens_host`` what the connector loaded from host memory, and the tree's own view of the
same request is in ``tree_hit_tokens_gpu``/``tree_hit_tokens_host``; the summary's tree fields
(evictions, swaps) are the tree's decisions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import simpy

from ragsim.errors import RagsimInputError
from ragsim.profiles.allocator import memory_allocator
from ragsim.profiles.profile import Profile
from ragsim.realrun.clock import WakeableClock
from ragsim.realrun.cores import EngineCore
from ragsim.realrun.search import RealSearchDriving
from ragsim.realrun.speed import SpeedProbe
from ragsim.realrun.tokens import PromptTokens, trace_texts
from ragsim.realrun.vllm.engine import (
    BLOCK_MULTIPLE_TOKENS,
    CPU_BLOCK_TOKENS,
    TREE_CONNECTOR,
    EngineSettings,
    build_engine,
    greedy,
    smallest_block_tokens,
)
from ragsim.serving.config import SimConfig
from ragsim.serving.engine import Job
from ragsim.serving.pipeline import Pipeline, Progress, RunResult, planned_arrivals, requests_to_run
from ragsim.traces.schema import Trace

SYSTEMS = ("vllm", "vllm-apc", "ragcache")


class _NoIterations:
    """ragsim's engine is idle under this backend (vLLM serves every request): it must never
    be asked to run an iteration, of either scheduler (the configuration's ``scheduler`` is the
    simulation's model of vLLM's steps, which vLLM runs its own way: ``validate`` gives both
    sides the same configuration)."""

    def _never(self, *args, **kwargs):
        raise AssertionError("--backend vllm: ragsim's engine got work; vLLM serves requests")

    prefill = decode = mixed = leave = gpu_failed = recovery_s = recover = _never


# What vLLM's engine does whatever a configuration says, as the configuration's fields: (the
# value, the option that sets it, why). ``check_config`` refuses a configuration that says
# otherwise; ``engine_terms`` gives the values to simulate a vLLM run with.
ENGINE_FIXED = {
    "speculate": (False, "--speculate",
                  "vLLM prefills the final list only (no speculative pipelining)"),
    "reorder": (False, "--reorder", "vLLM schedules first come first served"),
}


PROMPTS_PER_STEP = ("vLLM takes prompts into a step while its token budget and max_num_seqs "
                    "(max_batch_size) allow, however many")


def engine_terms(config: SimConfig, *, on_cpu: bool) -> dict:
    """How vLLM's engine runs ``config``, as the simulator's fields: ``ENGINE_FIXED``'s values,
    as many prompts a step as requests may run (``PROMPTS_PER_STEP``) and, with its prefix
    cache, hits counted in whole blocks of the smallest block it pages
    (``smallest_block_tokens``) and shared by the requests of one batch (vLLM v1 caches a block
    when it schedules it, so a batch mate's blocks are hits). ``ragsim validate`` simulates a
    vLLM run on these terms where its configuration does not set them."""
    terms = {name: value for name, (value, _, _) in ENGINE_FIXED.items()}
    # vLLM's scheduler takes prompts into a step while its token budget and max_num_seqs
    # allow, with no limit of its own on how many (at overload a step of 57 prompts where
    # ragsim's default let 8, and the simulation served a third of vLLM's prompts a step)
    terms["max_prefill_bs"] = config.max_batch_size
    if config.cache:
        terms.update(prefix_block_tokens=smallest_block_tokens(on_cpu), batch_kv_sharing=True)
    return terms


def check_config(config: SimConfig) -> None:
    """Refuse what vLLM's engine does not do, naming the option."""
    if config.system not in SYSTEMS:
        raise RagsimInputError(
            f"--backend vllm runs the systems {', '.join(SYSTEMS)}, got {config.system!r}",
            field="--system")
    tiered = config.system == "ragcache"  # the tree's host tier is the connector's
    if tiered and not config.cache:
        raise RagsimInputError("ragcache on vLLM is its knowledge tree: not with --no-cache",
                               field="--no-cache")
    refused = (*((name, getattr(config, name) != value, flag, why)
                 for name, (value, flag, why) in ENGINE_FIXED.items()),
               ("host_cache_bytes", not tiered and config.cache and config.host_cache_bytes > 0,
                "--host-mem", "vLLM's prefix cache has no host tier (--system ragcache adds one)"),
               ("fail_gpu_at_s", bool(config.fail_gpu_at_s), "--fail-gpu-at",
                "faults are not injected into vLLM"),
               ("gpu_failure_rate_per_h", config.gpu_failure_rate_per_h > 0,
                "--gpu-failure-rate", "faults are not injected into vLLM"),
               ("host_replicas", not tiered and config.cache and config.host_replicas > 0,
                "--host-replicas", "vLLM's prefix cache has no host tier"),
               ("overlap_swap", config.overlap_swap, "--overlap-swap",
                "the host tier's copies finish before vLLM's step starts"))
    for name, on, flag, why in refused:
        if on:
            hint = ("; ragcache's preset turns it on: give --no-speculate --no-reorder"
                    if tiered and name in ("speculate", "reorder") else "")
            raise RagsimInputError(f"not with --backend vllm: {why}{hint}", field=flag)


def engine_settings(trace: Trace, config: SimConfig, profile: Profile, seed: int,
                    threads: int | None = None) -> EngineSettings:
    """vLLM's engine arguments for this run: the configuration's limits, KV budget and prefix
    block (the simulator's ``--block-tokens`` is vLLM's ``block_size``), and its CPU threads:
    ``threads``, else those the profile was measured with where it timed vLLM on a CPU (a
    step's price holds only at the thread count it was timed at)."""
    block = config.prefix_block_tokens if config.cache else CPU_BLOCK_TOKENS
    if block < BLOCK_MULTIPLE_TOKENS or block % BLOCK_MULTIPLE_TOKENS:
        raise RagsimInputError(f"vLLM pages KV in blocks of a multiple of "
                               f"{BLOCK_MULTIPLE_TOKENS} tokens, got {block}",
                               field="--block-tokens")
    longest = int((config.system_prompt_tokens + trace.doc_tokens_per_request + trace.query_tokens
                   + trace.output_tokens).max()) if trace.n_requests else 1
    max_len = -(-max(longest, 1) // block) * block
    return EngineSettings(
        prefix_caching=config.cache, block_tokens=block,
        kv_cache_bytes=int(config.gpu_kv_bytes or profile.kv_capacity_bytes),
        max_num_seqs=config.max_batch_size,
        max_batched_tokens=max(config.max_batched_tokens, max_len),
        max_model_len=max_len, seed=seed,
        kv_connector=TREE_CONNECTOR if config.system == "ragcache" else None,
        threads=threads or profiled_threads(profile))


def profiled_threads(profile: Profile) -> int | None:
    """The CPU threads a vLLM profile timed the engine with (None: not a vLLM CPU profile)."""
    threads = profile.obtained.get("threads")
    measured_here = profile.engine.startswith("vLLM") and profile.obtained.get(
        "device_type") == "cpu"
    return int(threads) if measured_here and isinstance(threads, int) and threads > 0 else None


def warm_up_prompts(settings: EngineSettings, kv_bytes_per_token: int) -> list[list[int]]:
    """Prompts that vLLM's scheduler takes into one step of the run's token budget
    (``max_batched_tokens``), each within ``max_model_len`` and ``max_num_seqs`` of them, their
    KV within half the engine's KV memory; each of other tokens, so no prompt hits another's
    cached blocks."""
    per = max(1, settings.max_model_len - 1)  # room for the one token each generates
    tokens = min(settings.max_batched_tokens, settings.max_num_seqs * per,
                 settings.kv_cache_bytes // max(1, 2 * kv_bytes_per_token))
    prompts, left = [], tokens
    while left > 0:
        n = min(per, left)
        prompts.append([3 + len(prompts)] * n)
        left -= n
    return prompts


class VllmRun(RealSearchDriving, Pipeline):
    """The pipeline on a wall clock, every request served by vLLM's engine."""

    # with each generated token, the log-probabilities of this many most likely tokens
    # (``self.logprobs``, per request: exactness tests compare them; None: not asked)
    logprobs_top: int | None = None
    weights_std: float | None = None  # None: vLLM's dummy weights (``EngineSettings``)

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile, *, seed: int = 0,
                 progress: Progress | None = None, speed_probes: bool = True,
                 threads: int | None = None) -> None:
        check_config(config)
        self.speed_probes = speed_probes  # time the profile's grid points before and after
        self.seed = seed
        self.settings = dataclasses.replace(engine_settings(trace, config, profile, seed,
                                                            threads),
                                            weights_std=self.weights_std)
        arrivals = planned_arrivals(trace, config)
        first_s = float(arrivals.min()) if len(arrivals) and config.arrival != "sequential" \
            else 0.0
        env = WakeableClock(initial_time=first_s)
        tiered = self.settings.kv_connector is not None
        super().__init__(trace, config, profile, env=env, iterations=lambda tree: _NoIterations(),
                         progress=progress, record_moves=tiered)
        # ragcache: the pipeline's own tree becomes vLLM's host tier (connector.py, which
        # imports vLLM: only then)
        self._tree_key = kv_transfer = self.connector = None
        if tiered:
            from ragsim.realrun.vllm import connector

            self._tree_key = connector.register_tree(self.tree)
            kv_transfer = connector.transfer_config(self._tree_key, self.settings.block_tokens)
        self.llm, self._model_dir = build_engine(profile.model, self.settings, kv_transfer)
        if tiered:
            self.connector = connector.connector_side(self._tree_key, "scheduler")
        self.r_tree_hit_gpu = np.zeros(self.n, dtype=np.int64)
        self.r_tree_hit_host = np.zeros(self.n, dtype=np.int64)
        texts, why_no_text = trace_texts(trace)
        self.tokens = PromptTokens(trace, config.system_prompt_tokens, profile.model.vocab_size,
                                   texts, why_no_text)
        self.tokens.encode_ahead()  # before the clock: a front end's work, not the engine's
        self._jobs: dict[str, Job] = {}
        self._work: simpy.Event | None = None
        # request -> the token ids vLLM generated (greedy; exactness is tested on them)
        self.outputs: dict[int, list[int]] = {}
        self.prompts: dict[int, list[int]] = {}  # request -> the prompt vLLM was given
        self.logprobs: dict[int, list[dict[int, float]]] = {}  # with ``logprobs_top``
        self.steps = 0
        self.step_s = 0.0
        # time between two steps while requests were waiting for the engine (the harness's
        # handling of outputs, arrivals and vLLM's add_request): engine time no price has
        # (validate measures it through this loop: ``realrun/vllm/loop.py``)
        self.between_steps_s = 0.0
        self.between_steps = 0
        # requests handed to vLLM while it had work: their intake lands between two steps
        # (``realrun/vllm/loop.py`` fits the loop's time on them and on the steps)
        self.submitted_while_busy = 0
        # the trace's staged faiss search on the search workers, as the torch run has it
        # (``search_latency = "trace"`` on a trace built with text), else the modelled times
        self.start_real_search()
        self._warm_up()
        # each step as the decisions vLLM's scheduler made in it (``ragsim.decisions``)
        self.decisions: list[dict] = []
        self.submitted_s: dict[int, float] = {}  # job -> when it was added to vLLM
        self._chunked: set[int] = set()  # jobs a recorded step has taken a chunk of
        self._scheduled = _watch_scheduler(self.llm)

    def _warm_up(self) -> None:
        """Before the clock starts, two small requests through the engine (the first steps pay
        for allocations no later one does), then one step as large as the run's token budget
        allows (``warm_up_prompts``); the prefix cache is emptied after them.

        Why the large step: a new engine's first step above the sizes it has run faults its
        new memory in, page by page, and a served step pays that only in the first minutes of
        a server's life. On the project's 2-core CPU (2026-12-05, vLLM 2 layers x 256 hidden):
        a new engine's first 2,023-token step took 235 ms against 108 ms run again (8,212
        page faults, 124 ms of system time), its first 4,000-token step 441 against 277 ms, and
        a second engine in the same process paid them again. In the 50% load validation
        of run F the steps of 1,024+ tokens ran 1.5-1.6x their prices. The step's token
        count is among those the run's engine had run (``engine_warm_step_tokens``), so the
        simulation of the run charges it no growth either (``validation.warmed_like``)."""
        for n, ids in enumerate(([1] * 40, [2] * 24)):
            self.llm.add_request(f"warm-up-{n}", {"prompt_token_ids": ids}, greedy(2))
        while self.llm.has_unfinished_requests():
            self.llm.step()
        for n, ids in enumerate(warm_up_prompts(self.settings, self.kv)):
            self.llm.add_request(f"warm-up-budget-{n}", {"prompt_token_ids": ids}, greedy(1))
        while self.llm.has_unfinished_requests():
            self.llm.step()
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ the engine
    def _submit(self, job: Job) -> None:
        """Hand the job to vLLM (not to ragsim's pool)."""
        ids = self.tokens.of(job.docs, job.doc_tokens, job.request, job.query_tokens)
        job.context_tokens = len(ids)
        key = str(job.key)
        self._jobs[key] = job
        self.submitted_s[job.key] = self.env.now
        prompt = ids.tolist()  # Python ints, as vLLM takes them
        self.prompts[job.request] = prompt
        params = None
        if self.connector is not None:
            from ragsim.realrun.vllm.connector import request_params

            params = request_params(job.docs, job.doc_tokens, job.query_tokens, job.request)
        self.submitted_while_busy += self.llm.has_unfinished_requests()
        self.llm.add_request(key, {"prompt_token_ids": prompt},
                             greedy(job.output_tokens, params, self.logprobs_top))
        if self._work is not None and not self._work.triggered:
            self._work.succeed()

    def _serve(self):
        """Step vLLM while it has requests; sleep until one is added."""
        env, llm = self.env, self.llm
        last_ended = None  # the end of the step before, while the engine had work
        while True:
            if not llm.has_unfinished_requests():
                last_ended = None  # idle: the time until the next request is not the loop's
                self._work = env.event()
                yield self._work
                self._work = None
                continue
            if self._scheduled is not None:
                self._scheduled.clear()
            started = time.monotonic()
            if last_ended is not None:
                self.between_steps_s += started - last_ended
                self.between_steps += 1
            outputs = llm.step()
            ended = last_ended = time.monotonic()
            self.steps += 1
            self.step_s += ended - started
            self._record_step(self._env_time(started), self._env_time(ended))
            # the clock moves to the wall time the step ended at (it may have been late when
            # the step began): vLLM's timestamps of this step lie before it
            yield env.timeout(max(0.0, self._env_time(ended) - env.now))
            for output in outputs:
                self._on_output(output)

    def _record_step(self, start_s: float, end_s: float) -> None:
        """The step just run as its scheduler's decisions: the prompt chunks it scheduled
        (job key, request, tokens computed before, cached ones included, tokens taken, host
        tier bytes loaded with a first chunk), which of them finished their prompt, and the
        decodes (how many, their mean context)."""
        if self._scheduled is None:
            return
        saved = self.connector.take_blocks_saved() * self.settings.block_tokens \
            if self.connector is not None else 0
        chunks, completing, contexts = [], [], []
        started = 0  # jobs whose first chunk this step takes
        for out in self._scheduled:
            scheduled = out.num_scheduled_tokens
            cached = out.scheduled_cached_reqs
            before = [(new.req_id, new.num_computed_tokens) for new in out.scheduled_new_reqs]
            before += list(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
            for req_id, computed in before:
                # vLLM's scheduler knows a request by its id with a random suffix of its own
                job = self._jobs.get(req_id) or self._jobs.get(req_id.rsplit("-", 1)[0])
                take = int(scheduled.get(req_id, 0))
                if job is None or take == 0:
                    continue
                prompt = job.context_tokens
                if computed >= prompt:
                    contexts.append(computed)
                    continue
                record = self.connector.records.get(job.request) \
                    if self.connector is not None and computed > 0 else None
                loaded = record.external * self.kv if record is not None else 0
                chunks.append((job.key, job.request, int(computed), take, int(loaded)))
                if job.key not in self._chunked:
                    self._chunked.add(job.key)
                    started += 1
                if computed + take >= prompt:
                    completing.append(job.key)
        if chunks or contexts:
            decision = {
                "kind": "mixed", "start_s": start_s, "end_s": end_s, "jobs": chunks,
                "completing": completing, "size": len(contexts),
                "context_tokens": float(np.mean(contexts)) if contexts else 0.0,
                "requests_started": started}
            if self.connector is not None:  # what its worker saved in the step (tokens)
                decision["saved_tokens"] = saved
            self.decisions.append(decision)

    def _env_time(self, monotonic_s: float) -> float:
        """A vLLM timestamp (its engine core's ``time.monotonic()``) on the run's clock."""
        return self.env.env_time(monotonic_s)

    def _on_output(self, output) -> None:
        job = self._jobs[output.request_id]
        metrics = output.metrics
        if job.first_token_s < 0 and output.outputs and output.outputs[0].token_ids:
            cached = int(output.num_cached_tokens or 0)
            job.alpha = job.hit_gpu = cached
            job.beta = job.context_tokens - cached
            record = self.connector.records.get(job.request) \
                if self.connector is not None else None
            if record is not None:  # vLLM's prefix cache, then the connector's host tier
                job.hit_gpu, job.hit_host = cached - record.external, record.external
                job.swap_in_bytes = record.external * self.kv
                self.r_tree_hit_gpu[job.request] = record.tree_hit_gpu
                self.r_tree_hit_host[job.request] = record.tree_hit_host
            job.recomputed = 0
            job.prefill_start_s = self._env_time(metrics.scheduled_ts)
            job.first_token_s = self._env_time(metrics.first_token_ts)
            self.prefilled(job)
        if output.finished:
            job.done = True
            del self._jobs[output.request_id]
            self.outputs[job.request] = list(output.outputs[0].token_ids)
            if self.logprobs_top is not None:
                self.logprobs[job.request] = [{t: lp.logprob for t, lp in step.items()}
                                              for step in output.outputs[0].logprobs]
            finish_s = self._env_time(metrics.last_token_ts)
            self.finished(job)
            self.r_finish[job.request] = finish_s

    # ------------------------------------------------------------------ run
    def _probe(self) -> SpeedProbe | None:
        """The machine's speed now on this engine (``speed.probe_vllm_speed``); the prefix
        cache is emptied after it, so the probes' prompts take nothing from the run's."""
        from ragsim.realrun.vllm.profile import VllmTimer
        from ragsim.realrun.vllm.speed import probe_vllm_speed

        timer = VllmTimer(self.llm, self.settings, self.profile.model.vocab_size, self.seed)
        probe = probe_vllm_speed(timer, self.profile)
        self.llm.reset_prefix_cache()
        return probe if probe.points else None

    def run(self) -> RunResult:
        from ragsim.realrun.vllm.shapes import step_tokens_run

        before = self._probe() if self.speed_probes else None
        # the step sizes this process had run before the clock started (its warm-up, probes,
        # earlier runs and profile): their first-time price is paid (``Profile.warmed``)
        warm = step_tokens_run()
        # the engine's thread on a core of its own while it serves, the run's others on the
        # rest, as its profile timed it (``realrun/cores.py``)
        self.env.process(self._serve())
        result = self.serve_on_engine_core(EngineCore(self.settings.threads))
        self._fix_records(result)
        result.engine_warm_step_tokens = warm
        result.summary["engine_warm_step_tokens"] = len(warm)
        # which: a stored run's simulation can be run again as validate ran it
        # (benchmarks/resimulate_point.py)
        result.summary["engine_warm_step_token_counts"] = [int(t) for t in warm]  # in order
        self._note_built_capacity(result)
        if self._scheduled is not None:  # for ``validate --replay-decisions``
            result.decisions = {"iterations": self.decisions, "submitted_s": self.submitted_s}
        result.summary.update(self._vllm_fields(result))
        if self.connector is not None:
            result.columns["tree_hit_tokens_gpu"] = self.r_tree_hit_gpu
            result.columns["tree_hit_tokens_host"] = self.r_tree_hit_host
            result.summary.update(self._tree_fields(result))
        if self._jobs:  # cut short (Ctrl-C, SIGTERM): what vLLM still holds is dropped
            self.llm.abort_request(list(self._jobs))
            self._jobs.clear()
        after = self._probe() if before is not None and not result.summary["interrupted"] \
            else None
        if after is not None:
            result.summary.update(speed_ratio_before=before.ratio, speed_ratio_after=after.ratio,
                                  speed_probes={"before": before.points,
                                                "after": after.points})
        return result

    def _note_built_capacity(self, result: RunResult) -> None:
        """How many token counts this process's oneDNN keeps built (``shape_cache_counts``: the
        capacity this process runs with), recorded for the simulation of the run
        (``validation.warmed_like``), and said where the profile was measured keeping another
        number: a profile measured on the default, run under ``ONEDNN_PRIMITIVE_CACHE_CAPACITY
        =4096``, would charge rebuilds the engine never does."""
        from ragsim.realrun.vllm.profile import shape_cache_counts

        kept = shape_cache_counts(self.profile.model)
        result.engine_built_capacity_counts = kept
        result.summary["engine_built_capacity_counts"] = kept
        shapes = self.profile.new_shapes
        measured = shapes.built_capacity_counts if shapes is not None else None
        if shapes is not None and measured != kept:
            profiled = ("records no such bound" if measured is None
                        else f"was measured keeping {measured:,}")
            result.summary.setdefault("warnings", []).append(
                f"vLLM's engine keeps {kept:,} token counts built in this process "
                f"(ONEDNN_PRIMITIVE_CACHE_CAPACITY); its profile {profiled}: the simulation "
                "of this run prices the engine's bound")

    def _fix_records(self, result: RunResult) -> None:
        """Columns derived from ``finish_s`` before vLLM's finish times were set."""
        cols = result.columns
        done = cols["status"] == "completed"
        cols["e2e_s"] = np.where(done, cols["finish_s"] - cols["arrival_s"], np.nan)
        decode = np.maximum(self.trace.output_tokens - 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["tpot_s"] = np.where(done & (decode > 0), (cols["finish_s"]
                                      - cols["first_token_s"]) / np.maximum(decode, 1), np.nan)

    def _tree_fields(self, result: RunResult) -> dict:
        """The connector's work and the tree's view of the hits, next to vLLM's."""
        cols = result.columns
        served = np.isfinite(cols["first_token_s"])
        from ragsim.realrun.vllm.connector import connector_side, forget

        worker = connector_side(self._tree_key, "worker")
        forget(self._tree_key)
        doc_tokens = int(cols["doc_tokens"][served].sum())
        tree_gpu = int(self.r_tree_hit_gpu[served].sum())
        tree_host = int(self.r_tree_hit_host[served].sum())
        return {"host_tier": {**self.connector.stats(), "bytes_held": worker.bytes_held,
                              "peak_bytes_held": worker.peak_bytes_held,
                              "load_s": worker.load_s, "save_s": worker.save_s,
                              "blocks_copied_in": worker.blocks_copied_in,
                              "blocks_copied_out": worker.blocks_copied_out,
                              "tree_host_capacity_bytes": int(self.tree.host_capacity_bytes)},
                "tree_hit_tokens_gpu": tree_gpu, "tree_hit_tokens_host": tree_host,
                "tree_token_hit_rate": (tree_gpu + tree_host) / doc_tokens
                if doc_tokens else 0.0}

    def _vllm_fields(self, result: RunResult) -> dict:
        import vllm

        elapsed = result.summary["elapsed_s"]
        from ragsim.realrun.vllm import platform_device

        fields = {"backend": "vllm", "device": platform_device(), "model": self.profile.model.name,
                  "vllm_version": vllm.__version__, "vllm_engine": self.settings.as_dict(),
                  "allocator": memory_allocator(),
                  "engine_steps": self.steps, "engine_step_s": self.step_s,
                  "engine_between_steps_s": self.between_steps_s,
                  "engine_between_steps": self.between_steps,
                  "engine_requests_while_busy": self.submitted_while_busy,
                  "engine_between_steps_mean_ms": (1e3 * self.between_steps_s
                                                   / self.between_steps
                                                   if self.between_steps else 0.0),
                  "iterations_prefill": 0, "iterations_decode": 0,
                  "gpu_busy_fraction": self.step_s / elapsed if elapsed > 0 else 0.0,
                  "token_ids": self.tokens.report.as_dict(),
                  "search": self.search_fields(),
                  "vllm_counters": _counters(self.llm)}
        not_vllms = "iterations, scheduler decisions" if self.connector is not None \
            else "iterations, scheduler decisions, evictions"
        fields["warnings"] = [*result.summary.get("warnings", []),
                              f"--backend vllm: ragsim's engine fields ({not_vllms}) are not "
                              "vLLM's; engine_steps and engine_step_s are"]
        return fields


def _watch_scheduler(llm) -> list | None:
    """A list that receives every ``SchedulerOutput`` vLLM's in-process scheduler returns (its
    ``schedule`` wrapped, results passed on unchanged), or None where the engine core is not
    in this process (its scheduler's decisions are then not seen)."""
    core = getattr(getattr(llm, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "schedule"):
        return None
    seen: list = []
    schedule = scheduler.schedule

    def watched(*args, **kwargs):
        out = schedule(*args, **kwargs)
        seen.append(out)
        return out

    scheduler.schedule = watched
    return seen


def _counters(llm) -> dict:
    """vLLM's own prefix-cache counters (its Prometheus metrics), where it exposes them."""
    wanted = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
              "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
              "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens")
    found = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # an engine built without stats: nothing to report
        return found
    for metric in metrics:
        if metric.name in wanted and hasattr(metric, "value"):
            found[metric.name.removeprefix("vllm:")] = found.get(
                metric.name.removeprefix("vllm:"), 0) + metric.value
    return found


def run_vllm(trace: Trace, config: SimConfig, profile: Profile, *, seed: int = 0,
             progress: Callable[[int, float], None] | None = None,
             threads: int | None = None) -> RunResult:
    """Serve ``trace`` under ``config`` with vLLM, in real time, on the profile's model, on
    ``threads`` CPU threads (None: the profile's, ``engine_settings``)."""
    from ragsim.realrun.vllm.engine import release_engines

    trace = requests_to_run(trace, config)
    started = time.perf_counter()
    try:
        result = VllmRun(trace, config, profile, seed=seed, progress=progress,
                         threads=threads).run()
    finally:
        release_engines()  # the run's engine, dropped with it: its memory back
    result.summary["setup_s"] = time.perf_counter() - started - result.summary["elapsed_s"]
    return result

