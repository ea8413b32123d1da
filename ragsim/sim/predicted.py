"""The simulator's iterations: each takes the time the cost profile predicts for it.

A single prefill costs T(alpha, beta) from the profile's bilinear grid, a batch the batched
prefill model (priced on that grid), a decode step the decode grid at the batch's mean context
or, where the profile's engine pads its decode batch (``decode_padding``), at the batch's common
end (``PaddedDecodeBatch``, the rule that engine lays its batch out by).
Host hits are copied host->GPU at the profile's measured bandwidth, before the prefill or, with
``overlap_swap``, while it computes (the iteration takes the longer of the two). A step that
begins after the engine sat idle pays the profile's cold start for the pause
(``profile.idle_start``; the first step of a run, with no step before it, the longest pause's).
A decode step after a step with prompts pays the profile's ``decode_after_prompt`` extra for
its position after it and that step's size (a batch's first steps after a join). A decode step
that changes a padded batch first writes its rows (``profile.batch_copy``: the rows x tokens the
layout's rule says it writes).
After a GPU failure the engine restarts (``gpu_recovery_s``) and copies the system prompt back.
The engine's serving loop (``EngineLoop``: a configuration's ``engine_loop_step_s``,
``engine_loop_request_s`` and ``engine_loop_search_s``) adds its time to the steps: each step
begun as the one before ended (a busy engine) pays the loop's time between two steps, and each
request pays its intake with its first prompt chunk, and there also what its search cost the
engine (its search ran beside the busy engine).
A KV connector's work inside the steps (``ConnectorCosts``: a configuration's
``connector_request_s``, ``connector_save_s_per_token`` and ``connector_load_s_per_token``) is
part of a step's price: a request's tree work with its first chunk, the saves of the documents
the tree admits for it with the chunks that compute them, and its host-tier loads at the
connector's rate where it was measured.
With a configuration's ``step_time_sigma`` each step's whole time is then drawn around that
price (``serving.step_noise``: one of the runs a real engine might have); without it every step
takes its price.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import simpy

from ragsim.profiles.decode_after_prompt import AfterPrompt
from ragsim.profiles.decode_layout import PaddedDecodeBatch
from ragsim.profiles.new_shapes import NewShapeCharge
from ragsim.profiles.profile import Profile
from ragsim.serving.connector_costs import ConnectorCosts, saved_in_chunk
from ragsim.serving.costs import (
    blend_selection_s,
    decode_step_s,
    mixed_step_s,
    prefill_compute_s,
    step_overhead_s,
)
from ragsim.serving.engine import Job, PrefillTiming, Wait
from ragsim.serving.engine_loop import EngineLoop
from ragsim.serving.step_noise import StepTimeNoise


class PredictedIterations:
    """``ragsim.serving.engine.Iterations`` with the profile's predicted durations."""

    def __init__(self, env: simpy.Environment, profile: Profile, overlap_swap: bool,
                 reuse_kind: str = "prefix", loop: EngineLoop | None = None,
                 noise: StepTimeNoise | None = None,
                 connector: ConnectorCosts | None = None) -> None:
        self.env = env
        self.loop = loop
        self.connector = connector  # a KV connector's work in the steps (None: none)
        self.noise = noise  # each step's time drawn around its price (None: at its price)
        # position-free reuse: a blended prefill computes the recomputed tokens with the new
        # ones (in the jobs' alpha/beta) and, for blend, first runs the selection pass
        self.reuse_kind = reuse_kind
        self.overlap_swap = overlap_swap
        self.profile = profile
        self._h2d = profile.transfers.host_to_device_s
        # the first-time price of a step's token count (``profile.new_shapes``; none without)
        self.new_shape = NewShapeCharge(profile.new_shapes)
        # per step of the last priced run: off the grid? (None: all on it)
        self._run_outside: list[bool] | None = None
        # when the last step ended (None: no step yet): a step begun later pays a cold start
        self._last_end_s: float | None = None
        # the engine's padded decode batch, followed step by step (None: a paged engine); a
        # run of steps of an unchanging batch (``decode_durations``) is laid out once, its
        # end then a token further each step
        self.layout = PaddedDecodeBatch() if profile.decode_padding == "common_end" else None
        # where the last step with prompts was (the decode steps after one pay the profile's
        # extra by their position and its size)
        self.after_prompt = AfterPrompt(profile.decode_after_prompt)

    def _cold_start_s(self) -> float:
        """What the step beginning now pays for the engine's idle time before it."""
        if self.profile.idle_start is None:
            return 0.0
        last = self._last_end_s
        return self.profile.idle_start_s(float("inf") if last is None else self.env.now - last)

    def _loop_s(self, jobs: Iterable[Job] = ()) -> float:
        """What the step beginning now pays for the engine's loop (``EngineLoop``): its
        ``jobs`` not prefilled yet take their first chunk in it. Nothing is counted without a
        loop (every simulation's steps pass here)."""
        if self.loop is None:
            return 0.0
        return self.loop.seconds(self._last_end_s == self.env.now,
                                 sum(1 for j in jobs if j.prefilled == 0))

    def _copy_s(self, swap_bytes: int) -> float:
        """The host->GPU copy of a step's host-tier hits: at the connector's measured rate
        where there is one, else at the profile's transfer bandwidth."""
        if not swap_bytes:
            return 0.0
        if self.connector is not None:
            load = self.connector.load_s(swap_bytes, self.profile.model.kv_bytes_per_token)
            if load is not None:
                return load
        return self._h2d(swap_bytes)

    def _connector_s(self, chunks: Iterable[tuple[Job, int]]) -> float:
        """A KV connector's work in a step that takes ``chunks``: the tree's work on each job
        whose first chunk it is, the saves of the tokens the chunks compute of the documents
        the tree admitted for their jobs (``saved_in_chunk``)."""
        connector = self.connector
        if connector is None:
            return 0.0
        new = saved = 0
        for job, take in chunks:
            new += job.prefilled == 0
            if job.computing:
                saved += saved_in_chunk(sum(n.tokens for n in job.computing), job.prefilled,
                                        take)
        return connector.seconds(new, saved)

    def timing(self, jobs: list[Job]) -> PrefillTiming:
        compute = prefill_compute_s(self.profile, [j.alpha for j in jobs],
                                    [j.beta for j in jobs], self.new_shape)
        if self.reuse_kind == "blend":
            compute += blend_selection_s(self.profile, "blend",
                                         sum(j.free_hit_tokens for j in jobs))
        compute += self._connector_s((j, j.beta) for j in jobs)
        swap_bytes = sum(j.swap_in_bytes for j in jobs)
        copy = self._copy_s(swap_bytes)
        duration = max(compute, copy) if self.overlap_swap else compute + copy
        return PrefillTiming(duration_s=duration, compute_s=compute, copy_s=copy)

    def prefill(self, jobs: list[Job]) -> Wait:
        timing = self.timing(jobs)
        self.after_prompt.charge(sum(j.beta for j in jobs))
        # on top of the step: a copy beside it does not hide it
        cold = self._cold_start_s() + self._loop_s(jobs)
        if cold:
            timing = PrefillTiming(duration_s=timing.duration_s + cold,
                                   compute_s=timing.compute_s + cold, copy_s=timing.copy_s)
        if self.noise is not None:
            k = self.noise.factor()
            timing = PrefillTiming(duration_s=timing.duration_s * k,
                                   compute_s=timing.compute_s * k, copy_s=timing.copy_s * k)
        yield self.env.timeout(timing.duration_s)
        self._last_end_s = self.env.now
        return timing

    def mixed(self, chunks: list[tuple[Job, int]], decoding: set[Job],
              mean_context_tokens: float) -> Wait:
        """A mixed step, priced by ``serving.costs.mixed_step_s``: the prefill chunks as one
        batched prefill (each chunk over its job's context so far) plus, where the profile
        measured mixed steps, what the decode rows add to such a step; without that
        measurement, plus a whole decode step (additive: an upper bound, it pays a step's fixed
        cost and the weight reads twice). Host hits are copied before a job's first chunk (or
        beside the compute, with ``overlap_swap``)."""
        compute = mixed_step_s(self.profile, [j.alpha + j.prefilled for j, _ in chunks],
                               [take for _, take in chunks], len(decoding),
                               mean_context_tokens, self.new_shape)
        if self.layout is not None and decoding:  # its rows took a token (priced at the mean:
            self._padded_context(decoding)          # mixed steps are measured as such)
            self.layout.advance()
        if self.reuse_kind == "blend":  # the selection pass, before a job's first chunk
            compute += blend_selection_s(self.profile, "blend", sum(
                j.free_hit_tokens for j, _ in chunks if j.prefilled == 0))
        compute += self._connector_s(chunks)
        swap_bytes = sum(j.swap_in_bytes for j, _ in chunks if j.prefilled == 0)
        copy = self._copy_s(swap_bytes)
        duration = max(compute, copy) if self.overlap_swap else compute + copy
        # the cold start on top of the step, as ``prefill`` and the replay charge it (a copy
        # beside the compute does not hide it)
        cold = self._cold_start_s() + self._loop_s(j for j, _ in chunks)
        compute, duration = compute + cold, duration + cold
        if self.noise is not None:
            k = self.noise.factor()
            compute, duration, copy = compute * k, duration * k, copy * k
        # its chunks are prompts: its decode rows pay nothing
        self.after_prompt.charge(sum(take for _, take in chunks))
        yield self.env.timeout(duration)
        self._last_end_s = self.env.now
        return PrefillTiming(duration_s=duration, compute_s=compute, copy_s=copy)

    def _batch_write_s(self) -> float:
        """What the step just laid out pays to write its batch's changed rows
        (``profile.batch_copy``; 0 where the batch did not change)."""
        layout = self.layout
        return self.profile.batch_copy_s(layout.written_rows, layout.written_row_tokens)

    def _padded_context(self, jobs: set[Job]) -> float:
        """The padded batch laid out for ``jobs`` (a joiner's context is its ``context_tokens``:
        it joins at its first step): the batch's common end."""
        self.layout.plan(jobs, _context_tokens)
        return self.layout.end_tokens

    def decode(self, jobs: set[Job], mean_context_tokens: float) -> Wait:
        context, write = mean_context_tokens, 0.0
        if self.layout is not None:
            context = self._padded_context(jobs)
            write = self._batch_write_s()  # a changed batch's rows, written first
            self.layout.advance()
        duration = decode_step_s(self.profile, len(jobs), context, self.new_shape) + write
        duration += self._cold_start_s() + self._loop_s() + self.after_prompt.charge(None)
        if self.noise is not None:
            duration *= self.noise.factor()
        yield self.env.timeout(duration)
        self._last_end_s = self.env.now
        return duration

    def decode_durations(self, batch_size: int, context_sum_tokens: int,
                         steps: int, jobs: Collection[Job] = ()) -> list[float]:
        """``steps`` decode steps of an unchanging batch (``jobs``), priced as ``decode`` would
        price each (every step adds a token to each request's context): the engine's decode
        runs. A run may end before its last step (a job arrives); ``decode_run_ended`` then
        says how many ran, and only their lookups count as the cost model's extrapolations.

        A padded batch is laid out once, as ``decode`` lays out the run's first step: its rows
        do not change within the run, so no later step rebuilds it, and step i runs over the
        first step's end plus i tokens, which the grid prices as a batch whose contexts sum to
        ``batch_size`` times that end (exact: integers)."""
        profile = self.profile
        write = 0.0
        if self.layout is not None:
            context_sum_tokens = batch_size * self._padded_context(jobs)
            write = self._batch_write_s()
        grid = profile.decode
        counted = grid.extrapolated_queries
        durations = grid.at_steps(batch_size, context_sum_tokens, steps)
        if profile.step_overhead is not None:  # as decode_step_s prices each step
            overhead = step_overhead_s(profile, batch_size)
            durations = [d + overhead for d in durations]
        if steps:  # as decode_step_s: every step has the batch's token count; the first may
            # pay a cold start, and each its position after the last prompt step (recorded
            # when the run ends)
            durations[0] += self.new_shape(batch_size) + self._cold_start_s() + self._loop_s()
            durations[0] += write  # a changed batch: its first step writes it
            durations = [d + extra for d, extra in
                         zip(durations, self.after_prompt.due(steps), strict=True)]
            if self.loop is not None and self.loop.step_s:  # each later step follows one
                durations[1:] = [d + self.loop.step_s for d in durations[1:]]
        if self.noise is not None:  # each step's own draw, as ``decode`` would take it
            durations = [d * k for d, k in zip(durations, self.noise.factors(steps),
                                               strict=True)]
        self._run_outside = None  # the usual case: every step on the grid
        if grid.extrapolated_queries != counted:  # which steps were off it, one by one
            grid.extrapolated_queries = counted
            outside = self._run_outside = []
            for i in range(steps):
                grid.at(batch_size, (context_sum_tokens + batch_size * i) / batch_size)
                outside.append(grid.extrapolated_queries != counted)
                grid.extrapolated_queries = counted
        return durations

    def decode_run_ended(self, steps_run: int) -> None:
        """The last priced run ended after ``steps_run`` steps (now): count their
        extrapolations."""
        self._last_end_s = self.env.now
        self.after_prompt.decodes(steps_run)  # each a decode step, as ``decode`` records
        if self.layout is not None:  # each step took a token, as ``decode`` advances it
            self.layout.advance(steps_run)
        if self._run_outside is not None:
            self.profile.decode.extrapolated_queries += sum(self._run_outside[:steps_run])

    def leave(self, job: Job) -> None:
        pass  # no tensors to free

    def gpu_failed(self) -> None:
        self.after_prompt.reset()
        if self.layout is not None:
            self.layout.reset()

    def recovery_s(self, restart_s: float, root_bytes: int) -> float:
        return restart_s + self._h2d(root_bytes)

    def recover(self, restart_s: float, root_bytes: int) -> Wait:
        yield self.env.timeout(self.recovery_s(restart_s, root_bytes))
        self._last_end_s = self.env.now


def _context_tokens(job: Job) -> int:
    return job.context_tokens


def predicted_iterations(env: simpy.Environment, profile: Profile, overlap_swap: bool,
                         loop: EngineLoop | None = None, noise: StepTimeNoise | None = None,
                         connector: ConnectorCosts | None = None):
    """The iterations factory a simulated pipeline is given (it calls it with its tree): one
    place, so that one engine and every replica of a fleet price alike (the tree's reuse rule
    decides whether a prefill pays CacheBlend's selection pass); ``noise``: that engine's
    step-time draws (``serving.step_noise``); ``connector``: its KV connector's work."""
    return lambda tree: PredictedIterations(env, profile, overlap_swap, tree.reuse.kind, loop,
                                            noise, connector)
