"""``ragsim.simulate``: one run of the RAG serving stack, simulated or served for real.

A run is set up in two steps that the command line needs apart: :func:`setup_run` resolves the
configuration (options over a config file over the system preset) and checks it, before any
trace is generated, so that ``ragsim run --out`` can refuse its folder before the work; then
:meth:`RunSetup.execute` loads the costs and the trace and runs. :func:`simulate` does both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ragsim.api.options import (
    as_bytes,
    cosine_distance,
    generator_settings,
    label,
    unknown_option,
)
from ragsim.errors import RagsimInputError

if TYPE_CHECKING:
    import pandas as pd

    from ragsim.serving.config import SimConfig
    from ragsim.serving.pipeline import RunResult

# ``ragsim run``'s options (``simulate``'s keywords): option -> the configuration field it sets.
# The same names in snake case as the flags (--host-mem: host_mem); errors name them so.
FIELD_OF_OPTION = {
    "trace": "trace", "requests": "n_requests", "seed": "seed",
    "drift": "trace_drift_per_1k_requests", "rate": "rate_rps", "arrival": "arrival",
    "cv": "cv", "system": "system", "profile": "profile", "overlap_swap": "overlap_swap",
    "batch_kv_sharing": "batch_kv_sharing", "policy": "policy",
    "frequency_scope": "frequency_scope", "frequency_window": "frequency_window_s",
    "cache": "cache", "host_mem": "host_cache_bytes", "host_write": "host_write",
    "gpu_mem": "gpu_kv_bytes",
    "cache_depth": "max_cached_depth", "block_tokens": "prefix_block_tokens", "reuse": "reuse",
    "system_prompt_tokens": "system_prompt_tokens", "reorder": "reorder", "order": "order",
    "reorder_window": "reorder_window_s", "reorder_window_start": "reorder_window_start",
    "speculate": "speculate", "max_batch_size": "max_batch_size",
    "max_prefill_bs": "max_prefill_bs", "max_batched_tokens": "max_batched_tokens",
    "scheduler": "scheduler", "padded_join": "padded_join", "top_k": "top_k",
    "search_workers": "search_workers",
    "search_s": "search_s", "search_stages": "search_stages", "stage_source": "stage_source",
    "stage_converge_p": "stage_converge_p", "stage_keeps_d1_p": "stage_keeps_d1_p",
    "stage_other_found_p": "stage_other_found_p", "search_latency": "search_latency",
    "search_time_scale": "search_time_scale", "retrieval": "retrieval",
    "fail_gpu_at": "fail_gpu_at_s", "gpu_failure_rate": "gpu_failure_rate_per_h",
    "gpu_recovery": "gpu_recovery_s", "host_replicas": "host_replicas",
    "retry_timeout": "retry_timeout_s", "max_retries": "max_retries",
    "answer_cache": "answer_cache", "answer_distance": "answer_distance",
    "answer_l1_size": "answer_l1_size", "answer_ttl": "answer_ttl_s", "instances": "instances",
    "answer_routing": "answer_routing",
    "answer_invalidate": "answer_invalidate", "answer_profile": "answer_profile",
    "redis_url": "answer_redis_url", "answer_namespace": "answer_namespace",
    "answer_tenant": "answer_tenant",
    "replicas": "replicas", "router": "router", "router_staleness": "router_staleness_s",
}
# answer_threshold: the semantic threshold as a cosine similarity (answer_distance's complement)
RUN_OPTIONS = (*FIELD_OF_OPTION, "answer_threshold")
# how a run is executed, beside its configuration (a sweep may set them per point)
EXECUTION_OPTIONS = ("backend", "device", "threads")
OPTION_OF_FIELD = {f: o for o, f in FIELD_OF_OPTION.items()}

# the one line ``run --backend vllm`` prints about the settings it took from vLLM
# (``validate.terms_note``, whose words are validate's: both sides)
RUN_TERMS_NOTE = {"who": "the run goes as vLLM runs",
                  "settable": "--block-tokens, --scheduler or a --config file may set the block "
                              "and the scheduler"}


def fields_of_options(options: dict) -> dict:
    """Configuration fields from ``simulate``'s options (None: not given). A configuration
    field's own name is taken too (``rate_rps`` as well as ``rate``), once."""
    from ragsim.serving.config import SimConfig

    fields_known = set(SimConfig.__dataclass_fields__)
    fields: dict = {}
    given_as: dict[str, str] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in FIELD_OF_OPTION or name == "answer_threshold":
            target = FIELD_OF_OPTION.get(name, "answer_distance")
        elif name in fields_known:
            target = name
        else:
            raise unknown_option(name, [*RUN_OPTIONS, *EXECUTION_OPTIONS], "ragsim.simulate")
        if target in given_as and not (target == "answer_distance"):
            raise RagsimInputError(f"sets {target}, as {given_as[target]} does: give one",
                                   field=name)
        given_as[target] = name
        if name in ("host_mem", "gpu_mem", "host_cache_bytes", "gpu_kv_bytes"):
            value = as_bytes(value, name)
        elif name == "policy" and isinstance(value, str):
            value = value.lower()
        elif name in ("fail_gpu_at", "fail_gpu_at_s"):
            value = list(value) if isinstance(value, list | tuple) else [value]
            value = value or None
        if name in ("answer_threshold", "answer_distance"):
            continue
        if value is not None:
            fields[target] = value
    distance = cosine_distance(
        options.get("answer_threshold"), options.get("answer_distance"),
        similarity_flag=label("answer_threshold"), distance_flag=label("answer_distance"))
    if distance is not None:
        fields["answer_distance"] = distance
    return fields


def _in_user_words(exc: RagsimInputError, by_option: set[str], from_file: dict | None,
                   config_file: str | None) -> RagsimInputError:
    """A configuration error about field ``x`` named as the user set it: ``run.x`` in the
    config file when the value came from there, else the option (``rate_rps`` -> ``rate``)."""
    name = exc.field
    if name is None or name in ("format", "version", "run"):
        return exc
    if from_file is not None and name in from_file and name not in by_option:
        return type(exc)(exc.detail, file=config_file, row=exc.row, field=f"run.{name}")
    option = OPTION_OF_FIELD.get(name)
    if option is None:  # settable in a config file only (reorder_scan, ...)
        return exc
    return type(exc)(exc.detail, row=exc.row, field=label(option))


def resolved_config(fields: dict, *, base: dict | None, config_file: str | None,
                    backend: str = "sim", device: str = "cpu"):
    """The configuration a run runs (``fields`` over the config file's table ``base``) and the
    settings the backend changed (field -> (was, now)), and the fields the user set (``fields``
    and the file's: what no later term may change). With the vLLM backend each setting
    vLLM's engine fixes that neither set takes vLLM's value and one set to a value vLLM cannot
    run is refused: ``validate.backend_terms``, the rule validation applies, so the run's
    config.toml and summary hold what vLLM ran. Errors name the option or the file's field as
    the user set it."""
    from ragsim.serving.config import build_config

    given = frozenset({*(base or {}), *fields})
    try:
        config = build_config(fields, base=base, source=config_file)
        if backend != "vllm":
            return config, {}, given
        from ragsim.validation import backend_terms

        return (*backend_terms(config, backend, device=device, given=given), given)
    except RagsimInputError as exc:
        raise _in_user_words(exc, set(fields), base, config_file) from None


def _config_table(config) -> tuple[dict | None, str | None]:
    """A config given as a TOML path, a configuration object or a ``[run]`` table."""
    from ragsim.serving.config import SimConfig, load_config_file

    if config is None:
        return None, None
    if isinstance(config, SimConfig):
        return {k: v for k, v in config.to_dict().items() if v is not None}, None
    if isinstance(config, dict):
        return dict(config), None
    if isinstance(config, str | Path):
        return load_config_file(config), str(config)
    raise RagsimInputError(f"must be a TOML path, a SimConfig or a dict, got "
                           f"{type(config).__name__}", field=label("config"))


@dataclass
class RunSetup:
    """A checked run that has not started: its configuration, the settings the backend took
    (``terms``), and the notes a caller may print (what was chosen for the user)."""

    config: SimConfig
    backend: str = "sim"
    device: str = "cpu"
    threads: int = 0
    terms: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config_file: str | None = None
    given: frozenset = frozenset()  # the fields the user set (options and the --config file)

    @property
    def inputs(self) -> tuple:
        """What the run reads (an output folder must not hold any of them)."""
        c = self.config
        return (self.config_file, c.trace, c.profile, c.answer_profile)

    def execute(self, on_progress: Callable[[int, float], None] | None = None,
                on_start: Callable[[int], None] | None = None, *, costs=None) -> Run:
        """Load the costs and the trace, then run. ``on_start(n_requests)`` is called once the
        trace is known, ``on_progress(done, now_s)`` as requests end. ``costs``: a Profile to
        price the run with instead of the configuration's (a sensitivity reprices so)."""
        from ragsim.backends import runner
        from ragsim.extras import require_answers, require_extra
        from ragsim.profiles.profile import load_profile
        from ragsim.traces import resolve_trace

        config = self.config
        costs = costs if costs is not None else load_profile(config.profile)
        if config.answer_cache:  # a bad latency profile is refused before the run
            from ragsim.serving.answer_latency import load_answer_latency

            load_answer_latency(config.answer_profile)
        data = resolve_trace(config.trace, seed=config.seed, n_requests=config.n_requests,
                             **generator_settings(config.trace_drift_per_1k_requests))
        used_drift = data.info.get("parameters", {}).get("drift_per_1k_requests")
        if used_drift is not None:  # recorded, so config.toml reruns this traffic if defaults move
            config = config.replace(trace_drift_per_1k_requests=used_drift)
        if self.backend == "torch":
            require_extra("profile", "run --backend torch")
            if config.answer_cache:  # the real stores (and the embedder for the semantic tier)
                require_answers("run --backend torch --answer-cache",
                                embedder=config.answer_semantic)
        if config.replicas > 1:  # a fleet behind a router (the runner runs it)
            from ragsim.serving.fleet import fleet_problem

            problem = fleet_problem(config, self.backend)
            if problem is not None:
                raise RagsimInputError(problem, field=label("replicas"))
        memory_note = None
        if self.backend == "torch":  # on a GPU: what its padded batches leave for the pool
            from ragsim.realrun.memory import fit_for_device

            config, memory_terms, memory_note = fit_for_device(
                config, data, costs, self.device, given=self.given, who="the run")
            self.terms = {**self.terms, **memory_terms}
        execute = runner(self.backend, device=self.device, threads=self.threads or None)
        if on_start is not None:
            on_start(data.n_requests)
        result = execute(data, config, costs, on_progress)
        if memory_note is not None:
            result.summary["backend_terms"] = {name: getattr(result.config, name)
                                               for name in self.terms}
            result.summary.setdefault("warnings", []).insert(0, memory_note)
        if self.backend == "vllm":  # the settings taken from vLLM (validate records them so too)
            result.summary["backend_terms"] = {name: getattr(result.config, name)
                                               for name in self.terms}
        return Run(result, inputs=self.inputs)


def setup_run(config=None, *, backend: str = "sim", device: str = "cpu", threads: int = 0,
              **options) -> RunSetup:
    """Resolve and check a run's configuration: ``options`` (``ragsim run``'s, snake case) over
    ``config`` (a TOML path, a SimConfig or a ``[run]`` dict) over the system preset."""
    from ragsim.backends import BACKENDS, CPU_PROFILES

    if backend not in BACKENDS:
        raise RagsimInputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}",
                               field=label("backend"))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise RagsimInputError(f"must be >= 0, got {threads}", field=label("threads"))
    base, config_file = _config_table(config)
    fields = fields_of_options(options)
    resolved, terms, given = resolved_config(fields, base=base, config_file=config_file,
                                             backend=backend, device=device)
    if backend != "sim" and resolved.host_write != "back":
        # a real engine applies the tree's moves before an iteration; a write-through copy of
        # KV the iteration has yet to compute has no order there yet
        raise RagsimInputError("host_write through (sglang-hicache, vllm-offload) is simulated "
                               f"only: use {label('backend')} sim, or {label('host_write')} back",
                               field=label("host_write"))
    if backend not in ("sim", "torch") and resolved.reuse != "prefix":
        # the blended prefill (RoPE shift, recompute) runs on the torch engine only
        raise RagsimInputError(f"reuse {resolved.reuse} runs on {label('backend')} sim or "
                               f"torch: use one of them, or {label('reuse')} prefix",
                               field=label("reuse"))
    setup = RunSetup(resolved, backend=backend, device=device, threads=threads, terms=terms,
                     config_file=config_file, given=given)
    if terms:
        from ragsim.validation import terms_note

        setup.notes.append(terms_note(terms, backend, **RUN_TERMS_NOTE))
    if backend in CPU_PROFILES and device == "cpu" and "profile" not in fields \
            and "profile" not in (base or {}):
        # the default profile's 7B model cannot be served on a CPU: serve the shipped profile
        # measured on this engine's scaled-down model, as validate does
        setup.config = resolved.replace(profile=CPU_PROFILES[backend])
        setup.notes.append(f"{label('backend')} {backend} on a CPU: profile "
                           f"{setup.config.profile} (its scaled-down model; {label('profile')} "
                           "for another)")
    return setup


@dataclass
class Result:
    """What a run or a replay hands back: its summary, its per-request records and its
    configuration, and ``save`` writing them as ``--out`` does. ``inputs``: what it read (the
    trace, the configuration file, the profiles), which ``save`` refuses to write over."""

    result: object
    inputs: tuple = field(default=(), kw_only=True)

    @property
    def summary(self) -> dict:
        """The summary the command's ``--json`` prints (with the configuration it ran)."""
        return self.result.summary

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (``requests.parquet``)."""
        return self.result.records

    @property
    def config(self):
        """The full configuration that ran."""
        return self.result.config

    def _config_toml(self) -> str | None:
        return None

    def save(self, out_dir: str | Path, *, force: bool = False) -> Path:
        """Write what ``--out`` writes, as one result set; an earlier result there is replaced
        only with ``force``, an input (the trace's own requests.parquet, say) never."""
        from ragsim.outputs import RUN_FILES, claim_output_dir, save_run_result

        out_dir = Path(out_dir)
        claim_output_dir(out_dir, writes=RUN_FILES, force=force, inputs=self.inputs,
                         flag=label("out_dir"))
        save_run_result(out_dir, self.requests, self.summary, self._config_toml(),
                        flag=label("out_dir"))
        return out_dir


@dataclass
class Run(Result):
    """A finished (or stopped) run: what ``ragsim run --json`` prints and ``--out`` writes
    (``requests.parquet``, ``summary.json``, ``config.toml``)."""

    result: RunResult

    def _config_toml(self) -> str:
        return self.config.to_toml()

    @property
    def problem(self) -> tuple[int, str] | None:
        """``(exit code, message)`` when the run did not end as asked (None when it did)."""
        return run_problem(self.summary)

    def _repr_html_(self) -> str:  # a notebook shows the headline numbers
        s = self.summary
        return (f"<b>ragsim run</b>: {s['config']['trace']} · {s['config']['system']} · "
                f"{s['config']['policy']}: {s['requests_completed']:,} completed, mean TTFT "
                f"{(s['ttft_mean_s'] or 0) * 1e3:,.1f} ms, token hit rate "
                f"{s['token_hit_rate']:.1%}")


def run_problem(summary: dict, out_dir: Path | None = None) -> tuple[int, str] | None:
    """Why a run did not end as asked, as ``ragsim run`` says it, with its exit code: the
    watchdog stopped it (2: the run's own settings) or it stalled (1: a bug in ragsim).
    Interruptions (Ctrl-C) are the caller's to report."""
    kept = f"; the records of those that ended are in {out_dir}" if out_dir is not None else ""
    if summary.get("no_progress"):
        return 2, f"stopped, no progress: {summary['no_progress']}{kept}"
    if summary["stalled"]:
        return 1, (f"the simulation stalled at {summary['stalled_at_s']:,.1f} simulated s with "
                   f"{summary['requests_pending']:,} of {summary['requests']:,} requests never "
                   f"ended (first ids: {summary['pending_request_ids'][:5]}): nothing left could "
                   "end them. This is a bug in ragsim; please report it with the run's "
                   f"config.toml{kept}")
    return None


def simulate(config=None, *, backend: str = "sim", device: str = "cpu", threads: int = 0,
             progress: bool = False, seeds: int = 1, sensitivity: bool = False,
             **options) -> Run:
    """Simulate the RAG serving stack end to end (``backend="torch"`` or ``"vllm"``: serve it
    for real), as ``ragsim run`` does.

    ``options`` are ``ragsim run``'s with the same names in snake case (``trace``,
    ``system``, ``policy``, ``rate``, ``requests``, ``gpu_mem``, ``host_mem``, ``seed``, ...;
    sizes as text, ``"32GiB"``, or bytes); ``config`` a TOML path, a SimConfig or a ``[run]``
    dict that they override. ``progress=True`` shows a progress bar on stderr.

    ``seeds=N`` (N >= 2) runs seeds ``seed .. seed+N-1`` and adds each summary metric's mean
    and 95% interval over them (``mean``, ``ci95``); ``sensitivity=True`` reprices the run
    under its profile's measured error, +-20% compute and copies at half the bandwidth
    (``sensitivity``: each metric's range): see :mod:`ragsim.api.uncertainty`."""
    setup = setup_run(config, backend=backend, device=device, threads=threads, **options)
    if seeds != 1 or sensitivity:
        from ragsim.api.uncertainty import run_with_uncertainty

        return run_with_uncertainty(setup, seeds=seeds, sensitivity=sensitivity)
    if not progress:
        return setup.execute()
    from ragsim.progress import progress_bar

    with progress_bar("run") as (start, advance):
        return setup.execute(on_progress=lambda done, now_s: advance(done),
                             on_start=start)


__all__ = ["Result", "Run", "RunSetup", "run_problem", "setup_run", "simulate"]
