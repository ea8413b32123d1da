"""``ragsim replay`` (a trace through the cache policy core, no timing) and ``ragsim models``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragsim.cli.common import (
    TRACE_NAMES,
    Command,
    claim_output_dir,
    counting_progress,
    err,
    exit_interrupted,
    friendly_errors,
    generator_settings,
    name_table,
    out,
    print_json,
    print_warnings,
    sigterm_like_ctrl_c,
    write_results,
)
from ragsim.errors import RagsimInputError
from ragsim.limits import REPLAY_BYTES_PER_REQUEST, memory_problem
from ragsim.units import describe_bytes, format_bytes, parse_bytes

# Replay's memory defaults differ from run's on purpose: run models the paper's A10G server (192
# GiB of host memory, the GPU's KV space from the profile); replay is for comparing policies,
# and at 192 GiB the built-in traces nearly fit, so every policy scores alike (mmlu: PGDSF
# 51.3%, LRU 50.0%; at 4 + 32 GiB: 40.8% and 35.4%). Both show their defaults in help and
# echo the sizes they used in the summary.
REPLAY_GPU_MEM = "4GiB"
REPLAY_HOST_MEM = "32GiB"


class ReplayCommand(Command):
    def help_defaults(self) -> dict[str, str]:
        from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

        return {"drift": f"{BUILTIN_DRIFT_PER_1K_REQUESTS:g} (synthetic traces)"}


@friendly_errors
def replay(
    trace: Annotated[str, typer.Option(
        help=f"Built-in name ({TRACE_NAMES}) or trace path.")] = "mmlu",
    policy: Annotated[str, typer.Option(
        help="pgdsf, gdsf, lru, lfu, fifo, belady (offline bound), or an ablation "
             "(pgdsf-const-cost, pgdsf-no-size); see `ragsim policies`.")] = "pgdsf",
    frequency_scope: Annotated[str, typer.Option(
        help="How every frequency policy counts retrievals: admission (restarts when a node "
             "leaves the cache), lifetime (whole trace), window (last --frequency-window "
             "seconds of trace time).")] = "lifetime",
    frequency_window: Annotated[float | None, typer.Option(
        help="The window scope's width, seconds of trace time.")] = None,
    model: Annotated[str, typer.Option(help="Built-in model or a HF config.json path.")
                     ] = "mistral-7b",
    gpu_mem: Annotated[str, typer.Option(help="GPU memory for cached KV.")] = REPLAY_GPU_MEM,
    host_mem: Annotated[str, typer.Option(
        help="Host memory for cached KV (less than run's 192GiB: below the built-in traces' "
             "working set, where policies differ).")] = REPLAY_HOST_MEM,
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
             "requests (0: stationary).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write requests.parquet and "
                                                 "summary.json here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier result in --out.")
                     ] = False,
) -> None:
    """Feed a trace, in order, through the cache policy core (no timing model)."""
    if out_dir is not None:  # before the replay: a typo, an input or an earlier result
        from ragsim.outputs import RUN_FILES

        claim_output_dir(out_dir, writes=RUN_FILES, inputs=(trace, profile, model), force=force)
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
    problem = memory_problem(requests, REPLAY_BYTES_PER_REQUEST)
    if problem:  # before minutes of generating or replaying end in a MemoryError
        raise RagsimInputError(f"cannot be replayed here: {problem}", field="--requests")
    _check_frequency_scope(frequency_scope, frequency_window)
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
        frequency_scope=frequency_scope,
        frequency_window_s=frequency_window,
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
    data = resolve_trace(trace, seed=seed, n_requests=requests, **generator_settings(drift))
    progress, callback = counting_progress(data.n_requests, "replay", not json_output)
    with sigterm_like_ctrl_c() as signals:
        with progress:
            result = run_replay(data, config, costs, callback)
        signals.disarm()  # what was replayed is kept: a later SIGTERM cannot cut the writing
        summary = result.summary
        if summary["interrupted"]:
            summary["interrupted_by"] = signals.name
        not_written = (write_results(out_dir, result.records, summary)
                       if out_dir is not None else None)
    if json_output:
        print_json(summary)
    else:
        _print_replay_summary(summary)
    print_warnings(summary)
    if not_written is not None:  # after the summary: the replay's figures are not lost too
        raise not_written
    if summary["interrupted"]:
        exit_interrupted(f"after the first {summary['requests']:,} of {data.n_requests:,} "
                         "requests", out_dir, signals)


def _check_frequency_scope(scope: str, window_s: float | None) -> None:
    from ragsim.cache.tree import FREQUENCY_SCOPES

    if scope not in FREQUENCY_SCOPES:
        raise RagsimInputError(f"unknown scope {scope!r}; choose one of "
                               f"{', '.join(FREQUENCY_SCOPES)}", field="--frequency-scope")
    if scope == "window" and window_s is None:
        raise RagsimInputError("the window scope needs --frequency-window SECONDS",
                               field="--frequency-scope")
    if scope != "window" and window_s is not None:
        raise RagsimInputError("applies only to --frequency-scope window",
                               field="--frequency-window")
    if window_s is not None and not window_s > 0:
        raise RagsimInputError("must be > 0", field="--frequency-window")


def _print_replay_summary(s: dict) -> None:
    c = s["config"]
    table = Table(title=f"replay: {c['trace']} · {c['policy']}{' (flat)' if c['flat'] else ''}"
                  f" · {c['model']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("requests", f"{s['requests']:,}"),
        ("GPU / host memory", f"{describe_bytes(c['gpu_capacity_bytes'])} / "
                              f"{describe_bytes(c['host_capacity_bytes'])}"),
        ("KV bytes per token", f"{c['kv_bytes_per_token']:,}"),
        ("frequency counted", c["frequency_scope"] + (
            f" ({c['frequency_window_s']:g} s)" if c["frequency_window_s"] else "")),
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


def models(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List built-in model architectures and their KV bytes per token."""
    from ragsim.profiles.models import BUILTIN_MODELS

    if json_output:
        print_json({name: spec.to_dict() for name, spec in BUILTIN_MODELS.items()})
        return
    table = name_table("model", list(BUILTIN_MODELS), "layers", "heads", "KV heads", "head dim",
                       "dtype", "KV/token")
    for spec in BUILTIN_MODELS.values():
        table.add_row(spec.name, str(spec.num_layers), str(spec.num_attention_heads),
                      str(spec.num_kv_heads), str(spec.head_dim), spec.dtype,
                      format_bytes(spec.kv_bytes_per_token))
    out.print(table)
