"""The answer cache's latency profile: the simulator charges each request the tiers it asked,
read from the profile (the semantic tier's at the index's size, interpolated in log(size));
bad profile files are refused naming file and field; ``ragsim profile --answer-cache`` measures
one on the real embedded server that the simulator then reads.

Expected delays are worked out by hand from a profile written here, never read from the code.
"""

from __future__ import annotations

import copy
import json
import math
from importlib import resources

import pytest
from typer.testing import CliRunner

from ragsim.cli import app
from ragsim.profiles.profile import load_profile
from ragsim.serving.config import build_config
from ragsim.sim.simulator import run_simulation
from tests.test_answer_sim import small_trace

HAND = {
    "format": "ragsim.answer-profile", "version": 1, "name": "by hand",
    "embed_s": 0.004,
    "l1": {"lookup_s": 1e-5, "write_s": 1e-5},
    "l2": {"lookup_s": 2e-4, "write_s": 3e-4},
    "semantic": {"entries": [1, 100], "lookup_s": [1e-3, 3e-3], "write_s": [1e-3, 2e-3]},
}


@pytest.fixture
def hand_profile(tmp_path):
    path = tmp_path / "answer-profile.json"
    path.write_text(json.dumps(HAND))
    return str(path)


def simulate(texts, profile_path, **settings):
    config = build_config({"trace": "mmlu", "answer_cache": True, "arrival": "sequential",
                           "answer_profile": profile_path, **settings})
    return run_simulation(small_trace(texts), config, load_profile("a10g-mistral-7b"))


def test_exact_tiers_pay_the_tiers_they_asked(hand_profile):
    result = simulate(["a", "b", "c", "a", "a"], hand_profile, answer_semantic=False,
                      instances=2)
    # round robin: request 3 reaches instance 1, which never saw "a" (L2 serves it and
    # backfills its L1); request 4 reaches instance 0, whose L1 holds "a"
    assert result.columns["answer_tier"].tolist() == ["miss", "miss", "miss", "l2", "l1"]
    ttft = result.columns["ttft_s"]
    assert ttft[3] == pytest.approx(1e-5 + 2e-4, rel=1e-9)  # L1's lookup, then L2's
    assert ttft[4] == pytest.approx(1e-5, rel=1e-9)
    assert result.summary["answer_cache_latency"]["source"] == hand_profile


def test_semantic_tier_pays_embedding_and_lookup_at_the_index_size(hand_profile):
    distinct = ["What is the capital of France?", "How many legs does a spider have?",
                "Who wrote Hamlet?", "What is the boiling point of water?",
                "How far is the Moon?", "What colour is the sky?", "Who painted the Mona Lisa?",
                "What is the largest ocean?", "How many days are in a leap year?",
                "What is the chemical symbol for gold?"]
    texts = [*distinct, "Quick question: What is the capital of France?"]
    result = simulate(texts, hand_profile, answer_semantic=True)
    assert result.columns["answer_tier"].tolist() == ["miss"] * 10 + ["semantic"]
    # 10 vectors in the index: log-interpolated between 1 (1 ms) and 100 (3 ms) -> 2 ms
    at_10 = 1e-3 + (3e-3 - 1e-3) * math.log(10) / math.log(100)
    assert at_10 == pytest.approx(2e-3)
    expected = 1e-5 + 2e-4 + 0.004 + at_10
    assert result.columns["ttft_s"][10] == pytest.approx(expected, rel=1e-9)


def test_semantic_lookup_held_flat_past_the_measured_sizes(hand_profile):
    from ragsim.serving.answer_latency import load_answer_latency

    lat = load_answer_latency(hand_profile)
    assert lat.semantic_lookup_at(0) == 1e-3 and lat.semantic_lookup_at(10**6) == 3e-3
    assert lat.semantic_lookup_at(100) == pytest.approx(3e-3)


def test_shipped_default_is_used_without_a_file():
    shipped = json.loads((resources.files("ragsim.serving") / "data" / "answer-profile.json")
                         .read_text())
    result = simulate(["a", "a"], "default", answer_semantic=False)
    assert result.columns["ttft_s"][1] == pytest.approx(shipped["l1"]["lookup_s"], rel=1e-9)
    assert result.summary["answer_cache_latency"]["name"] == shipped["name"]


def _broken(**change):
    data = copy.deepcopy(HAND)
    for dotted, value in change.items():
        *parents, last = dotted.split("__")
        node = data
        for p in parents:
            node = node[p]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return data


@pytest.mark.parametrize(("data", "field"), [
    (_broken(format="ragsim.profile"), "format"),
    (_broken(version=2), "version"),
    (_broken(l1__lookup_s=-1), "l1.lookup_s"),
    (_broken(l2__write_s="fast"), "l2.write_s"),
    (_broken(embed_s=...), "embed_s"),
    (_broken(semantic__entries=[100, 10]), "semantic.entries"),
    (_broken(semantic__lookup_s=[1e-3]), "semantic.lookup_s"),
    (_broken(semantic__write_s=[1e-3, None]), "semantic.write_s[1]"),
    (_broken(l2=[]), "l2"),
])
def test_bad_profile_file_exit_2_naming_file_and_field(tmp_path, data, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    res = CliRunner().invoke(app, ["run", "--trace", "mmlu", "--requests", "5", "--answer-cache",
                                   "--answer-profile", str(path), "--json"])
    assert res.exit_code == 2, res.output
    assert str(path) in res.output and f"field '{field}" in res.output, res.output


@pytest.mark.parametrize("text", [None, "{not json"])
def test_missing_or_unparsable_profile_file(tmp_path, text):
    path = tmp_path / "p.json"
    if text is not None:
        path.write_text(text)
    res = CliRunner().invoke(app, ["run", "--trace", "mmlu", "--requests", "5", "--answer-cache",
                                   "--answer-profile", str(path)])
    assert res.exit_code == 2
    assert str(path) in res.output


def test_profile_answer_cache_measures_the_real_tiers(tmp_path):
    out = tmp_path / "measured.json"
    res = CliRunner().invoke(app, ["profile", "--answer-cache", "--answer-entries", "50",
                                   "--answer-entries", "300", "--answer-samples", "20",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["format"] == "ragsim.answer-profile" and data["version"] == 1
    assert data["semantic"]["entries"] == [50, 300]
    assert data["semantic"]["recall"] == [1.0, 1.0]  # small HNSW with EPSILON 0.1: exact
    # ratios within one run: an in-process dict lookup is far below a network round trip,
    # which is below a vector query plus its embedding
    assert data["l1"]["lookup_s"] * 5 < data["l2"]["lookup_s"]
    assert data["l2"]["lookup_s"] < data["semantic"]["lookup_s"][0] + data["embed_s"]
    # and the simulator reads it
    result = simulate(["a", "a"], str(out), answer_semantic=False)
    assert result.columns["ttft_s"][1] == pytest.approx(data["l1"]["lookup_s"], rel=1e-9)
