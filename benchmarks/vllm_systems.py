"""The paper's comparison for real, on vLLM: ragcache-in-vLLM vs vllm-apc vs vllm.

The same trace and Poisson arrivals served by vLLM's engine three ways (``--backend vllm``):
``vllm`` (no prefix cache), ``vllm-apc`` (vLLM's prefix cache) and ``ragcache`` (vLLM's prefix
cache as the fast tier, ragsim's knowledge tree with PGDSF as its host tier, a KV connector),
each next to the simulator's prediction of the same run (``ragsim.validation.run_pair``: one
trace, configuration and profile for both sides). vLLM's KV memory is kept small (16 MiB:
8,192 tokens, a few prompts of the mmlu trace), so that its prefix cache evicts and a host tier
has something to give back.

    python benchmarks/vllm_systems.py profile \
        --out ragsim/profiles/data/cpu-vllm-mistral-7b-l2-h256.json
    python benchmarks/vllm_systems.py table --rates 4,8 --out vllm-systems/
    python benchmarks/vllm_systems.py table --rates 4,8 --scheduler prefill-first --out v0.3/

``profile`` measures the vLLM profile the simulation prices these runs with (the quick plan
reaching what the runs ask for: ``validate.run_needs``); ``table`` prints the markdown table of
docs/vllm.md and writes every run's records and summary under ``--out``; its simulations use
``--scheduler`` (default: the one ``ragsim validate --backend vllm`` simulates with,
``validate.VLLM_SCHEDULER``; the real runs are vLLM's whatever it says). The configurations
are the ones ``validate`` runs (``validate.backend_terms``: vLLM's block, no speculation or
reordering, KV shared within a batch). Run both in vLLM's own environment (``.venv-vllm``,
docs/vllm.md); on a shared 2-core machine each real run takes about a minute and a half.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from ragsim.serving.config import SCHEDULERS
from ragsim.validation import VLLM_SCHEDULER

SYSTEMS = ("vllm", "vllm-apc", "ragcache")
PROFILE = "cpu-vllm-mistral-7b-l2-h256"  # shipped (measured by `profile` below)
MiB = 2**20


def config_of(system: str, rate_rps: float, requests: int, gpu_mib: int, host_mib: int,
              profile: str, scheduler: str | None = None):
    """The run's configuration: the system's preset as vLLM on a CPU serves it, on the terms
    ``ragsim validate --backend vllm`` sets (``validate.backend_terms``: vLLM's block, FCFS,
    the final document list only, its prefix cache sharing blocks within a batch), simulated
    with ``scheduler`` (None: validate's default for vLLM)."""
    from ragsim.serving.config import build_config
    from ragsim.validation import backend_terms

    flags = {"trace": "mmlu", "system": system, "n_requests": requests, "arrival": "poisson",
             "rate_rps": rate_rps, "gpu_kv_bytes": gpu_mib * MiB, "profile": profile,
             "seed": 0, "scheduler": scheduler}
    if system == "ragcache":
        flags["host_cache_bytes"] = host_mib * MiB
    given = [name for name, value in flags.items() if value is not None]
    return backend_terms(build_config(flags), "vllm", device="cpu", given=given)[0]


def measure_profile(out: Path, requests: int, gpu_mib: int, threads: int = 1) -> None:
    from ragsim.profiles.models import resolve_model, scaled_down
    from ragsim.profiles.profiler import ProfilePlan
    from ragsim.realrun.vllm.engine import smallest_block_tokens
    from ragsim.realrun.vllm.profile import profile_vllm
    from ragsim.serving.pipeline import requests_to_run
    from ragsim.traces import resolve_trace
    from ragsim.validation import CPU_PROFILE_MAX_BATCH, run_needs

    spec = scaled_down(resolve_model("mistral-7b"), layers=2, hidden=256).with_dtype("fp32")
    # what the runs of 100 to `requests` requests ask for (the mmlu trace's sample, and so its
    # longest prompt, depends on the number of requests): no price by extrapolation
    needs: dict[str, int] = {}
    for n in sorted({100, 200, requests}):
        config = config_of("vllm", 1.0, n, gpu_mib, 1024, "cpu-mistral-7b-l2-h256")
        trace = requests_to_run(resolve_trace("mmlu", seed=0, n_requests=n), config)
        for key, value in run_needs(trace, config, spec.kv_bytes_per_token).items():
            needs[key] = max(needs.get(key, 0), value)
    needs["batch_size"] = min(max(needs["batch_size"], 16), CPU_PROFILE_MAX_BATCH)
    plan = ProfilePlan.quick().covering(**needs)
    # covering adds one row at the longest prefix; a row every 512 tokens past 2,048 keeps
    # the interpolation between measured prefixes short
    top = max(plan.cached_tokens)
    plan = replace(plan, cached_tokens=sorted({*plan.cached_tokens,
                                               *range(2560, top, 512)}))
    print(f"plan: {plan}", flush=True)
    made = profile_vllm(spec, name=out.stem, plan=plan, out=out,
                        block_tokens=smallest_block_tokens(on_cpu=True),
                        kv_cache_bytes=2**30, seed=0, threads=threads,
                        label="vLLM; scaled down from mistral-7b: 2 layers, hidden 256; "
                              "benchmarks/vllm_systems.py profile")
    v = made.obtained["validation"]
    print(f"wrote {out}: held-out prefill median {v['held_out_prefill_median_rel_error']:.1%} "
          f"max {v['held_out_prefill_max_rel_error']:.1%}; batches median "
          f"{v['held_out_batch_median_rel_error']:.1%} max {v['held_out_batch_max_rel_error']:.1%}")


def _row(system: str, rate: float, real, sim) -> dict:
    r, s = real.summary, sim.summary
    return {"system": system, "rate_rps": rate, "sim_scheduler": sim.config.scheduler,
            "real_ttft_mean_s": r["ttft_mean_s"], "real_ttft_p90_s": r["ttft_p90_s"],
            "sim_ttft_mean_s": s["ttft_mean_s"], "sim_ttft_p90_s": s["ttft_p90_s"],
            "real_hit_rate": r["token_hit_rate"], "real_hit_rate_host": r["token_hit_rate_host"],
            "sim_hit_rate": s["token_hit_rate"], "sim_hit_rate_host": s["token_hit_rate_host"],
            "tree_hit_rate": r.get("tree_token_hit_rate"),
            "real_throughput_rps": r["throughput_rps"], "sim_throughput_rps": s["throughput_rps"],
            "speed_before": r.get("speed_ratio_before"), "speed_after": r.get("speed_ratio_after"),
            "preemptions": r.get("vllm_counters", {}).get("num_preemptions")}


def table(rates: list[float], requests: int, gpu_mib: int, host_mib: int, profile_name: str,
          out: Path, scheduler: str | None = None) -> list[dict]:
    from ragsim.profiles.profile import load_profile
    from ragsim.serving.pipeline import requests_to_run
    from ragsim.traces import resolve_trace
    from ragsim.validation import run_pair

    scheduler = scheduler or VLLM_SCHEDULER
    profile = load_profile(profile_name)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in rates:
        for system in SYSTEMS:
            config = config_of(system, rate, requests, gpu_mib, host_mib, profile_name,
                               scheduler)
            trace = requests_to_run(resolve_trace("mmlu", seed=0, n_requests=requests), config)
            real, sim = run_pair(trace, config, profile, backend="vllm")
            rows.append(_row(system, rate, real, sim))
            folder = out / f"{system}-{rate:g}"
            folder.mkdir(exist_ok=True)
            for side, result in (("real", real), ("sim", sim)):
                result.records.to_parquet(folder / f"{side}.parquet", index=False)
                (folder / f"{side}.json").write_text(json.dumps(result.summary, indent=1,
                                                                default=str))
            print(json.dumps(rows[-1]), flush=True)
    (out / "table.json").write_text(json.dumps(rows, indent=1))
    print(f"simulated with --scheduler {scheduler}")
    print(markdown(rows))
    return rows


def markdown(rows: list[dict]) -> str:
    def ms(v: float) -> str:
        return f"{1e3 * v:,.0f}"

    lines = ["| rate (req/s) | system | real TTFT mean / p90 (ms) | sim TTFT mean / p90 (ms) | "
             "real token hit rate (host) | sim token hit rate (host) | speed (before→after) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = (f"x{r['speed_before']:.2f}→{r['speed_after']:.2f}"
                 if r["speed_before"] is not None else "")
        lines.append(
            f"| {r['rate_rps']:g} | {r['system']} | {ms(r['real_ttft_mean_s'])} / "
            f"{ms(r['real_ttft_p90_s'])} | {ms(r['sim_ttft_mean_s'])} / "
            f"{ms(r['sim_ttft_p90_s'])} | {r['real_hit_rate']:.3f} ({r['real_hit_rate_host']:.3f})"
            f" | {r['sim_hit_rate']:.3f} ({r['sim_hit_rate_host']:.3f}) | {speed} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="measure the vLLM profile the table is priced with")
    p.add_argument("--out", type=Path, default=Path(f"{PROFILE}.json"))
    p.add_argument("--threads", type=int, default=1,
                   help="the engine's CPU threads (the runs priced by the profile take them)")
    t = sub.add_parser("table", help="the three systems, real and simulated")
    t.add_argument("--rates", default="4,8", help="Poisson rates, requests/s, comma-separated")
    t.add_argument("--out", type=Path, default=Path("vllm-systems"))
    t.add_argument("--profile", default=PROFILE)
    t.add_argument("--host-mib", type=int, default=1024)
    t.add_argument("--scheduler", choices=SCHEDULERS, default=VLLM_SCHEDULER,
                   help="the simulations' iterations (default: validate's for --backend vllm, "
                   "%(default)s)")
    for q in (p, t):
        q.add_argument("--requests", type=int, default=300)
        q.add_argument("--gpu-mib", type=int, default=16)
    args = parser.parse_args()
    if args.command == "profile":
        measure_profile(args.out, args.requests, args.gpu_mib, args.threads)
    else:
        table([float(r) for r in args.rates.split(",")], args.requests, args.gpu_mib,
              args.host_mib, args.profile, args.out, args.scheduler)


if __name__ == "__main__":
    main()
