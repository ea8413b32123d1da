"""``ragsim validate``: run the real engine and the simulator on one trace, configuration and
profile, and report how far apart they are (``ragsim.validation`` computes; this module runs,
writes and prints)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragsim.api.validation import DEFAULT_REQUESTS, METRIC_WORDS
from ragsim.cli.common import (
    TRACE_NAMES,
    Command,
    counting_progress,
    err,
    exit_interrupted,
    friendly_errors,
    ms,
    out,
    phased_progress,
    print_json,
    sigterm_like_ctrl_c,
)


class ValidateCommand(Command):
    """What this command's unset options become, for help."""

    def help_defaults(self) -> dict[str, str]:
        from ragsim.validation import DEFAULT_TORCH_CPU_PROFILE

        return {"rate": "the trace's arrival times", "layers": "the profile's model",
                "hidden": "the profile's model", "threads": "the engine's",
                "policy": "the system's", "gpu_mem": "the profile's KV capacity",
                "host_mem": "the system's", "config_file": "none",
                "profile": f"{DEFAULT_TORCH_CPU_PROFILE} (on a CPU)", "loads": "one run",
                "search_latency": "the configuration's (fixed)", "reuse": "prefix"}


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
    threads: Annotated[int | None, typer.Option(
        help="CPU threads of the engine (default: the profile's; --profile-now measures on "
             "1).")] = None,
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
    search_latency: Annotated[str | None, typer.Option(
        "--search-latency", help="fixed (the modelled search_s) or trace: the simulation "
        "waits the trace's measured stage times; on a trace built with its text the real run "
        "searches its staged faiss index on the search workers.")] = None,
    replay_decisions: Annotated[bool, typer.Option(
        "--replay-decisions", help="Price the real run's own iterations (its admission, "
        "batch and speculation decisions) with the simulator's costs: the TTFT error split "
        "into cost_model_error and decision_error, and the cost model's share into the steps' "
        "prices and the engine's time outside its steps (torch, vllm); each real step "
        "against its price in real/steps.parquet.")] = False,
    repeats: Annotated[str, typer.Option(
        help="Real runs of each point, each on a fresh engine, against the one simulation: "
        "the errors are against their per-request average, with each run's own and the 95% "
        "interval their spread gives (an engine's run-to-run spread, measured). A count, or "
        "counts by load: 3,90=15,50=15 runs the 90% and 50% points 15 times, the others 3.")
    ] = "1",
    sim_replicas: Annotated[int, typer.Option(
        help="Simulations of each point, each step's time drawn around its price with the "
        "spread (and step-to-step correlation) the probe runs' steps showed, else the "
        "profile's for a step run again, averaged per request: each request's expected TTFT, "
        "as --repeats averages the real runs (1: the noise-free simulation alone; it is "
        "reported beside an ensemble).")] = 1,
    replicas: Annotated[int | None, typer.Option(
        help="A fleet on both sides: this many engines (real: a thread each). [default: 1]",
        show_default=False)] = None,
    router: Annotated[str | None, typer.Option(
        help="The fleet's router (a real fleet: round-robin, random or session). "
        "[default: round-robin]", show_default=False)] = None,
    reference_profile: Annotated[str | None, typer.Option(
        hidden=True, help="--backend sim: the profile of the simulated 'real' side.")] = None,
    reuse: Annotated[str | None, typer.Option(
        help="Document KV reuse: prefix, blend:R or epic:K (see `ragsim run --help`).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 when a target is missed (for CI); the verdict decides on the "
        "raw errors only.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace an earlier validation in --out.")] = False,
) -> None:
    """Measure how far the simulation is from a real engine on the same trace and settings."""
    from ragsim.api.validation import setup_validation

    def on_note(text: str, warning: bool) -> None:
        if warning:
            err.print(f"[yellow]note:[/] {text}", highlight=False)
        elif not json_output:
            err.print(f"[dim]note:[/] {text}", highlight=False, soft_wrap=True)

    phases, report_phase = phased_progress()  # shown once --profile-now measures

    def on_phase(*progress) -> None:
        if not phases.live.is_started:
            phases.start()
        report_phase(*progress)

    # a stop while validate measures (its profile, its probe runs) exits as one during the
    # runs does: what finished is said, 130 or 143
    with sigterm_like_ctrl_c() as signals:
        try:
            with _kept_on_interrupt(out_dir, signals):
                setup = setup_validation(
                    out_dir, backend=backend, trace=trace, system=system, rate=rate,
                    requests=requests, layers=layers, hidden=hidden, threads=threads,
                    device=device, config=config_file, policy=policy, gpu_mem=gpu_mem,
                    host_mem=host_mem, profile=profile, profile_now=profile_now,
                    sequential=sequential, loads=loads, seed=seed, scheduler=scheduler,
                    reference_profile=reference_profile, search_latency=search_latency,
                    replay_decisions=replay_decisions, replicas=replicas, router=router,
                    on_note=on_note, on_profile_phase=on_phase, reuse=reuse, repeats=repeats,
                    sim_replicas=sim_replicas, force=force)
        finally:
            if phases.live.is_started:
                phases.stop()

    def on_run(label: str, total: int):
        progress, done = counting_progress(total, label, not json_output)
        return progress, done

    with sigterm_like_ctrl_c() as signals, _kept_on_interrupt(out_dir, signals):
        found = setup.execute(on_run)
        signals.disarm()
    if found.loads is None:
        report = found.report
        print_json(report) if json_output else _print_report(report)
    else:
        print_json(found.loads) if json_output else _print_loads(found.loads)
    if not json_output:
        style = "red" if found.failed else "green"
        out.print(f"[{style}]verdict:[/] {found.verdict}", highlight=False, soft_wrap=True)
    if found.interrupted:
        if found.loads is None:
            exit_interrupted(f"after {found.report['requests']:,} requests ended in both runs "
                             "(compared)", out_dir, signals)
        rows = found.loads["loads"]
        exit_interrupted(f"at load {rows[-1]['load']} ({len(rows)} of {len(found.points)} "
                         "loads, the last cut short)", out_dir, signals)
    if check and found.failed:
        raise typer.Exit(1)


@contextmanager
def _kept_on_interrupt(out_dir: Path, signals):
    """Ctrl-C or SIGTERM outside a real run (while profiling, simulating or writing): what
    finished is already in ``out_dir`` (each load's folder, loads.json after every load); say
    so and exit 130 (143 for SIGTERM) instead of click's bare "Aborted!"."""
    try:
        yield
    except KeyboardInterrupt:
        exit_interrupted("before this comparison ended; what finished", out_dir, signals)


def _mark(passed: bool | None, short: bool = False) -> str:
    if short:
        return {True: "[green]✓[/]", False: "[red]✗[/]", None: ""}[passed]
    return {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]n/a[/]"}[passed]


def _measured(value: float | None) -> bool:
    """A number the report measured: neither absent (older reports) nor NaN (not measured)."""
    return value is not None and value == value


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
    if r.get("search_mode") == "faiss":  # searched for real: an error of its own
        table.add_row("search mean error (real faiss search)", _pct(r["search_mean_error"]),
                      "", "")
    if r.get("cost_model_error") is not None:
        table.add_row("TTFT mean error: cost model / decisions",
                      f"{_pct(r['cost_model_error'])} / {_pct(r['decision_error'])}", "", "")
        split = r.get("decisions") or {}
        if split.get("outside_steps_error") is not None:
            table.add_row("cost model: steps' prices / outside the steps",
                          f"{_pct(split['step_price_error'])} / "
                          f"{_pct(split['outside_steps_error'])}", "", "")
    elasticity = r.get("cost_elasticity")
    if elasticity is not None:
        table.add_row("a 1% error of every step's price moves the mean by",
                      f"{elasticity['elasticity']:.1f}%",
                      "unstable" if elasticity.get("unstable") else "", "")
    term = r.get("search_term")
    if term is not None:
        table.add_row(f"TTFT mean error at the search term's 95% ends "
                      f"({term['search_s_low'] * 1e3:.2f}-{term['search_s_high'] * 1e3:.2f} ms)",
                      f"{_pct(term['ttft_mean_error']['low'])} to "
                      f"{_pct(term['ttft_mean_error']['high'])}",
                      "" if term["ordered"] else "out of order", "")
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
        kinds = speed.get("by_kind") or {}
        if kinds:
            table.add_row("  by kind of probe point", ", ".join(
                f"{kind} x{factor:.2f}" for kind, factor in sorted(kinds.items())), "", "")
    if adjusted is not None:
        marks = {c["metric"]: c["passed"] for c in adjusted["checks"]}
        table.add_row(f"TTFT mean error at that speed (x{speed['factor']:.2f})",
                      _pct(adjusted["ttft_mean_error"]), "",
                      _mark(marks["ttft_mean_abs_error"]))
        table.add_row("TTFT p90 |error| at that speed", _pct(adjusted["ttft_p90_abs_error"]),
                      "", _mark(marks["ttft_p90_abs_error"]))
    repeats = r.get("repeats")
    if repeats:
        table.add_row(f"real runs: TTFT mean error each ({repeats['confidence']:.0%} interval "
                      "of the mean)",
                      ", ".join(_pct(run["ttft_mean_error"]) for run in repeats["per_run"])
                      + " (" + " to ".join(_pct(e) for e in repeats["ttft_mean_error_interval"])
                      + ")", "", "")
        if repeats.get("ttft_p90_abs_error_floor") is not None:  # not in older reports
            table.add_row("TTFT p90 |error| the runs' own spread gives a perfect model",
                          f"{repeats['ttft_p90_abs_error_floor']:.1%}", "", "")
        both = repeats.get("ttft_p90_abs_error_floor_both_sides")
        if _measured(both):  # an ensemble beside the runs
            table.add_row("... and with the replicas' average's own spread (both sides)",
                          f"{both:.1%}", "", "")
        if repeats.get("ttft_p90_abs_error_one_run") is not None:
            table.add_row("TTFT p90 |error| of one real run against the others' average",
                          f"{repeats['ttft_p90_abs_error_one_run']:.1%}", "", "")
    ensemble = r.get("sim_ensemble")
    if ensemble:
        single = ensemble["single_run"]
        table.add_row(f"simulated side: {ensemble['replicas']} simulations averaged, step time "
                      f"sigma {ensemble['step_time_sigma']:.3f}, correlation "
                      f"{ensemble.get('step_time_correlation', 0.0):.2f}; one against the others' "
                      "average, p90 |error|",
                      f"{ensemble['ttft_p90_abs_error_one_run']:.1%}", "", "")
        table.add_row("the noise-free simulation: TTFT mean error, p90 |error|, throughput",
                      f"{_pct(single['ttft_mean_error'])}, {single['ttft_p90_abs_error']:.1%}, "
                      f"{_pct(single['throughput_error'])}", "", "")
    table.add_row("KS statistic (p)", f"{r['ks_statistic']:.3f} ({r['ks_pvalue']:.3g})", "", "")
    table.add_row(f"TOST ±{r['tost_margin']:.0%} on log ratios (p), a diagnostic",
                  f"{'equivalent' if r['tost_equivalent'] else 'not shown'} "
                  f"({r['tost_pvalue']:.3g})", f"p < {r['tost_alpha']:g}", "")
    out.print(table)
    out.print("[dim]pass / FAIL: the raw errors against their targets, which decide the verdict; "
              "n/a: a target that does not apply here (hit agreement is one in sequential mode, "
              "throughput at overload). The rows below the targets are diagnostics: machine "
              "speed (moved: by more than 10% during the run, so the profile's prices drifted), "
              "errors at that speed, KS and TOST (whether the TTFT distributions match within "
              "the margin) never pass a run.[/]", highlight=False)
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
    _print_diagnosis(r.get("diagnosis") or [])


def _print_diagnosis(diagnosis: list[dict]) -> None:
    """Each missed target: its cause, the evidence read from the report and the next fix."""
    for miss in diagnosis:
        words = METRIC_WORDS.get(miss["metric"], miss["metric"])
        out.print(f"[red]missed[/] {words} {miss['value']:.1%}: [bold]{miss['cause']}[/] "
                  f"({miss['meaning']}). {'; '.join(miss['evidence'])}. "
                  f"[bold]next:[/] {miss['next_fix']}", highlight=False, soft_wrap=True)


def _speed(row: dict) -> str:
    from ragsim.validation import STEADY_SPEED_CHANGE, hidden_speed_kinds

    if row["machine_speed_factor"] is None:
        return "-"
    moved = abs(row["machine_speed_change"]) > STEADY_SPEED_CHANGE
    kinds = {kind: row[f"machine_speed_{kind}"] for kind in ("prefill", "decode")
             if row.get(f"machine_speed_{kind}") is not None}  # not in older reports
    hidden = hidden_speed_kinds(row["machine_speed_factor"], kinds)
    return (f"x{row['machine_speed_factor']:.2f}{'*' if moved else ''}"
            + "".join(f" ({kind} x{k:.2f})" for kind, k in hidden.items()))


def _busy(row: dict) -> str:
    """The engine's busy share, real / simulated (a load named as a share of the burst's
    capacity can keep the engine busier than its name says); '-' in an older report."""
    shares = [row.get(f"{side}_gpu_busy_fraction") for side in ("real", "sim")]
    return "-" if None in shares else f"{shares[0]:.0%}/{shares[1]:.0%}"


def _print_loads(combined: dict) -> None:
    from ragsim.validation import BURST_RATE_RPS

    real = "simulated reference" if combined["real_is_simulated"] else "real"
    table = Table(title=f"sim vs {real} at several loads · {combined['trace']} · "
                        f"{combined['system']} · capacity {combined['capacity_rps'] or 0:,.2f} "
                        "req/s", caption="errors: (sim - real) / real; ✓ ✗: targets (TTFT mean "
                        "10%, p90 25%; throughput 10% at overload; hits 100% when idle)")
    for header in ("load", "rate", "busy", "TTFT mean", "p90 |err|", "throughput", "hits",
                   "largest", "speed", "at speed: mean", "p90", "thr."):
        table.add_column(header, justify="left" if header in ("load", "largest") else "right")
    for row in combined["loads"]:
        rate = ("sequential" if row["arrival"] == "sequential" else "all at once"
                if row["rate_rps"] == BURST_RATE_RPS else f"{row['rate_rps']:,.2f}/s")
        table.add_row(
            row["load"], rate, _busy(row),
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
    repeated = [row for row in combined["loads"] if row.get("real_runs", 1) > 1]
    if repeated:
        out.print("TTFT mean error's 95% interval over the real runs (the engine's spread): "
                  + "; ".join(f"{row['load']} {_pct(row['ttft_mean_error_low'])} to "
                              f"{_pct(row['ttft_mean_error_high'])} ({row['real_runs']} runs, "
                              f"real mean varied {row['real_ttft_mean_cv']:.0%})"
                              for row in repeated), highlight=False)
        floors = [row for row in repeated if row.get("ttft_p90_abs_error_floor") is not None]
        if floors:
            out.print("TTFT p90 |error| a perfect model would show against the runs' average "
                      "(their per-request spread): " + "; ".join(
                          f"{row['load']} {row['ttft_p90_abs_error_floor']:.1%}"
                          for row in floors), highlight=False)
        both = [row for row in floors  # NaN or absent: no replicas beside the runs
                if _measured(row.get("ttft_p90_abs_error_floor_both_sides"))]
        if both:
            out.print("... the same, the simulated side an average of its replicas too (both "
                      "sides' spread): " + "; ".join(
                          f"{row['load']} {row['ttft_p90_abs_error_floor_both_sides']:.1%}"
                          for row in both), highlight=False)
        out.print("TTFT p90 |error| of one real run against the others' average: " + "; ".join(
            f"{row['load']} {row['real_ttft_p90_abs_error_one_run']:.1%}" for row in repeated
            if row.get("real_ttft_p90_abs_error_one_run") is not None), highlight=False)
    ensembles = [row for row in combined["loads"] if row.get("sim_replicas", 1) > 1]
    if ensembles:
        out.print(f"simulated side: {ensembles[0]['sim_replicas']} simulations averaged per "
                  f"request (step time sigma {ensembles[0]['step_time_sigma']:.3f}, "
                  f"correlation {ensembles[0].get('step_time_correlation', 0.0):.2f}); the "
                  "noise-free simulation's TTFT mean error / p90 |error|: " + "; ".join(
                      f"{row['load']} {_pct(row['single_ttft_mean_error'])} / "
                      f"{row['single_ttft_p90_abs_error']:.1%}" for row in ensembles),
                  highlight=False)
    split = [row for row in combined["loads"] if row.get("cost_model_error") is not None]
    if split:
        out.print("TTFT mean error split (--replay-decisions), cost model / decisions: "
                  + "; ".join(f"{row['load']} {_pct(row['cost_model_error'])} / "
                              f"{_pct(row['decision_error'])}" for row in split),
                  highlight=False)
    answering = [row for row in combined["loads"]
                 if row.get("ttft_cost_elasticity") is not None]
    if answering:
        out.print("a 1% error of every step's price moves the mean TTFT by: " + "; ".join(
            f"{row['load']} {row['ttft_cost_elasticity']:.1f}%"
            + (" (unstable: x0.95 / x1.05 span over 2x or out of order)"
               if row.get("ttft_cost_unstable") else "") for row in answering),
            highlight=False)
    searched = [row for row in combined["loads"]
                if row.get("ttft_mean_error_search_low") == row.get("ttft_mean_error_search_low")
                and row.get("ttft_mean_error_search_low") is not None]  # NaN: not measured
    if searched:
        out.print("TTFT mean error at the search term's 95% interval "
                  f"({searched[0]['search_s_low'] * 1e3:.2f}-"
                  f"{searched[0]['search_s_high'] * 1e3:.2f} ms a search): " + "; ".join(
                      f"{row['load']} {_pct(row['ttft_mean_error_search_low'])} to "
                      f"{_pct(row['ttft_mean_error_search_high'])}"
                      + ("" if row.get("ttft_mean_search_ordered") is not False else
                         " (out of order: the point's batches reshuffle)")
                      for row in searched),
                  highlight=False)
    for row in combined["loads"]:
        if row.get("miss_causes"):
            out.print(f"[red]missed[/] at {row['load']}: {row['miss_causes']}. [bold]next:[/] "
                      f"{row['next_fixes']}", highlight=False, soft_wrap=True)
    searched = [row for row in combined["loads"] if row.get("search_mean_error") is not None
                and row.get("search_mode") == "faiss"]
    if searched:
        out.print("search mean error (real faiss search): " + "; ".join(
            f"{row['load']} {_pct(row['search_mean_error'])}" for row in searched),
            highlight=False)
    out.print("[dim]busy: the engine's share of the run's time spent in steps, real / "
              "simulated (the simulated steps hold the engine loop the configuration "
              "charges)[/]", highlight=False)
    out.print("[dim]speed: the machine's time for the profile's own grid points during the run, "
              "over the profile's (* moved by more than 10% during the run); at speed: errors "
              "against the simulation priced at that speed[/]", highlight=False)
