"""The benchmark scripts the README quotes run, print every row and column they promise, and
print what another route computes for the same cell: ``ragsim run``/``ragsim replay`` through
the CLI with the settings the script documents, the helpers a script wraps called here, a
second implementation (the static bound), or a case worked by hand. Tiny sizes; which policy
wins at full size is checked by test_sim_paper_results.py and friends."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.traces import resolve_trace
from ragsim.traces.synthetic import BUILTIN_DRIFT_PER_1K_REQUESTS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
POLICIES = ("pgdsf", "gdsf", "lru", "lfu")
GiB = 2**30
runner = CliRunner()


def run_script(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / name), *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def cli_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows_of(out: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown table row whose first cell is ``first_cell``."""
    return [line.strip().strip("| ").split(" | ") for line in out.splitlines()
            if line.startswith(f"| {first_cell} |")]


def number(cell: str) -> float:
    return float(cell.strip().removesuffix("%").removesuffix("x").replace(",", ""))


def ratio_fits(ratio: str, numerator: str, denominator: str, decimals: int = 2) -> bool:
    """Whether a printed ratio can be the ratio of the true values behind two percentages
    printed to 0.1 point: each is within 0.05 points of what it shows, the ratio within half
    its last digit of what it shows."""
    a, b, r = number(numerator), number(denominator), number(ratio)
    half = 0.5 * 10**-decimals + 1e-12
    return (a - 0.05) / (b + 0.05) - half <= r <= (a + 0.05) / (b - 0.05) + half


def fixed_contents_bound(trace, capacity_tokens: float) -> float:
    """The static frequency bound (``ragsim.cache.bounds``) by a second route: a node is a
    prefix of a request's list, kept as a tuple; keeping a node of ``s`` tokens retrieved ``f``
    times saves ``(f - 1) * s`` tokens, so the fractional knapsack fills the room with the
    most retrieved nodes first (order within equal counts does not change the value)."""
    count: Counter[tuple[int, ...]] = Counter()
    size: dict[tuple[int, ...], int] = {}
    for r in range(trace.n_requests):
        docs = trace.docs_of(r).tolist()
        start = int(trace.doc_offsets[r])
        for depth in range(len(docs)):
            node = tuple(docs[:depth + 1])
            count[node] += 1
            size[node] = int(trace.doc_tokens_flat[start + depth])
    room, saved = capacity_tokens, 0.0
    for node in sorted((n for n in count if count[n] > 1), key=lambda n: -count[n]):
        taken = min(size[node], room)
        saved += (count[node] - 1) * taken
        room -= taken
        if room <= 0:
            break
    return saved / int(trace.doc_tokens_flat.sum())


def test_paper_comparison_policy_table_is_what_ragsim_run_gives_for_each_cell():
    out = run_script("paper_comparison.py", "--policies-only", "--requests", "400",
                     "--drift", "0.3")
    assert "mmlu, drift_per_1k_requests 0.3, co_retrieval_p 0.9, 400 requests" in out
    assert ("| host memory | pgdsf | gdsf | lru | lfu | pgdsf / gdsf (paper 1.02-1.32x) "
            "| pgdsf / lru (paper 1.06-1.62x) | pgdsf / lfu (paper 1.06-1.75x) |") in out
    rows = {r[0]: r[1:] for r in (line.strip().strip("| ").split(" | ")
                                  for line in out.splitlines() if " GiB |" in line)}
    assert list(rows) == ["8 GiB", "32 GiB", "128 GiB"]

    def run_cell(policy: str, host: str) -> float:
        # the settings the script documents: ragcache without speculation, Poisson 0.8 req/s
        return cli_json("run", "--trace", "mmlu", "--requests", "400", "--drift", "0.3",
                        "--seed", "0", "--rate", "0.8", "--no-speculate", "--policy", policy,
                        "--host-mem", host)["token_hit_rate"]

    at_8 = {policy: run_cell(policy, "8GiB") for policy in POLICIES}
    assert rows["8 GiB"][:4] == [f"{at_8[p]:.1%}" for p in POLICIES]
    assert rows["8 GiB"][4:] == [f"{at_8['pgdsf'] / at_8[p]:.2f}x" for p in POLICIES[1:]]
    assert rows["32 GiB"][2] == f"{run_cell('lru', '32GiB'):.1%}"
    assert rows["128 GiB"][3] == f"{run_cell('lfu', '128GiB'):.1%}"
    for cells in rows.values():
        assert len(cells) == 7
        for ratio, baseline in zip(cells[4:], cells[1:4], strict=True):
            assert ratio_fits(ratio, cells[0], baseline), cells


def test_policy_seeds_rows_match_ragsim_run_and_a_second_bound_and_the_ranges_the_rows():
    # 1,000 requests and 1 GiB of host memory: the room (GPU KV space and host memory) limits
    # the bound (seed 1: 20.4%; 25.5% with room for every repeated node, 10.8% with the host
    # memory alone)
    out = run_script("policy_seeds.py", "--synthetic", "nq", "--seeds", "2", "--requests",
                     "1000", "--host-gib", "1")
    label = f"nq (drift {BUILTIN_DRIFT_PER_1K_REQUESTS:g})"  # the built-in default
    per_seed = rows_of(out, label)
    assert [(r[1], r[2]) for r in per_seed] == [("0", "1 GiB"), ("1", "1 GiB")]
    # seed 1 by other routes: each policy through `ragsim run` with the script's settings
    # (ragcache without speculation, Poisson 0.8 req/s), the bound by fixed_contents_bound with
    # all of the GPU's KV space and the host memory
    hit = {p: cli_json("run", "--trace", "nq", "--requests", "1000", "--seed", "1", "--rate",
                       "0.8", "--no-speculate", "--policy", p, "--host-mem", "1GiB"
                       )["token_hit_rate"] for p in POLICIES}
    profile = load_profile("a10g-mistral-7b")
    capacity_tokens = (profile.kv_capacity_bytes + 1 * GiB) / profile.model.kv_bytes_per_token
    bound = fixed_contents_bound(resolve_trace("nq", seed=1, n_requests=1000), capacity_tokens)
    assert per_seed[1][3:] == [
        f"{hit['pgdsf'] / hit['gdsf']:.3f}", f"{hit['pgdsf'] / hit['lru']:.3f}",
        f"{hit['pgdsf'] / hit['lfu']:.3f}", f"{bound:.1%}", f"{hit['pgdsf'] / bound:.3f}",
        f"{hit['lfu'] / bound:.3f}"]
    # the range row: each column's smallest and largest over the seeds (printed to 0.001
    # there, to 0.01 here)
    ranges = rows_of(out, "1 GiB")
    assert len(ranges) == 1 and len(ranges[0]) == 6
    columns = [[number(r[i]) for r in per_seed] for i in (3, 4, 5, 7, 8)]
    for cell, values in zip(ranges[0][1:], columns, strict=True):
        low, high = (float(v) for v in cell.removesuffix("x").split("-"))
        assert abs(low - min(values)) <= 0.0055 and abs(high - max(values)) <= 0.0055, (
            cell, values)


@pytest.mark.slow  # ~25 s: the benchmark over a whole trace (CI runs it: pytest -m slow)
def test_vllm_prefix_cache_rows_are_the_helpers_it_wraps_and_agree_with_room_for_all():
    out = run_script("vllm_prefix_cache.py", "--requests", "60", "--blocks", "400", "100000")
    assert "| KV tokens | ragsim / vLLM hit tokens | requests with the same prefix |" in out
    rows = [line.strip().strip("| ").split(" | ") for line in out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    assert [r[0] for r in rows] == ["6,400", "1,600,000"]  # 16-token blocks
    # under eviction: the differential test's helpers, called here on the same 60 requests
    from test_vllm_prefix_cache import ragsim_hits, vllm_hits

    trace = resolve_trace("mmlu", n_requests=60)
    ours, theirs = ragsim_hits(trace, 400, 37), vllm_hits(trace, 400, 37)
    assert rows[0][1:] == [f"{ours.sum() / theirs.sum():.3f}x", f"{(ours == theirs).mean():.1%}"]
    assert rows[0] != ["6,400", "1.000x", "100.0%"]  # eviction makes them differ here
    # with room for everything the two agree request by request (tests/test_vllm_prefix_cache)
    assert rows[1][1:] == ["1.000x", "100.0%"]


def test_policy_regimes_cells_are_what_ragsim_replay_gives():
    # drift 1 at 32 GiB: GDSF, not LFU, is the best baseline there, so the two ratios differ
    out = run_script("policy_regimes.py", "--traces", "nq", "--requests", "1500", "--drifts",
                     "0", "1", "--host-gib", "8", "32", "--workers", "1")
    assert ("| trace | requests | drift | host | pgdsf | gdsf | lru | lfu | best baseline "
            "| pgdsf / best baseline | pgdsf / lfu |") in out
    rows = rows_of(out, "nq")
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("1,500", "0", "8 GiB"), ("1,500", "0", "32 GiB"),
        ("1,500", "1", "8 GiB"), ("1,500", "1", "32 GiB")]

    def replay(policy: str, drift: str, host: str) -> float:
        # the script's setting: replay, GPU 4 GiB (replay's default), seed 0
        return cli_json("replay", "--trace", "nq", "--requests", "1500", "--drift", drift,
                        "--host-mem", host, "--seed", "0", "--policy", policy
                        )["token_hit_rate"]

    rate = {p: replay(p, "1", "32GiB") for p in POLICIES}
    best = max(POLICIES[1:], key=rate.__getitem__)
    assert rows[3][4:] == [*(f"{rate[p]:.1%}" for p in POLICIES), best,
                           f"{rate['pgdsf'] / rate[best]:.2f}x",
                           f"{rate['pgdsf'] / rate['lfu']:.2f}x"]
    assert rows[0][4] == f"{replay('pgdsf', '0', '8GiB'):.1%}"
    assert rows[0][7] == f"{replay('lfu', '0', '8GiB'):.1%}"
    for r in rows:
        printed = dict(zip(POLICIES, r[4:8], strict=True))
        assert r[8] in ("gdsf", "lru", "lfu")
        assert number(printed[r[8]]) == max(number(printed[p]) for p in POLICIES[1:]), r
        assert ratio_fits(r[9], printed["pgdsf"], printed[r[8]]), r
        assert ratio_fits(r[10], printed["pgdsf"], printed["lfu"]), r


def test_sim_fingerprint_tells_equal_runs_from_changed_ones(tmp_path):
    # two runs of the same code fingerprint the same; a changed column is named
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    run_script("sim_fingerprint.py", "write", str(first), "--requests", "20")
    run_script("sim_fingerprint.py", "write", str(second), "--requests", "20")
    assert run_script("sim_fingerprint.py", "compare", str(first), str(second)).endswith(
        "0 of 51 configurations differ\n")
    data = json.loads(second.read_text())
    key = next(iter(data))
    data[key]["hash"]["ttft_s"] = "changed"
    second.write_text(json.dumps(data))
    result = subprocess.run([sys.executable, str(BENCHMARKS / "sim_fingerprint.py"), "compare",
                             str(first), str(second)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "columns: ['ttft_s']" in result.stdout
    assert result.stdout.endswith("1 of 51 configurations differ\n")


def test_fleet_scale_prints_each_fleet_size_with_the_simulated_time_ragsim_run_gives():
    out = run_script("fleet_scale.py", "--requests", "200", "--replicas", "1,2")
    lines = out.splitlines()
    assert lines[0] == "mmlu, 200 requests, 2 req/s per replica, router round-robin"
    assert lines[1].split() == ["replicas", "CPU", "s", "wall", "s", "req/CPU-s", "simulated",
                                "s", "16", "x", "1M", "would", "take"]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "2"] and all(r[-1] == "min" for r in rows)
    for r in rows:
        n = int(r[0])
        # the script's settings through the CLI: the same load per replica, 32 GiB host each
        simulated = cli_json("run", "--trace", "mmlu", "--requests", "200", "--rate", str(2 * n),
                             "--replicas", str(n), "--router", "round-robin", "--host-mem",
                             "32GiB")["simulated_s"]
        assert r[4] == f"{simulated:,.0f}", (r, simulated)
        # minutes for a million requests at the printed speed (that printed to the request per
        # CPU-second, so within half a request of the true one)
        speed = number(r[3])
        assert abs(float(r[5]) - 1e6 / speed / 60) <= 0.05 + 1e6 * 0.5 / speed**2 / 60, r


def test_fleet_table_prints_every_router_and_its_cells_are_what_ragsim_run_gives():
    out = run_script("fleet_table.py", "--traces", "mmlu", "--replicas", "2",
                     "--requests-per-replica", "20")
    lines = out.splitlines()
    assert lines[0] == ("total memory 64.00 GiB GPU + 256.00 GiB host, split evenly; "
                        "20 requests per replica")
    assert lines[1].split() == ["trace", "N", "req/s", "router", "hit", "rate", "TTFT", "mean",
                                "p90", "imbalance", "GPU", "busy"]
    rows = {line[20:42].strip(): line[:20].split() + line[42:].split() for line in lines[2:]}
    assert list(rows) == ["round-robin", "random", "session", "least-loaded",
                          "prefix-affinity", "kv-aware", "kv-aware, 1 s late"]
    assert all(r[:3] == ["mmlu", "2", "3.0"] and len(r) == 8 for r in rows.values())
    # kv-aware by the CLI: the fleet's rate, half the totals per replica, seed 0
    s = cli_json("run", "--trace", "mmlu", "--requests", "40", "--rate", "3", "--replicas", "2",
                 "--router", "kv-aware", "--gpu-mem", "32GiB", "--host-mem", "128GiB")
    assert rows["kv-aware"][3:] == [f"{s['token_hit_rate']:.1%}", f"{s['ttft_mean_s']:.3f}s",
                                    f"{s['ttft_p90_s']:.3f}s", f"{s['load_imbalance']:.2f}",
                                    f"{s['gpu_busy_imbalance']:.2f}"]


def test_router_table_prints_every_timing_free_router_as_ragsim_replay_gives_it():
    out = run_script("router_table.py", "--traces", "mmlu", "--replicas", "2", "--requests",
                     "200")
    lines = out.splitlines()
    assert lines[0] == "total memory 16.00 GiB GPU + 64.00 GiB host, split evenly"
    rows = {line[20:37].strip(): line.split() for line in lines[2:]}
    assert list(rows) == ["(one server)", "round-robin", "random", "session",
                          "prefix-affinity"]

    def replay(*args: str) -> dict:
        return cli_json("replay", "--trace", "mmlu", "--requests", "200", "--seed", "0", *args)

    one = replay("--gpu-mem", "16GiB", "--host-mem", "64GiB")
    assert rows["(one server)"] == ["mmlu", "1", "(one", "server)",
                                    f"{one['token_hit_rate']:.1%}", "-"]
    s = replay("--replicas", "2", "--router", "prefix-affinity", "--gpu-mem", "8GiB",
               "--host-mem", "32GiB")
    assert rows["prefix-affinity"] == ["mmlu", "2", "prefix-affinity",
                                       f"{s['token_hit_rate']:.1%}", f"{s['load_imbalance']:.2f}"]
    assert rows["round-robin"][-1] == "1.00"  # 200 requests over 2 replicas, in turn


def test_reuse_table_prints_each_load_memory_and_rule_with_throughput_paired_by_seed():
    out = run_script("reuse_table.py", "--traces", "wiki-trivia", "--requests", "40",
                     "--seeds", "2")
    assert ("| trace | load | offered req/s | memory | reuse | hit (gpu+host) | pos-free | recomp "
            "| TTFT mean [95% CI] ms | TTFT p90 ms | TTFT / prefix | throughput [95% CI] req/s "
            "| throughput / prefix |") in out
    rows = rows_of(out, "wiki-trivia")
    assert [tuple(r[1:5]) for r in rows] == [
        (load, rate, memory, rule) for load, rate in (("moderate", "2"), ("saturation", "48"))
        for memory in ("gpu", "gpu+host") for rule in ("prefix", "blend:0.15", "epic:32")]
    assert all(len(r) == 13 for r in rows)
    assert all(r[10] == r[12] == "1.000 [1.000, 1.000]" for r in rows if r[4] == "prefix")

    # saturation, GPU only, epic:32 by the CLI over the same two seeds: throughput with its
    # interval, and over prefix's on the same seed
    def by_cli(reuse: str) -> dict:
        return cli_json("run", "--trace", "wiki-trivia", "--requests", "40", "--rate", "48",
                        "--gpu-mem", "3GiB", "--host-mem", "0GiB", "--seed", "0", "--seeds",
                        "2", "--reuse", reuse)

    epic, prefix = by_cli("epic:32"), by_cli("prefix")
    low, high = epic["ci95"]["throughput_rps"]
    row = rows[8]
    assert row[11] == f"{epic['mean']['throughput_rps']:.2f} [{low:.2f}, {high:.2f}]"
    ratios = [a / b for a, b in zip(epic["by_seed"]["throughput_rps"],
                                    prefix["by_seed"]["throughput_rps"], strict=True)]
    assert row[12] == (f"{sum(ratios) / len(ratios):.3f} [{min(ratios):.3f}, "
                       f"{max(ratios):.3f}]")
    assert row[12] != "1.000 [1.000, 1.000]"  # at saturation the rules' throughputs differ


def test_decode_paths_prints_each_shape_and_ratios_of_its_own_columns():
    """benchmarks/decode_paths.py (the GPU session's first stage) on a tiny model: a row per
    shape, each ratio the quotient of the columns it names (to the printed rounding); no
    timing is judged."""
    out = run_script("decode_paths.py", "--layers", "1", "--hidden", "128", "--steps", "2")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and
            line.split()[0].isdigit()]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 512), (1, 2048), (4, 512),
                                                      (8, 1024), (16, 512), (16, 2048)]
    for r in rows:
        profiler, engine, ragged, at_mean = (float(x) for x in r[2:6])
        for shown, a, b in ((r[6], engine, profiler), (r[7], ragged, profiler),
                            (r[8], ragged, at_mean)):
            # each time is printed to 0.01 ms: the ratio of the true times lies within that
            low, high = (a - 0.005) / (b + 0.005), (a + 0.005) / (b - 0.005)
            assert low - 0.005 <= float(shown) <= high + 0.005, (r, shown)
