"""Threshold sweep of the semantic tier: hit rate against false-hit rate, similarity 0.80-0.98.

Workload: Red-Trivia's questions (read from the installed package, not shipped; picture
questions, whose text differs only in an image link, and texts that recur with another answer
left out: see ``usable_trivia``), a random subset of Q, asked R times with a Zipf popularity
(exponent 1.0); 40% of the requests are templated rewrites of their question
(``ragsim.traces.paraphrase``). A request's answer key is its question's normalised answer,
so two questions with the same answer share a key (a hit between them serves the right
answer). The rewrites are templates around the question, easy to match; real paraphrases
(not available offline here) may well give more false hits at low thresholds.

Embeddings: all-MiniLM-L6-v2. Decisions: the simulator's answer stage (the shared tier logic
over modelled stores, exact KNN), requests one second apart, TTLs longer than the run. A false
hit is a hit whose stored answer key differs from the request's; the article's guideline is a
false-hit rate under 5%.

    python benchmarks/answer_cache_threshold_sweep.py [--questions 2000] [--requests 4000]
        [--out DIR]    # writes threshold_sweep.json and threshold_sweep.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ragsim.cache.answers import normalize_query
from ragsim.serving.answer_stage import AnswerStage, embed_texts
from ragsim.serving.config import build_config
from ragsim.traces import resolve_trace
from ragsim.traces.corpus.sources import trivia_questions
from ragsim.traces.paraphrase import with_questions

SIMILARITIES = np.round(np.arange(0.80, 0.981, 0.02), 2)


def sweep(trace, similarities=SIMILARITIES) -> list[dict]:
    rows = []
    embeddings = embed_texts(trace.query_text.to_pylist())
    for s in similarities:
        config = build_config({"trace": "mmlu", "answer_cache": True,
                               "answer_distance": float(1 - s), "answer_ttl_s": 1e9,
                               "answer_l1_ttl_s": 1e9, "answer_ttl_jitter": 0.0})
        stage = AnswerStage(trace, config, embed=lambda _texts: embeddings)
        for i in range(trace.n_requests):
            hit, _ = stage.lookup(i, float(i))
            if not hit:
                stage.write_back(i, float(i) + 0.5)
        hits = int(stage.answered().sum())
        rows.append({"similarity": float(s), "distance": float(1 - s),
                     "hit_rate": hits / trace.n_requests,
                     "semantic_hits": int((stage.tier == 3).sum()),
                     "false_hits": int(stage.false_hit.sum()),
                     "false_hit_rate": float(stage.false_hit.sum()) / hits if hits else 0.0})
    return rows


def usable_trivia() -> tuple[list[str], list[str]]:
    """Red-Trivia's questions whose text says what is asked: without the picture questions
    ("What country is represented by this flag? <image URL>": the text differs only in the
    link) and without texts that repeat, after normalisation, with another answer."""
    trivia = trivia_questions()
    seen: dict[str, str] = {}
    clashing: set[str] = set()
    for text, answer in zip(trivia.texts, trivia.answers, strict=True):
        norm, key = normalize_query(text), " ".join(str(answer).casefold().split())
        if seen.setdefault(norm, key) != key:
            clashing.add(norm)
    questions, keys, used = [], [], set()
    for text, answer in zip(trivia.texts, trivia.answers, strict=True):
        norm = normalize_query(text)
        if "http" in text or norm in clashing or norm in used:
            continue
        used.add(norm)
        questions.append(text)
        keys.append(" ".join(str(answer).casefold().split()))
    return questions, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    questions_all, keys_all = usable_trivia()
    rng = np.random.default_rng(args.seed)
    chosen = rng.choice(len(questions_all), size=min(args.questions, len(questions_all)),
                        replace=False)
    questions = [questions_all[i] for i in chosen]
    keys = [keys_all[i] for i in chosen]
    base = resolve_trace("mmlu", seed=args.seed, n_requests=min(args.requests, 5000))
    trace = with_questions(base, questions, keys, zipf_s=1.0, paraphrase_p=0.4,
                           n_requests=args.requests, seed=args.seed)
    rows = sweep(trace)
    exact_only = len(set(trace.query_text.to_pylist()))
    print(f"{args.requests} requests over {len(questions)} Red-Trivia questions "
          f"({exact_only} distinct texts)\n")
    print("| similarity | distance | hit rate | semantic hits | false hits | false-hit rate |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mark = " (over 5%)" if r["false_hit_rate"] > 0.05 else ""
        print(f"| {r['similarity']:.2f} | {r['distance']:.2f} | {r['hit_rate']:.1%} | "
              f"{r['semantic_hits']} | {r['false_hits']} | {r['false_hit_rate']:.1%}{mark} |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "threshold_sweep.json").write_text(json.dumps(
            {"requests": args.requests, "questions": len(questions), "rows": rows}, indent=1))
        plot(rows, args.out / "threshold_sweep.png")
        print(f"\nwrote {args.out / 'threshold_sweep.json'} and threshold_sweep.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = [100 * r["false_hit_rate"] for r in rows]
    y = [100 * r["hit_rate"] for r in rows]
    ax.plot(x, y, "o-")
    for r, xi, yi in zip(rows, x, y, strict=True):
        ax.annotate(f"{r['similarity']:.2f}", (xi, yi), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.axvline(5.0, color="red", linestyle="--", label="5% false hits (the article's limit)")
    ax.set_xlabel("false-hit rate (% of hits)")
    ax.set_ylabel("answer-cache hit rate (% of requests)")
    ax.set_title("Semantic threshold (cosine similarity) sweep")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
