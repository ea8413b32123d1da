"""How fast ``ragsim run`` simulates, against Vidur on a comparable workload, measured in one run.

ragsim: the built-in ``mmlu`` trace (top-2 documents of ~700 tokens, ~80-token queries, ~32
output tokens), 10,000 requests, A10G + Mistral-7B derived profile, at a moderate and at a
saturating Poisson rate, for the ``ragcache`` system (knowledge tree in GPU + host, PGDSF,
reordering, speculation) and for ``vllm`` (no cache). Timed: the event loop (``elapsed_s``).

Vidur (give its interpreter with ``--vidur-python``): the same number of requests with the same
prompt/decode token counts (prefill = documents + query), Poisson arrivals at the same rates,
one replica of Llama-2-7B on an A100 (the shapes it has profiles for), vLLM scheduler, its
default random-forest execution-time predictor. Timed in its process: importing ``vidur.main``,
building its ``Simulator`` (which trains or loads the predictors), the ``Simulator.run`` event
loop, and the whole ``vidur.main`` run after import. The headline ratio is ragsim's event loop
against Vidur's (like for like); the ratio against Vidur's whole run after import is printed
too. Vidur models no KV reuse across requests, which ragsim does here.

Running Vidur offline. ``vidur`` 0.0.26 on the package index fetches its profiling data from a
model hub when it starts. Instead use a source checkout (github.com/microsoft/vidur) and
``--vidur-root`` (it becomes Vidur's working directory, whose ``./data/profiling`` it reads and
whose ``./cache`` keeps its trained predictors; metrics go to a temporary folder). If the
checkout lacks the large ``attention.csv`` profiles, write a stand-in for the one used here:

    git clone https://github.com/microsoft/vidur VIDUR_SRC    # or export a snapshot
    python -m venv VENV && VENV/bin/pip install -r VIDUR_SRC/requirements.txt \
        && VENV/bin/pip install -e VIDUR_SRC
    python benchmarks/vidur_standin_profile.py VIDUR_SRC       # a100, Llama-2-7b-hf
    python benchmarks/run_speed.py --vidur-python VENV/bin/python --vidur-root VIDUR_SRC

The stand-in's attention times come from a roofline formula, not a GPU: Vidur's code runs end to
end on it, and its wall time per simulated request does not depend on the values beyond how
requests batch, but the measured ratio is then "against Vidur with a stand-in attention table";
the report says which table was used (``vidur_attention_profile``). With ``--vidur-root``, one
short Vidur run first trains and caches the predictors (minutes to hours on 2 cores the first
time; reported as ``vidur_warmup``), so the timed runs load them from the cache. Without
``--vidur-python`` the script prints ragsim's numbers next to the Vidur figures recorded in
issue 4 on a 2-core machine (~450-570 requests/s at saturating load, ~70 at light load),
labelled as recorded, not measured.

    python benchmarks/run_speed.py [--requests 10000] [--vidur-python PATH [--vidur-root DIR]]

Target (issue 4): >= 10x Vidur's simulated requests per wall second. Wall-clock numbers are
noisy on shared machines: compare the ratios printed, measured in this one run.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from ragsim.traces import resolve_trace

RATES = {"moderate": 0.8, "saturating": 3.0}
# Vidur on a 2-core machine, 2,000-10,000 requests, as recorded in issue 4 (low end of each range)
RECORDED_VIDUR_RPS = {"moderate": 70.0, "saturating": 450.0}


def ragsim_speed(n: int, rate: float, system: str, repeats: int) -> dict:
    profile = load_profile("a10g-mistral-7b")
    trace = resolve_trace("mmlu", n_requests=n)
    best = None
    for _ in range(repeats):
        result = run_simulation(trace, build_config({"system": system, "rate_rps": rate}),
                                profile)
        if best is None or result.summary["elapsed_s"] < best["elapsed_s"]:
            best = result.summary
    return {"requests_per_wall_s": n / best["elapsed_s"],
            "sim_s_per_wall_s": best["simulated_s"] / best["elapsed_s"],
            "elapsed_s": best["elapsed_s"], "ttft_mean_s": best["ttft_mean_s"],
            "throughput_rps": best["throughput_rps"]}


VIDUR_SCRIPT = r"""
import sys, time, runpy
t0 = time.perf_counter()
import vidur.main  # noqa: F401  (import cost measured separately)
from vidur.simulator import Simulator
t1 = time.perf_counter()
spans = {}
def timed(name, method):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spans[name] = time.perf_counter() - start
    return wrapper
Simulator.__init__ = timed("setup", Simulator.__init__)
Simulator.run = timed("loop", Simulator.run)
sys.argv = ["vidur.main"] + sys.argv[1:]
runpy.run_module("vidur.main", run_name="__main__")
t2 = time.perf_counter()
print("RAGSIM_BENCH", t1 - t0, t2 - t1, spans["setup"], spans["loop"])
"""

ATTENTION_PROFILE = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"


def vidur_attention_profile(root: str | None) -> str:
    if root is None:
        return "as the vidur package provides it"
    path = Path(root) / ATTENTION_PROFILE
    if not path.exists():
        return f"missing ({ATTENTION_PROFILE})"
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    return ("stand-in from a formula (benchmarks/vidur_standin_profile.py), not measured"
            if "stand_in" in header else "measured (Vidur's profile)")


def vidur_speed(python: str, n: int, rate: float, prefill: int, decode: int,
                root: str | None = None) -> dict:
    """One ``vidur.main`` run; ``root``: the Vidur source folder to run in (its ./data and
    ./cache), else a fresh temporary folder (the package must find its data by itself)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "--replica_config_device", "a100",
            "--replica_config_model_name", "meta-llama/Llama-2-7b-hf",
            "--cluster_config_num_replicas", "1",
            "--replica_config_tensor_parallel_size", "1",
            "--replica_config_num_pipeline_stages", "1",
            "--request_generator_config_type", "synthetic",
            "--synthetic_request_generator_config_num_requests", str(n),
            "--length_generator_config_type", "fixed",
            "--fixed_request_length_generator_config_prefill_tokens", str(prefill),
            "--fixed_request_length_generator_config_decode_tokens", str(decode),
            "--interval_generator_config_type", "poisson",
            "--poisson_request_interval_generator_config_qps", str(rate),
            "--replica_scheduler_config_type", "vllm",
            "--vllm_scheduler_config_batch_size_cap", "256",
            "--metrics_config_output_dir", tmp,
            "--no-metrics_config_write_metrics",
            "--no-metrics_config_enable_chrome_trace",
        ]
        started = time.perf_counter()
        proc = subprocess.run([python, "-c", VIDUR_SCRIPT, *args], capture_output=True,
                              text=True, cwd=root or tmp)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"vidur failed:\n{proc.stderr[-3000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RAGSIM_BENCH")][-1]
    import_s, run_s, setup_s, loop_s = (float(x) for x in line.split()[1:])
    return {"requests_per_wall_s": n / loop_s, "loop_s": loop_s,
            "requests_per_wall_s_whole_run": n / run_s, "run_s": run_s, "setup_s": setup_s,
            "import_s": import_s, "process_wall_s": wall}


def vidur_warmup(python: str, root: str, prefill: int, decode: int) -> dict:
    """A short run in ``root`` that trains Vidur's predictors, or finds them in ./cache."""
    cache = Path(root) / "cache"
    cached_before = len(list(cache.glob("*.pkl"))) if cache.is_dir() else 0
    result = vidur_speed(python, 200, RATES["saturating"], prefill, decode, root)
    return {"cached_files_before": cached_before,
            "cached_files_after": len(list(cache.glob("*.pkl"))),
            "setup_s": result["setup_s"], "process_wall_s": result["process_wall_s"],
            "note": "setup_s includes training the predictors when the cache was cold"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vidur-python", default=None,
                        help="interpreter of an environment with the vidur package")
    parser.add_argument("--vidur-root", default=None,
                        help="Vidur source folder: its working directory (./data profiles, "
                             "./cache predictors); default: a temporary folder")
    parser.add_argument("--vidur-repeats", type=int, default=1,
                        help="Vidur runs per load; the fastest event loop is kept")
    args = parser.parse_args()
    if args.vidur_root and not args.vidur_python:
        parser.error("--vidur-root needs --vidur-python")
    trace = resolve_trace("mmlu", n_requests=args.requests)
    prefill = round(float(
        (trace.doc_tokens_flat.sum() + trace.query_tokens.sum()) / trace.n_requests))
    decode = round(float(trace.output_tokens.mean()))
    report: dict = {"requests": args.requests, "prefill_tokens_mean": prefill,
                    "decode_tokens_mean": decode, "rates_rps": RATES}
    if args.vidur_python:
        report["vidur_attention_profile"] = vidur_attention_profile(args.vidur_root)
        if args.vidur_root:
            report["vidur_warmup"] = vidur_warmup(args.vidur_python, args.vidur_root, prefill,
                                                  decode)
    for load, rate in RATES.items():
        for system in ("ragcache", "vllm"):
            report[f"ragsim_{system}_{load}"] = ragsim_speed(args.requests, rate, system,
                                                             args.repeats)
        if args.vidur_python:
            vidur = min((vidur_speed(args.vidur_python, args.requests, rate, prefill, decode,
                                     args.vidur_root) for _ in range(args.vidur_repeats)),
                        key=lambda v: v["loop_s"])
            report[f"vidur_{load}"] = vidur
            ours = report[f"ragsim_ragcache_{load}"]["requests_per_wall_s"]
            report[f"ratio_ragcache_vs_vidur_{load}"] = ours / vidur["requests_per_wall_s"]
            report[f"ratio_ragcache_vs_vidur_whole_run_{load}"] = (
                ours / vidur["requests_per_wall_s_whole_run"])
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    for load in RATES:
        r = report[f"ragsim_ragcache_{load}"]
        line = (f"{load:>10}: ragsim ragcache {r['requests_per_wall_s']:,.0f} req/s, "
                f"{r['sim_s_per_wall_s']:,.0f} sim-s/s")
        if f"vidur_{load}" in report:
            v = report[f"vidur_{load}"]
            line += (f"; Vidur {v['requests_per_wall_s']:,.0f} req/s event loop, "
                     f"{v['requests_per_wall_s_whole_run']:,.0f} whole run; ratio "
                     f"{report[f'ratio_ragcache_vs_vidur_{load}']:.1f}x, "
                     f"{report[f'ratio_ragcache_vs_vidur_whole_run_{load}']:.1f}x "
                     "(target >= 10x)")
        else:
            recorded = RECORDED_VIDUR_RPS[load]
            line += (f"; vs Vidur's recorded {recorded:,.0f} req/s (not measured here): "
                     f"{r['requests_per_wall_s'] / recorded:.1f}x (target >= 10x)")
        print(line, file=sys.stderr)
    if args.vidur_python:
        print(f"Vidur attention profile: {report['vidur_attention_profile']}", file=sys.stderr)


if __name__ == "__main__":
    main()
