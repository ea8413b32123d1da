"""``ragsim run`` (the end-to-end simulation) and ``ragsim systems`` (its presets)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import TextColumn
from rich.table import Table

from ragsim.api.run import FIELD_OF_OPTION as RUN_FIELD_OF_OPTION
from ragsim.api.run import RUN_OPTIONS, run_problem
from ragsim.cli.common import (
    TRACE_NAMES,
    Command,
    check_out_dir,
    claim_output_dir,
    err,
    exit_interrupted,
    friendly_errors,
    make_bar,
    ms,
    name_table,
    out,
    print_json,
    print_warnings,
    sigterm_like_ctrl_c,
    write_results,
)
from ragsim.outputs import RUN_FILES
from ragsim.units import describe_bytes, format_bytes

WORKLOAD, CACHE, SCHEDULER, RETRIEVAL, ENGINE, FAULTS, BACKEND, OUTPUT = (
    "Workload", "Cache", "Scheduler", "Retrieval", "Engine", "Faults", "Backend", "Output")
ANSWERS = "Answer cache"
UNCERTAINTY = "Uncertainty"


# run's options -> configuration fields: the API's table (help shows each field's default)
FIELD_OF_OPTION = RUN_FIELD_OF_OPTION
# what an unset (None) field means, for help
_UNSET_MEANS = {
    "n_requests": "the whole trace", "top_k": "the trace's lists",
    "rate_rps": "the trace's arrival times", "gpu_kv_bytes": "the profile's KV capacity",
    "max_cached_depth": "every document", "frequency_window_s": "none (window scope: required)",
    "answer_namespace": "a fresh run id",
}


def _opt(panel: str | None, help_text: str, *names: str):
    """An option of ``run`` in its help panel (``run`` has ~40: grouped, they can be read)."""
    return typer.Option(*names, help=help_text, rich_help_panel=panel)


def _shown(field: str, value) -> str:
    if value is None:
        return _UNSET_MEANS.get(field, "none")
    if isinstance(value, bool):
        return "on" if value else "off"
    if field.endswith("_bytes"):
        return describe_bytes(value)
    if isinstance(value, tuple | list):
        return ", ".join(f"{v:g}" for v in value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def effective_defaults() -> dict[str, str]:
    """Each configuration field's default as help shows it: the default system's preset over
    SimConfig's defaults, then the systems that set something else (``192 GiB; vllm, sglang:
    0``). Read from the code that applies them, so help cannot fall behind."""
    import dataclasses

    from ragsim.serving.config import SYSTEM_PRESETS, SimConfig
    from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

    shown = {}
    for field in dataclasses.fields(SimConfig):
        name = field.name
        value = SYSTEM_PRESETS[SimConfig.system].get(name, field.default)
        others: dict[str, list[str]] = {}
        for system, settings in SYSTEM_PRESETS.items():
            if name in settings and settings[name] != value:
                others.setdefault(_shown(name, settings[name]), []).append(system)
        shown[name] = "; ".join([_shown(name, value),
                                 *(f"{', '.join(s)}: {v}" for v, s in others.items())])
    shown["trace_drift_per_1k_requests"] = (f"{BUILTIN_DRIFT_PER_1K_REQUESTS:g} (synthetic "
                                            "traces)")
    # a preset's order, or the one its reorder means (cache-aware or fcfs)
    orders: dict[str, list[str]] = {}
    for system, settings in SYSTEM_PRESETS.items():
        reorder = settings.get("reorder", SimConfig.reorder)
        order = settings.get("order") or ("cache-aware" if reorder else "fcfs")
        orders.setdefault(order, []).append(system)
    default_order = next(o for o, s in orders.items() if SimConfig.system in s)
    shown["order"] = "; ".join([default_order, *(f"{', '.join(s)}: {o}" for o, s in
                                                 orders.items() if o != default_order)])
    return shown


class RunCommand(Command):
    """``run``: its options default to None (a --config file may set them); help shows the
    effective defaults, read from SimConfig and the presets."""

    def help_defaults(self) -> dict[str, str]:
        defaults = effective_defaults()
        return {p.name: defaults[FIELD_OF_OPTION.get(p.name, p.name)] for p in self.params
                if FIELD_OF_OPTION.get(p.name, p.name) in defaults}


@friendly_errors
def run(
    config_file: Annotated[Path | None, _opt(
        None, "TOML configuration (its \\[run] table); flags given here override it.",
        "--config")] = None,
    # workload
    trace: Annotated[str | None, _opt(
        WORKLOAD, f"Built-in name ({TRACE_NAMES}) or trace path.")] = None,
    requests: Annotated[int | None, _opt(WORKLOAD, "Simulate only the first N requests.")
                        ] = None,
    seed: Annotated[int | None, _opt(
        WORKLOAD, "Seed (built-in traces, arrivals, synthetic stages).")] = None,
    drift: Annotated[float | None, _opt(
        WORKLOAD, "Synthetic traces: share of popularity ranks that trade documents every "
        "1,000 requests (0: stationary).")] = None,
    rate: Annotated[float | None, _opt(WORKLOAD, "Re-time arrivals at R requests/s.")] = None,
    arrival: Annotated[str | None, _opt(
        WORKLOAD, "trace, poisson or gamma (with --rate), or sequential (one request at a "
        "time).")] = None,
    cv: Annotated[float | None, _opt(WORKLOAD, "Gamma arrivals' coefficient of variation.")
                  ] = None,
    # engine
    system: Annotated[str | None, _opt(
        ENGINE, "Preset: vllm, vllm-apc, sglang, ragcache (see `ragsim systems`).")] = None,
    profile: Annotated[str | None, _opt(
        ENGINE, "Cost profile: shipped name or JSON path.")] = None,
    overlap_swap: Annotated[bool | None, _opt(
        ENGINE, "Overlap host->GPU KV loads with compute.", "--overlap-swap/--no-overlap-swap")
    ] = None,
    batch_kv_sharing: Annotated[bool | None, _opt(
        ENGINE, "A request hits KV a batch mate is computing (vLLM v1: yes; SGLang, RAGCache: "
        "no).", "--batch-kv-sharing/--no-batch-kv-sharing")] = None,
    # cache
    policy: Annotated[str | None, _opt(
        CACHE, "Replacement policy: pgdsf, gdsf, lru, lfu, fifo, or an ablation "
        "(pgdsf-const-cost, pgdsf-no-size); see `ragsim policies`.")] = None,
    frequency_scope: Annotated[str | None, _opt(
        CACHE, "How every frequency policy counts retrievals: admission (restarts when a "
        "node leaves the cache), lifetime (whole run), window (last --frequency-window s).")
    ] = None,
    frequency_window: Annotated[float | None, _opt(
        CACHE, "The window scope's width, seconds of simulated time.")] = None,
    cache: Annotated[bool | None, _opt(
        CACHE, "Cross-request KV reuse (off: vLLM v0.3).", "--cache/--no-cache")] = None,
    host_mem: Annotated[str | None, _opt(CACHE, "Host memory for cached KV, e.g. 192GiB.")
                        ] = None,
    host_write: Annotated[str | None, _opt(
        CACHE, "KV to host: back (on GPU eviction: RAGCache) or through (when computed: "
        "HiCache, vLLM offloading).")] = None,
    gpu_mem: Annotated[str | None, _opt(
        CACHE, "GPU memory for KV (cache and running requests), e.g. 20GiB.")] = None,
    reuse: Annotated[str | None, _opt(
        CACHE, "Document KV reuse: prefix, blend:R (any position, R recomputed: CacheBlend) or "
        "epic:K (first K recomputed).")] = None,
    cache_depth: Annotated[int | None, _opt(CACHE, "Cache only the first k' documents (top-k').")
                           ] = None,
    block_tokens: Annotated[int | None, _opt(
        CACHE, "Reuse whole blocks of this many tokens only (vLLM APC: 16).")] = None,
    system_prompt_tokens: Annotated[int | None, _opt(CACHE, "Shared system prompt (tree root).")
                                    ] = None,
    # scheduler
    reorder: Annotated[bool | None, _opt(
        SCHEDULER, "Cache-aware reordering.", "--reorder/--no-reorder")] = None,
    order: Annotated[str | None, _opt(
        SCHEDULER, "Prefill first: fcfs, cache-aware (paper), sjf (least to compute) or lpm "
        "(most cached).")] = None,
    reorder_window: Annotated[float | None, _opt(
        SCHEDULER, "Reordering window, seconds: the oldest waiting request is passed over "
        "for at most this long.", "--reorder-window")] = None,
    reorder_window_start: Annotated[str | None, _opt(
        SCHEDULER, "When a request's window starts: head (when it becomes the oldest waiting "
        "request) or arrival (the paper's literal rule; FCFS once a queue builds).")] = None,
    speculate: Annotated[bool | None, _opt(
        SCHEDULER, "Dynamic speculative pipelining.", "--speculate/--no-speculate")] = None,
    max_batch_size: Annotated[int | None, _opt(SCHEDULER, "Most running requests.")] = None,
    max_prefill_bs: Annotated[int | None, _opt(SCHEDULER, "Most requests per prefill iteration.")
                              ] = None,
    max_batched_tokens: Annotated[int | None, _opt(
        SCHEDULER, "Most new tokens per prefill iteration (mixed: per step, decodes "
        "included).")] = None,
    scheduler: Annotated[str | None, _opt(
        SCHEDULER, "prefill-first (vLLM v0.3) or mixed (chunked prefill: decodes and prompt "
        "chunks share each step's token budget; vLLM >= 0.4, SGLang).")] = None,
    padded_join: Annotated[str | None, _opt(
        SCHEDULER, "Padded engines (torch's profiles): if-cheaper (a prompt joins a batch "
        "only if priced cheaper than apart) or always.")] = None,
    # retrieval
    top_k: Annotated[int | None, _opt(RETRIEVAL, "Use only the first K retrieved documents.")
                     ] = None,
    search_workers: Annotated[int | None, _opt(RETRIEVAL, "Vector-search CPU workers.")] = None,
    search_s: Annotated[float | None, _opt(
        RETRIEVAL, "One request's full vector search, seconds.")] = None,
    search_stages: Annotated[int | None, _opt(
        RETRIEVAL, "Stages of a search (intermediate top-k lists).")] = None,
    stage_source: Annotated[str | None, _opt(
        RETRIEVAL, "Intermediate lists: auto, trace, synthetic, none.")] = None,
    stage_converge_p: Annotated[float | None, _opt(
        RETRIEVAL, "Synthetic stages: chance that a stage finds the final list.")] = None,
    stage_keeps_d1_p: Annotated[float | None, _opt(
        RETRIEVAL, "Synthetic stages: chance that a wrong list holds the final first document.")
    ] = None,
    stage_other_found_p: Annotated[float | None, _opt(
        RETRIEVAL, "Synthetic stages: chance that a wrong list without the final first document "
        "holds each other final document.")] = None,
    search_latency: Annotated[str | None, _opt(
        RETRIEVAL, "fixed (search_s) or trace (the trace's measured stage times; with "
        "--backend torch on a trace built with its text, its staged faiss search is run for "
        "real on --search-workers threads).")] = None,
    search_time_scale: Annotated[float | None, _opt(
        RETRIEVAL, "Multiply measured stage times (a larger index than the one measured).")
    ] = None,
    retrieval: Annotated[str | None, _opt(
        RETRIEVAL, "Model the vector search: auto (when the trace's documents were retrieved, "
        "not for prefix blocks such as Mooncake's; a search option or --speculate means on), "
        "on, off. [default: auto]")] = None,
    replicas: Annotated[int | None, _opt(
        ENGINE, "A fleet: this many engines, each with --gpu-mem and --host-mem of its own, "
        "behind --router.")] = None,
    router: Annotated[str | None, _opt(
        ENGINE, "Which replica takes a request: round-robin, random, session (by session "
        "id), least-loaded, prefix-affinity (SGLang's), kv-aware (Dynamo's).")] = None,
    router_staleness: Annotated[float | None, _opt(
        ENGINE, "The router sees the replicas' caches and loads this many seconds late.")
    ] = None,
    # faults
    fail_gpu_at: Annotated[list[float] | None, _opt(
        FAULTS, "Fail the GPU at T seconds (repeatable).")] = None,
    gpu_failure_rate: Annotated[float | None, _opt(FAULTS, "GPU failures per hour (Poisson).")
                                ] = None,
    gpu_recovery: Annotated[float | None, _opt(
        FAULTS, "Seconds the GPU is down after a failure.")] = None,
    host_replicas: Annotated[int | None, _opt(
        FAULTS, "Upper nodes kept replicated in host memory.")] = None,
    retry_timeout: Annotated[float | None, _opt(
        FAULTS, "Seconds before a failed request is retried.")] = None,
    max_retries: Annotated[int | None, _opt(
        FAULTS, "Retries before a request fails for good.")] = None,
    # answer cache
    answer_cache: Annotated[bool | None, _opt(
        ANSWERS, "Put the answer cache (L1 / L2 exact, semantic) in front of retrieval.",
        "--answer-cache/--no-answer-cache")] = None,
    answer_threshold: Annotated[float | None, _opt(
        ANSWERS, "Semantic hit when cosine similarity >= this (the article's 0.88-0.95). "
        "\\[default: 0.9]")] = None,
    answer_distance: Annotated[float | None, _opt(
        ANSWERS, "Or as redisvl says it: cosine distance <= this (1 - similarity).")] = None,
    answer_l1_size: Annotated[int | None, _opt(ANSWERS, "L1 entries per instance.")] = None,
    answer_ttl: Annotated[float | None, _opt(ANSWERS, "L2 / semantic TTL, seconds.")] = None,
    instances: Annotated[int | None, _opt(
        ANSWERS, "Service instances, each with its own L1 (shared L2 / semantic).")] = None,
    answer_routing: Annotated[str | None, _opt(
        ANSWERS, "Requests to instances: round-robin or hash.")] = None,
    answer_invalidate: Annotated[bool | None, _opt(
        ANSWERS, "When a question's answer changes in the trace, drop its shared entries "
        "(a KB update); the instances' L1s keep the old one until their TTL.",
        "--answer-invalidate/--no-answer-invalidate")] = None,
    answer_profile: Annotated[str | None, _opt(
        ANSWERS, "Tier latencies: a JSON file of `ragsim profile --answer-cache`, or 'default' "
        "(shipped, measured on the embedded server).")] = None,
    redis_url: Annotated[str | None, _opt(
        ANSWERS, "--backend torch: a Redis Stack / Redis 8 for L2 and the semantic tier; "
        "default: an embedded server. Its other keys are never touched.")] = None,
    answer_tenant: Annotated[str | None, _opt(
        ANSWERS, "Whose entries a request may be served: none (one shared cache) or session "
        "(each session a tenant: no user gets another's answer).")] = None,
    answer_namespace: Annotated[str | None, _opt(
        ANSWERS, "--redis-url: keep this run's entries under this name (runs given one name "
        "share, or warm, one cache); default: a fresh run id, deleted at the end.")] = None,
    # backend
    backend: Annotated[str, _opt(
        BACKEND, "sim: simulate (the profile's costs); torch: serve for real on the profile's "
        "model, random weights; vllm: on vLLM's engine (docs/vllm.md).")
    ] = "sim",
    device: Annotated[str, _opt(
        BACKEND, "torch backend: cpu, cuda or cuda:N; vllm: cpu (vLLM's CPU build: blocks of 32 "
        "tokens) or cuda (16).")] = "cpu",
    threads: Annotated[int, _opt(
        BACKEND, "torch backend: CPU threads (0: as many as the profile was measured with).")
    ] = 0,
    # uncertainty
    seeds: Annotated[int, _opt(
        UNCERTAINTY, "Run N seeds (--seed, --seed+1, ...): each metric's mean and 95% "
        "interval (Student-t); the records are the first seed's.")] = 1,
    sensitivity: Annotated[bool, _opt(
        UNCERTAINTY, "Reprice the run under the profile's held-out error, +-20% compute and "
        "half the copy bandwidth: each metric's range; one spanning >2x is flagged unstable.",
        "--sensitivity")] = False,
    # output
    json_output: Annotated[bool, _opt(OUTPUT, "Print one JSON object.", "--json")] = False,
    out_dir: Annotated[Path | None, _opt(
        OUTPUT, "Write requests.parquet, summary.json and config.toml here.", "--out")] = None,
    force: Annotated[bool, _opt(OUTPUT, "Replace an earlier result in --out.", "--force")
                     ] = False,
) -> None:
    """Simulate the RAG serving stack end to end (or serve it for real: --backend torch): TTFT,
    throughput and hit rates."""
    from ragsim.api.run import setup_run

    if out_dir is not None:
        check_out_dir(out_dir)  # before the run: a typo must not cost the simulation
    options = {name: value for name, value in locals().items()
               if name in RUN_OPTIONS and value is not None}
    setup = setup_run(config_file, backend=backend, device=device, threads=threads, **options)
    if out_dir is not None:  # before the run: an earlier result or an input must not be lost
        claim_output_dir(out_dir, writes=RUN_FILES, force=force, inputs=setup.inputs)
    if not json_output:
        for note in setup.notes:
            err.print(f"[dim]note:[/] {note}", highlight=False, soft_wrap=True)
    progress = make_bar(TextColumn("{task.fields[simulated]}"), enabled=not json_output)
    tasks = []  # the bar's task, added once the trace (and so its length) is known
    clock = "simulated s" if backend == "sim" else "s"
    with sigterm_like_ctrl_c() as signals:
        if seeds != 1 or sensitivity:  # several runs: no bar (each is one of them)
            from ragsim.api.uncertainty import run_with_uncertainty

            result = run_with_uncertainty(setup, seeds=seeds, sensitivity=sensitivity)
        else:
            with progress:
                result = setup.execute(
                    on_start=lambda total: tasks.append(progress.add_task("run", total=total,
                                                                          simulated="")),
                    on_progress=lambda done, now: progress.update(
                        tasks[0], completed=done, simulated=f"{now:,.0f} {clock}"))
        signals.disarm()  # what ended is kept: a later SIGTERM cannot cut the writing
        summary = result.summary
        if summary["interrupted"]:
            summary["interrupted_by"] = signals.name
        # what ran: the run decides what the config left to the trace (retrieval)
        not_written = (write_results(out_dir, result.requests, summary, result.config.to_toml())
                       if out_dir is not None else None)
    if json_output:
        print_json(summary)
    else:
        _print_run_summary(summary)
        _print_uncertainty(summary)
    print_warnings(summary)
    if not_written is not None:  # after the summary: the run's figures are not lost too
        raise not_written
    ended = summary["requests_completed"] + summary["requests_failed"]
    if summary["interrupted"]:
        exit_interrupted(f"at {summary['simulated_s']:,.1f} simulated s: {ended:,} of "
                         f"{summary['requests']:,} requests ended", out_dir, signals)
    problem = run_problem(summary, out_dir)
    if problem is not None:  # the watchdog (2: the run's own settings) or a stall (1: a bug)
        code, message = problem
        err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
        raise typer.Exit(code)


def _print_run_summary(s: dict) -> None:
    c = s["config"]
    real = s.get("backend", "sim") != "sim"
    kind = "real run" if real else "run"
    # a CPU engine's KV budget is host memory, not a GPU's
    kv_label = "KV memory (CPU)" if real and s.get("device", "cpu") == "cpu" else "GPU KV"
    table = Table(title=f"{kind}: {c['trace']} · {c['system']} · {c['policy']} · {s['profile']}",
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
        ("TTFT mean / p50 / p90 / p99", " / ".join(ms(s[f"ttft_{k}_s"])
                                                   for k in ("mean", "p50", "p90", "p99"))),
        ("  search wait / search / queue / swap-in / prefill",
         " / ".join(ms(s[f"ttft_{k}_mean_s"]) for k in ("search_wait", "search", "queue",
                                                         "swap_in", "prefill"))),
        ("TPOT mean", ms(s["tpot_mean_s"])),
        ("end-to-end mean / p99", f"{ms(s['e2e_mean_s'])} / {ms(s['e2e_p99_s'])}"),
        ("throughput", f"{s['throughput_rps']:.3f} req/s, {s['throughput_tokens_s']:,.1f} tok/s"),
        ("token hit rate (GPU + host)", f"{s['token_hit_rate']:.1%} ({s['token_hit_rate_gpu']:.1%}"
                                        f" + {s['token_hit_rate_host']:.1%})"),
        ("request hit rate", f"{s['request_hit_rate']:.1%}"),
        ("hits on own speculation (not above)", f"{s['speculative_self_hit_rate']:.1%}"),
        ("swapped in / out", f"{format_bytes(s['swap_in_bytes'])} / "
                             f"{format_bytes(s['swap_out_bytes'])}"),
        ("recomputed tokens", f"{s['recomputed_tokens']:,}"),
        *([("position-free hits / recomputed", f"{s['position_free_hit_tokens']:,} / "
                                               f"{s['blend_recomputed_tokens']:,}")]
          if "position_free_hit_tokens" in s else []),
        ("speculations (kept) / wasted", f"{s['speculations_started']:,} "
                                         f"({s['speculation_kept']:,}) / "
                                         f"{s['speculation_wasted_s']:,.1f} GPU s"),
        ("scheduler overhead", f"{s['scheduler_overhead_ms_per_decision']:.3f} ms/decision"),
        ("GPU failures / retries", f"{s['gpu_failures']} / {s['retries']}"),
        (f"{kv_label} / host cache", f"{describe_bytes(s['gpu_kv_bytes'])} / "
                                     f"{describe_bytes(c['host_cache_bytes'])}"),
    ]
    if "answer_cache_hit_rate" in s:  # the answer cache in front of RAG: what it answered
        hits = s["answer_cache_hits"]
        rows.insert(1, ("answer cache hits (L1 / L2 / semantic)",
                        f"{s['answer_cache_hit_rate']:.1%} ({hits['l1']:,} / {hits['l2']:,} / "
                        + (f"{hits['semantic']:,}" if s["answer_cache_semantic"] else "off")
                        + f"), {s['answer_cache_false_hits']:,} false"))
    if s.get("replicas"):  # a fleet: each replica's share, hit rate and TTFT p90
        rows.insert(1, (f"replicas ({c['router']})", ", ".join(
            f"{r['requests']:,} at {r['token_hit_rate']:.1%}, p90 "
            + (f"{1e3 * r['ttft_p90_s']:,.0f} ms" if r["ttft_p90_s"] is not None else "-")
            for r in s["replicas"]) + f"; imbalance {s['load_imbalance']:.2f}"))
    if real:  # served in real time: the clock was the machine's
        rows.append(("measured", f"{s['simulated_s']:,.1f} s of serving, {s['elapsed_s']:.2f} s "
                                 "wall"))
    else:
        rows.append(("simulated", f"{s['simulated_s']:,.1f} s in {s['elapsed_s']:.2f} s wall "
                                  f"({s['sim_requests_per_wall_s']:,.0f} req/s)"))
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)


UNCERTAIN_ROWS = (("TTFT mean", "ttft_mean_s", ms), ("TTFT p99", "ttft_p99_s", ms),
                  ("throughput (req/s)", "throughput_rps", lambda v: f"{v:.3f}"),
                  ("token hit rate", "token_hit_rate", lambda v: f"{v:.1%}"))


def _print_uncertainty(s: dict) -> None:
    """Over seeds: mean [95% interval]; repriced: [min, max] (flagged when it spans > 2x)."""
    if "ci95" not in s and "sensitivity" not in s:
        return
    table = Table(title="uncertainty", show_header=True)
    table.add_column("metric", style="bold")
    if "ci95" in s:
        table.add_column(f"{len(s['seeds'])} seeds: mean [95% CI]", justify="right")
    if "sensitivity" in s:
        table.add_column(f"{len(s['sensitivity_perturbations'])} repricings: range",
                         justify="right")
    for label_text, key, shown in UNCERTAIN_ROWS:
        cells = []
        if "ci95" in s:
            low, high = s["ci95"].get(key, (None, None))
            cells.append("-" if low is None else
                         f"{shown(s['mean'][key])} [{shown(low)}, {shown(high)}]")
        if "sensitivity" in s:
            low, high = s["sensitivity"].get(key, (None, None))
            flag = " unstable" if key in s["sensitivity_unstable"] else ""
            cells.append("-" if low is None else f"[{shown(low)}, {shown(high)}]{flag}")
        table.add_row(label_text, *cells)
    out.print(table)


def systems(json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the system presets of `ragsim run --system` and what each sets."""
    from ragsim.serving.config import SYSTEM_DESCRIPTIONS, SYSTEM_PRESETS
    from ragsim.serving.system_sources import SYSTEM_SOURCES

    if json_output:
        print_json({name: {"description": SYSTEM_DESCRIPTIONS[name], "settings": settings,
                           "follows": SYSTEM_SOURCES[name]}
                     for name, settings in SYSTEM_PRESETS.items()})
        return
    table = name_table("system", list(SYSTEM_PRESETS), "what it models", "settings",
                       title="systems (`ragsim run --system NAME`; any flag overrides)")
    table.columns[0].style = "bold"
    for name, settings in SYSTEM_PRESETS.items():
        table.add_row(name, SYSTEM_DESCRIPTIONS[name],
                      ", ".join(f"{k}={format_bytes(v) if k.endswith('_bytes') else v}"
                                for k, v in settings.items()))
    out.print(table)
