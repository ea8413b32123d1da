"""``ragsim replay`` (a trace through the cache policy core, no timing) and ``ragsim models``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragsim.api.replays import REPLAY_GPU_MEM, REPLAY_HOST_MEM
from ragsim.cli.common import (
    TRACE_NAMES,
    Command,
    claim_output_dir,
    err,
    exit_interrupted,
    friendly_errors,
    make_bar,
    name_table,
    out,
    print_json,
    print_warnings,
    sigterm_like_ctrl_c,
    write_results,
)
from ragsim.units import describe_bytes, format_bytes


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
    replicas: Annotated[int, typer.Option(
        help="A fleet: this many caches behind one --router, each with --gpu-mem and "
             "--host-mem of its own.")] = 1,
    router: Annotated[str, typer.Option(
        help="Which replica takes a request: round-robin, random, session (sticky by session "
             "id) or prefix-affinity (SGLang's cache-aware router).")] = "round-robin",
    reuse: Annotated[str, typer.Option(
        help="Document KV reuse: prefix, blend:R (any position, R recomputed: CacheBlend) or "
             "epic:K (first K recomputed).")] = "prefix",
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
    from ragsim.api.replays import REPLAY_OPTIONS, setup_replay

    options = {name: value for name, value in locals().items() if name in REPLAY_OPTIONS}
    setup = setup_replay(**options)
    if not json_output:
        for note in setup.notes:
            err.print(f"note: {note}")
    progress = make_bar(enabled=not json_output)
    tasks = []  # the bar's task, added once the trace (and so its length) is known
    with sigterm_like_ctrl_c() as signals:
        with progress:
            result = setup.execute(
                on_start=lambda total: tasks.append(progress.add_task("replay", total=total)),
                on_progress=lambda done: progress.update(tasks[0], completed=done))
        signals.disarm()  # what was replayed is kept: a later SIGTERM cannot cut the writing
        summary = result.summary
        if summary["interrupted"]:
            summary["interrupted_by"] = signals.name
        not_written = (write_results(out_dir, result.requests, summary)
                       if out_dir is not None else None)
    if json_output:
        print_json(summary)
    else:
        _print_replay_summary(summary)
    print_warnings(summary)
    if not_written is not None:  # after the summary: the replay's figures are not lost too
        raise not_written
    if summary["interrupted"]:
        exit_interrupted(f"after the first {summary['requests']:,} of {result.trace_requests:,} "
                         "requests", out_dir, signals)


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
        *([("position-free hits / recomputed", f"{s['position_free_hit_tokens']:,} / "
                                               f"{s['blend_recomputed_tokens']:,}")]
          if "position_free_hit_tokens" in s else []),
        ("swapped in / out", f"{format_bytes(s['swap_in_bytes'])} / "
                             f"{format_bytes(s['swap_out_bytes'])}"),
        ("evictions GPU / host", f"{s['evictions_gpu']:,} / {s['evictions_host']:,}"),
        ("wall time", f"{s['elapsed_s']:.2f} s ({s['requests_per_s']:,.0f} requests/s)"),
    ]
    if s.get("replicas"):  # a fleet: each replica's share and hit rate
        rows.insert(1, (f"replicas ({c['router']})",
                        ", ".join(f"{r['requests']:,} at {r['token_hit_rate']:.1%}"
                                  for r in s["replicas"])
                        + f"; imbalance {s['load_imbalance']:.2f}"))
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
