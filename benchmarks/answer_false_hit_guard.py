"""Which semantic false-hit guard works: cosine alone, the entity check (ragsim's guard), or a
threshold learned per entry under an error bound (vCache's approach), on the held-out near-twin
set (tests/data/answer_near_twins*.jsonl), for similarity thresholds 0.80-0.98.

    python benchmarks/answer_false_hit_guard.py [--out curve.json]

The procedure is `ragsim answers golden --paraphrases`'s, on the tier logic itself
(``AnswerCache`` over the modelled store: exact KNN, the nearest entry only, as redisvl's
lookup): the distinct questions once (every hit is a false hit), then each paraphrase (a hit
with the rephrased question's answer is right, any other is false). The learned threshold
(``vcache``) serves a candidate only when that entry's own record says so: each entry keeps the
(similarity, right?) of the candidates it was checked against (a check is a miss: RAG answers
and the two answers are compared), and serves at similarity s when the candidates it saw at
>= s number n and were all right with (1 - delta)^n <= alpha, i.e. its error rate is below
delta with confidence 1 - alpha (delta 0.01, alpha 0.05: n >= 299). The per-entry record only
fills with traffic that repeats near one entry; this set asks each paraphrase once.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, ModelSharedStore
from ragsim.cache.answers.keys import normalize_query
from ragsim.traces.corpus.embedding import Embedder

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
DELTA, ALPHA = 0.01, 0.05


class LearnedThreshold:
    """vCache-style per-entry decisions: serve only what the entry's record bounds."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[float, bool]]] = {}
        self.needed = math.ceil(math.log(ALPHA) / math.log(1 - DELTA))

    def serve(self, key: str, similarity: float) -> bool:
        record = [right for s, right in self.seen.get(key, []) if s <= similarity]
        return len(record) >= self.needed and all(record)

    def observe(self, key: str, similarity: float, right: bool) -> None:
        self.seen.setdefault(key, []).append((similarity, right))


def run(questions, answers, paraphrases, vectors, para_vectors, similarity, guard):
    config = AnswerCacheConfig(distance_threshold=1 - similarity, ttl_jitter=0.0,
                               guard="none" if guard == "vcache" else guard)
    store = ModelSharedStore()
    cache = AnswerCache(config, store)
    learned = LearnedThreshold() if guard == "vcache" else None
    answer_of = {normalize_query(q): a for q, a in zip(questions, answers, strict=True)}

    def ask(text, vector, want):
        got = cache.lookup(text, 0.0, embedding=vector)
        if got.hit and learned is not None and got.tier == "semantic":
            sim = 1 - got.distance
            served = learned.serve(got.entry.key, sim)
            learned.observe(got.entry.key, sim,
                            answer_of[normalize_query(got.entry.query)] == want)
            if not served:  # checked, not served: RAG answers
                got = None
        if got is not None and got.hit:
            return "right" if got.entry.answer == want else "false"
        cache.write_back(text, want, 0.0, embedding=vector)
        return "miss"

    first = [ask(q, v, a) for q, v, a in zip(questions, vectors, answers, strict=True)]
    para = [ask(text, pv, answers[i]) for (text, i), pv in zip(paraphrases, para_vectors,
                                                               strict=True)]
    return {"similarity": similarity, "guard": guard,
            "first_pass_hit_rate": sum(r != "miss" for r in first) / len(first),
            "false_hit_rate": first.count("false") / len(first),
            "paraphrase_hit_rate": para.count("right") / len(para),
            "paraphrase_false_hit_rate": para.count("false") / len(para)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (DATA / "answer_near_twins.jsonl").open()]
    questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    index = {q: i for i, q in enumerate(questions)}
    paraphrases = [(p["question"], index[p["rephrases"]]) for p in
                   map(json.loads, (DATA / "answer_near_twins_paraphrases.jsonl").open())]
    embedder = Embedder()
    vectors = embedder.embed(questions)
    para_vectors = embedder.embed([text for text, _ in paraphrases])
    curve = [run(questions, answers, paraphrases, vectors, para_vectors, s, g)
             for s in (0.80, 0.85, 0.90, 0.95, 0.98)
             for g in ("none", "entities", "vcache")]
    print(f"{len(questions)} distinct questions, {len(paraphrases)} paraphrases")
    print("similarity guard     first-pass false hits  paraphrase hits  paraphrase false hits")
    for r in curve:
        print(f"{r['similarity']:.2f}       {r['guard']:9s} {r['false_hit_rate']:10.1%} "
              f"{r['paraphrase_hit_rate']:17.1%} {r['paraphrase_false_hit_rate']:15.1%}")
    if args.out:
        args.out.write_text(json.dumps(curve, indent=1) + "\n")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
