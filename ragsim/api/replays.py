"""``ragsim.replay``: a trace, in order, through the cache policy core (no timing model).

Set up in two steps, as a run is: :func:`setup_replay` checks the options and loads the costs
(before any trace is generated), :meth:`ReplaySetup.execute` replays.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ragsim.api.options import as_bytes, generator_settings, label
from ragsim.api.run import Result
from ragsim.errors import RagsimInputError
from ragsim.limits import REPLAY_BYTES_PER_REQUEST, memory_problem

if TYPE_CHECKING:

    from ragsim.profiles.profile import Profile
    from ragsim.sim.replay import ReplayConfig, ReplayResult

# Replay's memory defaults differ from run's on purpose: run models the paper's A10G server (192
# GiB of host memory, the GPU's KV space from the profile); replay is for comparing policies,
# and at 192 GiB the built-in traces nearly fit, so every policy scores alike (mmlu: PGDSF
# 51.3%, LRU 50.0%; at 4 + 32 GiB: 40.8% and 35.4%). Both show their defaults in help and
# echo the sizes they used in the summary.
REPLAY_GPU_MEM = "4GiB"
REPLAY_HOST_MEM = "32GiB"


def _check_frequency_scope(scope: str, window_s: float | None) -> None:
    from ragsim.cache.tree import FREQUENCY_SCOPES

    if scope not in FREQUENCY_SCOPES:
        raise RagsimInputError(f"unknown scope {scope!r}; choose one of "
                               f"{', '.join(FREQUENCY_SCOPES)}", field=label("frequency_scope"))
    if scope == "window" and window_s is None:
        raise RagsimInputError(f"the window scope needs {label('frequency_window')} SECONDS",
                               field=label("frequency_scope"))
    if scope != "window" and window_s is not None:
        raise RagsimInputError(f"applies only to {label('frequency_scope')} window",
                               field=label("frequency_window"))
    if window_s is not None and not window_s > 0:
        raise RagsimInputError("must be > 0", field=label("frequency_window"))


def _check_fleet(replicas: int, router: str) -> None:
    from ragsim.cache.routers import ROUTERS, TIMING_FREE_ROUTERS
    from ragsim.limits import MAX_INSTANCES

    if isinstance(replicas, bool) or not isinstance(replicas, int) or not \
            1 <= replicas <= MAX_INSTANCES:
        raise RagsimInputError(f"must be a whole number from 1 to {MAX_INSTANCES}, got "
                               f"{replicas!r}", field=label("replicas"))
    if router not in TIMING_FREE_ROUTERS:
        why = ("needs the simulator's clock (outstanding requests)" if router in ROUTERS
               else "is not a router")
        raise RagsimInputError(f"{router!r} {why}; a replay routes by "
                               f"{', '.join(TIMING_FREE_ROUTERS)}", field=label("router"))


@dataclass
class ReplaySetup:
    """A checked replay that has not started: its configuration, the costs PGDSF reads, the
    drift asked of a synthetic trace, and the notes a caller may print."""

    config: ReplayConfig
    costs: Profile
    drift: float | None = None
    notes: list[str] = field(default_factory=list)
    inputs: tuple = ()  # what it reads, as given (trace, profile, model): never written over

    def execute(self, on_progress: Callable[[int], None] | None = None,
                on_start: Callable[[int], None] | None = None) -> Replay:
        from ragsim.sim.replay import run_replay
        from ragsim.traces import resolve_trace

        c = self.config
        data = resolve_trace(c.trace, seed=c.seed, n_requests=c.n_requests,
                             **generator_settings(self.drift))
        if on_start is not None:
            on_start(data.n_requests)
        return Replay(run_replay(data, c, self.costs, on_progress), data.n_requests,
                      inputs=self.inputs)


def setup_replay(trace: str = "mmlu", policy: str = "pgdsf", frequency_scope: str = "lifetime",
                 frequency_window: float | None = None, model: str = "mistral-7b",
                 gpu_mem: str | int = REPLAY_GPU_MEM, host_mem: str | int = REPLAY_HOST_MEM,
                 flat: bool = False, kv_bytes_per_token: int | None = None,
                 profile: str = "a10g-mistral-7b", system_prompt_tokens: int = 0,
                 cache_depth: int | None = None, requests: int | None = None, seed: int = 0,
                 drift: float | None = None, replicas: int = 1,
                 router: str = "round-robin", reuse: str = "prefix") -> ReplaySetup:
    """Check ``ragsim replay``'s options (the same names in snake case) and load the costs."""
    from ragsim.cache.policies import POLICY_NAMES
    from ragsim.cache.reuse import parse_reuse
    from ragsim.profiles.models import resolve_model
    from ragsim.profiles.profile import load_profile
    from ragsim.sim.replay import ReplayConfig

    spec = resolve_model(model)
    if kv_bytes_per_token is not None and kv_bytes_per_token <= 0:
        raise RagsimInputError("must be > 0", field=label("kv_bytes_per_token"))
    if cache_depth is not None and cache_depth < 0:
        raise RagsimInputError("must be >= 0", field=label("cache_depth"))
    from ragsim import limits

    if cache_depth is not None and cache_depth > limits.MAX_CACHED_DEPTH:
        raise RagsimInputError(f"must be <= {limits.MAX_CACHED_DEPTH:,} (documents; omit it "
                               "for no limit)", field=label("cache_depth"))
    if system_prompt_tokens < 0:
        raise RagsimInputError("must be >= 0", field=label("system_prompt_tokens"))
    for name, value in (("kv_bytes_per_token", kv_bytes_per_token), ("seed", seed),
                        ("system_prompt_tokens", system_prompt_tokens)):
        if value is not None and abs(value) > limits.MAX_INTEGER:  # as run's settings
            raise RagsimInputError(f"must lie within +-{limits.MAX_INTEGER:,} (2**60), got "
                                   f"{value:,}", field=label(name))
    if requests is not None and requests <= 0:
        raise RagsimInputError("must be > 0", field=label("requests"))
    problem = memory_problem(requests, REPLAY_BYTES_PER_REQUEST)
    if problem:  # before minutes of generating or replaying end in a MemoryError
        raise RagsimInputError(f"cannot be replayed here: {problem}", field=label("requests"))
    _check_frequency_scope(frequency_scope, frequency_window)
    _check_fleet(replicas, router)
    try:
        rule = parse_reuse(reuse)
    except ValueError as exc:
        raise RagsimInputError(str(exc), field=label("reuse")) from None
    if flat and rule.position_free:
        raise RagsimInputError(f"{reuse} needs the tree: a flat cache (--flat) has no "
                               "positions", field=label("reuse"))
    config = ReplayConfig(
        trace=trace, policy=policy.lower(), model=spec.name,
        kv_bytes_per_token=kv_bytes_per_token or spec.kv_bytes_per_token,
        gpu_capacity_bytes=as_bytes(gpu_mem, "gpu_mem"),
        host_capacity_bytes=as_bytes(host_mem, "host_mem"),
        flat=flat, profile=profile, system_prompt_tokens=system_prompt_tokens,
        max_cached_depth=cache_depth, n_requests=requests, seed=seed,
        frequency_scope=frequency_scope, frequency_window_s=frequency_window,
        replicas=replicas, router=router, reuse=str(rule),
    )
    if config.policy not in POLICY_NAMES:
        raise RagsimInputError(f"unknown policy {policy!r}; choose one of "
                               f"{', '.join(POLICY_NAMES)}", field=label("policy"))
    notes = []
    if flat and config.host_capacity_bytes:
        config = replace(config, host_capacity_bytes=0)
        notes.append(f"{label('flat')} uses one tier of {label('gpu_mem')}; host memory is "
                     "ignored")
    costs = load_profile(profile)
    if drift is not None and not 0.0 <= drift <= 1.0:
        raise RagsimInputError("must lie in [0, 1]", field=label("drift"))
    return ReplaySetup(config, costs, drift, notes, inputs=(trace, profile, model))


# replay's options, read from the one place that declares them
REPLAY_OPTIONS = tuple(inspect.signature(setup_replay).parameters)


@dataclass
class Replay(Result):
    """A finished (or interrupted) replay: what ``ragsim replay --json`` prints and ``--out``
    writes (``requests.parquet``, ``summary.json``)."""

    result: ReplayResult
    trace_requests: int = 0  # the trace's requests (a Ctrl-C may have replayed fewer)


def replay(trace: str = "mmlu", *, progress: bool = False, **options) -> Replay:
    """Feed a trace, in order, through the cache policy core (no timing model), as
    ``ragsim replay`` does; ``options`` are its options in snake case (``policy``, ``gpu_mem``,
    ``host_mem``, ``flat``, ``requests``, ``seed``, ``drift``, ...)."""
    from ragsim.api.options import unknown_option

    for name in options:
        if name not in REPLAY_OPTIONS:
            raise unknown_option(name, REPLAY_OPTIONS, "ragsim.replay")
    setup = setup_replay(trace, **options)
    if not progress:
        return setup.execute()
    from ragsim.progress import progress_bar

    with progress_bar("replay") as (start, advance):
        return setup.execute(on_progress=advance, on_start=start)


__all__ = ["REPLAY_OPTIONS", "Replay", "ReplaySetup", "replay", "setup_replay"]
