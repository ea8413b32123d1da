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
clock is the one ``simpy.rt`` runs on) and ``num_cached_tokens`` the cache hit (vLLM's prefix
cache is its only tier: ``hit_tokens_gpu``). ragsim's own engine and knowledge tree are built by
the pipeline but get no work: their counters stay zero and the summary's engine fields are
vLLM's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import simpy
import simpy.rt

from ragsim.errors import RagsimInputError
from ragsim.profiles.profile import Profile
from ragsim.realrun.speed import SpeedProbe
from ragsim.realrun.tokens import PromptTokens, trace_texts
from ragsim.realrun.vllm.engine import (
    CPU_BLOCK_TOKENS,
    EngineSettings,
    build_engine,
    greedy,
)
from ragsim.serving.config import SimConfig
from ragsim.serving.engine import Job
from ragsim.serving.pipeline import Pipeline, Progress, RunResult, planned_arrivals, requests_to_run
from ragsim.traces.schema import Trace

SYSTEMS = ("vllm", "vllm-apc")


class _NoIterations:
    """ragsim's engine is idle under this backend (vLLM serves every request): it must never
    be asked to run an iteration."""

    def _never(self, *args, **kwargs):
        raise AssertionError("--backend vllm: ragsim's engine got work; vLLM serves requests")

    prefill = decode = leave = gpu_failed = recovery_s = recover = _never


def check_config(config: SimConfig) -> None:
    """Refuse what vLLM's engine does not do, naming the option."""
    if config.system not in SYSTEMS:
        raise RagsimInputError(
            f"--backend vllm runs the systems {', '.join(SYSTEMS)}, got {config.system!r} "
            "(RAGCache inside vLLM, as a KV connector, is not built yet: docs/vllm.md)",
            field="--system")
    refused = (("speculate", config.speculate, "--speculate",
                "vLLM prefills the final list only (no speculative pipelining)"),
               ("reorder", config.reorder, "--reorder", "vLLM schedules first come first served"),
               ("host_cache_bytes", config.cache and config.host_cache_bytes > 0, "--host-mem",
                "vLLM's prefix cache has no host tier"),
               ("fail_gpu_at_s", bool(config.fail_gpu_at_s), "--fail-gpu-at",
                "faults are not injected into vLLM"),
               ("gpu_failure_rate_per_h", config.gpu_failure_rate_per_h > 0,
                "--gpu-failure-rate", "faults are not injected into vLLM"),
               ("host_replicas", config.cache and config.host_replicas > 0, "--host-replicas",
                "vLLM's prefix cache has no host tier"),
               ("overlap_swap", config.overlap_swap, "--overlap-swap",
                "vLLM's prefix cache has no host tier"))
    for _name, on, flag, why in refused:
        if on:
            raise RagsimInputError(f"not with --backend vllm: {why}", field=flag)


def engine_settings(trace: Trace, config: SimConfig, profile: Profile, seed: int
                    ) -> EngineSettings:
    """vLLM's engine arguments for this run: the configuration's limits, KV budget and prefix
    block (the simulator's ``--block-tokens`` is vLLM's ``block_size``)."""
    block = config.prefix_block_tokens if config.cache else CPU_BLOCK_TOKENS
    if block < 16 or block % 16:
        raise RagsimInputError(f"vLLM pages KV in blocks of a multiple of 16 tokens, got "
                               f"{block}", field="--block-tokens")
    cumulative = np.concatenate(([0], np.cumsum(trace.doc_tokens_flat)))
    docs = cumulative[trace.doc_offsets[1:]] - cumulative[trace.doc_offsets[:-1]]
    longest = int((config.system_prompt_tokens + docs + trace.query_tokens
                   + trace.output_tokens).max()) if trace.n_requests else 1
    max_len = -(-max(longest, 1) // block) * block
    return EngineSettings(
        prefix_caching=config.cache, block_tokens=block,
        kv_cache_bytes=int(config.gpu_kv_bytes or profile.kv_capacity_bytes),
        max_num_seqs=config.max_batch_size,
        max_batched_tokens=max(config.max_batched_tokens, max_len),
        max_model_len=max_len, seed=seed)


class VllmRun(Pipeline):
    """The pipeline on a wall clock, every request served by vLLM's engine."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile, *, seed: int = 0,
                 progress: Progress | None = None, speed_probes: bool = True) -> None:
        check_config(config)
        self.speed_probes = speed_probes  # time the profile's grid points before and after
        self.seed = seed
        self.settings = engine_settings(trace, config, profile, seed)
        self.llm, self._model_dir = build_engine(profile.model, self.settings)
        arrivals = planned_arrivals(trace, config)
        first_s = float(arrivals.min()) if len(arrivals) and config.arrival != "sequential" \
            else 0.0
        env = simpy.rt.RealtimeEnvironment(initial_time=first_s, factor=1.0, strict=False)
        super().__init__(trace, config, profile, env=env, iterations=lambda tree: _NoIterations(),
                         progress=progress)
        texts, why_no_text = trace_texts(trace)
        self.tokens = PromptTokens(trace, config.system_prompt_tokens, profile.model.vocab_size,
                                   texts, why_no_text)
        self._jobs: dict[str, Job] = {}
        self._work: simpy.Event | None = None
        # request -> the token ids vLLM generated (greedy; exactness is tested on them)
        self.outputs: dict[int, list[int]] = {}
        self.prompts: dict[int, list[int]] = {}  # request -> the prompt vLLM was given
        self.steps = 0
        self.step_s = 0.0
        self._warm_up()

    def _warm_up(self) -> None:
        """Two requests through the engine before the clock starts (the first steps pay for
        allocations no later one does); the prefix cache is emptied after them."""
        for n, ids in enumerate(([1] * 40, [2] * 24)):
            self.llm.add_request(f"warm-up-{n}", {"prompt_token_ids": ids}, greedy(2))
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
        prompt = [int(t) for t in ids]
        self.prompts[job.request] = prompt
        self.llm.add_request(key, {"prompt_token_ids": prompt}, greedy(job.output_tokens))
        if self._work is not None and not self._work.triggered:
            self._work.succeed()

    def _serve(self):
        """Step vLLM while it has requests; sleep until one is added."""
        env, llm = self.env, self.llm
        while True:
            if not llm.has_unfinished_requests():
                self._work = env.event()
                yield self._work
                self._work = None
                continue
            started = time.monotonic()
            outputs = llm.step()
            ended = time.monotonic()
            self.steps += 1
            self.step_s += ended - started
            # the clock moves to the wall time the step ended at (it may have been late when
            # the step began): vLLM's timestamps of this step lie before it
            yield env.timeout(max(0.0, self._env_time(ended) - env.now))
            for output in outputs:
                self._on_output(output)

    def _env_time(self, monotonic_s: float) -> float:
        """A vLLM timestamp (its engine core's ``time.monotonic()``) on the run's clock."""
        env = self.env
        return env.env_start + (monotonic_s - env.real_start) / env.factor

    def _on_output(self, output) -> None:
        job = self._jobs[output.request_id]
        metrics = output.metrics
        if job.first_token_s < 0 and output.outputs and output.outputs[0].token_ids:
            cached = int(output.num_cached_tokens or 0)
            job.alpha = job.hit_gpu = cached
            job.beta = job.context_tokens - cached
            job.recomputed = 0
            job.prefill_start_s = self._env_time(metrics.scheduled_ts)
            job.first_token_s = self._env_time(metrics.first_token_ts)
            self.prefilled(job)
        if output.finished:
            job.done = True
            del self._jobs[output.request_id]
            self.outputs[job.request] = list(output.outputs[0].token_ids)
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
        before = self._probe() if self.speed_probes else None
        self.env.process(self._serve())
        self.env.sync()  # the clock starts now, not when the engine was built
        result = super().run()
        self._fix_records(result)
        result.summary.update(self._vllm_fields(result))
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

    def _fix_records(self, result: RunResult) -> None:
        """Columns derived from ``finish_s`` before vLLM's finish times were set."""
        cols = result.columns
        done = cols["status"] == "completed"
        cols["e2e_s"] = np.where(done, cols["finish_s"] - cols["arrival_s"], np.nan)
        decode = np.maximum(self.trace.output_tokens - 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["tpot_s"] = np.where(done & (decode > 0), (cols["finish_s"]
                                      - cols["first_token_s"]) / np.maximum(decode, 1), np.nan)

    def _vllm_fields(self, result: RunResult) -> dict:
        import vllm

        elapsed = result.summary["elapsed_s"]
        fields = {"backend": "vllm", "device": "cpu", "model": self.profile.model.name,
                  "vllm_version": vllm.__version__, "vllm_engine": self.settings.as_dict(),
                  "engine_steps": self.steps, "engine_step_s": self.step_s,
                  "iterations_prefill": 0, "iterations_decode": 0,
                  "gpu_busy_fraction": self.step_s / elapsed if elapsed > 0 else 0.0,
                  "token_ids": self.tokens.report.as_dict(),
                  "vllm_counters": _counters(self.llm)}
        fields["warnings"] = [*result.summary.get("warnings", []),
                              "--backend vllm: ragsim's engine fields (iterations, scheduler "
                              "decisions, evictions) are not vLLM's; engine_steps and "
                              "engine_step_s are"]
        return fields


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
             progress: Callable[[int, float], None] | None = None) -> RunResult:
    """Serve ``trace`` under ``config`` with vLLM, in real time, on the profile's model."""
    trace = requests_to_run(trace, config)
    started = time.perf_counter()
    run = VllmRun(trace, config, profile, seed=seed, progress=progress)
    result = run.run()
    result.summary["setup_s"] = time.perf_counter() - started - result.summary["elapsed_s"]
    return result

