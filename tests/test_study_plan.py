"""`ragsim plan`: the configuration it picks meets the SLO when run by hand, everything cheaper
misses it, and the cost is the price table's arithmetic (worked here by hand)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragsim.cli import app

runner = CliRunner()
PRICES = """
gpu_usd_per_h = { a10g = 1.0, a100 = 4.0 }
host_usd_per_gib_h = 0.01
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    (tmp / "prices.toml").write_text(PRICES)
    result = runner.invoke(app, [
        "plan", "--trace", "mmlu", "--rate", "4", "--slo", "ttft_p90_s<=0.2", "--requests",
        "300", "--replicas", "1", "--replicas", "2", "--host-mem", "0", "--host-mem", "8GiB",
        "--prices", str(tmp / "prices.toml"), "--jobs", "1", "--json", "--out", str(tmp / "o"),
        "--plot", str(tmp / "margin.png")])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), tmp


def run_by_hand(profile: str, replicas: int, host_bytes: int) -> dict:
    """The candidate as a user runs it: the fleet's 4 req/s over its replicas, round-robin,
    300 requests per replica."""
    result = runner.invoke(app, ["run", "--json", "--trace", "mmlu", "--requests",
                                 str(300 * replicas), "--system", "ragcache", "--profile",
                                 profile, "--rate", "4", "--replicas", str(replicas),
                                 "--router", "round-robin", "--host-mem", str(host_bytes)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_plan_holds_when_run_by_hand(planned):
    plan, tmp = planned
    candidates, best = plan["candidates"], plan["best"]
    # the priced GPUs' profiles of the model x 2 host sizes x 2 replica counts
    assert {c["profile"] for c in candidates} == {"a10g-mistral-7b", "a100-mistral-7b"}
    assert len(candidates) == 2 * 2 * 2
    price = {"a10g": 1.0, "a100": 4.0}
    for c in candidates:
        host_gib = c["host_cache_bytes_per_replica"] / 2**30
        assert c["cost_usd_per_h"] == pytest.approx(c["replicas"] * (price[c["gpu"]]
                                                                     + 0.01 * host_gib))
        assert c["rate_rps_per_replica"] == pytest.approx(4 / c["replicas"])
    assert best is not None and best["ttft_p90_s"] <= 0.2
    by_hand = run_by_hand(best["profile"], best["replicas"],
                          best["host_cache_bytes_per_replica"])
    assert by_hand["ttft_p90_s"] == pytest.approx(best["ttft_p90_s"], rel=1e-12)
    cheaper = [c for c in candidates if c["cost_usd_per_h"] < best["cost_usd_per_h"]]
    assert cheaper, "a plan where the cheapest candidate wins tests nothing"
    assert all(c["ttft_p90_s"] > 0.2 for c in cheaper)
    cheapest = candidates[0]
    missed = run_by_hand(cheapest["profile"], cheapest["replicas"],
                         cheapest["host_cache_bytes_per_replica"])
    assert missed["ttft_p90_s"] > 0.2
    # the margin curve passes through the winner at the asked rate and is written
    at_rate = next(p for p in plan["margin_curve"] if p["rate_factor"] == 1.0)
    assert at_rate["ttft_p90_s"] == pytest.approx(best["ttft_p90_s"], rel=1e-12)
    assert (tmp / "margin.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp / "o" / "plan.json").read_text())["best"] == best


@pytest.mark.parametrize(("args", "message"), [
    (["--slo", "ttft_p90_s=0.5"], "field '--slo'"),
    (["--slo", "ttft_nope_s<=0.5", "--requests", "50", "--replicas", "1", "--host-mem", "0",
      "--model", "llama2-70b"], "field '--slo'"),
    (["--model", "gpt-9"], "field '--model'"),
    (["--rate", "0"], "field '--rate'"),
])
def test_bad_plans_exit_2(args, message):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_an_interrupted_plan_json_leaves_the_previous_one(tmp_path, monkeypatch):
    """plan.json is written whole or not at all: a write cut half-way (a full disk) keeps the
    previous plan, never half of a new one."""
    import pathlib

    from ragsim.api import plan

    (tmp_path / "prices.toml").write_text(PRICES)
    out = tmp_path / "o"
    out.mkdir()
    (out / "plan.json").write_text('{"previous": true}\n')
    real_write_text = pathlib.Path.write_text

    def cut(self, text, *args, **kwargs):
        if self.suffix == ".json" and "plan" in self.name:
            real_write_text(self, text[: len(text) // 2], *args, **kwargs)
            raise OSError(28, "No space left on device")
        return real_write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", cut)
    with pytest.raises(OSError):
        plan(trace="mmlu", rate=1.0, slo="ttft_p90_s<=5", requests=100, replicas=[1],
             host_mem=[0], prices=str(tmp_path / "prices.toml"), jobs=1, out_dir=out,
             force=True)
    assert json.loads((out / "plan.json").read_text()) == {"previous": True}
    assert [p.name for p in out.iterdir() if p.name.endswith(".json")] == ["plan.json"]


def test_each_router_named_is_a_candidate_of_every_fleet():
    """``router`` as a list: every fleet is tried behind each router (one replica once, as it
    has nothing to route), candidates carry their router, the cheapest meeting the SLO wins
    (at equal cost the larger margin) and its margin curve runs behind its own router."""
    import tempfile
    from pathlib import Path

    from ragsim.api import plan

    with tempfile.TemporaryDirectory() as tmp:
        prices = Path(tmp) / "prices.toml"
        prices.write_text('gpu_usd_per_h = { a10g = 1.0 }\nhost_usd_per_gib_h = 0.01\n')
        result = plan(trace="mmlu", rate=4.0, slo="ttft_p90_s<=5", requests=150,
                      replicas=[1, 2], host_mem=[0], prices=str(prices), jobs=1,
                      router=["round-robin", "kv-aware", "round-robin"])
    assert result["routers"] == ["round-robin", "kv-aware"]  # repeats tried once
    pairs = sorted((c["replicas"], c["router"]) for c in result["candidates"])
    assert pairs == [(1, "round-robin"), (2, "kv-aware"), (2, "round-robin")]
    fleets = [c for c in result["candidates"] if c["replicas"] == 2]
    assert len({c["ttft_p90_s"] for c in fleets}) == 2  # the routers' runs differ
    best = result["best"]
    assert best == result["candidates"][0] and best["replicas"] == 1  # cheapest meets
    # by hand: the kv-aware fleet as `run` simulates it equals its candidate
    by_hand = run_by_hand_router("a10g-mistral-7b", 2, "kv-aware")
    assert by_hand["ttft_p90_s"] == pytest.approx(
        next(c for c in fleets if c["router"] == "kv-aware")["ttft_p90_s"], rel=1e-12)


def run_by_hand_router(profile: str, replicas: int, router: str) -> dict:
    result = runner.invoke(app, ["run", "--json", "--trace", "mmlu", "--requests",
                                 str(150 * replicas), "--system", "ragcache", "--profile",
                                 profile, "--rate", "4", "--replicas", str(replicas),
                                 "--router", router, "--host-mem", "0"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
