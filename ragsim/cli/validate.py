"""``ragsim validate``: run the real engine and the simulator on one trace, configuration and
profile, and report how far apart they are (``ragsim.validate`` computes; this module runs,
writes and prints)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.backends import CPU_PROFILES
from ragsim.cli.common import (
    TRACE_NAMES,
    Command,
    check_out_dir,
    counting_progress,
    err,
    exit_interrupted,
    friendly_errors,
    ms,
    out,
    phased_progress,
    print_json,
    require_extra,
    sigterm_like_ctrl_c,
    write_results,
)
from ragsim.errors import RagsimInputError

DEFAULT_REQUESTS = 200  # a real run takes real time: a few minutes on two CPU cores
# configuration fields this command sets -> its options, so an error names what the user typed
# the shipped profile of vLLM's CPU engine: what --backend vllm prices with on a CPU by default
VLLM_CPU_PROFILE = CPU_PROFILES["vllm"]
_OPTION_OF_FIELD = {"trace": "--trace", "system": "--system", "rate_rps": "--rate",
                    "n_requests": "--requests", "seed": "--seed", "profile": "--profile",
                    "policy": "--policy", "gpu_kv_bytes": "--gpu-mem",
                    "host_cache_bytes": "--host-mem", "scheduler": "--scheduler"}


class ValidateCommand(Command):
    """What this command's unset options become, for help."""

    def help_defaults(self) -> dict[str, str]:
        from ragsim.validate import DEFAULT_TORCH_CPU_PROFILE

        return {"rate": "the trace's arrival times", "layers": "the profile's model",
                "hidden": "the profile's model", "threads": "the engine's",
                "policy": "the system's", "gpu_mem": "the profile's KV capacity",
                "host_mem": "the system's", "config_file": "none",
                "profile": f"{DEFAULT_TORCH_CPU_PROFILE} (on a CPU)", "loads": "one run"}


@friendly_errors
def validate(
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for validation.json, the per-request comparison, both runs' "
        "records and the plots.")],
    backend: Annotated[str, typer.Option(help="Real engine: torch (the reference engine).")
                       ] = "torch",
    trace: Annotated[str, typer.Option(help=f"Built-in name ({TRACE_NAMES}) or trace path.")
                     ] = "mmlu",
    system: Annotated[str, typer.Option(help="Preset (see `ragsim systems`).")] = "ragcache",
    rate: Annotated[float | None, typer.Option(
        help="Poisson arrivals at R requests/s (with --loads: the overload point's rate, "
        "every request at once if not given).")] = None,
    requests: Annotated[int, typer.Option(help="Run the first N requests.")
                        ] = DEFAULT_REQUESTS,
    layers: Annotated[int | None, typer.Option(help="Engine layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Engine hidden size.")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch.")] = None,
    device: Annotated[str, typer.Option(help="Where the engine runs: cpu, cuda or cuda:N.")
                      ] = "cpu",
    config_file: Annotated[Path | None, typer.Option(
        "--config", help="TOML configuration (its \\[run] table, as `ragsim run --config`); "
        "the options here override it.")] = None,
    policy: Annotated[str | None, typer.Option(help="Replacement policy (see `ragsim "
                                                    "policies`).")] = None,
    gpu_mem: Annotated[str | None, typer.Option(
        "--gpu-mem", help="KV memory on the GPU, e.g. 2MiB (a byte budget on a CPU).")] = None,
    host_mem: Annotated[str | None, typer.Option(
        "--host-mem", help="Host memory for the KV cache's host tier.")] = None,
    profile: Annotated[str | None, typer.Option(
        help="Cost profile: shipped name or JSON path (--backend vllm on a CPU: "
        "cpu-vllm-mistral-7b-l2-h256 unless given).")] = None,
    profile_now: Annotated[bool, typer.Option(
        "--profile-now", help="Profile the engine on this machine first (quick plan) and "
        "use that profile.")] = False,
    sequential: Annotated[bool, typer.Option(
        "--sequential", help="One request at a time, speculation and host replicas off "
        "(their decisions race with time): hit agreement must then be 1.0.")
    ] = False,
    loads: Annotated[str | None, typer.Option(
        help="Compare at several loads, e.g. idle,50,90,over: the overload point's real "
        "throughput is the capacity the percentages take; idle is sequential.")] = None,
    seed: Annotated[int, typer.Option(help="Seed (built-in traces, arrivals, stages).")] = 0,
    scheduler: Annotated[str | None, typer.Option(
        help="The simulator's iterations: prefill-first or mixed (chunked prefill). Default: "
        "the engine's own (torch: prefill-first; vLLM: mixed, as vLLM >= 0.4 schedules).")
    ] = None,
    reference_profile: Annotated[str | None, typer.Option(
        hidden=True, help="--backend sim: the profile of the simulated 'real' side.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure how far the simulation is from a real engine on the same trace and settings."""
    from ragsim import validate as v

    check_out_dir(out_dir)  # before the runs: a typo must not cost them
    if backend not in v.BACKENDS:
        raise RagsimInputError(f"unknown backend {backend!r}; known: torch, vllm",
                               field="--backend")
    if profile is not None and profile_now:
        raise RagsimInputError("give --profile or --profile-now, not both", field="--profile")
    if backend == "vllm" and profile is None and device == "cpu" and not profile_now:
        profile = VLLM_CPU_PROFILE  # measured on vLLM's CPU engine (docs/vllm.md)
    if backend == "vllm" and profile is None:
        raise RagsimInputError("--backend vllm needs a profile of vLLM itself: measure one with "
                               "ragsim profile --engine vllm and give it as --profile",
                               field="--profile")
    if sequential and loads is not None:
        raise RagsimInputError("--loads has its own sequential point (idle)",
                               field="--sequential")
    points = v.parse_loads(loads) if loads is not None else None
    if backend == "torch" or profile_now:
        require_extra("profile", "ragsim validate")
    config, terms = _config(config_file, trace=trace, system=system, rate=rate,
                            requests=requests, seed=seed, policy=policy, gpu_mem=gpu_mem,
                            host_mem=host_mem, scheduler=scheduler, backend=backend,
                            device=device)
    if terms and not json_output:
        err.print(f"[dim]note:[/] {v.terms_note(terms, backend)}", highlight=False,
                  soft_wrap=True)
    from ragsim.traces import resolve_trace

    data = resolve_trace(config.trace, seed=config.seed, n_requests=config.n_requests)
    costs = _cost_profile(profile, profile_now, backend, out_dir, layers=layers, hidden=hidden,
                          device=device, threads=threads, seed=seed,
                          needs=lambda kv_bytes: v.run_needs(data, config, kv_bytes))
    v.engine_scale(costs, layers, hidden)
    config = config.replace(profile=str(out_dir / "profile.json") if profile_now
                            else profile or costs.name)
    if sequential:
        config, changed = v.sequential_config(config)
        if changed and not json_output:
            err.print("[dim]note:[/] sequential: "
                      + ", ".join(f"{k} {was} -> {now}" for k, (was, now) in changed.items())
                      + " (decisions that race with time; the open-loop runs keep them)",
                      highlight=False)
    reference = None
    if reference_profile is not None:
        from ragsim.profiles.profile import load_profile

        reference = load_profile(reference_profile)
    if backend == "sim":
        err.print("[yellow]note:[/] --backend sim: the 'real' side is a second simulation"
                  + (f" (profile {reference.name})" if reference else "")
                  + ", not a real run", highlight=False)

    def one(cfg, load: str | None, folder: Path) -> dict:
        progress, done = counting_progress(data.n_requests, f"{backend} run", not json_output)
        with progress:
            real, sim = v.run_pair(data, cfg, costs, backend=backend, device=device,
                                   threads=threads,
                                   reference_profile=reference,
                                   progress=lambda ended, _now: done(ended))
        adjusted = v.speed_adjusted_sim(data, cfg, costs, real)
        report = v.compare(real, sim, backend=backend, load=load, sim_speed_adjusted=adjusted,
                           terms=terms)
        # a real run cut short (Ctrl-C, SIGTERM) keeps what ended: compared and written
        report["interrupted"] = bool(real.summary.get("interrupted"))
        _write_pair(folder, real, sim, report, backend)
        return report

    with sigterm_like_ctrl_c() as signals, _kept_on_interrupt(out_dir, signals):
        if points is None:
            report = one(config, None, out_dir)
            signals.disarm()
            print_json(report) if json_output else _print_report(report)
            if report["interrupted"]:
                exit_interrupted(f"after {report['requests']:,} requests ended in both runs "
                                 "(compared)", out_dir, signals)
            return
        rows, capacity_rps = [], None
        combined = {"backend": backend, "real_is_simulated": backend == "sim",
                    "system": config.system, "trace": config.trace,
                    "profile": config.profile,
                    "backend_terms": {name: getattr(config, name) for name in terms},
                    "capacity_rps": None, "loads": rows}
        for load in points:
            report = one(v.config_at_load(config, load, capacity_rps), load,
                         out_dir / f"load-{load}")
            if load == v.LOAD_OVER:
                capacity_rps = combined["capacity_rps"] = report["real"]["throughput_rps"]
            rows.append(v.load_row(report))
            _write_loads(out_dir, combined)  # after every load: an interruption keeps them
            if report["interrupted"]:
                break
        signals.disarm()
    print_json(combined) if json_output else _print_loads(combined)
    if rows and rows[-1].get("interrupted"):
        exit_interrupted(f"at load {rows[-1]['load']} ({len(rows)} of {len(points)} loads, the "
                         "last cut short)", out_dir, signals)


@contextmanager
def _kept_on_interrupt(out_dir: Path, signals):
    """Ctrl-C or SIGTERM outside a real run (while profiling, simulating or writing): what
    finished is already in ``out_dir`` (each load's folder, loads.json after every load); say
    so and exit 130 (143 for SIGTERM) instead of click's bare "Aborted!"."""
    try:
        yield
    except KeyboardInterrupt:
        exit_interrupted("before this comparison ended; what finished", out_dir, signals)


def _config(config_file: Path | None, *, trace: str, system: str, rate: float | None,
            requests: int, seed: int, policy: str | None, gpu_mem: str | None,
            host_mem: str | None, scheduler: str | None = None, backend: str = "torch",
            device: str = "cpu"):
    """The run's configuration (a --config file under this command's options) on the terms
    the backend runs it with, where neither set them (``validate.backend_terms``: for vLLM
    its engine's settings and the mixed scheduler), and what those terms changed (field ->
    (was, now)); an error naming this command's option or the file's field."""
    from ragsim import validate as v
    from ragsim.serving.config import build_config, load_config_file
    from ragsim.units import parse_bytes

    base = load_config_file(config_file) if config_file is not None else None
    flags = {"trace": trace, "system": system, "rate_rps": rate, "n_requests": requests,
             "seed": seed, "policy": policy.lower() if policy else None,
             "scheduler": scheduler,
             "gpu_kv_bytes": parse_bytes(gpu_mem, field="--gpu-mem") if gpu_mem else None,
             "host_cache_bytes": parse_bytes(host_mem, field="--host-mem") if host_mem
             else None}
    source = str(config_file) if config_file is not None else None
    given = {*(base or {}), *(name for name, value in flags.items() if value is not None)}
    try:
        config = build_config(flags, base=base, source=source)
    except RagsimInputError as exc:
        flag = _OPTION_OF_FIELD.get(exc.field or "")
        raise (type(exc)(exc.detail, field=flag) if flag else exc) from None
    return v.backend_terms(config, backend, device=device, given=given, source=source)


def _cost_profile(name: str | None, profile_now: bool, backend: str, out_dir: Path, *,
                  layers: int | None, hidden: int | None, device: str, threads: int | None,
                  seed: int, needs=None):
    """--profile as ``run --profile`` resolves it, a profile measured now (--profile-now, at
    the default profile's scale unless --layers/--hidden say otherwise; its plan reaches what
    the runs will ask, ``needs(kv_bytes_per_token)``), or the default."""
    from ragsim import validate as v
    from ragsim.profiles.profile import load_profile

    if name is not None:
        return load_profile(name)
    if backend == "torch" and not profile_now and device != "cpu":
        raise RagsimInputError("no shipped profile for the scaled-down engine on a GPU; "
                               "give --profile or --profile-now", field="--profile")
    default = load_profile(v.DEFAULT_TORCH_CPU_PROFILE)
    if not profile_now:
        return default
    out_dir.mkdir(parents=True, exist_ok=True)
    progress, report = phased_progress()
    with progress:
        # on a CPU the default profile's scale; on a GPU the full model unless told otherwise
        on_cpu = device == "cpu"
        return v.profile_here(
            out_dir / "profile.json",
            layers=layers or (default.model.num_layers if on_cpu else None),
            hidden=hidden or (default.model.hidden_size if on_cpu else None),
            device=device, threads=threads, seed=seed, progress=report,
            needs=None if needs is None else needs(default.model.kv_bytes_per_token))


def _write_pair(folder: Path, real, sim, report: dict, backend: str) -> None:
    """Both runs' records and summaries, the joined per-request comparison, the plots, the
    configuration and ``validation.json``."""
    import pandas as pd

    from ragsim import validate as v

    for name, side in (("real", real), ("sim", sim)):
        not_written = write_results(folder / name, pd.DataFrame(side.columns), side.summary)
        if not_written is not None:
            raise not_written
    joined, _ = v.join_runs(real.columns, sim.columns)
    table = v.per_request(joined)
    write_atomically(folder / "requests.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    v.plot_ttft(joined, folder, "real" if backend != "sim" else "reference (simulated)")
    write_text_atomically(folder / "config.toml", sim.config.to_toml())
    write_text_atomically(folder / "validation.json",
                          json.dumps(report, indent=2, default=str) + "\n")


def _write_loads(out_dir: Path, combined: dict) -> None:
    import pandas as pd

    rows = pd.DataFrame(combined["loads"])
    write_atomically(out_dir / "loads.parquet", lambda tmp: rows.to_parquet(tmp, index=False))
    write_text_atomically(out_dir / "loads.json",
                          json.dumps(combined, indent=2, default=str) + "\n")


def _mark(passed: bool | None, short: bool = False) -> str:
    if short:
        return {True: "[green]✓[/]", False: "[red]✗[/]", None: ""}[passed]
    return {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]n/a[/]"}[passed]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _print_report(r: dict) -> None:
    real = "simulated reference" if r["real_is_simulated"] else f"real ({r['backend']})"
    table = Table(title=f"validate: sim vs {real} · {r['trace']} · {r['system']} · "
                        f"{r['profile']} · {r['requests']:,} requests "
                        f"({r['requests_dropped']:,} dropped)")
    for header in ("metric", "value", "target", ""):
        table.add_column(header, justify="left" if header == "metric" else "right")
    checks = {c["metric"]: c for c in r["checks"]}
    for name, label, value in (
            ("ttft_mean_abs_error", "TTFT mean error", _pct(r["ttft_mean_error"])),
            ("ttft_p90_abs_error", "TTFT p90 |error| per request", _pct(r["ttft_p90_abs_error"])),
            ("throughput_abs_error", "throughput error", _pct(r["throughput_error"])),
            ("hit_agreement", "hit agreement (per tier)", f"{r['hit_agreement']:.1%}")):
        c = checks[name]
        table.add_row(label, value, f"{c['sense']} {c['target']:.0%}", _mark(c["passed"]))
    for q in (50, 90, 99):
        table.add_row(f"TTFT p{q} error", _pct(r[f"ttft_p{q}_error"]), "", "")
    if r.get("iteration_time_ratio") is not None:
        table.add_row("iteration time, predicted / measured",
                      f"{r['iteration_time_ratio']:.3f}", "", "")
    if r.get("beyond_profile_time_share") is not None:
        table.add_row("engine time past the profile's range",
                      f"{r['beyond_profile_time_share']:.1%}", "", "")
    speed, adjusted = r.get("machine_speed"), r.get("speed_adjusted")
    if speed is not None:
        table.add_row("machine speed vs profile (time ratio)",
                      f"{speed['ratio_before']:.2f} → {speed['ratio_after']:.2f}",
                      "steady" if speed["steady"] else "[yellow]moved[/]", "")
    if adjusted is not None:
        marks = {c["metric"]: c["passed"] for c in adjusted["checks"]}
        table.add_row(f"TTFT mean error at that speed (x{speed['factor']:.2f})",
                      _pct(adjusted["ttft_mean_error"]), "",
                      _mark(marks["ttft_mean_abs_error"]))
        table.add_row("TTFT p90 |error| at that speed", _pct(adjusted["ttft_p90_abs_error"]),
                      "", _mark(marks["ttft_p90_abs_error"]))
    table.add_row("KS statistic (p)", f"{r['ks_statistic']:.3f} ({r['ks_pvalue']:.3g})", "", "")
    table.add_row(f"TOST ±{r['tost_margin']:.0%} on log ratios (p)",
                  f"{'equivalent' if r['tost_equivalent'] else 'not shown'} "
                  f"({r['tost_pvalue']:.3g})", f"p < {r['tost_alpha']:g}", "")
    out.print(table)
    out.print("[dim]n/a: hit agreement is a target in sequential mode, throughput at "
              "overload[/]", highlight=False)
    parts = Table(title="TTFT components (means): where the error comes from")
    for header in ("component", "real", "sim", "error", "of TTFT", "model assumption"):
        parts.add_column(header, justify="right" if header in ("real", "sim", "error",
                                                                "of TTFT") else "left")
    for name, c in r["components"].items():
        style = "bold" if name == r["dominant_component"] else ""
        parts.add_row(name, ms(c["real_s"]), ms(c["sim_s"]), ms(c["error_s"]),
                      _pct(c["share_of_ttft"]), c["assumption"], style=style)
    out.print(parts)
    if r["dominant_component"] is not None:
        c = r["components"][r["dominant_component"]]
        out.print(f"largest error: {r['dominant_component']} ({ms(c['error_s'])}): check "
                  f"{c['assumption']}", highlight=False)


def _speed(row: dict) -> str:
    from ragsim.validate import STEADY_SPEED_CHANGE

    if row["machine_speed_factor"] is None:
        return "-"
    moved = abs(row["machine_speed_change"]) > STEADY_SPEED_CHANGE
    return f"x{row['machine_speed_factor']:.2f}{'*' if moved else ''}"


def _print_loads(combined: dict) -> None:
    from ragsim.validate import BURST_RATE_RPS

    real = "simulated reference" if combined["real_is_simulated"] else "real"
    table = Table(title=f"sim vs {real} at several loads · {combined['trace']} · "
                        f"{combined['system']} · capacity {combined['capacity_rps'] or 0:,.2f} "
                        "req/s", caption="errors: (sim - real) / real; ✓ ✗: targets (TTFT mean "
                        "10%, p90 25%; throughput 10% at overload; hits 100% when idle)")
    for header in ("load", "rate", "TTFT mean", "p90 |err|", "throughput", "hits", "largest",
                   "speed", "at speed: mean", "p90", "thr."):
        table.add_column(header, justify="left" if header in ("load", "largest") else "right")
    for row in combined["loads"]:
        rate = ("sequential" if row["arrival"] == "sequential" else "all at once"
                if row["rate_rps"] == BURST_RATE_RPS else f"{row['rate_rps']:,.2f}/s")
        table.add_row(
            row["load"], rate,
            f"{_pct(row['ttft_mean_error'])} {_mark(row['ttft_mean_abs_error_passed'], True)}",
            f"{row['ttft_p90_abs_error']:.1%} {_mark(row['ttft_p90_abs_error_passed'], True)}",
            f"{_pct(row['throughput_error'])} {_mark(row['throughput_abs_error_passed'], True)}",
            f"{row['hit_agreement']:.1%} {_mark(row['hit_agreement_passed'], True)}",
            row["dominant_component"] or "-",
            _speed(row),
            _pct(row["adjusted_ttft_mean_error"]),
            "-" if row["adjusted_ttft_p90_abs_error"] is None else
            f"{row['adjusted_ttft_p90_abs_error']:.1%}",
            _pct(row["adjusted_throughput_error"]))
    out.print(table)
    out.print("[dim]speed: the machine's time for the profile's own grid points during the run, "
              "over the profile's (* moved by more than 10% during the run); at speed: errors "
              "against the simulation priced at that speed[/]", highlight=False)
