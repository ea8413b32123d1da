"""The real run's decisions priced by the simulator's costs: which part of a TTFT error is the
cost model's, which the decisions'.

A validation's TTFT error mixes two causes. The simulator prices an iteration differently from
what it took (the cost model), and it decides differently (admission, batching, speculation:
when a real search stage ends a hair later than modelled, another batch forms, and a queue
follows). ``replay`` separates them: it takes the real run's own sequence of iterations (each
with the jobs it ran, in the order they ran, ``TorchIterations.decisions``), prices each with
the simulator's cost functions (``serving.costs``: the same T(alpha, beta) grid, batched-prefill
model, decode grid and host->GPU copy the simulation charges) and re-times the sequence: an
iteration starts when the one before it ended, or when its last job entered the request pool
(the real run's submission time), whichever is later. A request's replayed first token is the
replayed end of the prefill that gave it its first token (or its search's end, when a kept
speculation waited for it).

A vLLM run's steps are its own scheduler's: each ``step()`` is recorded as the chunks it
scheduled (a request's computed tokens so far, cached ones included, and the tokens it took)
and its decodes (``VllmRun``), and priced as the simulator prices a mixed step; a request's
first token comes with the step whose chunk finished its prompt.

The replay and the real run share every decision and differ only in costs, so

* ``cost_model_error`` = (replayed mean TTFT - real mean TTFT) / real mean TTFT, and
* ``decision_error`` = the rest of the TTFT mean error (simulated - replayed, over the same
  real mean): what the simulator's own decisions (and its search times) add.

They are shares of the real mean TTFT and add up to the report's ``ttft_mean_error``, as the
components' ``share_of_ttft`` do. The same decisions replayed at each iteration's *measured*
duration split the cost model's share once more:

* ``step_price_error`` = (replayed at prices - replayed at measured durations) / real mean:
  what the profile's prices of the steps themselves add, and
* ``outside_steps_error`` = (replayed at measured durations - real mean) / real mean: the
  engine thread's time outside its steps (taking a request in, the harness's loop between
  steps, the other work that runs there) past what the configuration's engine loop
  (``EngineLoop``, charged in both replays as in the simulation) accounts for.

The replay keeps the real run's submission times, so a decision the engine made because of
real costs (which request waited for which batch) stays as it was: that is the point.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ragsim.profiles.decode_after_prompt import AfterPrompt
from ragsim.profiles.new_shapes import NewShapeCharge
from ragsim.profiles.profile import Profile
from ragsim.serving.connector_costs import ConnectorCosts
from ragsim.serving.costs import decode_step_s, mixed_step_s, prefill_compute_s
from ragsim.serving.engine_loop import EngineLoop

# a first token at the end of an iteration is recorded at that end: compared with this slack
_SAME_TIME_S = 1e-9


def priced_s(decision: dict, profile: Profile, overlap_swap: bool = False,
             new_shape: NewShapeCharge | None = None,
             after_prompt: AfterPrompt | None = None,
             connector: ConnectorCosts | None = None) -> float:
    """What the simulator charges for one real iteration (``PredictedIterations``' prices).
    ``new_shape``: the token counts run so far (one per replay, fed the iterations in their
    order), for the first-time price of a step's token count where the profile has one;
    ``after_prompt``: where the last step with prompts was (one per replay, fed likewise), for
    the extra of the decode steps after one (``decode_after_prompt``); ``connector``: a KV
    connector's work in the step (the jobs it started, ``requests_started``, and the tokens its
    worker saved, ``saved_tokens``, as the real run recorded them; its loads at its rate)."""
    prompts = runs_prompts(decision)
    extra = after_prompt.charge(prompt_tokens(decision)) \
        if after_prompt is not None and prompts is not None else 0.0
    if decision["kind"] == "decode":
        context = profile.decode_context_tokens(decision["context_tokens"],
                                                decision.get("padded_context_tokens"))
        # the rows a changed padded batch wrote, as the engine counted them (``batch_copy``)
        return decode_step_s(profile, decision["size"], context, new_shape) + extra \
            + profile.batch_copy_s(decision.get("batch_rows") or 0,
                                   decision.get("batch_row_tokens") or 0)
    jobs = decision["jobs"]
    if decision["kind"] == "mixed":  # as ``PredictedIterations.mixed``
        compute = mixed_step_s(profile, [j[2] for j in jobs], [j[3] for j in jobs],
                               decision["size"], decision["context_tokens"], new_shape) \
            if jobs or decision["size"] else 0.0
    else:
        compute = prefill_compute_s(profile, [j[2] for j in jobs], [j[3] for j in jobs],
                                    new_shape) if jobs else 0.0
    swap_bytes = sum(j[4] for j in jobs)
    copy = None
    if connector is not None:
        compute += connector.seconds(int(decision.get("requests_started", 0)),
                                     int(decision.get("saved_tokens", 0)))
        if swap_bytes:
            copy = connector.load_s(swap_bytes, profile.model.kv_bytes_per_token)
    if copy is None:
        copy = profile.transfers.host_to_device_s(swap_bytes) if swap_bytes else 0.0
    return (max(compute, copy) if overlap_swap else compute + copy) + extra


def prompt_tokens(decision: dict) -> int | None:
    """The new tokens of the prompts a real step ran (None: it ran none), what
    ``AfterPrompt`` records a step by."""
    jobs = decision.get("jobs")
    return int(sum(job[3] for job in jobs)) if jobs else None


def runs_prompts(decision: dict) -> bool | None:
    """Whether a real step ran prompts (a prefill, or a vLLM step with prompt chunks: True), or
    only decodes (a decode step, or a vLLM step of decodes alone: False); None for a step that
    ran neither, which changes nothing (``AfterPrompt``)."""
    if decision.get("jobs"):
        return True
    return False if decision.get("size") else None


def measured_s(decision: dict) -> float:
    """What the real iteration took (a replay at these prices gives the real run back, less
    the time the engine spent between iterations)."""
    return decision["end_s"] - decision["start_s"]


def replay(decisions: list[dict], submitted_s: dict[int, float], columns: dict[str, np.ndarray],
           price: Callable[[dict], float], *, closed_loop: bool = False,
           cold_start: Callable[[float], float] | None = None,
           loop: EngineLoop | None = None) -> np.ndarray:
    """Per request (the run's rows): the TTFT the real run's decisions give when each
    iteration costs ``price(decision)`` (``priced_s``: the simulator's prices; NaN where the
    request did not complete); a request no prefill served (an answer cache hit) keeps its
    real TTFT.

    ``closed_loop`` (a sequential run: each request arrives when the one before ended): a
    request arrives in the replay as late as the replay runs behind the real run when it comes
    (its arrival, search and entry into the pool shifted by that much). Replayed on the real
    arrival times instead, prices 30% above the machine's made every request queue behind the
    ones before it (a replay of an idle run at +2,900% of its TTFT).

    ``cold_start`` (``Profile.idle_start_s``): what an iteration that begins after the replayed
    engine sat idle pays for the pause, as the simulator charges it (the first iteration, with
    none before it, pays for an infinite one).

    ``loop`` (``EngineLoop``, the configuration's): the engine's loop as the simulator charges
    it, by the same rule: a step that begins as the replayed one before it ended pays its
    time between steps, and each job its intake with the first step that takes a chunk of
    it. Charged at measured durations too, the rest is what the loop's model misses."""
    first_token = np.asarray(columns["first_token_s"], float)
    arrival = np.asarray(columns["arrival_s"], float)
    search_end = np.asarray(columns["search_end_s"], float)
    ttft = first_token - arrival  # replaced below for every request a prefill served
    # request -> the replayed end of its prefill that ended last by its first token (that one
    # gave it: a terminated speculation's earlier prefill did not)
    served: dict[int, float] = {}
    shift: dict[int, float] = {}  # closed loop: request -> how late it arrives in the replay
    replayed_end = -np.inf
    behind = 0.0  # closed loop: the replay's last iteration's end less the real one's
    taken: set = set()  # jobs a replayed step has taken a chunk of (their intake is paid)
    for decision in decisions:
        jobs = decision.get("jobs", ())
        if closed_loop:
            for _, request, *_ in jobs:
                shift.setdefault(request, behind)
        ready = max((submitted_s.get(j[0], decision["start_s"]) + shift.get(j[1], 0.0)
                     for j in jobs), default=-np.inf)
        start = decision["start_s"] if not np.isfinite(replayed_end) else max(replayed_end,
                                                                                 ready)
        cold = cold_start(start - replayed_end) if cold_start is not None else 0.0
        if loop is not None:
            new_jobs = {j[0] for j in jobs} - taken
            taken |= new_jobs
            cold += loop.seconds(start == replayed_end, len(new_jobs))
        replayed_end = start + price(decision) + cold
        behind = max(replayed_end - decision["end_s"], 0.0)
        # a vLLM step: the chunks that finished their prompts (vLLM stamps the first token
        # inside the step); a prefill: every job, unless the request's first token came
        # before the prefill ended (a later attempt's)
        completing = decision.get("completing")
        for key, request, *_ in jobs:
            if key in completing if completing is not None \
                    else decision["end_s"] <= first_token[request] + _SAME_TIME_S:
                served[request] = replayed_end
    for request, replayed in served.items():
        if np.isfinite(first_token[request]):
            late = shift.get(request, 0.0)
            ttft[request] = max(replayed, search_end[request] + late) - arrival[request] - late
    return ttft


def split_error(joined, replayed_ttft: np.ndarray, request_ids: np.ndarray,
                measured_ttft: np.ndarray | None = None) -> dict:
    """The TTFT mean error split into ``cost_model_error`` and ``decision_error`` (shares of
    the real mean TTFT over the requests both runs completed; they add up to the TTFT mean
    error), with the replay's own errors against the real run. ``replayed_ttft`` is aligned
    with the real run's rows, whose ids are ``request_ids``; so is ``measured_ttft`` (the
    replay at measured durations), which splits ``cost_model_error`` into
    ``step_price_error`` and ``outside_steps_error``."""
    row_of = {int(r): k for k, r in enumerate(np.asarray(request_ids).tolist())}
    rows = np.array([row_of[int(r)] for r in joined["request_id"].tolist()], dtype=np.int64)
    real = joined["ttft_s_real"].to_numpy(float)
    sim = joined["ttft_s_sim"].to_numpy(float)
    replayed = replayed_ttft[rows]
    real_mean = float(real.mean())
    cost = (float(replayed.mean()) - real_mean) / real_mean
    total = (float(sim.mean()) - real_mean) / real_mean
    per_request = np.abs(replayed - real) / real
    split = {}
    if measured_ttft is not None:
        at_measured = float(measured_ttft[rows].mean())
        outside = (at_measured - real_mean) / real_mean
        split = {"step_price_error": cost - outside, "outside_steps_error": outside,
                 "measured_replay_ttft_mean_s": at_measured}
    return {"cost_model_error": cost, "decision_error": total - cost, **split,
            "replayed_ttft_mean_s": float(replayed.mean()),
            "replayed_ttft_p90_abs_error": float(np.percentile(per_request, 90)),
            "replay_iterations_from": "the real run's iterations, priced by the simulator's "
                                      "costs (ragsim.decisions)"}


# where the table of steps by size splits (a step's tokens: the prompt tokens it took plus one
# for each request it decoded): a decode step, small, mid-sized and large prompt steps, and
# the steps a burst builds, past the quick profile plan's grid of 3,072 new tokens
STEP_TOKEN_EDGES = (64, 256, 1024, 4096)


def step_tokens(decision: dict) -> int:
    """The tokens one step computed: its prompt chunks' new tokens, plus one for each request
    it decoded (a decode or a mixed step)."""
    new = sum(job[3] for job in decision.get("jobs", ()))
    return new + (decision.get("size", 0) if decision["kind"] != "prefill" else 0)


def priced_steps(decisions: list[dict], price: Callable[[dict], float],
                 cold_start: Callable[[float], float] | None = None) -> list[dict]:
    """Every step of a run, one row each, measured against what ``price`` charges for it
    (called on every step, in the run's order, as the replay calls it: a first-time price
    depends on what ran before), plus ``cold_start`` of the engine's idle time before the step
    as the run measured it (the first step: an infinite one), as ``replay`` charges it. Why a
    row per step: where prices miss is a question of the steps' shapes (rows, tokens, padded
    ends), which groups by size hide; ``validate --replay-decisions`` writes these rows to each
    real run's ``steps.parquet``. ``after_prompts``: a step of decodes alone right after a
    step that ran prompts (the batch's first after a join), ``decodes_after_prompts`` a
    decode-only step's position after the last one (1: right after; 0: a step with prompts, or
    none before it): what ``decode_after_prompt`` charges by."""
    rows = []
    last_end = -np.inf
    steps_so_far = AfterPrompt(None)  # the replay's rule, for which steps it charges
    for index, decision in enumerate(decisions):
        jobs = decision.get("jobs") or ()
        cold = cold_start(decision["start_s"] - last_end) if cold_start is not None else 0.0
        new = [job[3] for job in jobs]
        position = steps_so_far.record(prompt_tokens(decision)) \
            if runs_prompts(decision) is not None else 0
        rows.append({
            "step": index, "kind": decision["kind"], "start_s": decision["start_s"],
            "prompt_rows": len(jobs),
            "decode_rows": int(decision.get("size") or 0) if decision["kind"] != "prefill"
            else 0,
            "new_tokens": int(sum(new)), "longest_new_tokens": int(max(new, default=0)),
            "longest_cached_tokens": int(max((job[2] for job in jobs), default=0)),
            # each prompt row's shape, in the step's order: a step's price is a function of
            # them, so a step can be timed again apart from its run (benchmarks/run_batches.py)
            "row_cached_tokens": [int(job[2]) for job in jobs],
            "row_new_tokens": [int(job[3]) for job in jobs],
            "swap_in_bytes": int(sum(job[4] for job in jobs)),
            "step_tokens": step_tokens(decision),
            "context_tokens": decision.get("context_tokens"),
            "padded_context_tokens": decision.get("padded_context_tokens"),
            "measured_s": measured_s(decision), "priced_s": price(decision) + cold,
            "cold_start_s": cold,
            "after_prompts": position == 1, "decodes_after_prompts": position,
            # a torch decode step that changed its padded batch: how, the time it took apart
            # from the forward pass, and the rows and row-tokens it wrote (``TorchIterations``)
            "batch_change": decision.get("batch_change"),
            "batch_copy_s": decision.get("batch_copy_s"),
            "batch_rows": decision.get("batch_rows"),
            "batch_row_tokens": decision.get("batch_row_tokens"),
            # the time in the model's passes, and the engine thread's CPU time over the step
            # (a torch run's; None on vLLM): wall time past the CPU time the thread was not
            # running, waiting for the interpreter's lock or for its core
            "passes_s": decision.get("passes_s"),
            "engine_cpu_s": decision.get("engine_cpu_s")})
        last_end = decision["end_s"]
    return rows


def prices_by_step_size(decisions: list[dict], price: Callable[[dict], float],
                        edges: tuple[int, ...] = STEP_TOKEN_EDGES,
                        cold_start: Callable[[float], float] | None = None) -> list[dict]:
    """The steps of a run grouped by their tokens (``step_tokens``, between consecutive
    ``edges``), each group's measured time against its price (``priced_steps``). Why: one
    ratio over a run hides where the prices miss; a burst's few large steps carry every
    request behind them (run W, CPU vLLM at 90% load: the steps of 4,096+ tokens ran
    1.19-1.41x their price, the mid-sized ones 0.93-1.11x; docs/validation.md)."""
    return by_step_size(priced_steps(decisions, price, cold_start), edges)


def size_class(step_tokens: int, edges: tuple[int, ...] = STEP_TOKEN_EDGES) -> int:
    """A step's size class: how many of ``edges`` its tokens reach (0: under the first)."""
    return sum(step_tokens >= edge for edge in edges)


def by_step_size(steps: list[dict], edges: tuple[int, ...] = STEP_TOKEN_EDGES) -> list[dict]:
    """``priced_steps`` rows grouped by their tokens between consecutive ``edges``; groups
    without steps are left out."""
    bounds = (0, *edges)
    groups = [{"tokens_from": lo, "tokens_to": hi, "steps": 0, "measured_s": 0.0,
               "priced_s": 0.0} for lo, hi in zip(bounds, (*edges, None), strict=True)]
    for step in steps:
        group = groups[size_class(step["step_tokens"], edges)]
        group["steps"] += 1
        group["measured_s"] += step["measured_s"]
        group["priced_s"] += step["priced_s"]
    return with_ratios([g for g in groups if g["steps"]])


def with_ratios(groups: list[dict]) -> list[dict]:
    """``groups`` (of steps: ``measured_s``, ``priced_s``) with each one's measured time over
    its price and its share of all their measured time."""
    total = sum(g["measured_s"] for g in groups)
    for g in groups:
        g["measured_over_priced"] = g["measured_s"] / g["priced_s"] if g["priced_s"] else None
        g["share_of_step_time"] = g["measured_s"] / total if total else None
    return groups
