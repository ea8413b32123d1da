"""What one simulation run is: a flat, validated, serialisable configuration and system presets.

A configuration is plain data (TOML on disk, ``[run]`` table) so a run can be repeated exactly:
``ragsim run --out DIR`` writes the resolved configuration next to the results and
``ragsim run --config DIR/config.toml`` reruns it. Presets (``--system``) set the fields that
distinguish the systems the paper compares; any field can then be overridden flag by flag.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from ragsim import limits
from ragsim.cache.answers.keys import NAME_RULE, valid_name
from ragsim.cache.padded_batches import PADDED_JOINS
from ragsim.cache.policies import POLICY_NAMES
from ragsim.cache.reorder import DEFAULT_SCAN_LIMIT, DEFAULT_WINDOW_S, ORDERS, WINDOW_STARTS
from ragsim.cache.reuse import parse_reuse
from ragsim.cache.routers import ROUTERS
from ragsim.cache.tree import DEFAULT_FREQUENCY_SCOPE, FREQUENCY_SCOPES, HOST_WRITES
from ragsim.errors import ConfigError, RagsimInputError
from ragsim.redact import redact_url
from ragsim.units import parse_bytes

GiB = 2**30
ARRIVALS = ("trace", "poisson", "gamma", "sequential")
STAGE_SOURCES = ("auto", "trace", "synthetic", "none")
RETRIEVALS = ("auto", "on", "off")
# settings that only mean something with a vector search: giving one asks for it
SEARCH_SETTINGS = ("search_workers", "search_s", "search_stages", "stage_source",
                   "stage_converge_p", "stage_keeps_d1_p", "stage_other_found_p",
                   "search_latency", "search_time_scale", "search_handoff_s",
                   "search_dispatch_s")
SEARCH_LATENCIES = ("fixed", "trace")
# a step-time spread past this is not a timing noise but a different machine
MAX_STEP_TIME_SIGMA = 1.0
# a step's deviation carried into the next one past this is not a noise about the price but a
# run at another speed
MAX_STEP_TIME_CORRELATION = 0.95
CONFIG_VERSION = 1


@dataclass(frozen=True)
class SimConfig:
    """Every knob of a run; defaults are the paper's main setup (A10G, Mistral-7B, top-2).

    Memory: ``gpu_kv_bytes`` is the GPU memory for KV (cache *and* running requests); ``None``
    takes the profile's ``kv_capacity_bytes`` (what weights and activations leave of the GPU).
    """

    trace: str = "mmlu"
    system: str = "ragcache"
    profile: str = "a10g-mistral-7b"
    n_requests: int | None = None
    top_k: int | None = None  # truncate each request's retrieved list (None: as in the trace)
    seed: int = 0
    # synthetic traces only: popularity drift per 1,000 requests (None: the built-in trace's);
    # a run records the value it used, so its config.toml reruns the same traffic
    trace_drift_per_1k_requests: float | None = None
    # arrivals
    # trace timestamps, re-timed (poisson | gamma), or sequential: each request arrives when the
    # previous one ended (one client, closed loop; what `validate --sequential` compares)
    arrival: str = "trace"
    rate_rps: float | None = None
    cv: float = 1.0
    # knowledge cache
    cache: bool = True  # False: no cross-request reuse (vLLM v0.3)
    policy: str = "pgdsf"
    # how every frequency policy counts retrievals: admission | lifetime | window (the last
    # frequency_window_s seconds of simulated time); one rule for all, see cache/tree.py
    frequency_scope: str = DEFAULT_FREQUENCY_SCOPE
    frequency_window_s: float | None = None
    host_cache_bytes: int = 192 * GiB
    # when KV is copied to host: "back", the first time the GPU evicts it (RAGCache, HiCache's
    # write_back), or "through", when it is computed (HiCache's write_through, vLLM's CPU
    # offloading connector); see ragsim/cache/tree.py
    host_write: str = "back"
    # may the host drop its copy of KV still in GPU? (HiCache: no, it evicts only the host
    # copies of nodes the GPU evicted; vLLM's CPU LRU and RAGCache: yes)
    host_evicts_gpu_copies: bool = True
    gpu_kv_bytes: int | None = None
    max_cached_depth: int | None = None
    prefix_block_tokens: int = 1  # hits count whole blocks only (vLLM's automatic prefix cache)
    # document KV reuse: prefix (behind the same ordered prefix) | blend:R | epic:K (also at any
    # position, recomputing R of each such document or its first K tokens; cache/reuse.py)
    reuse: str = "prefix"
    system_prompt_tokens: int = 0
    # scheduler
    reorder: bool = True
    # which waiting request a decision takes: fcfs | cache-aware (the paper's OrderPriority) |
    # sjf (fewest tokens to compute) | lpm (most tokens cached); see ragsim/cache/reorder.py.
    # None: from reorder (cache-aware if on, else fcfs); resolved, reorder = order != fcfs
    order: str | None = None
    # seconds a request can be passed over; "head": counted from when it is the oldest waiting
    # request, "arrival": the paper's literal rule (see ragsim/cache/reorder.py)
    reorder_window_s: float = DEFAULT_WINDOW_S
    reorder_window_start: str = "head"
    reorder_scan: int = DEFAULT_SCAN_LIMIT
    max_batch_size: int = 256  # running requests
    max_prefill_bs: int = 8  # requests prefilled in one iteration
    max_batched_tokens: int = 16384  # new tokens prefilled in one iteration
    # retrieval (vector search on a CPU pool)
    search_workers: int = 16
    # one request's search on one worker: measured, benchmarks/retrieval_latency.py (the paper's
    # 300k x 768-d IVF1024, a quarter of the lists probed), see serving/retrieval.py
    search_s: float = 0.0155
    search_stages: int = 4
    stage_source: str = "auto"  # auto: the trace's stages if present, else synthetic
    # synthetic stages: chance a stage finds the final list (fitted on wiki-trivia's real
    # staged IVF search, a quarter of the lists probed: ragsim trace stats wiki-trivia)
    stage_converge_p: float = 0.72
    # synthetic stages: the shape of a wrong list (fitted on wiki-trivia's first wrong lists:
    # python benchmarks/fit_stage_model.py): it holds the final D1 with this probability, and
    # a list without D1 holds each other final document with stage_other_found_p
    stage_keeps_d1_p: float = 0.477
    stage_other_found_p: float = 0.777
    search_latency: str = "fixed"  # fixed: search_s in equal stages; trace: measured times
    search_time_scale: float = 1.0  # multiplies the trace's measured stage times
    # added once to each search (to its first stage): handing the search to a worker and seeing
    # its stages' results, past their own times (threads waking each way; a search measured in
    # a tight loop at trace build leaves it out). validate measures it on the real run's
    # worker pool (realrun/search.py: measure_handoff); 0: a search tier that costs nothing
    search_handoff_s: float = 0.0
    # from a request's arrival to its search being handed to the search tier (a front end
    # waking for it), before any worker is taken: no worker is held meanwhile, and a run
    # counts it as the wait for the search (search_wait). validate measures it on its probe
    # runs (realrun/probe_runs.py: search_lag_in_runs); 0: a front end that hands over at once
    search_dispatch_s: float = 0.0
    # the engine's serving loop, on the engine's own timeline: the time between two steps of a
    # busy engine (handling a step's outputs), and per request handed to it past the intake
    # the profile's prefill prices hold (its intake in a serving process, the pipeline's work
    # on it). ragsim's real vLLM run does both on the engine's thread; validate measures them
    # there (realrun/vllm/loop.py: measure_engine_loop); 0: a loop that costs nothing
    engine_loop_step_s: float = 0.0
    engine_loop_request_s: float = 0.0
    # per request searched while the engine was busy: what its search cost the engine's steps
    # (a search tier in the engine's process shares its interpreter; serving/engine_loop.py).
    # validate times the engine's steps beside the trace's searches (realrun/search_cost.py);
    # 0: a search tier of its own
    engine_loop_search_s: float = 0.0
    # a KV connector's work inside the engine's steps, which no profile of the engine alone
    # holds (serving/connector_costs.py): per request the tree serves (its scheduler side), per
    # token it saves out of the engine's KV and per token it loads back (0: the profile's
    # transfers price host-tier copies). validate measures them on the probe runs' connector
    # (ragcache on vLLM); 0: a connector that costs nothing
    connector_request_s: float = 0.0
    connector_save_s_per_token: float = 0.0
    connector_load_s_per_token: float = 0.0
    # each step's time drawn around its price: x exp(N(0, step_time_sigma)) (serving/
    # step_noise.py), from a generator seeded by seed and step_noise_seed: one of the runs a
    # real engine might have. 0: every step at its price (one noise-free run). validate
    # --sim-replicas averages runs of step_noise_seed 0..K-1 (sigma measured on its probe runs'
    # steps, else the profile's repeats). step_time_correlation: how much of a step's deviation
    # carries into the next step's (an AR(1) in ln(step time), sigma its stationary spread;
    # 0: each step drawn on its own)
    step_time_sigma: float = 0.0
    step_time_correlation: float = 0.0
    step_noise_seed: int = 0
    # model the vector search (and speculation on it)? auto: when the trace's documents were
    # retrieved, not when they are prefix blocks with no search behind them (Mooncake); a
    # search setting or speculate=true given explicitly means on. A run records what it used.
    retrieval: str = "auto"
    speculate: bool = True
    # engine
    overlap_swap: bool = False  # host->GPU KV loads overlapped with the prefill's compute
    # requests of one prefill batch hit KV an earlier request of the same batch computes (vLLM
    # v1 caches blocks when it schedules them; SGLang and RAGCache insert after the prefill)
    batch_kv_sharing: bool = False
    # how an iteration is formed: "prefill-first" (vLLM v0.3, the paper's prototype: a prefill
    # iteration of waiting requests, else a decode step) or "mixed" (vLLM >= 0.4's chunked
    # prefill, SGLang's mixed chunks: every step decodes the running requests and fills the
    # rest of max_batched_tokens with prefill chunks; a long prompt spans several steps)
    scheduler: str = "prefill-first"
    # which waiting prompt joins a prefill batch on an engine that pads a batch to its longest
    # prompt (a profile whose batched prefill pads: the torch engine's): "if-cheaper" (only a
    # prompt the profile prices cheaper together than in a step of its own,
    # ragsim/cache/padded_batches.py) or "always" (fill the step, as before 2026-12-07). A
    # varlen engine's profile (vLLM's, the GPU profiles) batches every prompt either way.
    padded_join: str = "if-cheaper"
    # faults
    fail_gpu_at_s: tuple[float, ...] = ()
    gpu_failure_rate_per_h: float = 0.0
    host_replicas: int = 0  # upper nodes kept replicated in host memory (fault tolerance)
    replicate_every_s: float = 10.0
    gpu_recovery_s: float = 10.0
    retry_timeout_s: float = 1.0
    max_retries: int = 3
    # answer cache in front of retrieval (ragsim/cache/answers; off: none of these apply, and
    # they are left out of the recorded configuration, so runs without it are unchanged)
    answer_cache: bool = False
    answer_distance: float = 0.1  # semantic hit: cosine distance <= this (similarity 0.9)
    answer_semantic: bool = True  # the semantic tier (needs query_text in the trace)
    answer_guard: str = "entities"  # a semantic hit's false-hit guard (or "none")
    # whose entries a request may be served: "none" (every request shares the cache) or
    # "session" (each session a tenant of its own: one user never gets another's answer)
    answer_tenant: str = "none"
    answer_l1_size: int = 100
    answer_l1_ttl_s: float = 60.0
    answer_ttl_s: float = 3600.0  # L2 and semantic entries
    answer_null_ttl_s: float = 600.0
    answer_ttl_jitter: float = 0.1
    answer_hot_top_n: int | None = None
    answer_hot_window_s: float = 60.0
    instances: int = 1  # service instances, each with its own L1
    # a fleet: this many engines (each with the memory above) behind one router
    replicas: int = 1
    router: str = "round-robin"
    # the router sees the replicas' caches and outstanding work as of this long ago (a fleet's)
    router_staleness_s: float = 0.0
    answer_routing: str = "round-robin"  # or hash
    # a question whose answer changed in the trace has its shared entries dropped when the new
    # answer first appears (a knowledge-base update); instances' L1s keep the old one
    answer_invalidate: bool = True
    # each tier's lookup latency (and the query embedding's): a latency profile measured on the
    # real stores (ragsim profile --answer-cache); "default" is the one shipped with ragsim
    answer_profile: str = "default"
    # the real run's (--backend torch) Redis Stack / Redis 8 for L2 and the semantic tier
    # (None: an embedded server started for the run); the simulator does not use it
    answer_redis_url: str | None = None
    # the real run's keys on that Redis lie under ragsim:{namespace}: (None: a fresh run id,
    # deleted at the end; a name: kept, so runs given the same name share or warm one cache)
    answer_namespace: str | None = None

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["fail_gpu_at_s"] = list(self.fail_gpu_at_s)
        if self.reuse == "prefix":  # recorded when not the default: prefix runs as before
            data.pop("reuse")
        if not self.answer_cache:
            for name in ANSWER_FIELDS:
                data.pop(name)
        elif self.answer_redis_url:  # a recorded configuration never holds a password
            data["answer_redis_url"] = redact_url(self.answer_redis_url)
        if self.replicas == 1 and not self.router_staleness_s:  # a fleet's field
            data.pop("router_staleness_s")
        return data

    def to_toml(self) -> str:
        """TOML of the resolved configuration (``None`` fields are omitted: they mean default)."""
        run = {k: v for k, v in self.to_dict().items() if v is not None}
        return tomli_w.dumps({"format": "ragsim.config", "version": CONFIG_VERSION, "run": run})

    def replace(self, **changes) -> SimConfig:
        """A copy with ``changes``; changing ``reorder`` alone sets the order it means
        (cache-aware or fcfs), changing ``order`` alone sets ``reorder``."""
        if "reorder" in changes and "order" not in changes and changes["reorder"] != self.reorder:
            changes["order"] = "cache-aware" if changes["reorder"] else "fcfs"
        elif "order" in changes and "reorder" not in changes and changes["order"] in ORDERS:
            changes["reorder"] = changes["order"] != "fcfs"
        return validate(dataclasses.replace(self, **changes))


SCHEDULERS = ("prefill-first", "mixed")

# The systems the paper compares. Each preset lists only what it changes from the defaults.
SYSTEM_PRESETS: dict[str, dict] = {
    "vllm": dict(cache=False, reorder=False, speculate=False, host_cache_bytes=0,
                 policy="lru"),
    "vllm-apc": dict(cache=True, policy="lru", host_cache_bytes=0, reorder=False,
                     speculate=False, prefix_block_tokens=16, batch_kv_sharing=True),
    "sglang": dict(cache=True, policy="lru", host_cache_bytes=0, reorder=False,
                   speculate=False),
    "ragcache": dict(cache=True, policy="pgdsf", host_cache_bytes=192 * GiB, reorder=True,
                     speculate=True, host_replicas=32),
    # today's engines with host tiers, and the paper-era SGLang's own scheduling; what each
    # follows in its engine's source: ragsim/serving/system_sources.py (`ragsim systems --json`)
    "sglang-lpm": dict(cache=True, policy="lru", host_cache_bytes=0, reorder=True, order="lpm",
                       speculate=False, reorder_window_s=limits.MAX_DURATION_S),
    "sglang-hicache": dict(cache=True, policy="lru", host_cache_bytes=192 * GiB,
                           host_write="through", host_evicts_gpu_copies=False, reorder=False,
                           speculate=False, overlap_swap=True),
    "vllm-offload": dict(cache=True, policy="lru", host_cache_bytes=192 * GiB,
                         host_write="through", reorder=False, speculate=False,
                         prefix_block_tokens=16, batch_kv_sharing=True, overlap_swap=True),
}
SYSTEM_DESCRIPTIONS = {
    "vllm": "vLLM v0.3 (the paper's baseline): continuous batching, no cross-request KV reuse",
    "vllm-apc": "vLLM with automatic prefix caching: GPU blocks of 16 tokens, LRU",
    "sglang": "SGLang (2024, the paper's baseline): GPU radix tree over token prefixes, LRU, "
              "no host tier, FCFS",
    "sglang-lpm": "SGLang v0.1 (the paper's era) as its server scheduled: the sglang preset "
                  "with longest-prefix-match order and no starvation bound",
    "sglang-hicache": "SGLang with HiCache: radix tree in GPU + host, write-through, LRU in "
                      "both tiers, layer-wise load-back overlapped with compute, FCFS",
    "vllm-offload": "vLLM v1 prefix caching with its CPU offloading connector: blocks of 16 "
                    "tokens stored to host as computed, LRU in both tiers",
    "ragcache": "RAGCache: knowledge tree in GPU + host, PGDSF, cache-aware reordering, "
                "dynamic speculative pipelining, host replicas of the upper nodes",
}


ANSWER_FIELDS = ("answer_cache", "answer_distance", "answer_semantic", "answer_guard",
                 "answer_tenant",
                 "answer_l1_size",
                 "answer_l1_ttl_s", "answer_ttl_s", "answer_null_ttl_s", "answer_ttl_jitter",
                 "answer_hot_top_n", "answer_hot_window_s", "instances", "answer_routing",
                 "answer_invalidate", "answer_profile", "answer_redis_url", "answer_namespace")


def preset(system: str) -> dict:
    if system not in SYSTEM_PRESETS:
        raise ConfigError(f"unknown system {system!r}; known: {', '.join(SYSTEM_PRESETS)}",
                          field="system")
    return dict(SYSTEM_PRESETS[system])


_FIELDS = {f.name: f for f in dataclasses.fields(SimConfig)}
_BYTES_FIELDS = ("host_cache_bytes", "gpu_kv_bytes")


def build_config(overrides: dict, *, base: dict | None = None, source: str | None = None
                 ) -> SimConfig:
    """Defaults, then the system preset, then ``base`` (a config file), then ``overrides``.

    The preset is applied under everything given explicitly, so ``--system sglang --policy
    pgdsf`` is SGLang's setup with PGDSF.
    """
    given = {**(base or {}), **{k: v for k, v in overrides.items() if v is not None}}
    unknown = sorted(set(given) - set(_FIELDS))
    if "reorder_window" in unknown:  # a config.toml written before the window was seconds
        raise ConfigError("the reordering window is now seconds: replace reorder_window "
                          "(scheduling decisions) with reorder_window_s", file=source,
                          field="reorder_window")
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", file=source,
                          field=unknown[0])
    if "retrieval" not in given and (given.get("speculate") is True
                                     or any(k in given for k in SEARCH_SETTINGS)):
        given["retrieval"] = "on"  # asked for a search: model one whatever the trace
    if given.get("rate_rps") is not None and "arrival" not in given:
        given["arrival"] = "poisson"  # a rate without a process: Poisson, the paper's choice
    system = given.get("system", SimConfig.system)
    if not isinstance(system, str) or system not in SYSTEM_PRESETS:  # named with the file
        raise ConfigError(f"unknown system {system!r}; known: {', '.join(SYSTEM_PRESETS)}",
                          file=source, field="system")
    values = {**preset(system), **given}
    _resolve_order(values, given, source)
    for name in _BYTES_FIELDS:
        value = values.get(name)
        if value is not None and not isinstance(value, int):
            if isinstance(value, bool) or not isinstance(value, str | float) or (
                    isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"must be a size such as 4GiB or a number of bytes, got "
                                  f"{value!r}", file=source, field=name)
            try:
                values[name] = parse_bytes(value, field=name)
            except RagsimInputError as exc:  # the same message, with the file that said it
                raise ConfigError(exc.detail, file=source, field=name) from exc
            except OverflowError as exc:  # digits past a float's range
                raise ConfigError(f"too large: {value!r}", file=source, field=name) from exc
    if "fail_gpu_at_s" in values:
        times = values["fail_gpu_at_s"]
        values["fail_gpu_at_s"] = tuple(times) if isinstance(times, list | tuple) else (times,)
    return validate(SimConfig(**values), source=source)


def _resolve_order(values: dict, given: dict, source: str | None) -> None:
    """``order`` and ``reorder`` say one thing: an order given sets reorder (every order but
    fcfs reorders); reorder given alone sets the order (cache-aware or fcfs) over a preset's."""
    order, reorder = given.get("order"), given.get("reorder")
    if order is not None and isinstance(order, str) and isinstance(reorder, bool) \
            and reorder != (order != "fcfs"):
        raise ConfigError(f"order {order} {'reorders' if order != 'fcfs' else 'is FCFS'}: "
                          f"it cannot go with reorder = {str(reorder).lower()}", file=source,
                          field="order")
    if order is None and isinstance(reorder, bool):
        values["order"] = "cache-aware" if reorder else "fcfs"
    order = values.get("order")
    if order is None:
        values["order"] = ("cache-aware" if values.get("reorder", SimConfig.reorder)
                           else "fcfs")
    elif isinstance(order, str) and order in ORDERS and "reorder" not in given:
        values["reorder"] = order != "fcfs"


def _check(ok: bool, name: str, message: str, source: str | None) -> None:
    if not ok:
        raise ConfigError(message, file=source, field=name)


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _kinds() -> tuple[dict[str, type], set[str]]:
    """Each field's base type (bool, int, float, str, tuple) and which fields may be None."""
    kinds, optional = {}, set()
    for name, hint in typing.get_type_hints(SimConfig).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            optional.add(name)
        base = typing.get_origin(hint) or hint
        kinds[name] = args[0] if base is types.UnionType else base
    return kinds, optional


_KINDS, _OPTIONAL = _kinds()


def validate(config: SimConfig, *, source: str | None = None) -> SimConfig:
    """Reject what cannot run, naming the field."""
    for name, kind in _KINDS.items():
        value = getattr(config, name)
        if value is None:
            _check(name in _OPTIONAL, name, "must be set", source)
        elif kind is bool:
            _check(isinstance(value, bool), name, f"must be true or false, got {value!r}",
                   source)
        elif kind is int:
            _check(isinstance(value, int) and not isinstance(value, bool), name,
                   f"must be an integer, got {value!r}", source)
            _check(abs(value) <= limits.MAX_INTEGER, name,
                   f"must lie within +-{limits.MAX_INTEGER:,} (2**60), got {value:,}", source)
        elif kind is float:
            _check(_is_number(value), name, f"must be a number, got {value!r}", source)
        elif kind is str:
            _check(isinstance(value, str), name, f"must be a string, got {value!r}", source)
        elif kind is tuple:
            _check(all(_is_number(v) for v in value), name,
                   f"must be a list of numbers, got {list(value)!r}", source)
    c = config
    _check(c.system in SYSTEM_PRESETS, "system",
           f"unknown system {c.system!r}; known: {', '.join(SYSTEM_PRESETS)}", source)
    _check(c.policy in POLICY_NAMES and c.policy != "belady", "policy",
           f"must be one of {', '.join(p for p in POLICY_NAMES if p != 'belady')} "
           "(Belady needs the future, which an online simulator does not have)", source)
    _check(c.host_write in HOST_WRITES, "host_write", f"must be one of {', '.join(HOST_WRITES)}",
           source)
    try:
        rule = parse_reuse(c.reuse)
    except ValueError as exc:
        _check(False, "reuse", str(exc), source)
    _check(not rule.position_free or c.prefix_block_tokens == 1, "reuse",
           f"{c.reuse} reuses whole documents: it needs prefix_block_tokens 1, not "
           f"{c.prefix_block_tokens}", source)
    _check(c.frequency_scope in FREQUENCY_SCOPES, "frequency_scope",
           f"must be one of {', '.join(FREQUENCY_SCOPES)}", source)
    _check(c.frequency_scope != "window" or c.frequency_window_s is not None,
           "frequency_window_s", "the window frequency scope needs a window in seconds", source)
    _check(c.frequency_scope == "window" or c.frequency_window_s is None, "frequency_window_s",
           "applies only to frequency_scope window", source)
    _check(c.frequency_window_s is None or c.frequency_window_s > 0, "frequency_window_s",
           "must be > 0", source)
    _check(c.arrival in ARRIVALS, "arrival", f"must be one of {', '.join(ARRIVALS)}", source)
    _check(c.arrival in ("trace", "sequential") or (c.rate_rps is not None and c.rate_rps > 0),
           "rate_rps",
           "a re-timed arrival process needs a positive rate", source)
    _check(c.rate_rps is None or c.rate_rps > 0, "rate_rps", "must be > 0", source)
    _check(c.cv > 0, "cv", "must be > 0", source)
    _check(c.replicate_every_s >= limits.MIN_REPLICATE_EVERY_S, "replicate_every_s",
           f"must be >= {limits.MIN_REPLICATE_EVERY_S:g} s (every tick is simulated)", source)
    for name in ("search_s", "gpu_recovery_s", "retry_timeout_s", "reorder_window_s",
                 "replicate_every_s", "search_handoff_s", "search_dispatch_s",
                 "engine_loop_step_s",
                 "engine_loop_request_s", "engine_loop_search_s", "connector_request_s",
                 "connector_save_s_per_token", "connector_load_s_per_token"):
        _check(not getattr(c, name) > limits.MAX_DURATION_S, name,
               f"must be <= {limits.MAX_DURATION_S:,.0f} s (30 days), got "
               f"{getattr(c, name):.4g}: are the units seconds?", source)
    _check(not c.search_s * c.search_time_scale > limits.MAX_DURATION_S, "search_time_scale",
           f"makes a search of {c.search_s * c.search_time_scale:.4g} s, more than 30 days",
           source)
    _check(c.gpu_failure_rate_per_h <= limits.MAX_GPU_FAILURE_RATE_PER_H,
           "gpu_failure_rate_per_h",
           f"must be <= {limits.MAX_GPU_FAILURE_RATE_PER_H:g} (once a second), got "
           f"{c.gpu_failure_rate_per_h:g}", source)
    _check(c.max_retries <= limits.MAX_RETRIES, "max_retries",
           f"must be <= {limits.MAX_RETRIES}", source)
    _check(c.instances <= limits.MAX_INSTANCES, "instances",
           f"must be <= {limits.MAX_INSTANCES}", source)
    _check(isinstance(c.replicas, int) and not isinstance(c.replicas, bool)
           and 1 <= c.replicas <= limits.MAX_INSTANCES, "replicas",
           f"must be a whole number from 1 to {limits.MAX_INSTANCES}", source)
    _check(c.router in ROUTERS, "router", f"must be one of {', '.join(ROUTERS)}", source)
    _check(0 <= c.router_staleness_s <= limits.MAX_DURATION_S, "router_staleness_s",
           f"must be from 0 to {limits.MAX_DURATION_S:g} s", source)
    _check(0 < c.stage_converge_p <= 1, "stage_converge_p", "must be in (0, 1]", source)
    for name in ("stage_keeps_d1_p", "stage_other_found_p"):
        _check(0 <= getattr(c, name) <= 1, name, "must be in [0, 1]", source)
    _check(c.stage_source in STAGE_SOURCES, "stage_source",
           f"must be one of {', '.join(STAGE_SOURCES)}", source)
    _check(c.search_latency in SEARCH_LATENCIES, "search_latency",
           f"must be one of {', '.join(SEARCH_LATENCIES)}", source)
    _check(c.search_latency == "fixed" or c.stage_source in ("auto", "trace"), "search_latency",
           "measured stage times describe the trace's own stages: use stage_source auto or "
           "trace", source)
    _check(c.order is None or c.order in ORDERS, "order",
           f"must be one of {', '.join(ORDERS)}", source)
    _check(c.order is None or c.reorder == (c.order != "fcfs"), "order",
           f"order {c.order} does not go with reorder = {str(c.reorder).lower()}", source)
    _check(c.reorder_window_s >= 0, "reorder_window_s", "must be >= 0", source)
    _check(c.reorder_window_start in WINDOW_STARTS, "reorder_window_start",
           f"must be one of {', '.join(WINDOW_STARTS)}", source)
    _check(c.search_time_scale > 0, "search_time_scale", "must be > 0", source)
    _check(c.scheduler in SCHEDULERS, "scheduler", f"must be one of {', '.join(SCHEDULERS)}",
           source)
    _check(c.padded_join in PADDED_JOINS, "padded_join",
           f"must be one of {', '.join(PADDED_JOINS)}", source)
    _check(c.retrieval in RETRIEVALS, "retrieval", f"must be one of {', '.join(RETRIEVALS)}",
           source)
    for name in ("search_workers", "search_stages", "max_batch_size", "max_prefill_bs",
                 "max_batched_tokens", "reorder_scan", "prefix_block_tokens"):
        _check(getattr(c, name) >= 1, name, "must be >= 1", source)
    _check(c.search_stages <= limits.MAX_SEARCH_STAGES, "search_stages",
           f"must be <= {limits.MAX_SEARCH_STAGES}", source)
    for name in ("search_s", "search_handoff_s", "search_dispatch_s", "engine_loop_step_s",
                 "engine_loop_request_s",
                 "engine_loop_search_s", "connector_request_s", "connector_save_s_per_token",
                 "connector_load_s_per_token", "gpu_recovery_s", "retry_timeout_s",
                 "gpu_failure_rate_per_h",
                 "host_cache_bytes", "max_retries", "system_prompt_tokens", "seed",
                 "host_replicas", "step_time_sigma", "step_time_correlation",
                 "step_noise_seed"):
        _check(getattr(c, name) >= 0, name, "must be >= 0", source)
    _check(not c.step_time_sigma > MAX_STEP_TIME_SIGMA, "step_time_sigma",
           f"must be <= {MAX_STEP_TIME_SIGMA:g} (the standard deviation of ln(step time): "
           f"{MAX_STEP_TIME_SIGMA:g} lets one step in 20 take over 5x its price)", source)
    _check(not c.step_time_correlation > MAX_STEP_TIME_CORRELATION, "step_time_correlation",
           f"must be <= {MAX_STEP_TIME_CORRELATION:g} (a step's deviation carried into the "
           "next one: closer to 1 is a run at another speed, not a noise about the price)",
           source)
    _check(c.n_requests is None or c.n_requests >= 1, "n_requests", "must be >= 1", source)
    problem = limits.memory_problem(c.n_requests, limits.RUN_BYTES_PER_REQUEST)
    _check(problem is None, "n_requests", f"cannot be simulated here: {problem}", source)
    _check(c.trace_drift_per_1k_requests is None or 0 <= c.trace_drift_per_1k_requests <= 1,
           "trace_drift_per_1k_requests", "must lie in [0, 1]", source)
    _check(c.top_k is None or c.top_k >= 1, "top_k", "must be >= 1", source)
    _check(c.gpu_kv_bytes is None or c.gpu_kv_bytes > 0, "gpu_kv_bytes", "must be > 0", source)
    _check(c.max_cached_depth is None or c.max_cached_depth >= 0, "max_cached_depth",
           "must be >= 0", source)
    _check(c.max_cached_depth is None or c.max_cached_depth <= limits.MAX_CACHED_DEPTH,
           "max_cached_depth", f"must be <= {limits.MAX_CACHED_DEPTH:,} (documents; omit it "
           "for no limit)", source)
    _check(all(t >= 0 for t in c.fail_gpu_at_s), "fail_gpu_at_s",
           "failure times must be >= 0", source)
    _check(0 <= c.answer_distance <= 2, "answer_distance",
           "must be a cosine distance in [0, 2]", source)
    _check(c.answer_tenant in ("none", "session"), "answer_tenant", "must be none or session",
           source)
    _check(c.answer_guard in ("entities", "none"), "answer_guard", "must be entities or none",
           source)
    for name in ("answer_l1_size", "instances"):
        _check(getattr(c, name) >= 1, name, "must be >= 1", source)
    for name in ("answer_l1_ttl_s", "answer_ttl_s", "answer_null_ttl_s", "answer_hot_window_s"):
        _check(getattr(c, name) > 0, name, "must be > 0", source)
    _check(c.answer_ttl_jitter >= 0, "answer_ttl_jitter", "must be >= 0", source)
    _check(isinstance(c.answer_profile, str) and c.answer_profile != "", "answer_profile",
           "must name a latency profile ('default' or a JSON path)", source)
    _check(c.answer_hot_top_n is None or c.answer_hot_top_n >= 1, "answer_hot_top_n",
           "must be >= 1", source)
    _check(c.answer_routing in ("round-robin", "hash"), "answer_routing",
           "must be round-robin or hash", source)
    _check(c.answer_namespace is None or valid_name(c.answer_namespace), "answer_namespace",
           f"must be {NAME_RULE}", source)
    return config


CONFIG_TOP_KEYS = ("format", "version", "run")


def load_config_file(path: str | Path) -> dict:
    """The ``[run]`` table of a configuration file, checked for format and version. Keys
    beside ``format``, ``version`` and ``[run]`` are refused, as a sweep file refuses them (a
    setting written above ``[run]`` would otherwise be dropped without a word)."""
    from ragsim.user_files import read_user_toml

    source = str(path)
    data = read_user_toml(path, what="configuration", error=ConfigError)
    unknown = sorted(set(data) - set(CONFIG_TOP_KEYS))
    if unknown:
        hint = ("; settings go in the [run] table" if any(k in _FIELDS for k in unknown)
                else "")
        raise ConfigError(f"unknown key; a configuration has {', '.join(CONFIG_TOP_KEYS)}"
                          f"{hint}", file=source, field=unknown[0])
    if data.get("format", "ragsim.config") != "ragsim.config":
        raise ConfigError(f"not a ragsim configuration (format {data.get('format')!r})",
                          file=source, field="format")
    version = data.get("version", CONFIG_VERSION)
    # true == 1 and 1.0 == 1 in Python: the version is the integer itself
    if type(version) is not int or version != CONFIG_VERSION:
        raise ConfigError(f"unsupported version {version!r} (this ragsim reads "
                          f"{CONFIG_VERSION})", file=source, field="version")
    run = data.get("run")
    if not isinstance(run, dict):
        raise ConfigError("missing the [run] table", file=source, field="run")
    return run
