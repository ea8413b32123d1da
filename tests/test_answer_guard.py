"""The semantic tier's false-hit guard: a hit must also name the same entities as the question
asked. Hand-worked token cases, the tier logic on the modelled store, and `answers golden
--paraphrases` on the real server over a held-out set of distinct near-twin questions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, ModelSharedStore
from ragsim.cache.answers.guard import entities, same_entities
from ragsim.cli import app
from tests import answer_server

answer_redis = answer_server.answer_redis  # the real server's fixtures
answer_url = answer_server.answer_url

DATA = Path(__file__).parent / "data"
QUESTIONS = DATA / "answer_near_twins.jsonl"
PARAPHRASES = DATA / "answer_near_twins_paraphrases.jsonl"


@pytest.mark.parametrize(("query", "expected"), [
    ("What does os.execlpe do in Python?", {"os.execlpe", "python"}),
    ("Explain what os.execlpe does.", {"os.execlpe"}),
    ("What's math.log1p for, in Python?", {"math.log1p", "python"}),
    ("Quick question: Who wrote Hamlet?", {"hamlet"}),
    ("Natalia sold clips to 48 of her friends in April", {"natalia", "48", "april"}),
    ("what does max_workers mean", {"max_workers"}),
    ("Is C++ or C# faster?", {"c++", "c#"}),
    ("what is the boiling point of water", set()),
])
def test_entities_by_hand(query, expected):
    assert entities(query) == expected


@pytest.mark.parametrize(("asked", "stored", "same"), [
    ("What does os.execle do in Python?", "What does os.execlpe do in Python?", False),
    ("What does math.log2 do in Python?", "What does math.log10 do in Python?", False),
    ("What is 17 + 25?", "What is 17 + 26?", False),
    ("What is the capital of France?", "What is the capital of Spain?", False),
    ("Explain what os.execlpe does.", "What does os.execlpe do in Python?", True),  # context
    ("Please answer: Who wrote Hamlet?", "who wrote hamlet", True),
    ("what is the boiling point of water", "what is the freezing point of water", True),  # blind
])
def test_same_entities_by_hand(asked, stored, same):
    assert same_entities(asked, stored) is same
    assert same_entities(stored, asked) is same  # symmetric


def test_a_refused_candidate_is_a_miss_and_counted():
    vec = np.ones(8, dtype=np.float32)
    for guard, tier in (("entities", "miss"), ("none", "semantic")):
        cache = AnswerCache(AnswerCacheConfig(guard=guard), ModelSharedStore())
        cache.write_back("What does os.execle do in Python?", "execle's answer", 0.0,
                         embedding=vec)
        got = cache.lookup("What does os.execlpe do in Python?", 1.0, embedding=vec)
        assert got.tier == tier
        assert cache.counters.guard_rejections == (tier == "miss")
        # the same vector for a paraphrase of the stored question is served
        assert cache.lookup("Explain what os.execle does.", 1.0, embedding=vec).hit


def test_a_hit_from_another_question_is_false_though_its_answer_is_equal():
    """Two distinct questions with one answer (GSM8K's 100 questions have 72 answers): the
    second's semantic hit on the first's entry serves the right text for the wrong question,
    a false hit; a declared paraphrase of the first served from it is not one."""
    from ragsim.realrun.answers.golden import Golden, _golden_passes
    from ragsim.realrun.answers.stores import VectorIndex

    golden = Golden(["What is 3 + 4?", "What is 5 + 2?"], ["7", "7"],
                    paraphrases=[("Tell me 3 + 4.", 0)])
    result = _golden_passes(golden, ModelSharedStore(), lambda text: np.ones(8, np.float32),
                            config=AnswerCacheConfig(guard="none"), index=VectorIndex(),
                            cold_l1=False, progress=None)
    assert result["first_pass_hit_rate"] == 0.5  # the second question, from the first's entry
    assert result["first_pass_false_hits"] == 1 and result["false_hit_rate"] == 0.5
    assert result["second_pass_false_hits"] == 1  # L1 holds the first's entry for it
    assert result["paraphrase_hit_rate"] == 1.0 and result["paraphrase_false_hit_rate"] == 0.0


def test_an_unknown_guard_is_refused():
    with pytest.raises(ValueError, match="guard"):
        AnswerCacheConfig(guard="cosine")
    res = CliRunner().invoke(app, ["answers", "golden", "--questions", str(QUESTIONS),
                                   "--guard", "cosine"])
    assert res.exit_code == 2 and "--guard" in res.output


def subset(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """The first ``n`` questions (os.*: the densest family of twins) and their paraphrases."""
    rows = QUESTIONS.read_text().splitlines()[:n]
    kept = {json.loads(r)["question"] for r in rows}
    para = [p for p in PARAPHRASES.read_text().splitlines() if json.loads(p)["rephrases"] in kept]
    q, p = tmp_path / "q.jsonl", tmp_path / "p.jsonl"
    q.write_text("\n".join(rows) + "\n")
    p.write_text("\n".join(para) + "\n")
    return q, p


def golden(url: str, questions: Path, paraphrases: Path, guard: str) -> dict:
    res = CliRunner().invoke(app, ["answers", "golden", "--questions", str(questions),
                                   "--paraphrases", str(paraphrases), "--guard", guard,
                                   "--redis-url", url, "--algorithm", "flat", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_near_twins_no_false_hits_while_paraphrases_hit(answer_url, tmp_path):
    """The issue's acceptance: on distinct near-twin questions, first-pass false hits <= 1%
    while paraphrases still hit; cosine alone (the same run without the guard) serves other
    functions' answers."""
    questions, paraphrases = subset(tmp_path, 120)
    plain = golden(answer_url, questions, paraphrases, "none")
    assert plain["first_pass_false_hits"] > 0  # the failure the guard is for is in this set
    assert plain["second_pass_false_hits"] > 0  # served again: pass 1 vs 2 cannot see it
    guarded = golden(answer_url, questions, paraphrases, "entities")
    assert guarded["false_hit_rate"] <= 0.01
    assert guarded["second_pass_hit_rate"] == 1.0 and guarded["second_pass_false_hits"] == 0
    assert guarded["answers_identical"] is True
    assert guarded["paraphrases"] == 60
    assert guarded["paraphrase_hit_rate"] >= 0.6
    assert guarded["paraphrase_false_hit_rate"] <= 0.01
    assert guarded["guard_rejections"] > 0
    for key in ("first_pass_hit_rate", "second_pass_hit_rate", "answers_identical",
                "paraphrase_hit_rate", "false_hit_rate"):
        assert key in guarded


def test_a_paraphrase_of_no_question_is_refused_naming_row_and_field(tmp_path):
    questions, _ = subset(tmp_path, 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Explain os.WCOREDUMP.", '
                   '"rephrases": "what does os.WCOREDUMP do in python"}\n'
                   '{"question": "x", "rephrases": "not a question of the set"}\n')
    res = CliRunner().invoke(app, ["answers", "golden", "--questions", str(questions),
                                   "--paraphrases", str(bad)])
    assert res.exit_code == 2
    assert "rephrases" in res.output and "bad.jsonl" in res.output and "2" in res.output
