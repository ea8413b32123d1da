#!/usr/bin/env bash
# The validation table of docs/validation.md, measured on this machine's CPU.
#
#   benchmarks/validate_cpu.sh OUT_DIR [REQUESTS] [SYSTEMS]
#
# Profiles the torch engine once (`validate --profile-now`: the quick plan reaching what the
# runs ask for), then validates each system (default: ragcache sglang vllm) on the first
# REQUESTS (default 300) requests of mmlu at idle, 50% and 90% of the real capacity and at
# overload, on that one profile. Prints one markdown table of every load point (raw errors and
# the errors at the machine's measured speed) and writes it to OUT_DIR/table.md. Run it on a
# quiet machine: it measures time (about 8 minutes per system here). PROFILE=P reuses a profile.
set -euo pipefail

OUT=${1:?usage: benchmarks/validate_cpu.sh OUT_DIR [REQUESTS] [SYSTEMS]}
REQUESTS=${2:-300}
SYSTEMS=${3:-ragcache sglang vllm}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

PROFILE=${PROFILE:-}  # a profile to use instead of measuring one
for system in $SYSTEMS; do
  if [ -z "$PROFILE" ]; then
    source_profile=(--profile-now)
  else
    source_profile=(--profile "$PROFILE")
  fi
  "$PY" -m ragsim validate --backend torch "${source_profile[@]}" --trace mmlu \
    --system "$system" --requests "$REQUESTS" --loads idle,50,90,over \
    --out "$OUT/$system" --json > "$OUT/$system.json"
  [ -n "$PROFILE" ] || PROFILE="$OUT/$system/profile.json"
done

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$OUT" $SYSTEMS <<'PYEOF'
import json
import sys
from pathlib import Path

out, systems = Path(sys.argv[1]), sys.argv[2:]


def pct(x):
    return "-" if x is None else f"{x:+.1%}"


def share(x):
    return "-" if x is None else f"{x:.1%}"


lines = ["| system | load | rate (req/s) | TTFT mean error | p90 abs error | throughput error "
         "| hit agreement | machine speed (change) | at that speed: mean / p90 / throughput "
         "| iteration time predicted/measured | engine time past the profile "
         "| largest component |",
         "|" + "---|" * 12]
for system in systems:
    combined = json.loads((out / f"{system}.json").read_text())
    for row in combined["loads"]:
        report = json.loads((out / system / f"load-{row['load']}" / "validation.json")
                            .read_text())
        speed = report.get("machine_speed") or {}
        rate = ("sequential" if row["arrival"] == "sequential" else "all at once"
                if row["rate_rps"] >= 1e5 else f"{row['rate_rps']:.2f}")
        lines.append(
            f"| {system} | {row['load']} | {rate} | {pct(row['ttft_mean_error'])} "
            f"| {share(row['ttft_p90_abs_error'])} | {pct(row['throughput_error'])} "
            f"| {row['hit_agreement']:.3f} "
            f"| x{speed.get('factor', float('nan')):.2f} ({pct(speed.get('change_during_run'))}) "
            f"| {pct(row['adjusted_ttft_mean_error'])} / "
            f"{share(row['adjusted_ttft_p90_abs_error'])} / "
            f"{pct(row['adjusted_throughput_error'])} "
            f"| {report['iteration_time_ratio']:.2f} "
            f"| {share(report['beyond_profile_time_share'])} "
            f"| {row['dominant_component']} |")
    lines.append(f"| {system} | capacity (real, over) | {combined['capacity_rps']:.2f} "
                 + "| " * 9 + "|")
table = "\n".join(lines) + "\n"
(out / "table.md").write_text(table)
print(table)

# the chart: mean TTFT per load point, real against simulated (and simulated at the machine's
# measured speed), one panel per system; the overload point's throughput in the title
from ragsim.figures import new_figure, save_figure

loads_order = ["idle", "50", "90", "over"]
fig = new_figure(4.2 * len(systems), 3.6)
for k, system in enumerate(systems):
    ax = fig.add_subplot(1, len(systems), k + 1)
    combined = json.loads((out / f"{system}.json").read_text())
    rows = {row["load"]: row for row in combined["loads"]}
    shown = [load for load in loads_order if load in rows]
    real, sim, adjusted = [], [], []
    for load in shown:
        report = json.loads((out / system / f"load-{load}" / "validation.json").read_text())
        real_mean = report["real"]["ttft_mean_s"]
        real.append(real_mean)
        sim.append(real_mean * (1 + report["ttft_mean_error"]))
        extra = report.get("speed_adjusted")
        adjusted.append(real_mean * (1 + extra["ttft_mean_error"]) if extra else float("nan"))
    x = range(len(shown))
    width = 0.27
    ax.bar([i - width for i in x], real, width, label="real (torch engine)")
    ax.bar(list(x), sim, width, label="simulated")
    ax.bar([i + width for i in x], adjusted, width, label="simulated at measured speed")
    ax.set_xticks(list(x), [f"{load}%" if load.isdigit() else load for load in shown])
    ax.set_yscale("log")
    ax.set(xlabel="load", ylabel="mean TTFT (s)" if k == 0 else None,
           title=f"{system}: capacity {combined['capacity_rps']:.2f} req/s")
    if k == 0:
        ax.legend(fontsize=7)
fig.tight_layout()
print(save_figure(fig, out / "validation.png"))
PYEOF
