"""``ragsim.validate``: the real engine and the simulator on one trace, configuration and
profile, and how far apart they are (``ragsim.validation`` computes the comparison; this module
sets the pair up, runs it and writes what it found).

Set up in two steps, as a run is: :func:`setup_validation` checks the options, resolves the
configuration on the backend's terms and loads (or measures) the costs;
:meth:`ValidationSetup.execute` runs the pair once, or at each load, writing as it goes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ragsim.api.options import as_bytes, label
from ragsim.diagnosis import MATERIAL
from ragsim.errors import RagsimInputError
from ragsim.profiles.steps import heldout_misses, heldout_words

DEFAULT_REQUESTS = 200  # a real run takes real time: a few minutes on two CPU cores
# simulations a point may average (--sim-replicas): each is a whole simulation of the point
MAX_SIM_REPLICAS = 256
# what a validation writes directly in its folder (one comparison, or the table of loads): any
# of them there is an earlier validation, which --out replaces only with force
VALIDATION_FILES = ("validation.json", "requests.parquet", "config.toml", "loads.json",
                    "loads.parquet", "profile-priced.json")
# configuration fields this command sets -> its options, so an error names what the user typed
_OPTION_OF_FIELD = {"trace": "trace", "system": "system", "rate_rps": "rate",
                    "n_requests": "requests", "seed": "seed", "profile": "profile",
                    "policy": "policy", "gpu_kv_bytes": "gpu_mem",
                    "host_cache_bytes": "host_mem", "scheduler": "scheduler",
                    "search_latency": "search_latency", "reuse": "reuse",
                    "replicas": "replicas", "router": "router"}

# how the verdict names each target
METRIC_WORDS = {"ttft_mean_abs_error": "TTFT mean |error|",
                "ttft_p90_abs_error": "TTFT p90 |error| per request",
                "throughput_abs_error": "throughput |error|", "hit_agreement": "hit agreement"}
# on_run(label, total) -> (a context the run goes in, done(ended) -> None): a progress display
RunProgress = Callable[[str, int], tuple]
# a held-out kind of step whose median predicted/measured ratio is this far from 1 in the
# profile's own checks: its prices are biased for that kind before any run (the diagnosis's
# own threshold, one number; a p90 past the 15% target is common on a shared CPU's noise and
# is not named)
PROFILE_BIAS = MATERIAL

# on_note(text, warning): what a caller may print as the setup goes (warning: always shown)
Note = Callable[[str, bool], None]


def _no_progress(label_: str, total: int) -> tuple:
    return nullcontext(), (lambda ended: None)


def _config(config_file: str | Path | None, *, trace: str, system: str, rate: float | None,
            requests: int, seed: int, policy: str | None, gpu_mem, host_mem,
            scheduler: str | None = None, backend: str = "torch", device: str = "cpu",
            search_latency: str | None = None, reuse: str | None = None,
            replicas: int | None = None, router: str | None = None):
    """The run's configuration (a config file under this command's options) on the terms
    the backend runs it with, where neither set them (``validate.backend_terms``: for vLLM
    its engine's settings and the mixed scheduler), what those terms changed (field ->
    (was, now)), and the fields the user set (options and the file: what no later term may
    change); an error naming this command's option or the file's field."""
    from ragsim import validation as v
    from ragsim.serving.config import build_config, load_config_file

    base = load_config_file(config_file) if config_file is not None else None
    flags = {"trace": trace, "system": system, "rate_rps": rate, "n_requests": requests,
             "seed": seed, "policy": policy.lower() if policy else None,
             "scheduler": scheduler, "search_latency": search_latency, "reuse": reuse,
             "gpu_kv_bytes": as_bytes(gpu_mem, "gpu_mem") if gpu_mem else None,
             "host_cache_bytes": as_bytes(host_mem, "host_mem") if host_mem else None,
             "replicas": replicas, "router": router}
    source = str(config_file) if config_file is not None else None
    given = {*(base or {}), *(name for name, value in flags.items() if value is not None)}
    try:
        config = build_config(flags, base=base, source=source)
    except RagsimInputError as exc:
        option = _OPTION_OF_FIELD.get(exc.field or "")
        raise (type(exc)(exc.detail, field=label(option)) if option else exc) from None
    resolved, terms = v.backend_terms(config, backend, device=device, given=given,
                                      source=source)
    return resolved, terms, frozenset(given)


def _with_measured_handoff(resolved, data, config_file, note, probes):
    """The configuration with the search hand-off measured here (``realrun.search.
    measure_handoff``) for the simulation to add to each search, where the real run searches
    the trace's index for real and the configuration file does not set ``search_handoff_s``
    (said in a note either way): the real search pays it, and a simulation without it prices
    a search of the trace's build-time stage times only (-90% to -99% search error at rest).
    What the probe measured goes into ``probes["search_handoff"]``."""
    from ragsim.serving.config import load_config_file

    if config_file is not None and "search_handoff_s" in load_config_file(config_file):
        note(f"search: the hand-off is the configuration's ({resolved.search_handoff_s * 1e3:.3f} "
             "ms a search), not measured")
        return resolved
    from ragsim.realrun.search import measure_handoff

    probe = probes["search_handoff"] = measure_handoff(data, resolved.search_workers)
    note(f"search: the hand-off of a search to the worker pool and back, measured here: "
         f"{probe['handoff_s'] * 1e3:.3f} ms (median of {probe['searches']} searches, "
         f"{probe['seen_median_s'] * 1e3:.3f} ms seen against "
         f"{probe['recorded_median_s'] * 1e3:.3f} ms recorded; {probe['ran_median_s'] * 1e3:.3f}"
         " ms as a run records a search, begun to its last stage's end on the worker, the "
         "clock's look back being the queue's); the simulation adds it to each search "
         "(search_handoff_s)")
    return resolved.replace(search_handoff_s=probe["handoff_s"])


def _loop_given(resolved, config_file, note) -> bool:
    """Whether the configuration file sets the engine loop (any of its three terms), said in
    a note: then either engine's probe is not run."""
    from ragsim.serving.config import load_config_file

    fields = ("engine_loop_step_s", "engine_loop_request_s", "engine_loop_search_s")
    if config_file is None or not set(fields) & set(load_config_file(config_file)):
        return False
    note(f"engine loop: the configuration's ({resolved.engine_loop_step_s * 1e3:.3f} ms "
         f"a step, {resolved.engine_loop_request_s * 1e3:.3f} ms a request, "
         f"{resolved.engine_loop_search_s * 1e3:.3f} ms a search beside a busy engine), "
         "not measured")
    return True


def _with_measured_engine_loop(resolved, data, costs, config_file, note, threads, probes):
    """The configuration with the real vLLM run's engine loop measured here
    (``realrun.vllm.loop.measure_engine_loop``: the real run's own loop on requests this
    validation does not serve, at two loads) for the simulation and the replays to charge,
    unless the configuration file sets it (said in a note either way): the real run's thread
    spends that time between steps, and a simulation without it runs a faster engine than
    the one it is compared with (every vLLM 90% mean -9% to -20% low, runs G-L). What the
    probe measured goes into ``probes["engine_loop"]``."""
    if _loop_given(resolved, config_file, note):
        return resolved
    from ragsim.realrun.vllm.loop import measure_engine_loop

    served = data.n_requests
    wider, capacity_rps = _probe_trace(resolved, data, costs)
    results: list = []
    probe = probes["engine_loop"] = measure_engine_loop(wider, resolved, costs, served=served,
                                                        capacity_rps=capacity_rps,
                                                        threads=threads, seed=resolved.seed,
                                                        on_result=results.append)
    connector = probe.get("connector")
    connector_fields = {}
    if connector is not None:
        connector_fields = _measured_connector(resolved, connector, config_file, note)
        # the probe runs' steps priced as the simulation will price them (their connector's
        # work in them), so that the steps' spread about their prices is not that work
        for result in results:
            result.config = result.config.replace(**connector_fields)
    _measure_step_spread(results, costs, probes, note)
    note(loop_words(probe) + "; and " + search_cost_words(probe) + "; the simulation and the "
         "replays charge them (engine_loop_step_s, engine_loop_request_s, "
         "engine_loop_search_s)")
    resolved = _with_search_lag(resolved, probe.get("search_lag"), config_file, note)
    return resolved.replace(engine_loop_step_s=probe["step_s"],
                            engine_loop_request_s=probe["request_s"],
                            engine_loop_search_s=probe["search_s"], **connector_fields)


CONNECTOR_FIELDS = ("connector_request_s", "connector_save_s_per_token",
                    "connector_load_s_per_token")


def _measured_connector(resolved, connector: dict, config_file, note) -> dict:
    """The connector's costs the probe runs measured (``realrun.vllm.loop.connector_costs``),
    as the configuration's fields, unless the configuration file sets any of them (said in a
    note either way)."""
    from ragsim.serving.config import load_config_file

    if config_file is not None and set(CONNECTOR_FIELDS) & set(load_config_file(config_file)):
        note(f"connector: the configuration's ({resolved.connector_request_s * 1e3:.3f} ms a "
             f"request, {resolved.connector_save_s_per_token * 1e6:.3f} us a token saved, "
             f"{resolved.connector_load_s_per_token * 1e6:.3f} us a token loaded), not measured")
        return {}
    loads = (f"{connector['load_s_per_token'] * 1e6:.3f} us a token loaded over "
             f"{connector['tokens_loaded']:,}" if connector["tokens_loaded"]
             else "no loads (the profile's transfers price them)")
    note(f"connector: its work inside vLLM's steps on the same probe runs: "
         f"{connector['request_s'] * 1e3:.3f} ms a request over {connector['requests_served']} "
         f"(the tree's access {connector['tree_access_s'] * 1e3:.3f} ms of it), "
         f"{connector['save_s_per_token'] * 1e6:.3f} us a token saved over "
         f"{connector['tokens_saved']:,}, {loads}; the simulation and the replays price them "
         "in the steps (connector_request_s, connector_save_s_per_token, "
         "connector_load_s_per_token)")
    return {"connector_request_s": connector["request_s"],
            "connector_save_s_per_token": connector["save_s_per_token"],
            "connector_load_s_per_token": connector["load_s_per_token"]}


def _measure_step_spread(results, costs, probes, note) -> None:
    """How much the probe runs' steps varied about their prices (``ragsim.step_spread``),
    into ``probes["step_spread"]``: what ``--sim-replicas``' simulations draw each step's time
    with. Measured on runs this validation does not judge."""
    from ragsim import validation as v
    from ragsim.step_spread import served_step_spread

    spread = served_step_spread([v.priced_step_table(r, costs) for r in results])
    if spread is None:
        note("step spread: the probe runs kept too few steps to measure it")
        return
    probes["step_spread"] = spread
    note(f"step spread: the probe runs' {spread['steps']} steps ran about their prices with a "
         f"log spread of {spread['sigma']:.3f} and a step-to-step correlation of "
         f"{spread['correlation']:.2f} (each kind and size's median set aside: the prices' "
         "own error)")


def _probe_trace(resolved, data, costs):
    """The trace the probe runs draw from (the validation's requests and the probe's past
    them) and the simulated burst capacity their loads are shares of."""
    from ragsim import validation as v
    from ragsim.realrun.probe_runs import probe_size
    from ragsim.traces import resolve_trace

    served = data.n_requests
    wider = resolve_trace(resolved.trace, seed=resolved.seed,
                          n_requests=served + probe_size(served))
    burst = v.run_sim(wider.head(served), v.config_at_load(resolved, v.LOAD_OVER, None), costs)
    return wider, float(burst.summary["throughput_rps"])


def _with_measured_torch_loop(resolved, data, costs, config_file, note, device, threads,
                              probes, searches_for_real: bool):
    """The torch engine's configuration with its loop measured through two probe runs of its
    real run on requests this validation does not serve, at two loads
    (``realrun.probe_runs.torch_engine_loop``), as vLLM's runs get theirs: the time between
    the steps of its busy engine (``engine_loop_step_s``, ``engine_loop_request_s``) and what a
    search beside it costs its steps (``engine_loop_search_s``: ``realrun/search_cost.py``),
    unless the configuration file sets any of them (said in a note either way). The torch
    run's thread spends that time between its iterations (0.3 ms before a prefill, 0.1 ms
    before a decode step at 50% load: docs/validation.md, "The torch run's clock"), and its
    search workers share its interpreter as vLLM's run's do: equal terms. Without the search
    term run Q2's 90% simulation ran an engine 72% busy where the real one was 79%, and its
    mean came out -55% (docs/validation.md, "Run Q"). What the probe measured goes into
    ``probes["engine_loop"]``. Returns the configuration and the profile to price with: the
    same probe runs' steps measure the engine's work around its passes
    (``_with_run_step_costs``)."""
    if _loop_given(resolved, config_file, note):
        measured = (costs.obtained.get("engine_steps") or {}).get("measured")
        note("engine steps: the profile's step overhead and batch write (no probe runs here; "
             + ("the profile measured them on the engine's own runs, ragsim profile's engine "
                "steps)" if measured else "the profiler's, which time its sampling alone)"))
        return resolved, costs
    from ragsim.realrun.harness import RealRun
    from ragsim.realrun.probe_runs import torch_decode_step, torch_engine_loop

    wider, capacity_rps = _probe_trace(resolved, data, costs)
    # the threads the real runs' engine takes (``RealRun``: the profile's where not given)
    engine_threads = threads if threads is not None else (costs.obtained.get("threads") or None)
    # a fleet's loop is each replica's: one engine probed at its share of the fleet's capacity
    replicas = max(1, int(resolved.replicas))
    engine = resolved.replace(replicas=1) if replicas > 1 else resolved

    results: list = []
    engines: list = []

    def run(trace, config, profile):  # each on a fresh engine, as the validation's runs are
        real = RealRun(trace, config, profile, device=device, threads=threads,
                       model_seed=resolved.seed, speed_probes=False)
        engines[:] = [real.model]  # the last run's, which the search-cost probe steps
        result = real.run()
        results.append(result)
        return result

    probe = probes["engine_loop"] = torch_engine_loop(
        wider, engine, costs, served=data.n_requests, capacity_rps=capacity_rps / replicas,
        run=run,
        engine_step=(lambda: torch_decode_step(engines[-1], resolved.seed))
        if searches_for_real else None, threads=engine_threads)
    costs = _with_run_step_costs(costs, results, probes, note)
    _measure_step_spread(results, costs, probes, note)
    note(loop_words(probe) + "; " + search_cost_words(probe) + "; the simulation and the "
         "replays charge them (engine_loop_step_s, engine_loop_request_s, "
         "engine_loop_search_s)")
    resolved = _with_search_lag(resolved, probe.get("search_lag"), config_file, note)
    return resolved.replace(engine_loop_step_s=probe["step_s"],
                            engine_loop_request_s=probe["request_s"],
                            engine_loop_search_s=probe["search_s"]), costs


def _with_search_lag(resolved, lag: dict | None, config_file, note):
    """The configuration with the search's lag past its stage times as the probe runs'
    searches paid it beside their engine (``realrun.probe_runs.search_lag_in_runs``), in place
    of the hand-off probe's, which times the pool and the clock in a process without the
    engine (0.52-0.62 ms where the runs' searches took 1.0-1.2 ms past their stage times, at
    every load: docs/validation.md, "Run AZ"). The lag goes in two parts, counted where the
    run counts them: the front end's hand-over before a worker takes the search
    (``search_dispatch_s``, the record's ``search_wait``) and the worker's hand-off inside it
    (``search_handoff_s``). Both kept where the configuration file sets either, or where the
    probe runs had too few searches (said in a note either way)."""
    from ragsim.serving.config import load_config_file

    if lag is None:
        return resolved
    measured = (f"the probe runs' {lag['searches']} searches with a worker free took "
                f"{lag['lag_s'] * 1e3:.3f} ms past their stage times on average (beside a busy "
                f"engine {_ms(lag['busy_mean_lag_s'])} over {lag['busy_searches']}, an idle one "
                f"{_ms(lag['idle_mean_lag_s'])} over {lag['idle_searches']}), "
                f"{lag['dispatch_s'] * 1e3:.3f} ms of it before a worker took them")
    set_in_file = config_file is not None and {"search_handoff_s", "search_dispatch_s"} & set(
        load_config_file(config_file))
    if set_in_file:
        note(f"search: {measured}; the configuration's hand-over "
             f"({resolved.search_dispatch_s * 1e3:.3f} ms) and hand-off "
             f"({resolved.search_handoff_s * 1e3:.3f} ms) are kept")
        return resolved
    note(f"search: {measured}; the simulation hands each search over that late "
         f"(search_dispatch_s) and adds the rest to it (search_handoff_s; the hand-off probe, "
         f"without the engine: {resolved.search_handoff_s * 1e3:.3f} ms)")
    return resolved.replace(search_dispatch_s=lag["dispatch_s"],
                            search_handoff_s=lag["handoff_s"])


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _with_run_step_costs(costs, results, probes, note):
    """The profile with its step overhead and its batch write as the torch engine's steps
    paid them in the probe runs (``realrun.probe_runs.step_costs_in_runs``): what the engine
    does around its timed passes, which the profiler does not time as the engine does it. The
    simulation and the replays then price every step as the real runs' engine pays it, on
    requests no judged run serves. What was measured goes into ``probes["engine_steps"]``."""
    from dataclasses import replace

    from ragsim.realrun.probe_runs import step_costs_in_runs

    found = step_costs_in_runs([(getattr(r, "decisions", None) or {}).get("iterations")
                                for r in results], costs)
    if found is None:
        return costs
    report, overhead, copy = found
    probes["engine_steps"] = report
    words = (f"engine steps: measured on the probe runs' {report['steps']} steps, "
             f"{overhead.describe()} (the profile's: "
             + (costs.step_overhead.describe() if costs.step_overhead else "none") + ")")
    if copy is not None:
        words += (f"; {copy.describe()}, {report['writes']} writes "
                  f"{report['writes_measured_s'] * 1e3:.0f} ms where the profile's term "
                  f"priced {report['writes_profile_priced_s'] * 1e3:.0f} ms")
    note(words + "; the simulation and the replays charge them (profile-priced.json)")
    return replace(costs, step_overhead=overhead,
                   batch_copy=copy if copy is not None else costs.batch_copy)


def loop_words(probe: dict) -> str:
    """What a loop probe measured (either engine's), in words."""
    runs = "; ".join(f"{r['load']:.0%}: {r['between_steps_s'] * 1e3:.1f} ms over {r['gaps']} "
                     f"gaps, {r['requests_while_busy']} requests handed over busy"
                     for r in probe["runs"])
    whose = ("requests past the ones validated" if probe["held_aside"]
             else "the trace's last requests (it has none past the ones validated)")
    intake = (f", less its quiet intake {probe['quiet_intake_s'] * 1e3:.3f} ms, which the "
              "prices hold" if probe.get("quiet_intake_s") else "")
    return (f"engine loop: the real run's time between steps, measured on {probe['requests']} "
            f"{whose} ({runs}): {probe['step_s'] * 1e3:.3f} ms a step and "
            f"{probe['fitted_request_s'] * 1e3:.3f} ms a request{intake}")


def search_cost_words(probe: dict) -> str:
    """What a probe measured a search beside a busy engine to cost it, in words: the engine's
    steps timed with and without searches beside them (``realrun/search_cost.py``) where it
    ran, with the search threads' interpreter time beside; else the interpreter time alone."""
    cost = probe.get("search_cost")
    interpreter = probe.get("interpreter_s", probe["search_s"])
    if cost is None:
        return (f"its search threads' interpreter time, {interpreter * 1e3:.3f} ms a search "
                f"over {probe['searches']}, which a request searched beside a busy engine "
                "costs it")
    interval = (f" (95% over the blocks: {cost['search_s_low'] * 1e3:.3f}-"
                f"{cost['search_s_high'] * 1e3:.3f})" if "search_s_low" in cost else "")
    return (f"a search beside its busy engine, {cost['search_s'] * 1e3:.3f} ms of the "
            f"engine's steps a search{interval} ({cost['searches']} searches beside "
            f"{cost['pairs']} "
            f"blocks of {cost['steps']} steps, {cost['alone_step_s'] * 1e3:.2f} ms a step "
            f"alone, {cost['beside_step_s'] * 1e3:.2f} ms beside them; the search threads' "
            f"interpreter time was {interpreter * 1e3:.3f} ms a search)")


def _search_pool_beside_engine(resolved, config_file, threads, costs, note):
    """On a CPU, the real run's search workers on the cores its engine leaves (at least one),
    where the configuration file does not set ``search_workers`` (said in a note).

    The simulation models the search tier beside the engine, sharing nothing with it, as a GPU
    server's CPU serves search beside its accelerator. On one CPU they share the cores: at
    overload 16 search threads beside the engine on two cores took each search stage 24x its
    time at idle (1.85 ms against 0.076), and vLLM's first step of the burst took 105 ms
    where 8 were priced; both sides run the pool the machine can give."""
    from ragsim.serving.config import load_config_file

    if config_file is not None and "search_workers" in load_config_file(config_file):
        return resolved
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    measured = costs.obtained.get("threads") if costs.obtained.get("device_type") == "cpu" \
        else None
    engine = threads or (measured if isinstance(measured, int) and measured > 0 else cores)
    workers = max(1, cores - engine)
    if workers >= resolved.search_workers:
        return resolved
    note(f"search: {workers} worker thread(s) on the {cores} core(s) the engine's {engine} "
         f"thread(s) leave, on both sides (search_workers was {resolved.search_workers}: on one "
         "CPU the pool and the engine would share cores, which the simulation does not model)")
    return resolved.replace(search_workers=workers)


def _cost_profile(name: str | None, profile_now: bool, backend: str, out_dir: Path, *,
                  layers: int | None, hidden: int | None, device: str, threads: int | None,
                  seed: int, needs=None, on_phase=None, block_tokens: int = 32,
                  note: Note = lambda text, warning=False: None):
    """The profile as ``run`` resolves it, one measured now (``profile_now``, at the default
    profile's scale unless ``layers``/``hidden`` say otherwise; its plan reaches what the runs
    will ask, ``needs(kv_bytes_per_token)``; measured once more where its own held-out steps
    found it biased: ``least_biased_profile``), or the default."""
    from ragsim import validation as v
    from ragsim.profiles.profile import load_profile

    if name is not None:
        return load_profile(name)
    if backend == "torch" and not profile_now and device != "cpu":
        raise RagsimInputError(f"no shipped profile for the scaled-down engine on a GPU; "
                               f"give {label('profile')} or {label('profile_now')}",
                               field=label("profile"))
    default = load_profile(v.DEFAULT_TORCH_CPU_PROFILE)
    if not profile_now:
        return default
    out_dir.mkdir(parents=True, exist_ok=True)
    # on a CPU the default profile's scale; on a GPU the full model unless told otherwise
    on_cpu = device == "cpu"
    return least_biased_profile(lambda: v.profile_here(
        out_dir / "profile.json",
        layers=layers or (default.model.num_layers if on_cpu else None),
        hidden=hidden or (default.model.hidden_size if on_cpu else None),
        device=device, threads=threads, seed=seed, progress=on_phase,
        needs=None if needs is None else needs(default.model.kv_bytes_per_token),
        # vLLM's own steps (its scheduler, paged attention, sampling) for a vLLM validation
        engine="vllm" if backend == "vllm" else "torch", block_tokens=block_tokens),
        out_dir / "profile.json", note)


def _bias(profile) -> float:
    """How far the profile's most biased held-out kind's median ratio is from 1 (0: none past
    ``PROFILE_BIAS``)."""
    misses = heldout_misses(profile.obtained, biased_by=PROFILE_BIAS)
    return max((abs(s["median_ratio"] - 1.0) for s in misses.values()), default=0.0)


def least_biased_profile(measure: Callable[[], object], path: Path, note: Note):
    """A profile measured now (``measure()``, which writes ``path``) and, where its own held-out
    steps found a kind of step's prices more than ``PROFILE_BIAS`` off, measured once more: a
    profile timed in a noisy minute prices every run of the validation with that bias (run V,
    2026-12-06: held-out wide batches 1.72x, and the runs' steps 0.55-0.73x their prices). The
    less biased of the two is kept at ``path``, the other beside it (``*-set-aside.json``), and
    a note says which."""
    first = measure()
    bias = _bias(first)
    if not bias:
        return first
    aside = path.with_name(path.stem + "-set-aside.json")
    path.replace(aside)
    note(f"profile: its own held-out steps found a kind of step's prices {bias:.0%} off "
         f"({heldout_words(heldout_misses(first.obtained, biased_by=PROFILE_BIAS))}): "
         "measured once more", warning=True)
    second = measure()
    again = _bias(second)
    if again <= bias:
        note(f"profile: the second measurement kept ({again:.0%} off at most); the first set "
             f"aside as {aside.name}")
        return second
    second_path = path.with_name(path.stem + "-second.json")  # swap the two files
    path.replace(second_path)
    aside.replace(path)
    second_path.replace(aside)
    note(f"profile: the first measurement kept (the second {again:.0%} off); the second set "
         f"aside as {aside.name}", warning=True)
    return first


def _ensemble_spread(resolved, costs, replicas: int, note: Note, probes: dict
                     ) -> tuple[object, float, float]:
    """The step-time draws of ``--sim-replicas``' simulations, ``(config, sigma,
    correlation)``: the configuration's ``step_time_sigma`` (and ``step_time_correlation``)
    where it sets one; else what the probe runs' steps measured (``probes["step_spread"]``,
    ``ragsim.step_spread``: a serving engine's steps, on requests not judged); else the
    profile's repeated timings (``profiles.repeat_spread``: a quiet loop's, with no
    correlation). The configuration's noise-free run keeps 0 (said in a note)."""
    from ragsim.profiles.repeat_spread import step_time_sigma

    sigma, correlation = resolved.step_time_sigma, resolved.step_time_correlation
    source = "the configuration's step_time_sigma and step_time_correlation"
    measured = probes.get("step_spread")
    if not sigma and measured:
        sigma, correlation = measured["sigma"], measured["correlation"]
        source = f"measured on the probe runs' {measured['steps']} steps"
    elif not sigma:
        sigma, correlation = step_time_sigma(costs), 0.0
        source = f"the profile {costs.name!r}'s repeated timings"
        if sigma is None:
            raise RagsimInputError(
                f"the profile {costs.name!r} keeps no repeated timings to measure a step's "
                f"spread from (a derived profile): set step_time_sigma in a {label('config')} "
                f"file or give a measured profile", field=label("sim_replicas"))
    note(f"the simulated side: each request's TTFT averaged over {replicas} simulations, each "
         f"step's time x exp(e), e of spread {sigma:.3f} and step-to-step correlation "
         f"{correlation:.2f} ({source}); the noise-free simulation is reported beside it "
         f"(sim_ensemble.single_run)")
    return (resolved.replace(step_time_sigma=0.0, step_time_correlation=0.0), float(sigma),
            float(correlation))


def _search_term(found: dict | None, report: dict) -> dict | None:
    """``validation.search_term_range`` with the point's own errors at each end of the search
    term's interval (``ttft_mean_error``, ``throughput_error``: the report's, moved by each
    end's ratio to the simulation as charged)."""
    if found is None:
        return None
    errors = {"ttft_mean_error": {end: (1.0 + report["ttft_mean_error"]) * ratio - 1.0
                                  for end, ratio in found["ttft_mean_ratio"].items()}}
    if found["throughput_ratio"] is not None:
        errors["throughput_error"] = {end: (1.0 + report["throughput_error"]) * ratio - 1.0
                                      for end, ratio in found["throughput_ratio"].items()}
    return {**found, **errors}


def _write_pair(folder: Path, reals: list, sim, report: dict, backend: str,
                steps: list[list[dict] | None] | None = None, noise_free=None,
                first_run=None) -> None:
    """Both sides' records and summaries (``real``, and ``real-2``, ... for repeated real
    runs), each real run's steps against their prices where priced (``steps.parquet``), the
    joined per-request comparison (over repeated runs: their per-request average), the plots,
    the configuration and ``validation.json``. ``noise_free``: with ``--sim-replicas``, where
    ``sim`` is the replicas' per-request average, the noise-free run beside it
    (``sim-noise-free``): its times are steps' times, which an average's are not, so whoever
    reads batches and step starts reads them there. ``first_run``: where the noise-free side
    averages simulations of the real runs' several starting states (``like_runs``), the first
    run's simulation (``sim-first-run``), one simulation's steps for the same reason."""
    import pandas as pd

    from ragsim import validation as v
    from ragsim.atomic import write_atomically, write_text_atomically
    from ragsim.outputs import save_run_result

    for k, real in enumerate(reals, start=1):
        run_dir = folder / ("real" if k == 1 else f"real-{k}")
        save_run_result(run_dir, pd.DataFrame(real.columns), real.summary,
                        flag=label("out_dir"))
        table = steps[k - 1] if steps and k <= len(steps) else None
        if table:
            frame = pd.DataFrame(table)
            write_atomically(run_dir / "steps.parquet",
                             lambda tmp, frame=frame: frame.to_parquet(tmp, index=False))
    save_run_result(folder / "sim", pd.DataFrame(sim.columns), sim.summary,
                    flag=label("out_dir"))
    if noise_free is not None:
        save_run_result(folder / "sim-noise-free", pd.DataFrame(noise_free.columns),
                        noise_free.summary, flag=label("out_dir"))
    if first_run is not None:
        save_run_result(folder / "sim-first-run", pd.DataFrame(first_run.columns),
                        first_run.summary, flag=label("out_dir"))
    if len(reals) > 1:
        from ragsim.engine_spread import pooled_join

        joined = pooled_join(reals, sim.columns)[0]
    else:
        joined, _ = v.join_runs(reals[0].columns, sim.columns)
    table = v.per_request(joined)
    write_atomically(folder / "requests.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    v.plot_ttft(joined, folder, "real" if backend != "sim" else "reference (simulated)")
    write_text_atomically(folder / "config.toml", sim.config.to_toml())
    write_text_atomically(folder / "validation.json",
                          json.dumps(report, indent=2, default=str) + "\n")


def _write_loads(out_dir: Path, combined: dict) -> None:
    import pandas as pd

    from ragsim.atomic import write_atomically, write_text_atomically

    rows = pd.DataFrame(combined["loads"])
    write_atomically(out_dir / "loads.parquet", lambda tmp: rows.to_parquet(tmp, index=False))
    write_text_atomically(out_dir / "loads.json",
                          json.dumps(combined, indent=2, default=str) + "\n")


@dataclass
class Validation:
    """What a validation found: ``report`` (one comparison, ``validation.json``) or, with
    loads, ``loads`` (``loads.json``: one row per load); ``summary`` is whichever ``--json``
    prints. The raw errors are the verdict; speed probes sit beside them."""

    out_dir: Path
    report: dict | None = None
    loads: dict | None = None
    points: list[str] | None = None  # the loads asked for (some may not have run)
    reports: list[dict] = field(default_factory=list)  # every comparison made (one per load)

    @property
    def failed(self) -> list[str]:
        """Each target missed, in words: ``TTFT mean |error| 34.2% (target <= 10%) at load
        90``. The raw errors decide; speed-adjusted errors are diagnostics and never listed."""
        missed = []
        for report in self.reports:
            where = f" at load {report['load']}" if report.get("load") else ""
            for check in report["checks"]:
                if check["passed"] is False:
                    words = METRIC_WORDS.get(check["metric"], check["metric"])
                    missed.append(f"{words} {check['value']:.1%} "
                                  f"(target {check['sense']} {check['target']:.0%}){where}")
        return missed

    @property
    def verdict(self) -> str:
        """One line: pass or fail, and what failed."""
        applied = sum(c["passed"] is not None for r in self.reports for c in r["checks"])
        if self.failed:
            return f"FAIL: {len(self.failed)} of {applied} targets missed: " + "; ".join(
                self.failed)
        return f"pass: {applied} of {applied} targets met"

    @property
    def summary(self) -> dict:
        return self.report if self.loads is None else self.loads

    @property
    def interrupted(self) -> bool:
        if self.loads is None:
            return bool(self.report and self.report.get("interrupted"))
        rows = self.loads["loads"]
        return bool(rows and rows[-1].get("interrupted"))


@dataclass
class ValidationSetup:
    """A checked validation that has not run: the trace, the configuration on the backend's
    terms, the costs the simulator prices with and what the real side needs."""

    out_dir: Path
    backend: str
    device: str
    threads: int | None
    data: object
    config: object
    terms: dict
    costs: object
    reference: object = None
    points: list[str] | None = None
    notes: list[tuple[str, bool]] = field(default_factory=list)
    replay_decisions: bool = False  # split the TTFT error into cost model and decisions
    # real runs per point (``ragsim.engine_spread``): {None: every point not named, load: its
    # own} (``validation.parse_repeats``)
    repeats: dict = field(default_factory=lambda: {None: 1})
    # what validate measured before the runs for the simulation's configuration, as measured
    # (``search_handoff``, ``engine_loop``): in every point's report and in loads.json
    probes: dict = field(default_factory=dict)
    # simulations per point, averaged per request (``ragsim.sim_ensemble``; 1: the noise-free
    # run alone), each step's time drawn with this spread
    sim_replicas: int = 1
    step_time_sigma: float = 0.0
    step_time_correlation: float = 0.0

    def runs_at(self, load: str | None) -> int:
        """Real runs of the point at ``load`` (None: the single point of a run without
        ``--loads``)."""
        return self.repeats.get(load, self.repeats.get(None, 1))

    def search_cost(self) -> dict | None:
        """The search-cost probe's measurement (``realrun/search_cost.py``), taken by either
        engine's loop probe."""
        return (self.probes.get("engine_loop") or {}).get("search_cost") or None

    def execute(self, on_run: RunProgress | None = None) -> Validation:
        """Run the pair (at each load), writing each comparison as it ends: a Ctrl-C keeps
        what finished. ``on_run(label, total)`` gives each real run's progress display."""
        from ragsim import validation as v

        on_run = on_run or _no_progress
        backend, data, costs, terms = self.backend, self.data, self.costs, self.terms

        def real_run(cfg, k: int, runs: int):
            name = f"{backend} run" + (f" {k}/{runs}" if runs > 1 else "")
            context, done = on_run(name, data.n_requests)
            with context:
                return v.run_real(data, cfg, costs, backend=backend, device=self.device,
                                  threads=self.threads, reference_profile=self.reference,
                                  progress=lambda ended, _now: done(ended))

        def one(cfg, load: str | None, folder: Path, capacity_error: float | None = None
                ) -> dict:
            runs = self.runs_at(load)
            reals = [real_run(cfg, 1, runs)]
            # the same point again on a fresh engine (--repeats): the engine's own spread;
            # a run cut short (Ctrl-C, SIGTERM) ends the repeats and is left out of them
            while len(reals) < runs and not reals[-1].summary.get("interrupted"):
                again = real_run(cfg, len(reals) + 1, runs)
                if again.summary.get("interrupted"):
                    reals[-1].summary["interrupted"] = True
                    break
                reals.append(again)
            real, more = reals[0], reals[1:]
            # each simulated engine has run what its real one's process had before its run
            # began: those step sizes are built (``Profile.warmed``). vLLM's repeats share one
            # process, so each run begins warmer than the last: the noise-free side is one
            # simulation per run's starting state, averaged as the runs are (``like_runs``)
            states = v.like_runs(costs, reals)
            sim_costs = states[0]
            sim, first = v.run_sim_like_runs(data, cfg, states)
            # --sim-replicas: the per-request average of noisy replicas is the simulated side,
            # the noise-free run kept beside it; readings of one simulation (the elasticity,
            # the search term) are taken on the first run's
            ensemble = v.run_sim_ensemble(data, cfg, states, self.sim_replicas,
                                          self.step_time_sigma, self.step_time_correlation) \
                if self.sim_replicas > 1 else None
            adjusted = v.speed_adjusted_sim(data, cfg, sim_costs, *reals)
            replayed = [v.replay_decisions(r, state) for r, state in zip(reals, states,
                                                                         strict=True)] \
                if self.replay_decisions else [None]
            measured = [v.replay_decisions(r, costs, measured=True) for r in reals] \
                if self.replay_decisions else []
            # each step against its price, written beside each real run (steps.parquet)
            steps = [v.priced_step_table(r, costs) for r in reals] \
                if self.replay_decisions else []
            report = v.compare(real, ensemble or sim, backend=backend, load=load,
                               sim_speed_adjusted=adjusted, terms=terms,
                               replayed_ttft=replayed[0], capacity_error=capacity_error,
                               repeats=more, repeats_replayed=replayed[1:],
                               measured_replayed=measured,
                               elasticity=v.cost_elasticity(data, cfg, sim_costs, first),
                               steps=v.step_prices(reals, costs, steps)
                               if self.replay_decisions else None,
                               single=sim if ensemble is not None else None,
                               profile_misses=heldout_misses(costs.obtained,
                                                             biased_by=PROFILE_BIAS))
            report["search_term"] = _search_term(
                v.search_term_range(data, cfg, sim_costs, first, self.search_cost()), report)
            # a real run cut short (Ctrl-C, SIGTERM) keeps what ended: compared and written
            report["interrupted"] = any(bool(r.summary.get("interrupted")) for r in reals)
            report["probes"] = self.probes
            # how many starting states the noise-free side averages (one per distinct state
            # of the real runs' engines; 1: one simulation)
            report["sim_engine_states"] = int(sim.summary.get("sim_engine_states", 1))
            _write_pair(folder, reals, ensemble or sim, report, backend, steps,
                        noise_free=sim if ensemble is not None else None,
                        first_run=first if first is not sim else None)
            return report

        config = self.config
        if self.points is None:
            report = one(config, None, self.out_dir)
            return Validation(self.out_dir, report=report, reports=[report])
        reports = []
        rows, capacity_rps, capacity_error = [], None, None
        combined = {"backend": backend, "real_is_simulated": backend == "sim",
                    "system": config.system, "trace": config.trace,
                    "profile": config.profile,
                    "backend_terms": {name: getattr(config, name) for name in terms},
                    "probes": self.probes, "capacity_rps": None, "loads": rows}
        for load in self.points:
            at_share = load not in (v.LOAD_OVER, v.LOAD_IDLE)
            report = one(v.config_at_load(config, load, capacity_rps), load,
                         self.out_dir / f"load-{load}", capacity_error if at_share else None)
            reports.append(report)
            if load == v.LOAD_OVER:  # the engine's throughput (over its runs: their mean)
                capacity_rps = combined["capacity_rps"] = report["real_throughput_rps"]
                capacity_error = report["throughput_error"]
            rows.append(v.load_row(report))
            _write_loads(self.out_dir, combined)  # after every load: an interruption keeps them
            if report["interrupted"]:
                break
        return Validation(self.out_dir, loads=combined, points=list(self.points),
                          reports=reports)


def setup_validation(out_dir: str | Path, *, backend: str = "torch", trace: str = "mmlu",
                     system: str = "ragcache", rate: float | None = None,
                     requests: int = DEFAULT_REQUESTS, layers: int | None = None,
                     hidden: int | None = None, threads: int | None = None,
                     device: str = "cpu", config: str | Path | None = None,
                     policy: str | None = None, gpu_mem=None, host_mem=None,
                     profile: str | None = None, profile_now: bool = False,
                     sequential: bool = False, loads: str | None = None, seed: int = 0,
                     scheduler: str | None = None, reference_profile: str | None = None,
                     search_latency: str | None = None, replay_decisions: bool = False,
                     replicas: int | None = None, router: str | None = None,
                     on_note: Note | None = None, on_profile_phase=None,
                     reuse: str | None = None, repeats: int | str = 1,
                     sim_replicas: int = 1,
                     force: bool = False) -> ValidationSetup:
    """Check ``ragsim validate``'s options (snake case), resolve the configuration and load or
    measure the costs. ``on_note(text, warning)`` hears what was chosen for the user as it is
    chosen; ``on_profile_phase(phase, done, total)`` the measurement's progress. ``force``:
    replace an earlier validation in ``out_dir`` (refused otherwise, before any work).
    ``repeats``: real runs of each point, each on a fresh engine, against the one simulation
    (``ragsim.engine_spread``: errors against their average, with the spread's interval); a
    count, or counts by load as ``--repeats`` takes them (``"3,90=15,50=15"``,
    ``validation.parse_repeats``).
    ``sim_replicas``: simulations of each point, each step's time drawn with the spread and
    step-to-step correlation the probe runs' steps showed (``ragsim.step_spread``), else the
    profile's for a step run again (``profiles.repeat_spread``); a configuration's
    ``step_time_sigma`` and ``step_time_correlation`` instead where it sets them; averaged per
    request
    (``ragsim.sim_ensemble``); 1: the noise-free simulation alone."""
    from ragsim import validation as v
    from ragsim.backends import CPU_PROFILES
    from ragsim.extras import require_extra
    from ragsim.outputs import claim_output_dir

    notes: list[tuple[str, bool]] = []
    probes: dict = {}  # what is measured below for the configuration (ValidationSetup.probes)

    def note(text: str, warning: bool = False) -> None:
        notes.append((text, warning))
        if on_note is not None:
            on_note(text, warning)

    out_dir = Path(out_dir)
    # before the runs: a typo, an earlier validation or an input there must not cost them
    claim_output_dir(out_dir, writes=VALIDATION_FILES, force=force, flag=label("out_dir"),
                     inputs=(config, trace, profile, reference_profile))
    if backend not in v.BACKENDS:
        raise RagsimInputError(f"unknown backend {backend!r}; known: torch, vllm",
                               field=label("backend"))
    if isinstance(sim_replicas, bool) or not isinstance(sim_replicas, int) \
            or not 1 <= sim_replicas <= MAX_SIM_REPLICAS:
        raise RagsimInputError(f"simulations per point must be a whole number from 1 to "
                               f"{MAX_SIM_REPLICAS}, got {sim_replicas!r}",
                               field=label("sim_replicas"))
    if profile is not None and profile_now:
        raise RagsimInputError(f"give {label('profile')} or {label('profile_now')}, not both",
                               field=label("profile"))
    if backend == "vllm" and profile is None and device == "cpu" and not profile_now:
        profile = CPU_PROFILES["vllm"]  # measured on vLLM's CPU engine (docs/vllm.md)
    if backend == "vllm" and profile is None and not profile_now:
        raise RagsimInputError(f"{label('backend')} vllm needs a profile of vLLM itself: "
                               "measure one with ragsim profile --engine vllm and give it as "
                               f"{label('profile')}", field=label("profile"))
    if sequential and loads is not None:
        raise RagsimInputError(f"{label('loads')} has its own sequential point (idle)",
                               field=label("sequential"))
    points = v.parse_loads(loads) if loads is not None else None
    if not isinstance(repeats, int | str):
        raise RagsimInputError(f"real runs per point must be a whole number, or counts by "
                               f"load, got {repeats!r}", field=label("repeats"))
    try:
        repeats_by_load = v.parse_repeats(repeats, points)
    except RagsimInputError as error:  # the API's name for the option, not the CLI's
        raise RagsimInputError(error.detail, field=label("repeats")) from None
    if replay_decisions and backend == "sim":
        raise RagsimInputError(f"{label('replay_decisions')} replays a real engine's "
                               "iterations: --backend sim runs none", field=label(
                                   "replay_decisions"))
    if backend == "torch" or profile_now:
        require_extra("profile", "ragsim validate")
    resolved, terms, given = _config(config, trace=trace, system=system, rate=rate,
                              requests=requests, seed=seed, policy=policy, gpu_mem=gpu_mem,
                              host_mem=host_mem, scheduler=scheduler, backend=backend,
                              device=device, search_latency=search_latency, reuse=reuse,
                              replicas=replicas, router=router)
    if backend == "vllm" and resolved.reuse != "prefix":
        # the blended prefill (RoPE shift, recompute) runs on the torch engine only: vLLM
        # has nothing real to compare with
        raise RagsimInputError(f"reuse {resolved.reuse} runs on the torch engine only: the "
                               "vllm engine has no blended prefill to validate against",
                               field=label("reuse"))
    if resolved.replicas > 1:  # a fleet on both sides: the real one's limits first
        from ragsim.serving.fleet import fleet_problem

        problem = fleet_problem(resolved, backend)
        if problem is not None:
            raise RagsimInputError(problem, field=label("replicas"))
    if terms:
        note(v.terms_note(terms, backend))
    from ragsim.traces import resolve_trace

    data = resolve_trace(resolved.trace, seed=resolved.seed, n_requests=resolved.n_requests)
    searching = v.search_note(data, resolved, backend)
    if searching is not None:
        note(*searching)
    searches_for_real = (searching is not None and not searching[1]
                         and backend in ("torch", "vllm"))
    costs = _cost_profile(profile, profile_now, backend, out_dir, layers=layers, hidden=hidden,
                          device=device, threads=threads, seed=seed,
                          needs=lambda kv_bytes: v.run_needs(data, resolved, kv_bytes),
                          on_phase=on_profile_phase,
                          # vLLM's block where the run pages prefixes, else ragsim profile's
                          block_tokens=(resolved.prefix_block_tokens
                                        if resolved.prefix_block_tokens > 1 else 32),
                          note=note)
    if searches_for_real:
        if device == "cpu":
            resolved = _search_pool_beside_engine(resolved, config, threads, costs, note)
        resolved = _with_measured_handoff(resolved, data, config, note, probes)
    v.engine_scale(costs, layers, hidden)
    if backend == "torch":  # on a GPU: what the engine's padded batches leave for the pool
        from ragsim.realrun.memory import fit_for_device

        resolved, memory_terms, memory_note = fit_for_device(
            resolved, data, costs, device, given=given, who="both sides run so")
        if memory_note is not None:
            terms = {**terms, **memory_terms}
            note(memory_note)
    misses = heldout_misses(costs.obtained, biased_by=PROFILE_BIAS)
    if misses and backend != "sim":
        note(f"profile: its own held-out steps put a kind of step's prices more than "
             f"{PROFILE_BIAS:.0%} off ({heldout_words(misses)}): biased before any run; a miss "
             "the cost model carries names the profile as its next fix (remeasure it at rest)",
             warning=True)
    if backend in ("torch", "vllm"):  # the real engine runs in this process, on its allocator
        from ragsim.profiles.allocator import allocator_note, memory_allocator

        obtained = costs.obtained if isinstance(costs.obtained, dict) else {}
        warning = allocator_note(backend, obtained.get("allocator"), memory_allocator())
        if warning is not None:
            note(warning, warning=True)
    if backend == "vllm":  # the first real runs: after every note on how the runs will go
        resolved = _with_measured_engine_loop(resolved, data, costs, config, note, threads,
                                              probes)
    elif backend == "torch":  # likewise: its loop and, searching for real, its search term
        resolved, costs = _with_measured_torch_loop(resolved, data, costs, config, note,
                                                    device, threads, probes,
                                                    searches_for_real)
    resolved = resolved.replace(profile=str(out_dir / "profile.json") if profile_now
                                else profile or costs.name)
    if "engine_steps" in probes:  # the profile the simulation prices with, as given to it
        out_dir.mkdir(parents=True, exist_ok=True)
        resolved = resolved.replace(profile=str(costs.save(out_dir / "profile-priced.json")))
    sigma = correlation = 0.0
    if sim_replicas > 1:
        resolved, sigma, correlation = _ensemble_spread(resolved, costs, sim_replicas, note,
                                                        probes)
    if sequential:
        resolved, changed = v.sequential_config(resolved)
        if changed:
            note("sequential: " + ", ".join(f"{k} {was} -> {now}"
                                            for k, (was, now) in changed.items())
                 + " (decisions that race with time; the open-loop runs keep them)")
    reference = None
    if reference_profile is not None:
        from ragsim.profiles.profile import load_profile

        reference = load_profile(reference_profile)
    if backend == "sim":
        note(f"{label('backend')} sim: the 'real' side is a second simulation"
             + (f" (profile {reference.name})" if reference else "") + ", not a real run",
             warning=True)
    return ValidationSetup(out_dir, backend, device, threads, data, resolved, terms, costs,
                           reference, points, notes, replay_decisions, repeats_by_load,
                           probes,
                           sim_replicas=sim_replicas, step_time_sigma=sigma,
                           step_time_correlation=correlation)


def validate(out_dir: str | Path, *, progress: bool = False, **options) -> Validation:
    """Measure how far the simulation is from a real engine on the same trace and settings,
    as ``ragsim validate`` does (``options``: its options in snake case; ``config`` a TOML
    path). Writes what ``--out`` holds into ``out_dir``."""
    import inspect

    from ragsim.api.options import unknown_option

    known = set(inspect.signature(setup_validation).parameters) - {
        "out_dir", "on_note", "on_profile_phase"}
    for name in options:
        if name not in known:
            raise unknown_option(name, known, "ragsim.validate")
    setup = setup_validation(out_dir, **options)
    if not progress:
        return setup.execute()
    from ragsim.progress import progress_bar

    def on_run(label_: str, total: int):
        bar = progress_bar(label_)
        handles = []

        class _Context:
            def __enter__(self):
                start, advance = bar.__enter__()
                start(total)
                handles.append(advance)

            def __exit__(self, *exc):
                return bar.__exit__(*exc)

        return _Context(), (lambda ended: handles[0](ended) if handles else None)

    return setup.execute(on_run)


__all__ = ["DEFAULT_REQUESTS", "Validation", "ValidationSetup", "setup_validation", "validate"]
