"""Why a validation point missed its target, and what to fix next, read from its own evidence.

A validation report (``ragsim.validation.compare``) carries the evidence a reviewer reads by
hand when a target is missed: the TTFT error split into the cost model and diverged decisions
(``--replay-decisions``), each TTFT component's error, the real run's iterations priced by the
profile against their measured time, the share of engine time past the profile's range, the
machine's speed against the profile's (probes before and after the run) and the errors at that
speed. This module reads them in that order and names, for every missed target, one cause from
a fixed vocabulary (``CAUSES``), the evidence that points at it, and the next fix, so a miss is
never just a number.

The rules, in order (the first that holds names the cause):

* hit agreement: the engine's cache hits differ from the policy core's (``cache_hits``);
* decisions: the replay puts more of the mean error on diverged decisions than on the cost
  model, and at least ``MATERIAL`` of it (``decisions``); at a percentage of capacity whose
  overload point's throughput missed by more than ``MATERIAL``, the simulation ran that rate
  at another load of its own, and its decisions follow from that (``capacity``);
* search: the search is the component with the largest error (``search``);
* hand-over: one request at a time (sequential), the queue is the component with the largest
  error and the real one is longer: no request waited for another, so the engine took that
  long to take the request in (``engine_handover``);
* machine speed: the probes put the machine more than ``MATERIAL`` away from the profile's
  speed, or moving by more during the run, and the errors at that speed meet the target
  (``machine_speed``): the model priced a machine that was not there;
* outside the steps: the replay at the iterations' measured durations (``--replay-decisions``)
  puts more of the cost model's share on the engine thread's time outside its steps than on
  the steps' prices, and at least ``MATERIAL`` (``engine_loop``);
* iteration costs: the profile prices the run's own iterations more than ``MATERIAL`` away
  from their measured time (``iteration_costs``), or, for an engine that runs its own steps
  (vLLM), the replay's cost-model share carries the error; where the profile's own held-out
  steps found a kind of step's prices biased (``profile_heldout_misses``), the next fix is the
  profile;
* otherwise queueing or the host copies, whichever component is largest (``queueing``,
  ``host_copies``), and ``capacity`` for a throughput miss with iterations priced right;
* a dry run (``--backend sim``) misses only by its reference profile (``reference_profile``);
* over repeated real runs (``--repeats``), a miss whose error's interval reaches inside the
  target is named ``engine_spread`` whatever the rules above read (they are kept as evidence):
  the model and the engine's noise cannot be told apart there. For the p90 |error| per
  request the reading is its floor (``engine_spread.p90_abs_error_floor``): where a model
  equal to each request's expected TTFT would itself miss against the runs' average.

Where the real runs kept their steps (``--replay-decisions``), a missed TTFT or throughput
also carries those steps against their prices (``step_prices``): over every step, run by run
(a machine's speed that moves between runs), and the size of step the prices miss most, past
the profile's grid or not. A missed p90 |error| also carries the replay's own p90 per request
(the real runs' batches at the simulator's prices): the cost model's part of it, where the
split of the mean says little.

A missed mean TTFT also carries how strongly the point answers the cost model
(``cost_elasticity``: the simulation rerun with every step's price 5% lower and higher): where
a 1% price error moves the mean by E%, the 10% target asks for prices within 10/E %, and a fix
of the steps' prices is sized by it (its next fix says so). A point whose simulated mean tips
under that change (``unstable``) is asked no accuracy: its error says little about prices.

Each rule is a reading of the report, not a measurement of its own: a cause is as good as the
evidence behind it, which is given beside it. A machine whose speed moved is named as well
when it is not the first cause (its evidence line says so).
"""

from __future__ import annotations

# a share of the mean TTFT, a speed or an iteration-price ratio this far from agreement counts
MATERIAL = 0.10

CAUSES = {
    "cache_hits": "the engine's cache hits differ from the policy core's",
    "decisions": "the real run's decisions diverged from the simulator's",
    "search": "the search's time differs from the simulated one",
    "machine_speed": "the machine's speed moved away from the profile's",
    "iteration_costs": "the profile misprices the engine's iterations",
    "queueing": "requests queue differently with iterations priced right",
    "host_copies": "the host->GPU copies take a different time",
    "capacity": "the engine's capacity differs with iterations priced right",
    "engine_handover": "the engine takes time to take a request in, which is not modelled",
    "engine_loop": "the engine's thread spends time outside its steps (taking requests in, "
                   "the loop between steps), which is not modelled",
    "reference_profile": "the simulated reference is priced by another profile",
    "engine_spread": "the miss lies inside the engine's own run-to-run spread",
}

_NEXT_FIX = {
    "cache_hits": "compare the policy core's block size and eviction with the engine's "
                  "(backend_terms) request by request (requests.parquet, hits_agree)",
    "decisions": "find the decisions that race with the wall clock (speculative prefills "
                 "against search stages, admission at step boundaries) in the real run's "
                 "requests.parquet, and make both sides decide at the same instant or model "
                 "the race",
    "search_real": "model the hand-off of a search to its workers and back (a thread wake-up "
                   "each way and the loop's look at a finished stage), measured on the run's "
                   "own pool, beside the trace's stage times",
    "search_modelled": "measure this search tier (a trace built here with ragsim trace build, "
                       "--search-latency trace) instead of the fixed search_s",
    "machine_speed": "rerun at rest with the profile measured right before (--profile-now), "
                     "or on a machine of its own; the errors at the machine's speed are the "
                     "model's, the raw ones include the drift",
    "iteration_costs_seen": "remeasure the profile the way the run executes its iterations "
                            "(the run's engine settings, after a run's worth of steps), and "
                            "look for a per-step cost it leaves out",
    "iteration_costs_past": "extend the profile to the shapes the run reaches (more rows, "
                            "longer contexts): ragsim profile with a wider grid",
    "iteration_costs_unseen": "compare the profile's held-out errors with the run's shapes, and "
                              "time the profile's steps the way the harness runs them (one "
                              "engine, the run's settings, after a run's worth of steps)",
    "iteration_costs_profile": "remeasure the profile at rest (validate --profile-now again, or "
                               "ragsim profile) before reading this point: its own held-out "
                               "steps found a kind of step's prices biased, so they were that "
                               "far off before any run priced with them",
    "iteration_costs_allocator": "run the engine, and measure its profile, on tcmalloc "
                                 "(LD_PRELOAD=libtcmalloc_minimal.so.4, as the engines' CPU "
                                 "guides say): on glibc's malloc a step of a new size costs up "
                                 "to 2x its repeated time, which a profile does not measure",
    "engine_handover": "a measured hand-over term (the engine's own work on a new request and "
                       "its loop's wake-up before the step), timed on the engine the way the "
                       "harness hands requests over",
    "engine_loop": "measure the engine thread's time outside its steps, per step and per "
                   "request taken in (the harness's loop on synthetic traffic, in the "
                   "profile), and charge it on the simulated engine's timeline",
    "queueing": "compare the batches both sides formed (--replay-decisions; the scheduler's "
                "batch and token limits on both sides)",
    "host_copies": "measure the host->GPU copy on this machine (ragsim profile's transfer "
                   "rates) and check overlap_swap on both sides",
    "capacity": "compare the batches the engine forms at overload (rows a step, token budget) "
                "with the profile's batched-prefill and wide-batch timings",
    "capacity_load": "fix the overload point's throughput first (its own cause above): the "
                     "loads are shares of the engine's capacity, and a simulation of another "
                     "capacity runs them at another load",
    "engine_spread": "more real runs of the point (--repeats) to narrow the interval, on a "
                     "machine at rest: until it excludes the target, the model's error and the "
                     "engine's noise cannot be told apart",
    "reference_profile": "nothing to fix in the model: this is a dry run of the comparison "
                         "(--backend sim); validate against an engine (--backend torch or "
                         "vllm)",
}


def _pct(value: float) -> str:
    return f"{value:+.1%}"


def _speed(report: dict) -> dict | None:
    """The machine's speed against the profile's, when it is material: the probes' factor away
    from 1 by more than MATERIAL, or not steady during the run (``validation.machine_speed``
    says which)."""
    speed = report.get("machine_speed")
    if not speed:
        return None
    kinds = (speed.get("by_kind") or {}).values()
    return speed if (abs(speed["factor"] - 1) > MATERIAL or not speed["steady"]
                     or any(abs(k - 1) > MATERIAL for k in kinds)) else None


def _speed_words(speed: dict) -> str:
    words = (f"the machine ran the profile's own grid points x{speed['ratio_before']:.2f} "
             f"before and x{speed['ratio_after']:.2f} after the run (x1.00: as fast as when "
             "profiled)")
    kinds = speed.get("by_kind") or {}
    if any(abs(k - 1) > MATERIAL for k in kinds.values()):
        words += "; by kind of point, " + ", ".join(f"{kind} x{k:.2f}"
                                                     for kind, k in sorted(kinds.items()))
    return words


def _adjusted_meets(report: dict, metric: str) -> bool | None:
    adjusted = report.get("speed_adjusted")
    if not adjusted:
        return None
    marks = {c["metric"]: c["passed"] for c in adjusted["checks"]}
    return marks.get(metric)


def _largest_component(report: dict) -> tuple[str, dict] | None:
    name = report.get("dominant_component")
    return (name, report["components"][name]) if name else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _on_glibc(report: dict, evidence: list[str]) -> str | None:
    """The next-fix key for an engine that ran on glibc's malloc (its steps of new sizes cost
    more than the profile's repeated timings: ``profiles/allocator.py``), else None."""
    if (report.get("real") or {}).get("allocator") != "glibc":
        return None
    evidence.append("the engine ran on glibc's malloc")
    return "iteration_costs_allocator"


def _iteration_key(report: dict, evidence: list[str], key: str) -> str:
    """The next-fix key of an ``iteration_costs`` miss: the engine's allocator where it ran on
    glibc's malloc, the profile itself where its own held-out steps found a kind of step's
    prices biased (``profile_heldout_misses``: measured in a noisy minute, its prices are that
    far off whatever the run does), else ``key``."""
    glibc = _on_glibc(report, evidence)
    if glibc is not None:
        return glibc
    misses = report.get("profile_heldout_misses")
    if misses:
        from ragsim.profiles.steps import heldout_words

        evidence.append("the profile's own held-out checks found its prices biased before "
                        "any run: " + heldout_words(misses))
        return "iteration_costs_profile"
    return key


def _outside_steps(report: dict, evidence: list[str]) -> bool:
    """Whether the replay at measured durations puts more of the cost model's share outside
    the engine's steps than on their prices, and a material part (the evidence line either
    way, where the split exists)."""
    split = report.get("decisions") or {}
    outside, steps = split.get("outside_steps_error"), split.get("step_price_error")
    if outside is None or steps is None:
        return False
    evidence.append(f"of the cost model's share, the steps' prices {_pct(steps)}, the engine "
                    f"thread's time outside its steps {_pct(outside)}")
    return abs(outside) > abs(steps) and abs(outside) > MATERIAL


def _step_sizes(report: dict, evidence: list[str]) -> None:
    """Evidence lines from the real runs' steps against their prices (``step_prices``, with
    ``--replay-decisions``): over every step, and the size of step whose time the prices miss
    most (in seconds), saying where those steps lie past the profile's grid: a burst's few
    large steps carry every request queued behind them."""
    steps = report.get("step_prices")
    if not steps or steps.get("measured_over_priced") is None:
        return
    evidence.append(f"the real runs' {steps['steps']:,} steps ran "
                    f"{steps['measured_over_priced']:.2f}x the simulator's price for them")
    by_run = steps.get("by_run_measured_over_priced") or []
    known = [r for r in by_run if r is not None and r > 0]
    if len(known) > 1:
        words = f"run by run, {min(known):.2f}x to {max(known):.2f}x"
        if max(known) / min(known) - 1 > MATERIAL / 2:
            words += (" (the machine's speed moved from one run to the next: the runs' average "
                      "TTFT mixes those speeds)")
        followed = _followed_speed(report, by_run)
        if followed is not None:
            words += (f"; each run's mean TTFT error against the simulation followed its "
                      f"steps' ratio with a correlation of {followed:+.2f}")
        evidence.append(words)
    worst = max(steps["by_tokens"], key=lambda g: abs(g["measured_s"] - g["priced_s"]))
    if worst["measured_over_priced"] is None:
        return
    low, high, grid = worst["tokens_from"], worst["tokens_to"], steps["grid_new_tokens"]
    size = f"{low:,}-{high:,}" if high is not None else f"{low:,} or more"
    words = (f"the largest gap: steps of {size} tokens ran {worst['measured_over_priced']:.2f}x "
             f"their price ({worst['steps']:,} steps, {worst['share_of_step_time']:.0%} of the "
             "step time)")
    if low >= grid:
        words += f", past the profile's grid ({grid:,} new tokens a step)"
    elif high is None or high > grid:
        words += f", partly past the profile's grid ({grid:,} new tokens a step)"
    evidence.append(words)


# the fewest real runs whose errors are correlated with their speeds (run X's idle point: three
# runs within 2% of each other's speed read -0.99, a line through noise)
CORRELATED_RUNS = 5


def _followed_speed(report: dict, by_run: list) -> float | None:
    """The correlation over the real runs between each run's steps against their prices and
    its own TTFT mean error against the simulation (``repeats.per_run``), where every run has
    both and they vary; None otherwise. Strongly negative: the runs' errors are their
    machine's speed (run W's 90% point: the two runs at 1.00x within 5%, four at 1.16-1.20x
    off by 49-64%)."""
    import numpy as np

    runs = (report.get("repeats") or {}).get("per_run") or []
    errors = [run.get("ttft_mean_error") for run in runs]
    if len(errors) != len(by_run) or len(errors) < CORRELATED_RUNS or any(
            e is None or r is None or e != e for e, r in zip(errors, by_run, strict=True)):
        return None
    speed, error = np.asarray(by_run, float), np.asarray(errors, float)
    if speed.std() == 0 or error.std() == 0:
        return None
    return float(np.corrcoef(speed, error)[0, 1])


def _cost_side(report: dict, metric: str, evidence: list[str]) -> tuple[str, str]:
    """(cause, next-fix key) for a miss the cost model carries: speed, iteration prices,
    queueing, host copies or capacity."""
    if report.get("real_is_simulated"):
        evidence.append("the 'real' side is a second simulation")
        return "reference_profile", "reference_profile"
    speed = _speed(report)
    if speed is not None:
        evidence.append(_speed_words(speed))
        meets = _adjusted_meets(report, metric)
        if meets:
            evidence.append("at that speed the target is met")
            return "machine_speed", "machine_speed"
        if meets is False:
            evidence.append("at that speed the target is still missed")
    if _outside_steps(report, evidence):
        return "engine_loop", "engine_loop"
    ratio = report.get("iteration_time_ratio")
    past = report.get("beyond_profile_time_share")
    if ratio is not None:
        evidence.append(f"the profile prices the run's own iterations at {ratio:.3f} of their "
                        "measured time")
        if past is not None and past > MATERIAL:
            evidence.append(f"{past:.0%} of the engine's time went to iterations past the "
                            "profile's range (extrapolated)")
        if abs(ratio - 1) > MATERIAL:
            key = ("iteration_costs_past" if past is not None and past > 2 * MATERIAL
                   else "iteration_costs_seen")
            return "iteration_costs", _iteration_key(report, evidence, key)
    else:  # the engine's steps are its own (vLLM): the split is the only view of their prices
        cost = report.get("cost_model_error")
        if cost is None or abs(cost) > MATERIAL:
            evidence.append("the engine runs its own steps: " + (
                "the replay's cost-model share is the view of their prices" if cost is not None
                else "--replay-decisions would time them one by one and split the error"))
            return "iteration_costs", _iteration_key(report, evidence,
                                                     "iteration_costs_unseen")
    if metric == "throughput_abs_error":
        return "capacity", "capacity"
    largest = _largest_component(report)
    if largest is not None and largest[0] == "swap_in":
        return "host_copies", "host_copies"
    return "queueing", "queueing"


def _ttft_cause(report: dict, metric: str) -> tuple[str, str, list[str]]:
    evidence: list[str] = []
    decisions, cost = report.get("decision_error"), report.get("cost_model_error")
    if decisions is not None:
        evidence.append(f"of the mean error {_pct(report['ttft_mean_error'])}, the cost model "
                        f"{_pct(cost)}, diverged decisions {_pct(decisions)}")
        replayed_p90 = (report.get("decisions") or {}).get("replayed_ttft_p90_abs_error")
        if metric == "ttft_p90_abs_error" and replayed_p90 is not None:
            # per request, the split of the mean says little: the replay's own p90 is the
            # cost model's part with every batch as the engine formed it
            evidence.append(f"the real runs' own decisions at the simulator's prices: a p90 "
                            f"|error| per request of {replayed_p90:.1%} (the simulation's "
                            f"{report['ttft_p90_abs_error']:.1%})")
        _step_sizes(report, evidence)
        if abs(decisions) >= abs(cost) and abs(decisions) > MATERIAL:
            capacity = report.get("capacity_error")
            if capacity is not None and abs(capacity) > MATERIAL:
                # the rate is a share of the engine's capacity: a simulation of another
                # capacity runs it at another load, and queues and batches as that load does
                evidence.append(f"at overload the simulation served {_pct(capacity)} of the "
                                "engine's throughput: at this rate it runs at another share of "
                                "its own capacity, so its decisions follow another load")
                return "capacity", "capacity_load", evidence
            return "decisions", "decisions", evidence
    largest = _largest_component(report)
    if largest is not None:
        name, component = largest
        evidence.append(f"largest component: {name}, {_ms(component['real_s'])} real against "
                        f"{_ms(component['sim_s'])} simulated "
                        f"({_pct(component['share_of_ttft'] or 0)} of the mean TTFT)")
        if name in ("search", "search_wait"):
            mode = report.get("search_mode", "modelled")
            return "search", "search_real" if mode == "faiss" else "search_modelled", evidence
        if name == "queue" and report.get("arrival") == "sequential" \
                and component["error_s"] < 0 and not report.get("real_is_simulated"):
            # one request at a time waits for no other: its real queue is the hand-over
            evidence.append("one request at a time: no request waits for another, so the real "
                            "queue is the engine taking the request in")
            return "engine_handover", "engine_handover", evidence
    cause, key = _cost_side(report, metric, evidence)
    return cause, key, evidence


def _throughput_cause(report: dict) -> tuple[str, str, list[str]]:
    real = report.get("real_throughput_rps", report["real"]["throughput_rps"])
    evidence = [f"throughput {report['sim']['throughput_rps']:.2f} req/s simulated against "
                f"{real:.2f} real"]
    _step_sizes(report, evidence)
    cause, key = _cost_side(report, "throughput_abs_error", evidence)
    return cause, key, evidence


# the interval (``ragsim.engine_spread``) each target's error has over repeated real runs
_INTERVALS = {"ttft_mean_abs_error": "ttft_mean_error_interval",
              "throughput_abs_error": "throughput_error_interval"}


def _spread(report: dict, metric: str, target: float) -> tuple[bool, str] | None:
    """Over repeated real runs (``--repeats``): whether the error's interval reaches inside the
    target, or for the p90 |error| whether the floor the runs' per-request spread sets is past
    it (either way the miss cannot be told from the engine's noise), and the evidence line;
    None for one run or a metric without an interval."""
    repeats = report.get("repeats")
    if not repeats:
        return None
    if metric == "ttft_p90_abs_error":
        floor = repeats.get("ttft_p90_abs_error_floor")
        if floor is None or floor != floor:
            return None
        one_run = repeats.get("ttft_p90_abs_error_one_run")
        one_run = ("" if one_run is None or one_run != one_run else
                   f"; one real run against the others' average: {one_run:.1%}")
        # the simulated side an average of noisy replicas (--sim-replicas): its own error adds
        both = repeats.get("ttft_p90_abs_error_floor_both_sides")
        if both is not None and both == both:
            return both >= target, (
                f"over {repeats['runs']} real runs each request's TTFT varied: a model equal "
                f"to every request's expected TTFT would show a p90 |error| of {floor:.1%} "
                f"against their average (the runs' own spread), {both:.1%} simulated as this "
                f"average of replicas (both sides' spread; target {target:.0%}){one_run}")
        return floor >= target, (
            f"over {repeats['runs']} real runs each request's TTFT varied: a model equal to "
            f"every request's expected TTFT would show a p90 |error| of {floor:.1%} against "
            f"their average (the runs' own spread; target {target:.0%}){one_run}")
    if metric not in _INTERVALS:
        return None
    low, high = repeats[_INTERVALS[metric]]
    if low != low or high != high:  # NaN: no spread measured
        return None
    reaches = low <= target and high >= -target
    return reaches, (f"over {repeats['runs']} real runs the engine's mean TTFT varied by "
                     f"{repeats['real_ttft_mean_cv']:.0%} (coefficient of variation); the "
                     f"error's {repeats['confidence']:.0%} interval is {_pct(low)} to "
                     f"{_pct(high)}")


# causes whose fix is a better price of the steps: sized by the point's cost elasticity
_PRICE_FIXES = ("iteration_costs", "engine_loop", "machine_speed", "capacity", "engine_spread")


def _elasticity(report: dict) -> tuple[str, float | None] | None:
    """The evidence line of the point's cost elasticity and the price accuracy its mean-TTFT
    target needs (None without one)."""
    reading = report.get("cost_elasticity")
    if not reading:
        return None
    means = reading["ttft_mean_s"]
    needed = reading.get("price_accuracy_needed")
    words = (f"every step's price x{1 - reading['price_step']:g} / x{1 + reading['price_step']:g}"
             f" moves the simulated mean TTFT to {_ms(means['cheaper'])} / "
             f"{_ms(means['dearer'])} (as priced {_ms(means['as_priced'])}): a 1% price error "
             f"is {reading['elasticity']:.1f}% of it here")
    if reading.get("unstable"):
        return (words + "; the simulated point is unstable (its three means span "
                f"{reading['span']:.1f}x or leave the prices' order): one error of it says "
                "little about the cost model", None)
    if needed is not None:
        words += f", so the mean target holds only with the steps priced within {needed:.1%}"
    return words, needed


def diagnose(report: dict) -> list[dict]:
    """One entry per missed target of ``report`` (a ``validation.compare`` report): the
    metric, its value and target, the cause (a key of ``CAUSES``) and what it means, the
    evidence read from the report, and the next fix. Empty when every target is met."""
    misses = []
    for check in report["checks"]:
        if check["passed"] is not False:
            continue
        metric = check["metric"]
        if metric == "hit_agreement":
            cause, key = "cache_hits", "cache_hits"
            evidence = [f"{1 - report['hit_agreement']:.1%} of the requests hit a different "
                        "number of tokens in a tier"]
        elif metric == "throughput_abs_error":
            cause, key, evidence = _throughput_cause(report)
        else:
            cause, key, evidence = _ttft_cause(report, metric)
        spread = _spread(report, metric, check["target"])
        if spread is not None:
            reaches, words = spread
            evidence.append(words)
            if reaches:  # the cause read above is the one to fix once the interval is narrow
                evidence.append(f"without the spread the evidence points at {cause}")
                cause, key = "engine_spread", "engine_spread"
        speed = _speed(report)
        if cause in ("decisions", "search") and speed is not None:  # not read on their way
            evidence.append(_speed_words(speed) + ": part of the error is the machine's")
        next_fix = _NEXT_FIX[key]
        sized = _elasticity(report) if metric == "ttft_mean_abs_error" else None
        if sized is not None:
            evidence.append(sized[0])
            if cause in _PRICE_FIXES and sized[1] is not None:
                next_fix += f" (at this load: the steps priced within {sized[1]:.1%})"
        misses.append({"metric": metric, "value": check["value"], "target": check["target"],
                       "cause": cause, "meaning": CAUSES[cause], "evidence": evidence,
                       "next_fix": next_fix})
    return misses
