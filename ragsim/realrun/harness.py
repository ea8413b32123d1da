"""``ragsim run --backend torch``: the serving pipeline in real time on a real model.

The same pipeline as the simulator (``ragsim.serving``: arrivals, staged search, the request
pool, the engine's continuous batching over the knowledge tree, faults, records, summary), on a
wall clock (``clock.WakeableClock``: ``simpy.rt``, not strict, woken by the search workers; an
iteration that overruns is late, never an error) with ``TorchIterations``: every prefill and
decode is a forward pass of a real transformer, the tree's nodes hold real KV tensors, tier
moves are real copies. A trace built with its text is searched for real (``search.py``);
otherwise searches take the trace's recorded or the modelled stage times, waited in real time.

The model is the one the profile describes (``profile.model``), built with random weights, on
the thread count the profile was measured with, so the simulator's costs and this engine are
the same machine's. The run writes the same per-request columns and summary as ``ragsim run``,
plus the real engine's own accounting (``engine_*``) and ``backend``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ragsim.errors import RagsimInputError
from ragsim.profiles.allocator import memory_allocator
from ragsim.profiles.decode_after_prompt import AfterPrompt
from ragsim.profiles.new_shapes import NewShapeCharge
from ragsim.profiles.profile import Profile
from ragsim.profiles.torch_model import TorchModel, step_tokens_run
from ragsim.realrun.answers.stage import real_answer_stage
from ragsim.realrun.clock import WakeableClock
from ragsim.realrun.cores import EngineCore
from ragsim.realrun.engine import KVStore
from ragsim.realrun.iterations import TorchIterations
from ragsim.realrun.memory import grow_heap_before_clock
from ragsim.realrun.page_faults import PageFaults
from ragsim.realrun.search import RealSearchDriving
from ragsim.realrun.speed import probe_speed
from ragsim.realrun.tokens import PromptTokens, trace_texts
from ragsim.serving.config import SimConfig
from ragsim.serving.costs import decode_step_s, prefill_compute_s
from ragsim.serving.pipeline import Pipeline, Progress, RunResult, planned_arrivals, requests_to_run
from ragsim.traces.schema import Trace

# a CPU-only machine holds the model's weights in fp32: past this, --backend torch refuses
CPU_MODEL_LIMIT_BYTES = 4 * 2**30


def model_bytes(profile: Profile) -> int:
    """Roughly the weights' bytes (embeddings, attention, MLP; fp32 on a CPU)."""
    m = profile.model
    attention = m.hidden_size * m.head_dim * (2 * m.num_attention_heads + 2 * m.num_kv_heads)
    mlp = 3 * m.hidden_size * m.intermediate_size * m.num_experts
    params = m.num_layers * (attention + mlp) + 2 * m.vocab_size * m.hidden_size
    return 4 * params


class RealRun(RealSearchDriving, Pipeline):
    """The pipeline on a wall clock with a real engine."""

    def __init__(self, trace: Trace, config: SimConfig, profile: Profile, *,
                 device: str = "cpu", threads: int | None = None, model_seed: int = 0,
                 progress: Progress | None = None, speed_probes: bool = True,
                 clock_start_s: float | None = None, start=None) -> None:
        if device == "cpu" and model_bytes(profile) > CPU_MODEL_LIMIT_BYTES:
            raise RagsimInputError(
                f"profile {profile.name} describes {profile.model.name} "
                f"(~{model_bytes(profile) / 2**30:.0f} GiB of fp32 weights), too large for the "
                "torch backend on a CPU; use a scaled-down profile (cpu-mistral-7b-l2-h256) or "
                "measure one: ragsim profile --model M --layers 2 --hidden 256",
                field="--profile")
        if threads is None:
            threads = profile.obtained.get("threads") or None
        self.threads = threads
        self.speed_probes = speed_probes  # time the profile's grid points before and after
        self.model = TorchModel.build(profile.model, device=device, dtype=profile.model.dtype,
                                      threads=threads, seed=model_seed)
        arrivals = planned_arrivals(trace, config)
        first_s = float(arrivals.min()) if len(arrivals) and config.arrival != "sequential" \
            else 0.0
        if clock_start_s is not None:  # a fleet's replica: the fleet's clock, not its own
            first_s = clock_start_s
        self.start = start  # a fleet's barrier: every replica's clock starts at once
        env = WakeableClock(initial_time=first_s)
        self.iterations: TorchIterations | None = None
        model = self.model
        texts, why_no_text = trace_texts(trace)

        def iterations(tree):
            store = KVStore(model.device, gpu_capacity_bytes=tree.gpu_capacity_bytes,
                            host_capacity_bytes=tree.host_capacity_bytes)
            tokens = PromptTokens(trace, tree.system_prompt_tokens, profile.model.vocab_size,
                                  texts, why_no_text)
            tokens.encode_ahead()  # before the clock: a front end's work, not the engine's
            self.iterations = TorchIterations(env, tree, model, store, tokens, profile,
                                              overlap_swap=config.overlap_swap)
            return self.iterations

        super().__init__(trace, config, profile, env=env, iterations=iterations,
                         record_moves=True, progress=progress, answers=real_answer_stage)
        self.start_real_search()
        self.submitted_s: dict[int, float] = {}  # job -> when it entered the request pool
        self._warm_up()

    def _warm_up(self) -> None:
        """One pass of each kind before the clock starts: the first call of a model pays for
        allocations and kernel choices that no later request does."""
        from ragsim.profiles.torch_model import Row

        ids = list(range(1, 33))
        done = self.model.prefill([Row(None, ids, 0), Row(None, ids[:16], 0)])
        self.model.decode(done.batch, [1, 2])
        self.model.sync()

    def _submit(self, job) -> None:
        self.submitted_s[job.key] = self.env.now  # a decision's earliest start, for replays
        super()._submit(job)

    def run(self) -> RunResult:
        before = probe_speed(self.model, self.profile) if self.speed_probes else None
        # the memory its largest batch can take, grown before the clock as a serving engine
        # sets its KV memory up at start (``realrun.memory.grow_heap_before_clock``)
        faults_before = PageFaults.now()
        heap = grow_heap_before_clock(self.model, self.profile.model, self.trace, self.config)
        heap_faults = PageFaults.now().since(faults_before)
        if self.start is not None:
            self.start.wait()
        # the step sizes this process had run before the clock started (its warm-up, probes,
        # profile and earlier runs): their first-time price is paid (``Profile.warmed``)
        warm = self._warm_steps = step_tokens_run()
        # the engine's thread on a core of its own while it serves, the run's others on the
        # rest, as its profile timed it (``realrun/cores.py``); not a fleet's replica, whose
        # engines share the process's threads
        on_cpu = self.model.device.type == "cpu"
        why_not = None
        if self.start is not None:
            why_not = "a fleet's replicas share the process's cores"
        elif not on_cpu:
            why_not = f"the engine runs on {self.model.device.type}"
        core = EngineCore(self.threads if on_cpu else None, why_not=why_not)
        result = self.serve_on_engine_core(core)
        result.summary.update(self._real_fields())
        # pages faulted in growing it: a heap the allocator had kept faults few, one handed
        # back to the system since the last run faults them all again (``realrun/page_faults``)
        result.summary.update(heap_grown_before_clock_bytes=heap["bytes"],
                              heap_grown_before_clock_s=heap["seconds"],
                              heap_grown_before_clock_minor_page_faults=heap_faults.minor)
        result.engine_warm_step_tokens = warm
        result.summary["engine_warm_step_tokens"] = len(warm)
        # which, in order: a stored run's simulation can be run again as validate ran it
        result.summary["engine_warm_step_token_counts"] = [int(t) for t in warm]
        if self.iterations is not None:  # for ``validate --replay-decisions``
            result.decisions = {"iterations": self.iterations.decisions,
                                "submitted_s": self.submitted_s}
        if before is not None:
            after = probe_speed(self.model, self.profile)
            result.summary.update(speed_ratio_before=before.ratio, speed_ratio_after=after.ratio,
                                  speed_probes={"before": before.points,
                                                "after": after.points})
        if self.config.overlap_swap and self.model.device.type != "cuda":
            # said, not hidden: a CPU has no copy engine to overlap with
            result.summary["warnings"].append(
                "--overlap-swap on a CPU: host hits are copied layer by layer as the prefill "
                "reaches each layer, but nothing copies beside the compute, so the copies are "
                "not hidden as the simulator hides them (on CUDA they run on their own stream)")
        return result

    def _real_fields(self) -> dict:
        it = self.iterations
        fields = {"backend": "torch", "device": str(self.model.device),
                  "model": self.profile.model.name, "threads": self.threads,
                  "allocator": memory_allocator()}
        if it is not None:
            fields.update(it.times.as_dict())
            # the engine's loop, as the vLLM run reports its own (``engine_loop``)
            fields.update(engine_between_steps_s=it.between_steps_s,
                          engine_between_steps=it.between_steps,
                          engine_requests_while_busy=it.requests_after_step,
                          engine_between_steps_mean_ms=(1e3 * it.between_steps_s
                                                        / it.between_steps
                                                        if it.between_steps else 0.0))
            # priced as the simulation of this run prices it: the sizes run before it warm
            fields["cost_model_errors"] = cost_model_errors(it.log, self.profile.warmed(
                getattr(self, "_warm_steps", ())))
            fields["engine_store_gpu_bytes"] = it.store.gpu_bytes
            fields["engine_store_host_bytes"] = it.store.host_bytes
            fields["token_ids"] = it.tokens.report.as_dict()
        fields["search"] = self.search_fields()
        return fields


def cost_model_errors(log: list[tuple], profile: Profile) -> dict:
    """How the profile's predictions compare with the iterations as they ran, per kind:
    single prefills, batched prefills, decode steps (rebuilt batches apart). Per kind: how many,
    the median of predicted / measured, the median and p90 of |predicted - measured| /
    measured, and how many (and how much measured time) lay past what the profile measured
    (priced by extrapolation). This separates the cost model's error from the queueing it
    causes, and an extrapolation from a wrong model. Priced as the simulator prices them, the
    first-time price of a step's token count included (``new_shapes``, in the log's order), and
    the cold start of one begun after the engine sat idle (``idle_start``, the log's pause) and
    the extra of the decode steps after a prefill (``decode_after_prompt``)."""
    new_shape = NewShapeCharge(profile.new_shapes)
    after_prompt = AfterPrompt(profile.decode_after_prompt)
    prefill_x, prefill_y = max(profile.prefill.x_axis), max(profile.prefill.y_axis)
    decode_x, decode_y = max(profile.decode.x_axis), max(profile.decode.y_axis)
    kinds: dict[str, list[list]] = {}
    for entry in log:
        if entry[0] == "prefill":
            _, cached, new, seconds, _copy, pause = entry
            kind = "prefill_single" if len(cached) == 1 else "prefill_batch"
            predicted = prefill_compute_s(profile, cached, new, new_shape)
            after_prompt.charge(int(sum(new)))
            padded_new = len(new) * max(new)  # what a padded batch prices on the grid
            beyond = max(cached) > prefill_x or padded_new > prefill_y
        else:
            _, size, mean_context, seconds, rebuilt, pause, padded = entry
            kind = "decode_rebuilt" if rebuilt else "decode"
            context = profile.decode_context_tokens(mean_context, padded)
            predicted = decode_step_s(profile, size, context, new_shape)
            predicted += after_prompt.charge(None)
            beyond = size > decode_x or context > decode_y
        predicted += profile.idle_start_s(pause)
        columns = kinds.setdefault(kind, [[], [], []])
        columns[0].append(predicted)
        columns[1].append(seconds)
        columns[2].append(beyond)
    result = {}
    for kind, (predicted, measured, beyond) in sorted(kinds.items()):
        p, m, past = np.array(predicted), np.array(measured), np.array(beyond, dtype=bool)
        errors = np.abs(p - m) / m
        result[kind] = {"iterations": len(m), "median_ratio": float(np.median(p / m)),
                        "median_abs_error": float(np.median(errors)),
                        "p90_abs_error": float(np.percentile(errors, 90)),
                        "measured_s": float(m.sum()), "predicted_s": float(p.sum()),
                        "beyond_profile_iterations": int(past.sum()),
                        "beyond_profile_measured_s": float(m[past].sum())}
    return result


def run_real(trace: Trace, config: SimConfig, profile: Profile, *, device: str = "cpu",
             threads: int | None = None, seed: int = 0,
             progress: Callable[[int, float], None] | None = None) -> RunResult:
    """Serve ``trace`` under ``config`` for real, in real time, on the profile's model."""
    trace = requests_to_run(trace, config)
    started = time.perf_counter()
    run = RealRun(trace, config, profile, device=device, threads=threads, model_seed=seed,
                  progress=progress)
    result = run.run()
    result.summary["setup_s"] = time.perf_counter() - started - result.summary["elapsed_s"]
    return result
