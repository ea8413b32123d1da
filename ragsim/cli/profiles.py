"""``ragsim profile`` (measure a cost profile here) and ``ragsim profiles ...`` (inspect them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ragsim.cli.common import (
    Command,
    Group,
    err,
    friendly_errors,
    name_table,
    out,
    phased_progress,
    print_json,
    require_extra,
)
from ragsim.errors import RagsimInputError
from ragsim.outputs import claim_output_file
from ragsim.units import format_bytes

ANSWERS = "Answer cache"
STEPS = "Engine steps (--engine torch)"
app = typer.Typer(cls=Group, no_args_is_help=True,
                  help="Inspect prefill-cost profiles.")


@friendly_errors
def profile(
    model: Annotated[str, typer.Option(help="Built-in model or a HF config.json path.")
                     ] = "mistral-7b",
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    out_file: Annotated[Path | None, typer.Option("--out", help="Profile JSON to write. "
                        "\\[default: profile.json; answer-profile.json with --answer-cache]")
                        ] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace an earlier profile in --out (an interrupted measurement "
        "resumes from OUT.partial.json without it).")] = False,
    layers: Annotated[int | None, typer.Option(help="Scale down: this many layers.")] = None,
    hidden: Annotated[int | None, typer.Option(
        help="Scale down: this hidden size (heads, KV heads and MLP scale with it).")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, fp16 or bf16 (default: fp32 on CPU, "
                                            "the model's on CUDA).")] = "",
    quick: Annotated[bool, typer.Option(help="A small grid (minutes on two CPU cores).")
                     ] = False,
    threads: Annotated[int, typer.Option(
        help="CPU threads of the engine on a CPU (one is steadiest; runs priced by the "
             "profile take its count).")] = 1,
    name: Annotated[str, typer.Option(help="Profile name (default: DEVICE-MODEL).")] = "",
    seed: Annotated[int, typer.Option()] = 0,
    engine: Annotated[str, typer.Option(
        help="What to time: torch (the reference engine's forward passes) or vllm (vLLM's own "
             "steps, its prefix cache holding the cached prefixes; docs/vllm.md).")] = "torch",
    block_tokens: Annotated[int, typer.Option(
        help="--engine vllm: vLLM's KV block (cached prefixes are whole blocks).")] = 32,
    engine_steps: Annotated[bool, typer.Option(
        help="Then price the engine's own step path (its work around the passes: tokens, "
             "KV kept, each row's token, a changed batch's write) from two short real runs "
             "of the torch engine at two loads, as validate's probe runs do.",
        rich_help_panel=STEPS)] = True,
    steps_trace: Annotated[str, typer.Option(
        help="The workload those runs serve (built-in name or trace path).",
        rich_help_panel=STEPS)] = "mmlu",
    steps_requests: Annotated[int, typer.Option(
        help="Requests in each of the two runs.", min=4, rich_help_panel=STEPS)] = 48,
    answer_cache: Annotated[bool, typer.Option(
        help="Instead: the answer cache's latency profile (each tier's lookup and write on the "
             "real stores), read by `run --answer-cache --answer-profile`.",
        rich_help_panel=ANSWERS)] = False,
    redis_url: Annotated[str | None, typer.Option(
        help="Redis Stack / Redis 8 to measure; default: an embedded one.",
        rich_help_panel=ANSWERS)] = None,
    answer_entries: Annotated[list[int] | None, typer.Option(
        help="Semantic index sizes to measure at (repeatable). \\[default: 1000, 10000, "
             "100000]", rich_help_panel=ANSWERS)] = None,
    answer_samples: Annotated[int, typer.Option(help="Operations timed per tier and size.",
                                                rich_help_panel=ANSWERS)] = 200,
) -> None:
    """Measure prefill, batched prefill, decode and copies on this machine into a profile.

    Builds the model from its architecture with random weights (nothing is downloaded). On a
    CPU only small models are practical: scale one down with --layers/--hidden (the name and
    the file say so). Interrupted runs resume from OUT.partial.json.
    """
    if answer_cache:
        from ragsim.cli.answers import measure_answer_profile

        return measure_answer_profile(out_file or Path("answer-profile.json"),
                                      redis_url=redis_url, entries=answer_entries,
                                      samples=answer_samples, force=force)
    out_file = out_file or Path("profile.json")
    if engine not in ("torch", "vllm"):
        raise RagsimInputError(f"must be torch or vllm, got {engine!r}", field="--engine")
    if engine == "vllm":
        from ragsim.realrun.vllm import require_engine

        require_engine("ragsim profile --engine vllm")
    require_extra("profile", "ragsim profile")
    # before the measuring: a typo, or an earlier profile it would replace, must not cost it
    claim_output_file(out_file, force=force)
    if engine == "torch" and engine_steps:  # the step runs' workload, read before the grid
        from ragsim.traces import resolve_trace

        try:
            resolve_trace(steps_trace, seed=seed, n_requests=steps_requests)
        except RagsimInputError as error:
            raise type(error)(error.detail, file=error.file, row=error.row,
                              field=error.field or "--steps-trace") from None
    from ragsim.profiles.models import resolve_model, scaled_down
    from ragsim.profiles.profiler import ProfilePlan, run_profile
    from ragsim.profiles.steps import iteration_ratio_lines

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
    profile_name = _measured_name(name, f"{device_tag}-{spec.name}")
    plan = ProfilePlan.quick() if quick else ProfilePlan.full()
    progress, report = phased_progress()

    with progress:
        if engine == "vllm":
            from ragsim.realrun.vllm.profile import profile_vllm

            result = profile_vllm(spec, name=_measured_name(name,
                                                             f"{device_tag}-vllm-{spec.name}"),
                                  plan=plan, out=out_file, block_tokens=block_tokens,
                                  kv_cache_bytes=2**30, seed=seed,
                                  label=f"vLLM; {label}" if label else "vLLM", progress=report,
                                  threads=threads if device == "cpu" else None)
        else:
            result = run_profile(spec, name=profile_name, device=device, dtype=chosen_dtype,
                                 plan=plan, out=out_file, threads=threads, seed=seed,
                                 label=label, progress=report)
            if engine_steps:  # the grid is saved: an interrupted step run keeps it
                result = _with_engine_steps(result, out_file, steps_trace, steps_requests,
                                            device, threads, seed, report)
    v = result.obtained["validation"]
    err.print(f"wrote {out_file}")
    out.print(f"held-out prefill points: median error {v['held_out_prefill_median_rel_error']:.1%}"
              f", max {v['held_out_prefill_max_rel_error']:.1%}; held-out batches: median "
              f"{v['held_out_batch_median_rel_error']:.1%}, max "
              f"{v['held_out_batch_max_rel_error']:.1%}", highlight=False)
    for line in iteration_ratio_lines(v):
        out.print(line, highlight=False)
    from ragsim.api.engine_steps import engine_steps_words

    steps_line = engine_steps_words(result)
    if steps_line is not None:
        out.print(steps_line, highlight=False)
    _print_warnings(result.warnings)
    if device == "cpu" and result.obtained.get("allocator") == "glibc":
        from ragsim.profiles.allocator import TCMALLOC_PRELOAD

        err.print(f"[dim]note:[/] measured on glibc's malloc (obtained.allocator): runs priced "
                  "by it must run on it too, and on it an engine's steps of a size it has not "
                  "run cost up to 2x what this profile times (ragsim/profiles/allocator.py); "
                  f"the engines' CPU guides start them with {TCMALLOC_PRELOAD}",
                  highlight=False, soft_wrap=True)


def _with_engine_steps(result, out_file: Path, trace: str, requests: int, device: str,
                      threads: int, seed: int, report):
    """The measured profile with the torch engine's step path priced from its real runs
    (``api.engine_steps``), written over ``out_file``; stopped, the grid's profile stays there
    and the stop is said."""
    from ragsim.api.engine_steps import measure_engine_steps

    phase = "engine steps (real runs)"
    report(phase, 0, 2)
    try:
        measured = measure_engine_steps(result, trace=trace, requests=requests, device=device,
                                        threads=threads, seed=seed,
                                        on_run=lambda done, total: report(phase, done, total))
    except KeyboardInterrupt:
        err.print(f"stopped: {out_file} holds the profile without the engine's steps "
                  "(its step overhead and batch write are the profiler's)", highlight=False)
        raise
    measured.save(out_file)
    return measured


def _grid_tables(grid, title: str, width: int) -> list[Table]:
    """A cost grid as tables that fit ``width`` columns: as many of the grid's columns per
    table as fit, every cell whole (a 22-column grid in one 80-column table showed ``…``)."""
    rows = [f"{x:g}" for x in grid.x_axis]
    headers = [f"{y:g}" for y in grid.y_axis]
    cells = [[f"{v:.3g}" for v in row] for row in grid.values]
    label_w = max(len(r) for r in rows) + 3
    cell_w = max(len(c) for c in [*headers, *(c for row in cells for c in row)]) + 3
    per_table = max(1, (width - label_w - 1) // cell_w)
    tables = []
    for start in range(0, len(headers), per_table):
        stop = min(len(headers), start + per_table)
        part = f" ({headers[start]}-{headers[stop - 1]})" if per_table < len(headers) else ""
        table = Table("", *headers[start:stop], title=title + part)
        for label, row in zip(rows, cells, strict=True):
            table.add_row(label, *row[start:stop])
        tables.append(table)
    return tables


def _measured_name(given: str, default: str) -> str:
    """A measured profile's name, never a shipped profile's: ``--profile NAME`` would load the
    shipped file, not this measurement (the default name gets ``-measured``; a name the user
    chose that is taken is refused)."""
    from ragsim.profiles.profile import shipped_profile_names

    shipped = set(shipped_profile_names())
    if given:
        if given in shipped:
            raise RagsimInputError(f"{given!r} is a shipped profile's name; --profile "
                                   f"{given} would load that one, not this measurement: "
                                   "choose another", field="--name")
        return given
    if default not in shipped:
        return default
    err.print(f"[dim]note:[/] named {default}-measured ({default} is a shipped profile); give "
              "the output file as --profile to use this measurement", highlight=False,
              soft_wrap=True)
    return f"{default}-measured"


def _print_warnings(warnings: list[str]) -> None:
    """A profile that misses its accuracy targets says so where nobody can miss it."""
    for warning in warnings:
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)


@app.command("list", cls=Command)
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
        print_json({"profiles": rows})
        return
    table = name_table("name", [row["name"] for row in rows], "hardware", "model", "TP",
                       "obtained", "KV space")
    for row in rows:
        table.add_row(row["name"], row["hardware"], row["model"], str(row["tensor_parallel"]),
                      row["obtained"], format_bytes(row["kv_capacity_bytes"]))
    out.print(table)


@app.command("show", cls=Command)
@friendly_errors
def profiles_show(name: str,
                  plot: Annotated[Path | None, typer.Option(help="Write curves of T(cached, new) "
                                                                 "to this PNG/SVG/PDF.")] = None,
                  json_output: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A profile's provenance and tables (a shipped name or a JSON path)."""
    from ragsim.figures import check_plot_path
    from ragsim.profiles.plots import plot_prefill
    from ragsim.profiles.profile import load_profile
    from ragsim.profiles.steps import iteration_ratio_lines

    if plot is not None:
        check_plot_path(plot)  # before loading: a typo should cost nothing
    p = load_profile(name)
    if plot is not None:
        plot_prefill(p, plot)
        err.print(f"wrote {plot}")
    if json_output:
        print_json(p.to_dict())
        return
    out.print(f"[bold]{p.name}[/]: {p.model.name} on {p.tensor_parallel} x "
              f"{p.hardware.get('device', '?')}, {p.dtype}, {p.engine}; {p.kind}; "
              f"KV space {format_bytes(p.kv_capacity_bytes)}; overhead {p.overhead_s * 1e3:.1f} ms",
              highlight=False)
    _print_warnings(p.warnings)
    for key, value in p.obtained.get("sources", {}).items():
        out.print(f"  [dim]{key}[/]: {value}", highlight=False)
    for grid, title in ((p.prefill, "prefill seconds (rows: cached, columns: new tokens)"),
                        (p.decode, "decode seconds (rows: batch, columns: context tokens)")):
        for table in _grid_tables(grid, title, out.width):
            out.print(table)
    out.print(p.batched_prefill.describe(), highlight=False)
    for term in (p.mixed_steps, p.step_overhead, p.new_shapes, p.idle_start,
                 p.decode_after_prompt, p.batch_copy):
        if term is not None:
            out.print(term.describe(), highlight=False)
    for line in iteration_ratio_lines(p.obtained.get("validation", {})):
        out.print(line, highlight=False)
    t = p.transfers
    out.print(f"transfers: host->GPU {t.host_to_device_bytes_per_s / 1e9:.3g} GB/s, GPU->host "
              f"{t.device_to_host_bytes_per_s / 1e9:.3g} GB/s", highlight=False)


@app.command("predict", cls=Command)
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
        print_json(result)
        return
    note = "  (outside the grid: extrapolated)" if result["extrapolated"] else ""
    out.print(f"{p.name}: T({cached:g} cached, {new:g} new) = {seconds:.6g} s{note}")


@app.command("derive", cls=Command)
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
        print_json(report)
        return
    err.print(f"wrote {len(names)} profiles to {out_dir}")
    out.print(json.dumps(report["anchor"], indent=1), highlight=False)
