"""The ``ragsim`` command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.errors import RagsimInputError
from ragsim.units import format_bytes, parse_bytes

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Simulate KV-cache and scheduling policies for RAG serving.")
trace_app = typer.Typer(no_args_is_help=True, help="Create, convert and inspect traces.")
app.add_typer(trace_app, name="trace")
profiles_app = typer.Typer(no_args_is_help=True, help="Inspect prefill-cost profiles.")
app.add_typer(profiles_app, name="profiles")

out = Console()
err = Console(stderr=True)
# built-in traces, corpora and question sets, for help texts (ragsim.traces.BUILTIN_TRACES and
# ragsim.traces.corpus.sources' BUILTIN_CORPORA / BUILTIN_QUESTIONS; not imported here, to keep
# start-up light: a test checks they agree)
TRACE_NAMES = "mmlu, nq, wiki-trivia, wiki-trivia-topics"
CORPUS_NAMES = "wiki-offline"
QUESTION_NAMES = "trivia, gsm8k, gpqa"


def friendly_errors(fn: Callable) -> Callable:
    """Bad input ends with one clear line (file, row, field) and exit code 2, not a traceback.
    The message is printed as text (an id like ``[/b]`` is not markup) and never wrapped."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RagsimInputError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except ValueError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def _bar(*extra_columns, enabled: bool = True) -> Progress:
    """The one progress display every long command shows on stderr: what runs, a bar, done of
    total, anything ``extra_columns`` add, elapsed time; gone when the job ends."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    *extra_columns, TimeElapsedColumn(), console=err, transient=True,
                    disable=not enabled)


def _progress(total: int, label: str, enabled: bool):
    progress = _bar(enabled=enabled)
    task = progress.add_task(label, total=total)
    return progress, (lambda done: progress.update(task, completed=done))


def _phased_progress():
    """A progress display with one bar per phase, and the ``(phase, done, total)`` callback long
    jobs (profiling, trace building) report through."""
    progress = _bar()
    tasks: dict[str, int] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done)

    return progress, report


def _generator_settings(drift: float | None) -> dict:
    """``resolve_trace``'s generator overrides for a ``--drift`` (none when not given)."""
    return {} if drift is None else {"drift_per_1k_requests": drift}


def _print_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------- run
def _opt(help_text: str, *names: str):
    return typer.Option(*names, help=help_text)


@app.command()
@friendly_errors
def run(
    trace: Annotated[str | None, _opt(f"Built-in name ({TRACE_NAMES}) or trace path. "
                                      "[default: mmlu]")
                     ] = None,
    system: Annotated[str | None, _opt("Preset: vllm, vllm-apc, sglang, ragcache (see `ragsim "
                                       "systems`). [default: ragcache]")] = None,
    config_file: Annotated[Path | None, _opt("TOML configuration ([run] table); flags given "
                                             "here override it.", "--config")] = None,
    profile: Annotated[str | None, _opt("Cost profile: shipped name or JSON path. "
                                        "[default: a10g-mistral-7b]")] = None,
    policy: Annotated[str | None, _opt("Replacement policy: pgdsf, gdsf, lru, lfu, fifo.")
                      ] = None,
    cache: Annotated[bool | None, _opt("Cross-request KV reuse (off: vLLM v0.3).",
                                       "--cache/--no-cache")] = None,
    host_mem: Annotated[str | None, _opt("Host memory for cached KV, e.g. 192GiB.")] = None,
    gpu_mem: Annotated[str | None, _opt("GPU memory for KV (cache and running requests); "
                                        "default: the profile's KV capacity.")] = None,
    cache_depth: Annotated[int | None, _opt("Cache only the first k' documents (top-k').")
                           ] = None,
    block_tokens: Annotated[int | None, _opt("Reuse whole blocks of this many tokens only "
                                             "(vLLM APC: 16).")] = None,
    system_prompt_tokens: Annotated[int | None, _opt("Shared system prompt (tree root).")
                                    ] = None,
    top_k: Annotated[int | None, _opt("Use only the first K retrieved documents.")] = None,
    reorder: Annotated[bool | None, _opt("Cache-aware reordering.", "--reorder/--no-reorder")
                       ] = None,
    window: Annotated[int | None, _opt("Reordering window, in scheduling decisions.")] = None,
    speculate: Annotated[bool | None, _opt("Dynamic speculative pipelining.",
                                           "--speculate/--no-speculate")] = None,
    overlap_swap: Annotated[bool | None, _opt("Overlap host->GPU KV loads with compute.",
                                              "--overlap-swap/--no-overlap-swap")] = None,
    max_batch_size: Annotated[int | None, _opt("Most running requests.")] = None,
    max_prefill_bs: Annotated[int | None, _opt("Most requests per prefill iteration.")] = None,
    max_batched_tokens: Annotated[int | None, _opt("Most new tokens per prefill iteration.")
                                  ] = None,
    search_workers: Annotated[int | None, _opt("Vector-search CPU workers.")] = None,
    search_s: Annotated[float | None, _opt("One request's full vector search, seconds.")
                        ] = None,
    search_stages: Annotated[int | None, _opt("Stages of a search (intermediate top-k lists).")
                             ] = None,
    stage_source: Annotated[str | None, _opt("Intermediate lists: auto, trace, synthetic, none.")
                            ] = None,
    stage_converge_p: Annotated[float | None, _opt("Synthetic stages: chance that a stage "
                                                   "finds the final list.")] = None,
    search_latency: Annotated[str | None, _opt("fixed (search_s) or trace (the trace's "
                                               "measured stage times).")] = None,
    search_time_scale: Annotated[float | None, _opt("Multiply measured stage times (a larger "
                                                    "index than the one measured).")] = None,
    rate: Annotated[float | None, _opt("Re-time arrivals at R requests/s.")] = None,
    arrival: Annotated[str | None, _opt("trace, poisson or gamma (with --rate).")] = None,
    cv: Annotated[float | None, _opt("Gamma arrivals' coefficient of variation.")] = None,
    fail_gpu_at: Annotated[list[float] | None, _opt("Fail the GPU at T seconds (repeatable).")
                           ] = None,
    gpu_failure_rate: Annotated[float | None, _opt("GPU failures per hour (Poisson).")] = None,
    gpu_recovery: Annotated[float | None, _opt("Seconds the GPU is down after a failure.")
                            ] = None,
    host_replicas: Annotated[int | None, _opt("Upper nodes kept replicated in host memory.")
                             ] = None,
    retry_timeout: Annotated[float | None, _opt("Seconds before a failed request is retried.")
                             ] = None,
    max_retries: Annotated[int | None, _opt("Retries before a request fails for good.")] = None,
    requests: Annotated[int | None, _opt("Simulate only the first N requests.")] = None,
    seed: Annotated[int | None, _opt("Seed (built-in traces, arrivals, synthetic stages).")
                    ] = None,
    drift: Annotated[float | None, _opt("Synthetic traces: share of popularity ranks that "
                                        "trade documents every 1,000 requests (default "
                                        "0.1; 0: stationary).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write requests.parquet, "
                                                 "summary.json and config.toml here.")] = None,
) -> None:
    """Simulate the RAG serving stack end to end: TTFT, throughput and hit rates."""
    from ragsim.profiles.profile import load_profile
    from ragsim.sim.config import build_config, load_config_file
    from ragsim.sim.simulator import run_simulation
    from ragsim.traces import resolve_trace

    base = load_config_file(config_file) if config_file is not None else None
    flags = {
        "trace": trace, "system": system, "profile": profile,
        "policy": policy.lower() if policy else None, "cache": cache,
        "host_cache_bytes": parse_bytes(host_mem, field="--host-mem") if host_mem else None,
        "gpu_kv_bytes": parse_bytes(gpu_mem, field="--gpu-mem") if gpu_mem else None,
        "max_cached_depth": cache_depth, "prefix_block_tokens": block_tokens,
        "system_prompt_tokens": system_prompt_tokens, "top_k": top_k, "reorder": reorder,
        "reorder_window": window, "speculate": speculate, "overlap_swap": overlap_swap,
        "max_batch_size": max_batch_size, "max_prefill_bs": max_prefill_bs,
        "max_batched_tokens": max_batched_tokens, "search_workers": search_workers,
        "search_s": search_s, "search_stages": search_stages, "stage_source": stage_source,
        "stage_converge_p": stage_converge_p, "search_latency": search_latency,
        "search_time_scale": search_time_scale,
        "rate_rps": rate, "arrival": arrival, "cv": cv,
        "fail_gpu_at_s": list(fail_gpu_at) if fail_gpu_at else None,
        "gpu_failure_rate_per_h": gpu_failure_rate, "gpu_recovery_s": gpu_recovery,
        "host_replicas": host_replicas, "retry_timeout_s": retry_timeout,
        "max_retries": max_retries,
        "n_requests": requests, "seed": seed, "trace_drift_per_1k_requests": drift,
    }
    config = build_config(flags, base=base,
                          source=str(config_file) if config_file is not None else None)
    costs = load_profile(config.profile)
    data = resolve_trace(config.trace, seed=config.seed, n_requests=config.n_requests,
                         **_generator_settings(config.trace_drift_per_1k_requests))
    used_drift = data.info.get("parameters", {}).get("drift_per_1k_requests")
    if used_drift is not None:  # recorded, so config.toml reruns this traffic if defaults move
        config = config.replace(trace_drift_per_1k_requests=used_drift)
    progress = _bar(TextColumn("{task.fields[simulated]}"), enabled=not json_output)
    task = progress.add_task("run", total=data.n_requests, simulated="")
    with progress:
        result = run_simulation(
            data, config, costs,
            lambda done, now: progress.update(task, completed=done,
                                              simulated=f"{now:,.0f} simulated s"))
    summary = result.summary
    if out_dir is not None:
        _write_results(out_dir, result.records, summary)
        write_text_atomically(out_dir / "config.toml", config.to_toml())
    if json_output:
        _print_json(summary)
    else:
        _print_run_summary(summary)
    ended = summary["requests_completed"] + summary["requests_failed"]
    if summary["interrupted"]:
        _exit_interrupted(f"at {summary['simulated_s']:,.1f} simulated s: {ended:,} of "
                          f"{summary['requests']:,} requests ended", out_dir)
    if summary["stalled"]:
        kept = f"; the records of those that ended are in {out_dir}" if out_dir is not None else ""
        err.print(f"[red]error:[/] the simulation stalled at {summary['stalled_at_s']:,.1f} "
                  f"simulated s with {summary['requests_pending']:,} of {summary['requests']:,} "
                  f"requests never ended (first ids: {summary['pending_request_ids'][:5]}): "
                  "nothing left could end them. This is a bug in ragsim; please report it with "
                  f"the run's config.toml{kept}", highlight=False)
        raise typer.Exit(1)


def _write_results(out_dir: Path, records, summary: dict) -> None:
    """Per-request records (Parquet) and the summary (JSON) of a run or replay."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "requests.parquet",
                     lambda tmp: records.to_parquet(tmp, index=False))
    write_text_atomically(out_dir / "summary.json",
                          json.dumps(summary, indent=2, default=str) + "\n")


def _exit_interrupted(what_ended: str, out_dir: Path | None) -> None:
    """After Ctrl-C: say what the kept results cover, then exit 130 (the shell's SIGINT code)."""
    kept = f"; their records are in {out_dir}" if out_dir is not None else ""
    err.print(f"interrupted {what_ended}{kept}", highlight=False)
    raise typer.Exit(130)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f} ms"


def _print_run_summary(s: dict) -> None:
    c = s["config"]
    table = Table(title=f"run: {c['trace']} · {c['system']} · {c['policy']} · {s['profile']}",
                  show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    failed = ", ".join(f"{k}: {v}" for k, v in s["failed_by_reason"].items())
    rows = [
        ("requests completed / failed", f"{s['requests_completed']:,} / {s['requests_failed']:,}"
                                        + (f" ({failed})" if failed else "")
                                        + (f", {s['requests_pending']:,} not ended ("
                                           + ("stalled" if s["stalled"] else "interrupted") + ")"
                                           if s["requests_pending"] else "")),
        ("TTFT mean / p50 / p90 / p99", " / ".join(_ms(s[f"ttft_{k}_s"])
                                                   for k in ("mean", "p50", "p90", "p99"))),
        ("  search wait / search / queue / prefill",
         " / ".join(_ms(s[f"ttft_{k}_mean_s"]) for k in ("search_wait", "search", "queue",
                                                         "prefill"))),
        ("TPOT mean", _ms(s["tpot_mean_s"])),
        ("end-to-end mean / p99", f"{_ms(s['e2e_mean_s'])} / {_ms(s['e2e_p99_s'])}"),
        ("throughput", f"{s['throughput_rps']:.3f} req/s, {s['throughput_tokens_s']:,.1f} tok/s"),
        ("token hit rate (GPU + host)", f"{s['token_hit_rate']:.1%} ({s['token_hit_rate_gpu']:.1%}"
                                        f" + {s['token_hit_rate_host']:.1%})"),
        ("request hit rate", f"{s['request_hit_rate']:.1%}"),
        ("swapped in / out", f"{format_bytes(s['swap_in_bytes'])} / "
                             f"{format_bytes(s['swap_out_bytes'])}"),
        ("recomputed tokens", f"{s['recomputed_tokens']:,}"),
        ("speculations (kept) / wasted", f"{s['speculations_started']:,} "
                                         f"({s['speculation_kept']:,}) / "
                                         f"{s['speculation_wasted_s']:,.1f} GPU s"),
        ("scheduler overhead", f"{s['scheduler_overhead_ms_per_decision']:.3f} ms/decision"),
        ("GPU failures / retries", f"{s['gpu_failures']} / {s['retries']}"),
        ("GPU KV / host cache", f"{format_bytes(s['gpu_kv_bytes'])} / "
                                f"{format_bytes(c['host_cache_bytes'])}"),
        ("simulated", f"{s['simulated_s']:,.1f} s in {s['elapsed_s']:.2f} s wall "
                      f"({s['sim_requests_per_wall_s']:,.0f} req/s)"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
    if s["cost_extrapolations"]:
        err.print(f"[yellow]warning:[/] {s['cost_extrapolations']:,} cost lookups fell outside "
                  "the profile's grid (extrapolated)")


@app.command()
def systems(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the system presets of `ragsim run --system` and what each sets."""
    from ragsim.sim.config import SYSTEM_DESCRIPTIONS, SYSTEM_PRESETS

    if json_output:
        _print_json({name: {"description": SYSTEM_DESCRIPTIONS[name], "settings": settings}
                     for name, settings in SYSTEM_PRESETS.items()})
        return
    table = Table(title="systems (`ragsim run --system NAME`; any flag overrides)")
    table.add_column("system", style="bold")
    table.add_column("what it models")
    table.add_column("settings")
    for name, settings in SYSTEM_PRESETS.items():
        table.add_row(name, SYSTEM_DESCRIPTIONS[name],
                      ", ".join(f"{k}={format_bytes(v) if k.endswith('_bytes') else v}"
                                for k, v in settings.items()))
    out.print(table)


# --------------------------------------------------------------------------- replay
@app.command()
@friendly_errors
def replay(
    trace: Annotated[str, typer.Option(
        help=f"Built-in name ({TRACE_NAMES}) or trace path.")] = "mmlu",
    policy: Annotated[str, typer.Option(help="pgdsf, gdsf, lru, lfu, fifo or belady "
                                             "(offline bound).")] = "pgdsf",
    model: Annotated[str, typer.Option(help="Built-in model or a HF config.json path.")
                     ] = "mistral-7b",
    gpu_mem: Annotated[str, typer.Option(help="GPU memory for cached KV, e.g. 4GiB.")] = "4GiB",
    host_mem: Annotated[str, typer.Option(help="Host memory for cached KV, e.g. 32GiB.")
                        ] = "32GiB",
    flat: Annotated[bool, typer.Option(help="Documents as independent objects, one tier "
                                            "(--gpu-mem); no prefix tree.")] = False,
    kv_bytes_per_token: Annotated[int | None, typer.Option(
        help="Override the model's KV bytes per token.")] = None,
    profile: Annotated[str, typer.Option(
        help="Cost profile (prefill costs for PGDSF): shipped name or JSON path.")
    ] = "a10g-mistral-7b",
    system_prompt_tokens: Annotated[int, typer.Option(help="Tokens of the shared system "
                                                           "prompt (tree root).")] = 0,
    cache_depth: Annotated[int | None, typer.Option(
        help="Cache only the first k' documents of each request (top-k').")] = None,
    requests: Annotated[int | None, typer.Option(help="Replay only the first N requests "
                                                      "(built-in traces: generate N).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for built-in traces.")] = 0,
    drift: Annotated[float | None, typer.Option(
        help="Synthetic traces: share of popularity ranks that trade documents every 1,000 "
             "requests (default 0.1; 0: stationary).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write requests.parquet and "
                                                 "summary.json here.")] = None,
) -> None:
    """Feed a trace, in order, through the cache policy core (no timing model)."""
    from ragsim.profiles.models import resolve_model
    from ragsim.profiles.profile import load_profile
    from ragsim.sim.replay import ReplayConfig, run_replay
    from ragsim.traces import resolve_trace

    spec = resolve_model(model)
    if kv_bytes_per_token is not None and kv_bytes_per_token <= 0:
        raise RagsimInputError("must be > 0", field="--kv-bytes-per-token")
    if cache_depth is not None and cache_depth < 0:
        raise RagsimInputError("must be >= 0", field="--cache-depth")
    if system_prompt_tokens < 0:
        raise RagsimInputError("must be >= 0", field="--system-prompt-tokens")
    if requests is not None and requests <= 0:
        raise RagsimInputError("must be > 0", field="--requests")
    config = ReplayConfig(
        trace=trace,
        policy=policy.lower(),
        model=spec.name,
        kv_bytes_per_token=kv_bytes_per_token or spec.kv_bytes_per_token,
        gpu_capacity_bytes=parse_bytes(gpu_mem, field="--gpu-mem"),
        host_capacity_bytes=parse_bytes(host_mem, field="--host-mem"),
        flat=flat,
        profile=profile,
        system_prompt_tokens=system_prompt_tokens,
        max_cached_depth=cache_depth,
        n_requests=requests,
        seed=seed,
    )
    from ragsim.cache.policies import POLICY_NAMES

    if config.policy not in POLICY_NAMES:
        raise RagsimInputError(f"unknown policy {policy!r}; choose one of "
                               f"{', '.join(POLICY_NAMES)}", field="--policy")
    if flat and config.host_capacity_bytes:
        config = replace(config, host_capacity_bytes=0)
        if not json_output:
            err.print("note: --flat uses one tier of --gpu-mem; host memory is ignored")
    costs = load_profile(profile)
    if drift is not None and not 0.0 <= drift <= 1.0:
        raise RagsimInputError("must lie in [0, 1]", field="--drift")
    data = resolve_trace(trace, seed=seed, n_requests=requests, **_generator_settings(drift))
    progress, callback = _progress(data.n_requests, "replay", not json_output)
    with progress:
        result = run_replay(data, config, costs, callback)
    summary = result.summary
    if out_dir is not None:
        _write_results(out_dir, result.records, summary)
    if json_output:
        _print_json(summary)
    else:
        _print_replay_summary(summary)
    if summary["interrupted"]:
        _exit_interrupted(f"after the first {summary['requests']:,} of {data.n_requests:,} "
                          "requests", out_dir)


def _print_replay_summary(s: dict) -> None:
    c = s["config"]
    table = Table(title=f"replay: {c['trace']} · {c['policy']}{' (flat)' if c['flat'] else ''}"
                  f" · {c['model']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("requests", f"{s['requests']:,}"),
        ("GPU / host memory", f"{format_bytes(c['gpu_capacity_bytes'])} / "
                              f"{format_bytes(c['host_capacity_bytes'])}"),
        ("KV bytes per token", f"{c['kv_bytes_per_token']:,}"),
        ("document tokens", f"{s['doc_tokens']:,}"),
        ("token hit rate", f"{s['token_hit_rate']:.2%}"),
        ("  in GPU", f"{s['token_hit_rate_gpu']:.2%}"),
        ("  in host", f"{s['token_hit_rate_host']:.2%}"),
        ("requests with a hit", f"{s['request_hit_rate']:.2%}"),
        ("recomputed tokens", f"{s['recomputed_tokens']:,}"),
        ("swapped in / out", f"{format_bytes(s['swap_in_bytes'])} / "
                             f"{format_bytes(s['swap_out_bytes'])}"),
        ("evictions GPU / host", f"{s['evictions_gpu']:,} / {s['evictions_host']:,}"),
        ("wall time", f"{s['elapsed_s']:.2f} s ({s['requests_per_s']:,.0f} requests/s)"),
    ]
    for row in rows:
        table.add_row(*row)
    out.print(table)
    if s.get("cost_extrapolations"):
        err.print(f"[yellow]warning:[/] {s['cost_extrapolations']:,} cost queries fell "
                  f"outside the grids of profile {c['profile']} and were extrapolated")


# --------------------------------------------------------------------------- models
@app.command()
def models(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List built-in model architectures and their KV bytes per token."""
    from ragsim.profiles.models import BUILTIN_MODELS

    if json_output:
        _print_json({name: spec.to_dict() for name, spec in BUILTIN_MODELS.items()})
        return
    table = Table("model", "layers", "heads", "KV heads", "head dim", "dtype", "KV/token")
    for spec in BUILTIN_MODELS.values():
        table.add_row(spec.name, str(spec.num_layers), str(spec.num_attention_heads),
                      str(spec.num_kv_heads), str(spec.head_dim), spec.dtype,
                      format_bytes(spec.kv_bytes_per_token))
    out.print(table)


# --------------------------------------------------------------------------- traces
@trace_app.command("import-jsonl")
@friendly_errors
def trace_import_jsonl(source: Path, destination: Path) -> None:
    """Convert the JSONL interchange format into a trace directory."""
    from ragsim.traces import read_jsonl, write_trace

    trace = read_jsonl(source)
    write_trace(trace, destination)
    _report_written(trace, destination)


@trace_app.command("export-jsonl")
@friendly_errors
def trace_export_jsonl(trace: str, destination: Path,
                       seed: Annotated[int, typer.Option()] = 0,
                       requests: Annotated[int | None, typer.Option()] = None) -> None:
    """Write a trace (a path or a built-in name) in the JSONL interchange format."""
    from ragsim.traces import resolve_trace, write_jsonl

    data = resolve_trace(trace, seed=seed, n_requests=requests)
    write_jsonl(data, destination)
    err.print(f"wrote {data.n_requests:,} requests to {destination}")


@trace_app.command("import-mooncake")
@friendly_errors
def trace_import_mooncake(source: Path, destination: Path) -> None:
    """Convert a Mooncake trace (512-token hash blocks) into a trace directory."""
    from ragsim.traces import read_mooncake, write_trace

    trace = read_mooncake(source)
    write_trace(trace, destination)
    _report_written(trace, destination)


@trace_app.command("generate")
@friendly_errors
def trace_generate(name: str, destination: Path,
                   requests: Annotated[int | None, typer.Option()] = None,
                   seed: Annotated[int, typer.Option()] = 0,
                   drift: Annotated[float | None, typer.Option(
                       help="Fraction of popularity ranks that trade documents after every "
                            "1,000 requests (default 0.1, fitted to the paper's policy "
                            "results; 0: stationary).")] = None,
                   co_retrieval: Annotated[float | None, typer.Option(
                       help="Chance that a list's next document is a neighbour of the previous "
                            "one (default 0.9, fitted on real retrieval; 0: independent "
                            "draws).")] = None) -> None:
    """Write a built-in synthetic trace (mmlu, nq) to a directory."""
    from ragsim.traces import BUILTIN_SPECS, builtin_trace, write_trace

    if name not in BUILTIN_SPECS:
        raise RagsimInputError(f"unknown built-in trace {name!r}; known: "
                               f"{sorted(BUILTIN_SPECS)}")
    overrides = {}
    if drift is not None:
        if not 0.0 <= drift <= 1.0:
            raise RagsimInputError("must lie in [0, 1]", field="--drift")
        overrides["drift_per_1k_requests"] = drift
    if co_retrieval is not None:
        if not 0.0 <= co_retrieval <= 1.0:
            raise RagsimInputError("must lie in [0, 1]", field="--co-retrieval")
        overrides["co_retrieval_p"] = co_retrieval
    trace = builtin_trace(name, seed=seed, n_requests=requests, **overrides)
    write_trace(trace, destination)
    _report_written(trace, destination)


@trace_app.command("retime")
@friendly_errors
def trace_retime(trace: str, destination: Path,
                 rate: Annotated[float, typer.Option(help="Requests per second.")],
                 arrival: Annotated[str, typer.Option(help="poisson or gamma.")] = "poisson",
                 cv: Annotated[float, typer.Option(help="Coefficient of variation of the "
                                                        "gaps (gamma).")] = 1.0,
                 seed: Annotated[int, typer.Option()] = 0,
                 requests: Annotated[int | None, typer.Option()] = None) -> None:
    """The same requests arriving at a new rate (Poisson or gamma gaps), written to a folder."""
    from ragsim.traces import resolve_trace, write_trace
    from ragsim.traces.retime import retime

    data = retime(resolve_trace(trace, seed=seed, n_requests=requests), rate, process=arrival,
                  cv=cv, seed=seed)
    write_trace(data, destination)
    _report_written(data, destination)


@trace_app.command("build")
@friendly_errors
def trace_build(
    corpus: Annotated[str, typer.Option(help="Passages: a .jsonl/.parquet file (id, text, "
                                             f"optional title) or {CORPUS_NAMES}.")],
    questions: Annotated[str, typer.Option(help="Questions: a .jsonl/.parquet file (text, "
                                                "optional answer, arrival_s) or "
                                                f"{QUESTION_NAMES}.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the trace and report.")],
    top_k: Annotated[int, typer.Option(help="Documents retrieved per request.")] = 2,
    index: Annotated[str, typer.Option(help="ivf or hnsw.")] = "ivf",
    stages: Annotated[int, typer.Option(help="Search stages recorded per request.")] = 4,
    nlist: Annotated[int | None, typer.Option(
        help="IVF lists (default 4*sqrt(documents), at most documents/39).")
                     ] = None,
    nprobe: Annotated[int | None, typer.Option(help="IVF lists probed (default nlist/16).")
                      ] = None,
    hnsw_m: Annotated[int, typer.Option(help="HNSW links per node.")] = 32,
    ef_construction: Annotated[int, typer.Option(help="HNSW build breadth.")] = 64,
    ef_search: Annotated[int, typer.Option(help="HNSW search breadth of the last stage.")
                         ] = 64,
    chunking: Annotated[str, typer.Option(help="passage, window or pack.")] = "passage",
    window_tokens: Annotated[int, typer.Option(help="Window / pack size in tokens.")] = 256,
    overlap_tokens: Annotated[int, typer.Option(help="Tokens shared by neighbouring "
                                                     "windows.")] = 32,
    tokenizer: Annotated[str, typer.Option(help="mistral, cl100k or a SentencePiece "
                                                ".model file.")] = "mistral",
    embedder: Annotated[str, typer.Option(help="minilm or a sentence-transformers model "
                                               "folder.")] = "minilm",
    cache_dir: Annotated[Path | None, typer.Option(help="Embedding cache (default: the user "
                                                        "cache folder).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Embed everything again, keep "
                                                               "nothing.")] = False,
    requests: Annotated[int | None, typer.Option(help="Requests (default: every question "
                                                      "once).")] = None,
    sampling: Annotated[str, typer.Option(help="once, uniform or zipf (with replacement).")
                        ] = "once",
    order: Annotated[str, typer.Option(help="file or shuffle (sampling once).")] = "file",
    zipf_s: Annotated[float, typer.Option(help="Popularity exponent (sampling zipf).")] = 1.0,
    arrival: Annotated[str, typer.Option(help="poisson, gamma, or file (the questions' "
                                              "arrival_s).")] = "poisson",
    rate: Annotated[float, typer.Option(help="Requests per second.")] = 1.0,
    cv: Annotated[float, typer.Option(help="Gap coefficient of variation (gamma).")] = 1.0,
    output_tokens: Annotated[str, typer.Option(help="'answer' (the answer's tokens) or a "
                                                    "number.")] = "answer",
    redact_text: Annotated[bool, typer.Option("--redact-text", help="Store no question or "
                                              "document text; hash answer keys.")] = False,
    seed: Annotated[int, typer.Option()] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")
                           ] = False,
) -> None:
    """Build a trace from a corpus and questions: real tokenizer, embedder and staged faiss search.

    Writes requests.parquet and documents.parquet (the trace), build_report.json and
    passages.parquet (each document's corpus passages). Embeddings are cached, so rebuilding
    with other index or arrival options does not embed again.
    """
    from ragsim.traces.corpus import (
        BuildOptions,
        Chunking,
        IndexSpec,
        build_trace,
        write_build,
    )
    from ragsim.traces.corpus.embedding import default_cache_dir

    options = BuildOptions(
        corpus=corpus, questions=questions, top_k=top_k,
        index=IndexSpec(kind=index, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m,
                        ef_construction=ef_construction, ef_search=ef_search, stages=stages),
        chunking=Chunking(mode=chunking, window_tokens=window_tokens,
                          overlap_tokens=overlap_tokens),
        tokenizer=tokenizer, embedder=embedder,
        cache_dir=None if no_cache else (cache_dir or default_cache_dir()),
        requests=requests, sampling=sampling, order=order, zipf_s=zipf_s, arrival=arrival,
        rate_rps=rate, cv=cv, output_tokens=output_tokens, redact_text=redact_text, seed=seed)
    options.validate()
    progress, report = _phased_progress()

    with progress:
        result = build_trace(options, progress=report)
    write_build(result, out_dir)
    _report_written(result.trace, out_dir)
    if json_output:
        _print_json(result.report)
        return
    _print_build_report(result.report)


def _print_build_report(r: dict) -> None:
    s = r["staged_search"]
    rows = [
        ("corpus", f"{r['corpus']['source']}: {r['corpus']['passages']:,} passages -> "
                   f"{r['corpus']['documents']:,} documents ({r['corpus']['chunking']['mode']})"),
        ("document tokens", "p50 {p50:g}, mean {mean:g}, max {max:,}".format(
            **r["corpus"]["document_tokens"])),
        ("questions", f"{r['questions']['source']}: {r['questions']['requests']:,} requests, "
                      f"{r['questions']['distinct_asked']:,} distinct "
                      f"({r['questions']['sampling']})"),
        ("tokenizer", r["tokenizer"]),
        ("embedder", f"{r['embedder']['model']} ({r['embedder']['dimension']}-d; "
                     f"{r['embedder']['embedded']:,} embedded, {r['embedder']['from_cache']:,} "
                     "from cache)"),
        ("index", ", ".join(f"{k}={v}" for k, v in r["index"].items())),
        ("recall@k vs exact", f"{s['recall_at_k_vs_exact']:.3f} (identical top-k: "
                              f"{s['final_equals_exact']:.1%})"),
        ("stage = final top-k", ", ".join(f"{c:.0%}" for c in s["stage_equals_final"])),
        ("search time", f"mean {s['search_time_mean_s'] * 1e3:.3g} ms, p99 "
                        f"{s['search_time_p99_s'] * 1e3:.3g} ms ({s['measured_on']})"),
        ("retrieval skew", ", ".join(f"{k.removeprefix('top_').removesuffix('_share')}: "
                                     f"{v:.0%}" for k, v in r["retrieval_skew"].items())),
        ("documents retrieved", f"{r['unique_documents_retrieved']:,}"),
    ]
    table = Table(title="trace build", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)


def _report_written(trace, destination: Path) -> None:
    err.print(f"wrote {trace.n_requests:,} requests and {trace.n_documents:,} documents to "
              f"{destination}")
    if trace.info.get("document_size_mismatches"):
        err.print(f"[yellow]warning:[/] {trace.info['document_size_mismatches']} document size "
                  f"mismatch(es), first sizes kept; {trace.info['first_size_mismatch']}")


@trace_app.command("stats")
@friendly_errors
def trace_stats_command(
    traces: Annotated[list[str], typer.Argument(
        metavar="TRACE",
        help=f"Built-in names ({TRACE_NAMES}), trace folders or JSONL files.")],
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object; with several "
                                              "traces, one per trace keyed by name.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write the retrieval-skew and document-size "
                                                   "figure (.png, .svg or .pdf).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of built-in traces (all of them).")] = 0,
    requests: Annotated[int | None, typer.Option(help="Use the first N requests of every "
                                                      "trace.")] = None,
) -> None:
    """Requests, documents, tokens, top-k and retrieval skew of one or more traces.

    With --plot, also the paper's skew analysis: cumulative share of retrievals against the top
    fraction of documents (Figure 5) and the sizes of the retrieved documents (Figure 3), one
    line per trace.
    """
    from ragsim.figures import check_plot_path
    from ragsim.traces import resolve_trace, trace_stats
    from ragsim.traces.plots import plot_skew
    from ragsim.traces.skew import trace_skew

    if plot is not None:
        check_plot_path(plot)  # before reading traces: a typo should cost nothing
    if len(set(traces)) != len(traces):
        repeated = sorted({t for t in traces if traces.count(t) > 1})
        raise RagsimInputError(f"{', '.join(repeated)} given more than once", field="TRACE")
    loaded = {name: resolve_trace(name, seed=seed, n_requests=requests) for name in traces}
    if plot is not None:
        notes = plot_skew([trace_skew(t, name) for name, t in loaded.items()], plot)
        for note in notes:
            err.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        err.print(f"wrote {plot}", highlight=False)
    stats = {name: trace_stats(t) for name, t in loaded.items()}
    if json_output:
        _print_json(stats if len(stats) > 1 else stats[traces[0]])
        return

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    if len(stats) == 1:
        table = Table(title=f"trace {traces[0]}", show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
    else:
        table = Table("", *traces, title="traces")
        table.columns[0].style = "bold"
        for column in table.columns[1:]:
            column.justify = "right"
    for key in stats[traces[0]]:
        if key != "info":
            table.add_row(key, *[cell(s[key]) for s in stats.values()])
    out.print(table)
    for name, s in stats.items():
        if s["info"]:
            label = "how it was made" if len(stats) == 1 else f"how {name} was made"
            out.print(f"[bold]{label}:[/]", json.dumps(s["info"], indent=1, default=str),
                      highlight=False)


# --------------------------------------------------------------------------- profile
@app.command()
@friendly_errors
def profile(
    model: Annotated[str, typer.Option(help="Built-in model or a HF config.json path.")
                     ] = "mistral-7b",
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    out_file: Annotated[Path, typer.Option("--out", help="Profile JSON to write.")
                        ] = Path("profile.json"),
    layers: Annotated[int | None, typer.Option(help="Scale down: this many layers.")] = None,
    hidden: Annotated[int | None, typer.Option(
        help="Scale down: this hidden size (heads, KV heads and MLP scale with it).")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, fp16 or bf16 (default: fp32 on CPU, "
                                            "the model's on CUDA).")] = "",
    quick: Annotated[bool, typer.Option(help="A small grid (minutes on two CPU cores).")
                     ] = False,
    threads: Annotated[int, typer.Option(help="CPU threads for torch (one is steadiest).")
                       ] = 1,
    name: Annotated[str, typer.Option(help="Profile name (default: DEVICE-MODEL).")] = "",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Measure prefill, batched prefill, decode and copies on this machine into a profile.

    Builds the model from its architecture with random weights (nothing is downloaded). On a
    CPU only small models are practical: scale one down with --layers/--hidden (the name and
    the file say so). Interrupted runs resume from OUT.partial.json.
    """
    from ragsim.profiles.models import resolve_model, scaled_down
    from ragsim.profiles.profiler import ProfilePlan, run_profile

    spec = resolve_model(model)
    label = ""
    if layers is not None or hidden is not None:
        spec = scaled_down(spec, layers=layers, hidden=hidden)
        label = f"scaled down from {model}: {spec.num_layers} layers, hidden {spec.hidden_size}"
    chosen_dtype = dtype or ("fp32" if device == "cpu" else spec.dtype)
    if chosen_dtype not in ("fp32", "fp16", "bf16"):
        raise RagsimInputError(f"unknown dtype {chosen_dtype!r}", field="--dtype")
    spec = spec.with_dtype(chosen_dtype)
    device_tag = "cpu" if device == "cpu" else device.replace(":", "")
    profile_name = name or f"{device_tag}-{spec.name}"
    plan = ProfilePlan.quick() if quick else ProfilePlan.full()
    progress, report = _phased_progress()

    with progress:
        result = run_profile(spec, name=profile_name, device=device, dtype=chosen_dtype,
                             plan=plan, out=out_file, threads=threads, seed=seed, label=label,
                             progress=report)
    v = result.obtained["validation"]
    err.print(f"wrote {out_file}")
    out.print(f"held-out prefill points: median error {v['held_out_prefill_median_rel_error']:.1%}"
              f", max {v['held_out_prefill_max_rel_error']:.1%}; held-out batches: median "
              f"{v['held_out_batch_median_rel_error']:.1%}", highlight=False)


# --------------------------------------------------------------------------- profiles
@profiles_app.command("list")
def profiles_list(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The shipped profiles (names follow HARDWARE-MODEL[-tpN])."""
    from ragsim.profiles.profile import load_profile, shipped_profile_names

    rows = []
    for name in shipped_profile_names():
        p = load_profile(name)
        rows.append({"name": name, "hardware": p.hardware.get("device", ""),
                     "model": p.model.name, "tensor_parallel": p.tensor_parallel,
                     "obtained": p.kind, "kv_capacity_bytes": p.kv_capacity_bytes})
    if json_output:
        _print_json({"profiles": rows})
        return
    table = Table("name", "hardware", "model", "TP", "obtained", "KV space")
    for row in rows:
        table.add_row(row["name"], row["hardware"], row["model"], str(row["tensor_parallel"]),
                      row["obtained"], format_bytes(row["kv_capacity_bytes"]))
    out.print(table)


@profiles_app.command("show")
@friendly_errors
def profiles_show(name: str,
                  plot: Annotated[Path | None, typer.Option(help="Write curves of T(cached, new) "
                                                                 "to this PNG/SVG/PDF.")] = None,
                  json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A profile's provenance and tables (a shipped name or a JSON path)."""
    from ragsim.figures import check_plot_path
    from ragsim.profiles.plots import plot_prefill
    from ragsim.profiles.profile import load_profile

    if plot is not None:
        check_plot_path(plot)  # before loading: a typo should cost nothing
    p = load_profile(name)
    if plot is not None:
        plot_prefill(p, plot)
        err.print(f"wrote {plot}")
    if json_output:
        _print_json(p.to_dict())
        return
    out.print(f"[bold]{p.name}[/]: {p.model.name} on {p.tensor_parallel} x "
              f"{p.hardware.get('device', '?')}, {p.dtype}, {p.engine}; {p.kind}; "
              f"KV space {format_bytes(p.kv_capacity_bytes)}; overhead {p.overhead_s * 1e3:.1f} ms",
              highlight=False)
    for key, value in p.obtained.get("sources", {}).items():
        out.print(f"  [dim]{key}[/]: {value}", highlight=False)
    for grid, title in ((p.prefill, "prefill seconds (rows: cached, columns: new tokens)"),
                        (p.decode, "decode seconds (rows: batch, columns: context tokens)")):
        table = Table("", *[f"{y:g}" for y in grid.y_axis], title=title)
        for x, row in zip(grid.x_axis, grid.values, strict=True):
            table.add_row(f"{x:g}", *[f"{v:.3g}" for v in row])
        out.print(table)
    b = p.batched_prefill
    out.print(f"batched prefill: {b.per_iteration_s * 1e3:.3g} ms + {b.per_token_s * 1e6:.3g} "
              f"us/token + {b.per_pair_s * 1e9:.3g} ns/pair; fit {b.fit}", highlight=False)
    t = p.transfers
    out.print(f"transfers: host->GPU {t.host_to_device_bytes_per_s / 1e9:.3g} GB/s, GPU->host "
              f"{t.device_to_host_bytes_per_s / 1e9:.3g} GB/s", highlight=False)


@profiles_app.command("predict")
@friendly_errors
def profiles_predict(name: str,
                     cached: Annotated[float, typer.Option(help="Cached tokens (alpha).")],
                     new: Annotated[float, typer.Option(help="New tokens (beta).")],
                     json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The bilinearly interpolated prefill time of one request, to check a table by hand."""
    from ragsim.profiles.profile import load_profile

    if cached < 0 or new < 0:
        raise RagsimInputError("token counts must be >= 0", field="--cached/--new")
    p = load_profile(name)
    seconds = p.prefill_s(cached, new)
    result = {"profile": p.name, "cached_tokens": cached, "new_tokens": new,
              "prefill_s": seconds, "extrapolated": p.extrapolated_queries > 0}
    if json_output:
        _print_json(result)
        return
    note = "  (outside the grid: extrapolated)" if result["extrapolated"] else ""
    out.print(f"{p.name}: T({cached:g} cached, {new:g} new) = {seconds:.6g} s{note}")


@profiles_app.command("derive")
@friendly_errors
def profiles_derive(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the profile files.")],
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Regenerate the roofline-derived profiles (the shipped ones come from this command)."""
    from ragsim.profiles.derived import all_derived_profiles, anchor_report

    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for p in all_derived_profiles():
        p.save(out_dir / f"{p.name}.json")
        names.append(p.name)
    report = {"written": names, "anchor": anchor_report()}
    if json_output:
        _print_json(report)
        return
    err.print(f"wrote {len(names)} profiles to {out_dir}")
    out.print(json.dumps(report["anchor"], indent=1), highlight=False)


if __name__ == "__main__":
    app()
