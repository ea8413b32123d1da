"""``ragsim answers``: the answer cache on its real tiers (cachetools L1, Redis L2, redisvl's
semantic cache on Redis vector search) — the article's golden-set test and a per-tier latency
benchmark. Without ``--redis-url`` ragsim starts an embedded server and stops it at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ragsim.cli.common import (
    Command,
    Group,
    cosine_distance,
    counting_progress,
    err,
    friendly_errors,
    out,
    phased_progress,
    print_json,
)
from ragsim.errors import RagsimInputError
from ragsim.extras import ANSWERS_MODULES, require_answers  # noqa: F401 (re-exported)

app = typer.Typer(cls=Group, no_args_is_help=True,
                  help="The answer cache on real tiers: golden-set test and latency benchmark.")

INDEX_PANEL = "Vector index"

RedisUrl = Annotated[str | None, typer.Option(
    help="A Redis Stack / Redis 8 (with vector search) to use; default: start an embedded one.")]
Algorithm = Annotated[str, typer.Option(help="hnsw (approximate) or flat (exact).",
                                        rich_help_panel=INDEX_PANEL)]
M = Annotated[int, typer.Option("--m", help="HNSW M.", rich_help_panel=INDEX_PANEL)]
EfConstruction = Annotated[int, typer.Option(help="HNSW EF_CONSTRUCTION.",
                                             rich_help_panel=INDEX_PANEL)]
EfRuntime = Annotated[int, typer.Option(help="HNSW EF_RUNTIME.", rich_help_panel=INDEX_PANEL)]
Epsilon = Annotated[float, typer.Option(help="HNSW EPSILON of range queries (redisvl's lookups "
                                             "are range queries).", rich_help_panel=INDEX_PANEL)]


def check_index_options(*, algorithm: str, m: int, ef_construction: int, ef_runtime: int,
                        epsilon: float) -> None:
    """The vector index's options, refused before any server starts (Redis refuses them only
    when the index is created, which ended in a traceback)."""
    import math

    if algorithm not in ("hnsw", "flat"):
        raise RagsimInputError(f"must be hnsw or flat, got {algorithm!r}", field="--algorithm")
    for flag, value in (("--m", m), ("--ef-construction", ef_construction),
                        ("--ef-runtime", ef_runtime)):
        if value < 1:
            raise RagsimInputError(f"must be >= 1, got {value}", field=flag)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise RagsimInputError(f"must be a number > 0 (the range query's relative margin), "
                               f"got {epsilon}", field="--epsilon")


def read_golden(path: Path):
    """JSON lines with ``question`` (text) and ``answer`` (text, or null: RAG had no answer)."""
    from ragsim.realrun.answers.golden import Golden
    from ragsim.traces.io import iter_json_objects

    questions, answers = [], []
    for row, obj in iter_json_objects(path):
        q, a = obj.get("question"), obj.get("answer", ...)
        if not isinstance(q, str) or not q.strip():
            raise RagsimInputError("needs a non-empty text 'question'", file=str(path), row=row,
                                   field="question")
        if a is ... or not (a is None or isinstance(a, str)):
            raise RagsimInputError("needs 'answer': the text RAG would answer (or null)",
                                   file=str(path), row=row, field="answer")
        questions.append(q)
        answers.append(a)
    if not questions:
        raise RagsimInputError("no questions", file=str(path))
    return Golden(questions, answers)


def read_paraphrases(path: Path, questions: list[str]) -> list[tuple[str, int]]:
    """JSON lines with ``question`` (the paraphrase) and ``rephrases`` (the question of the
    golden set it rephrases, as written there: compared normalised)."""
    from ragsim.cache.answers import normalize_query
    from ragsim.traces.io import iter_json_objects

    index = {normalize_query(q): i for i, q in enumerate(questions)}
    found = []
    for row, obj in iter_json_objects(path):
        text, of = obj.get("question"), obj.get("rephrases")
        if not isinstance(text, str) or not text.strip():
            raise RagsimInputError("needs a non-empty text 'question' (the paraphrase)",
                                   file=str(path), row=row, field="question")
        if not isinstance(of, str) or normalize_query(of) not in index:
            raise RagsimInputError("needs 'rephrases': a question of --questions, as written "
                                   "there", file=str(path), row=row, field="rephrases")
        found.append((text, index[normalize_query(of)]))
    if not found:
        raise RagsimInputError("no paraphrases", file=str(path))
    return found


@app.command("golden", cls=Command)
@friendly_errors
def golden(
    questions: Annotated[Path, typer.Option(help="JSON lines: question, answer.")],
    paraphrases: Annotated[Path | None, typer.Option(
        help="JSON lines: question (a paraphrase), rephrases (the question of --questions it "
             "rephrases). Asked after the two passes: paraphrase_hit_rate.")] = None,
    redis_url: RedisUrl = None,
    threshold: Annotated[float | None, typer.Option(
        help="Semantic hit when cosine similarity >= this (the article's 0.88-0.95). "
             "\\[default: 0.9]")] = None,
    distance_threshold: Annotated[float | None, typer.Option(
        help="Or as redisvl says it: cosine distance <= this (1 - similarity).")] = None,
    guard: Annotated[str, typer.Option(
        help="A semantic hit's false-hit guard: entities (the two questions name the same "
             "entities) or none (cosine alone).")] = "entities",
    l1_size: Annotated[int, typer.Option(help="L1 entries.")] = 100,
    ttl: Annotated[float, typer.Option(help="L2 / semantic TTL, seconds.")] = 3600.0,
    cold_l1: Annotated[bool, typer.Option(
        help="Second pass on another instance (empty L1): hits come from Redis.")] = False,
    algorithm: Algorithm = "hnsw", m: M = 16, ef_construction: EfConstruction = 200,
    ef_runtime: EfRuntime = 200, epsilon: Epsilon = 0.1,
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Replay a golden set twice: the second pass should be (nearly) all hits, with the first
    pass's answers, much faster (the article's acceptance test). A hit served from another
    question's entry (not the question asked, nor a paraphrase of it) is a false hit, though
    its answer be equal; so is one serving another answer than the file gives. The file's
    answers stand in for RAG, so no LLM runs; the timing is the answer cache's own work."""
    check_index_options(algorithm=algorithm, m=m, ef_construction=ef_construction,
                        ef_runtime=ef_runtime, epsilon=epsilon)
    require_answers("ragsim answers golden", embedder=True)
    golden_set = read_golden(questions)
    if paraphrases is not None:
        import dataclasses

        golden_set = dataclasses.replace(
            golden_set, paraphrases=read_paraphrases(paraphrases, golden_set.questions))
    from ragsim.cache.answers.guard import GUARDS

    if guard not in GUARDS:
        raise RagsimInputError(f"must be one of {', '.join(GUARDS)}", field="--guard")
    distance = cosine_distance(threshold, distance_threshold, similarity_flag="--threshold",
                               distance_flag="--distance-threshold", default_similarity=0.9)
    from ragsim.cache.answers import AnswerCacheConfig
    from ragsim.realrun.answers.golden import answer_server, run_golden
    from ragsim.realrun.answers.stores import VectorIndex
    from ragsim.traces.corpus.embedding import Embedder

    config = AnswerCacheConfig(l1_size=l1_size, ttl_s=ttl, distance_threshold=distance,
                               guard=guard)
    index = VectorIndex(algorithm=algorithm, m=m, ef_construction=ef_construction,
                        ef_runtime=ef_runtime, epsilon=epsilon)
    index.attrs()  # bad --algorithm before the server starts
    embedder = Embedder()

    def embed(text: str):
        return embedder.embed([text])[0]

    with answer_server(redis_url) as (url, description):
        asks = 2 * len(golden_set.questions) + len(golden_set.paraphrases)
        progress, done = counting_progress(asks, "golden set", not json_output)
        with progress:
            result = run_golden(golden_set, url, embed, embedder.dimension, config=config,
                                index=index, cold_l1=cold_l1, progress=done)
    result = {**result, "server": description, "questions_file": str(questions),
              "paraphrases_file": str(paraphrases) if paraphrases else None}
    if json_output:
        print_json(result)
        return
    hits = result["second_pass_hits"]
    extra = ""
    if result["paraphrase_hit_rate"] is not None:
        extra = (f"\nparaphrases: {result['paraphrase_hit_rate']:.1%} hits with the right "
                 f"answer, {result['paraphrase_false_hit_rate']:.1%} false hits")
    out.print(f"{result['questions']} questions on {description}\n"
              f"first pass: {result['first_pass_hit_rate']:.1%} hits, false hits "
              f"{result['false_hit_rate']:.1%} (guard {guard}: "
              f"{result['guard_rejections']} refused)\n"
              f"second pass: {result['second_pass_hit_rate']:.1%} hits (L1 {hits['l1']}, "
              f"L2 {hits['l2']}, semantic {hits['semantic']}), answers identical: "
              f"{result['answers_identical']}\n"
              f"mean latency {result['first_pass_mean_s'] * 1e3:.3f} ms -> "
              f"{result['second_pass_mean_s'] * 1e3:.3f} ms ({result['speedup']:.0f}x)"
              + extra, highlight=False)


@app.command("bench", cls=Command)
@friendly_errors
def bench(
    entries: Annotated[int, typer.Option(help="Entries in L2 and the semantic tier.")] = 10_000,
    samples: Annotated[int, typer.Option(help="Lookups timed per tier.")] = 200,
    dims: Annotated[int, typer.Option(help="Vector dimension (384: all-MiniLM-L6-v2).")] = 384,
    redis_url: RedisUrl = None,
    algorithm: Algorithm = "hnsw", m: M = 16, ef_construction: EfConstruction = 200,
    ef_runtime: EfRuntime = 200, epsilon: Epsilon = 0.1,
    seed: Annotated[int, typer.Option()] = 0,
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Measured lookup latency per tier (L1 hit, L2 hit, semantic hit, full miss) with the
    shared tiers holding ENTRIES random unit vectors. Vectors are given, so the embedder's time
    is not in it. On a given Redis it writes into a namespace of its own, deleted at the end
    (the server's other keys are never touched)."""
    check_index_options(algorithm=algorithm, m=m, ef_construction=ef_construction,
                        ef_runtime=ef_runtime, epsilon=epsilon)
    require_answers("ragsim answers bench")
    if entries < 1 or samples < 1 or dims < 2:
        raise RagsimInputError("--entries and --samples must be >= 1, --dims >= 2",
                               field="--entries")
    from ragsim.realrun.answers.golden import answer_server, run_bench
    from ragsim.realrun.answers.stores import VectorIndex

    index = VectorIndex(algorithm=algorithm, m=m, ef_construction=ef_construction,
                        ef_runtime=ef_runtime, epsilon=epsilon)
    index.attrs()
    with answer_server(redis_url) as (url, description):
        progress, report = phased_progress()
        with progress:
            result = run_bench(url, entries=entries, dims=dims, samples=samples, index=index,
                               seed=seed, progress=report)
    result["server"] = description
    if json_output:
        print_json(result)
        return
    out.print(f"{entries} entries ({dims}-d, {algorithm}) on {description}; filled in "
              f"{result['fill_s']:.1f} s", highlight=False)
    for tier, row in result["lookup"].items():
        out.print(f"  {tier:9s} p50 {row['p50_us']:9.1f} us   p99 {row['p99_us']:9.1f} us   "
                  f"mean {row['mean_us']:9.1f} us", highlight=False)
    err.print("lookups are timed with the vector given (no embedding)")


@app.command("clear", cls=Command)
@friendly_errors
def clear(
    redis_url: Annotated[str, typer.Option(help="The Redis that holds the namespace.")],
    namespace: Annotated[str, typer.Option(
        help="The name given to `run --answer-namespace`.")],
) -> None:
    """Empty a named answer-cache namespace (a cold start for the runs that share it): its
    index is dropped and its own keys (ragsim:NAMESPACE:*) deleted; nothing else is touched."""
    require_answers("ragsim answers clear")
    from ragsim.realrun.answers.golden import check_server
    from ragsim.realrun.answers.stores import RedisSharedStore

    check_server(redis_url)
    store = RedisSharedStore(redis_url, dims=2, distance_threshold=0.1, namespace=namespace,
                             timeout_s=5.0)
    keys = len(store.own_keys())
    store.clear()
    out.print(f"namespace {namespace}: {keys} keys deleted", highlight=False)


DEFAULT_PROFILE_ENTRIES = (1_000, 10_000, 100_000)


def measure_answer_profile(out_file: Path, *, redis_url: str | None,
                           entries: list[int] | None, samples: int,
                           force: bool = False) -> None:
    """``ragsim profile --answer-cache``: the latency profile of the real tiers, written to
    ``out_file`` (the simulator's ``run --answer-cache --answer-profile FILE`` reads it);
    an earlier one there is replaced only with ``force``."""
    from ragsim.outputs import claim_output_file

    require_answers("ragsim profile --answer-cache", embedder=True)
    sizes = sorted(set(entries or DEFAULT_PROFILE_ENTRIES))
    if sizes[0] < 1 or samples < 1:
        raise RagsimInputError("--answer-entries and --answer-samples must be >= 1",
                               field="--answer-entries")
    claim_output_file(out_file, force=force)  # before the measuring, which it would cost
    from ragsim.atomic import write_text_atomically
    from ragsim.realrun.answers.golden import answer_server
    from ragsim.realrun.answers.latency import measure
    from ragsim.traces.corpus.embedding import Embedder

    embedder = Embedder()  # no disk cache: every embedding is computed, as a service does

    def embed(text: str):
        return embedder.embed([text])[0]

    with answer_server(redis_url) as (url, description):
        progress, report = phased_progress()
        with progress:
            profile = measure(url, entries=sizes, embed=embed, samples=samples,
                              embed_samples=min(50, samples), dims=embedder.dimension,
                              progress=report)
    profile["measured"]["server"] = description
    import json

    write_text_atomically(out_file, json.dumps(profile, indent=1) + "\n")
    err.print(f"wrote {out_file}")
    sem = profile["semantic"]
    out.print(f"L1 lookup {profile['l1']['lookup_s'] * 1e6:.1f} us, L2 lookup "
              f"{profile['l2']['lookup_s'] * 1e6:.1f} us, embedding "
              f"{profile['embed_s'] * 1e3:.2f} ms; semantic lookup "
              + ", ".join(f"{s * 1e3:.2f} ms at {n:,}" for n, s in
                          zip(sem["entries"], sem["lookup_s"], strict=True)), highlight=False)
