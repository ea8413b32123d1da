"""The torch engine's own step path priced into a profile, from real runs of it.

The profiler times the model's passes, the greedy sampling alone and a decode batch's write of
one shared prompt's KV; the reference engine's steps also look their prompts' tokens up, keep
their new KV, hand each row's token back and write rows whose KV lies in pieces. On the
project's 2-core CPU (docs/validation.md, "The torch engine's work around its passes") that
work cost a prompt step 0.29 ms where the profile priced 0.05, a decode row 0.085 ms (0.049),
and a changed batch's write 2.4-3.4x its price, so every loaded run priced by the profile alone
came out low. ``ragsim validate`` measures it on its own probe runs; this module measures it
for a profile, so that a plain ``ragsim run`` on it prices the engine as it runs: two short
real runs of a workload at two loads (``realrun.probe_runs.probe_configs``), their steps'
time outside the passes fitted into the profile's ``step_overhead`` (four terms) and their
writes into its ``batch_copy`` (``realrun.probe_runs.step_costs_in_runs``, the fit
``validate`` uses). What it measured, and the profiler's own terms beside, go into
``obtained["engine_steps"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from ragsim.profiles.allocator import memory_allocator
from ragsim.profiles.profile import Profile

# the workload the engine's steps are timed on where none is given (validate's default trace),
# and its requests a probe run: enough for prompt steps of one to several prompts and decode
# batches from one row to the burst's width, in a minute or two on two CPU cores
ENGINE_STEPS_TRACE = "mmlu"
ENGINE_STEPS_REQUESTS = 48


def measure_engine_steps(profile: Profile, *, trace: str = ENGINE_STEPS_TRACE,
                         requests: int = ENGINE_STEPS_REQUESTS, device: str = "cpu",
                         threads: int | None = None, seed: int = 0,
                         on_run: Callable[[int, int], None] | None = None) -> Profile:
    """``profile`` with its step overhead and batch write as the torch engine paid them in
    two real runs of ``requests`` requests of ``trace`` (built-in name or path), Poisson
    arrivals at ``probe_configs``' shares of the simulated burst capacity, each on a fresh
    engine built from the profile's model; ``on_run(done, total)`` hears each run end.
    Unchanged (with ``obtained["engine_steps"]`` saying why) where the runs kept no steps."""
    from ragsim import validation as v
    from ragsim.api.run import resolved_config
    from ragsim.realrun.harness import RealRun
    from ragsim.realrun.memory import fit_for_device
    from ragsim.realrun.probe_runs import probe_configs, step_costs_in_runs
    from ragsim.traces import resolve_trace

    config, _, given = resolved_config({"trace": trace, "system": "ragcache",
                                        "n_requests": requests, "seed": seed},
                                       base=None, config_file=None, device=device)
    data = resolve_trace(config.trace, seed=seed, n_requests=requests)
    config, _, _ = fit_for_device(config, data, profile, device, given=given,
                                  who="the engine's runs run so")
    burst = v.run_sim(data, v.config_at_load(config, v.LOAD_OVER, None), profile)
    capacity_rps = float(burst.summary["throughput_rps"])
    loads = probe_configs(config, capacity_rps)
    results = []
    for done, (_share, cfg) in enumerate(loads, 1):
        real = RealRun(data, cfg, profile, device=device, threads=threads, model_seed=seed,
                       speed_probes=False)
        results.append(real.run())
        if results[-1].summary.get("interrupted"):
            raise KeyboardInterrupt("the engine's step runs were stopped")
        if on_run is not None:
            on_run(done, len(loads))
    found = step_costs_in_runs([(getattr(r, "decisions", None) or {}).get("iterations")
                                for r in results],
                               profile)
    where = {"measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
             "allocator": memory_allocator(), "trace": trace, "requests": requests, "seed": seed,
             "loads": [{"share": share, "rate_rps": cfg.rate_rps} for share, cfg in loads],
             "capacity_rps": capacity_rps}
    if found is None:
        return replace(profile, obtained={**profile.obtained, "engine_steps": {
            **where, "measured": False, "why": "the runs kept no steps"}})
    report, overhead, copy = found
    # the fitted terms are the profile's own now; the profiler's stay beside, for comparison
    kept = {key: value for key, value in report.items() if not key.startswith(
        ("step_overhead", "batch_copy", "profile_"))}
    return replace(profile, step_overhead=overhead,
                   batch_copy=copy if copy is not None else profile.batch_copy,
                   obtained={**profile.obtained, "engine_steps": {
                       **where, "measured": True, **kept,
                       "profiler_step_overhead": report["profile_step_overhead"],
                       "profiler_batch_copy": report["profile_batch_copy"]}})


def engine_steps_words(profile: Profile) -> str | None:
    """What ``measure_engine_steps`` measured, in one sentence; None where it did not run."""
    found = profile.obtained.get("engine_steps")
    if not found:
        return None
    if not found.get("measured"):
        return f"engine steps: not measured ({found.get('why')}); the profiler's own terms"
    words = (f"engine steps: {found['steps']} steps of two real runs of {found['requests']} "
             f"{found['trace']} requests: {profile.step_overhead.describe()}")
    if found.get("writes"):
        words += (f"; {found['writes']} batch writes took {found['writes_measured_s'] * 1e3:.0f}"
                  f" ms where the profiler's term priced "
                  f"{found['writes_profile_priced_s'] * 1e3:.0f} ms")
    return words
