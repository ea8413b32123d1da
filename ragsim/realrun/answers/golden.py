"""The article's acceptance test and the per-tier latency benchmark, on the real tiers.

Golden set: replay fixed questions twice through the real answer cache. Pass one starts cold:
each miss "runs RAG" — the file's answer stands in for it, so no LLM is needed — and writes the
answer back to every tier. Pass two should be (almost) all hits, with the same answers, much
faster. What is timed is the answer cache's own work per request (lookup, and on a miss the
query embedding, the semantic search and the write-back); RAG itself costs nothing here, so the
speed-up is a lower bound on a real system's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from ragsim.cache.answers import NULL_RESULT, AnswerCache, AnswerCacheConfig, Counters
from ragsim.cache.answers.keys import normalize_query
from ragsim.cache.answers.stores import L1Store
from ragsim.errors import RagsimInputError
from ragsim.realrun.answers.server import EmbeddedServer
from ragsim.realrun.answers.stores import RedisSharedStore, VectorIndex, connect, own_namespace
from ragsim.redact import redact, redact_url


def check_server(redis_url: str, *, field: str = "--redis-url") -> None:
    """The user's Redis answers and has vector search, or a one-line error naming ``field``
    (the URL shown, and the server's or client's message, without the password)."""
    shown = redact_url(redis_url)
    try:
        client = connect(redis_url, timeout_s=2.0)
    except Exception:  # the parser's message may quote a piece of a malformed password
        raise RagsimInputError(f"not a Redis URL: {shown}", field=field) from None
    try:
        client.ping()
        modules = {m.get(b"name", m.get("name"))
                   for m in client.execute_command("MODULE LIST")}
    except Exception as error:
        raise RagsimInputError(f"no Redis answers at {shown}: {redact(str(error), redis_url)}",
                               field=field) from None
    if not modules & {b"search", "search", b"searchlight", "searchlight"}:
        raise RagsimInputError(f"the Redis at {shown} has no vector search (RediSearch "
                               f"module): use Redis Stack or Redis 8", field=field)


def describe_user_server(redis_url: str) -> str:
    return f"user Redis at {redact_url(redis_url)}"


@contextlib.contextmanager
def answer_server(redis_url: str | None) -> Iterator[tuple[str, str]]:
    """(url, description): the user's Redis, checked to answer, or an embedded one. The
    description never holds a password."""
    if redis_url:
        check_server(redis_url)
        yield redis_url, describe_user_server(redis_url)
        return
    with EmbeddedServer() as server:
        yield server.url, server.description


@dataclass(frozen=True)
class Golden:
    """Questions with the answer RAG would give each (``None``: no answer), and paraphrases:
    (text, index of the question it rephrases)."""

    questions: list[str]
    answers: list[str | None]
    paraphrases: list[tuple[str, int]] = dataclass_field(default_factory=list)


def timed_request(cache: AnswerCache, question: str, answer: str | None,
                  embed: Callable[[str], np.ndarray]) -> tuple[str, float, str, str]:
    """One request through the cache: (answer served, seconds, tier, the question the served
    answer was stored for: on a miss the one asked)."""
    start = time.perf_counter()
    got = cache.lookup(question, time.time(), embedding=lambda: embed(question))
    if got.hit:
        served, stored_for = got.entry.answer, got.entry.query
    else:
        cache.write_back(question, answer, time.time(), embedding=lambda: embed(question))
        served = answer if answer is not None else "NULL_RESULT"
        stored_for = question
    return served, time.perf_counter() - start, got.tier, stored_for


def question_of(golden: Golden) -> dict[str, int]:
    """Each text the set asks (normalised, as the exact tiers key it) -> the index of the
    question it asks: a question's own, a paraphrase's the one it rephrases. Two texts ask the
    same thing only when they map to the same index; the answers cannot say so (GSM8K's 100
    distinct questions have 72 distinct answers)."""
    asks: dict[str, int] = {}
    for i, question in enumerate(golden.questions):
        asks.setdefault(normalize_query(question), i)
    for text, i in golden.paraphrases:
        asks.setdefault(normalize_query(text), asks[normalize_query(golden.questions[i])])
    return asks


def run_golden(golden: Golden, url: str, embed: Callable[[str], np.ndarray], dims: int, *,
               config: AnswerCacheConfig, index: VectorIndex, cold_l1: bool = False,
               progress: Callable[[int], None] | None = None) -> dict:
    store = RedisSharedStore(url, dims=dims, distance_threshold=config.distance_threshold,
                             index=index, embed=lambda text: embed(text).tolist())
    with own_namespace(store):  # a fresh namespace: the first pass starts cold
        return _golden_passes(golden, store, embed, config=config, index=index,
                              cold_l1=cold_l1, progress=progress)


def _golden_passes(golden: Golden, store: RedisSharedStore,
                   embed: Callable[[str], np.ndarray], *, config: AnswerCacheConfig,
                   index: VectorIndex, cold_l1: bool,
                   progress: Callable[[int], None] | None) -> dict:
    """Pass 1 and pass 2 over the questions, then the paraphrases. A hit is *false* when the
    entry it serves was stored for another question than the one asked (nor a paraphrase of
    it), or serves another answer than the file gives: on a first pass over distinct
    questions every hit from another question is one, though it serve an equal answer."""
    asks = question_of(golden)
    first_cache = AnswerCache(config, store)
    expected = [a if a is not None else NULL_RESULT for a in golden.answers]
    passes = []
    done = 0
    rounds = [(golden.questions, golden.answers)] * 2
    if golden.paraphrases:
        rounds.append(([text for text, _ in golden.paraphrases],
                       [golden.answers[i] for _, i in golden.paraphrases]))
    for number, (questions, answers) in enumerate(rounds, start=1):
        cache = first_cache
        if number == 2 and cold_l1:  # another instance: its L1 is empty, L2 is shared
            cache = AnswerCache(config, store, l1=L1Store(config.l1_size), seed_offset=1)
        served, seconds, tiers, other = [], [], [], []
        for question, answer in zip(questions, answers, strict=True):
            a, s, t, stored_for = timed_request(cache, question, answer, embed)
            served.append(a)
            seconds.append(s)
            tiers.append(t)
            other.append(asks.get(normalize_query(stored_for)) != asks[normalize_query(question)])
            done += 1
            if progress is not None:
                progress(done)
        passes.append((served, np.asarray(seconds), tiers, other))
    (a1, s1, t1, o1), (a2, s2, t2, o2) = passes[:2]
    n = len(golden.questions)

    def hits(tiers: list[str]) -> int:
        return sum(t not in ("miss", "bypass") for t in tiers)

    def false_hits(served: list[str], tiers: list[str], want: list[str],
                   other: list[bool]) -> int:
        return sum(t not in ("miss", "bypass") and (o or a != w)
                   for a, t, w, o in zip(served, tiers, want, other, strict=True))

    first_false = false_hits(a1, t1, expected, o1)
    result = {
        "questions": n,
        "first_pass_hit_rate": hits(t1) / n,
        "first_pass_false_hits": first_false,
        "false_hit_rate": first_false / n,
        "second_pass_hit_rate": hits(t2) / n,
        "second_pass_hits": {tier: sum(t == tier for t in t2) for tier in ("l1", "l2",
                                                                         "semantic")},
        "second_pass_false_hits": false_hits(a2, t2, expected, o2),
        "answers_identical": a1 == a2,
        "first_pass_mean_s": float(s1.mean()),
        "second_pass_mean_s": float(s2.mean()),
        "speedup": float(s1.mean() / s2.mean()) if s2.mean() > 0 else float("inf"),
        "guard_rejections": first_cache.counters.guard_rejections,
        "paraphrases": len(golden.paraphrases),
        "paraphrase_hit_rate": None,
        "paraphrase_false_hit_rate": None,
        "cold_l1": cold_l1,
        "config": config.as_dict(),
        "index": vars(index),
    }
    if golden.paraphrases:
        a3, _, t3, o3 = passes[2]
        want = [expected[i] for _, i in golden.paraphrases]
        wrong = false_hits(a3, t3, want, o3)
        result["paraphrase_hit_rate"] = (hits(t3) - wrong) / len(t3)
        result["paraphrase_false_hit_rate"] = wrong / len(t3)
    return result


def _percentiles(seconds: Sequence[float]) -> dict:
    arr = np.asarray(seconds) * 1e6
    return {"p50_us": float(np.percentile(arr, 50)), "p99_us": float(np.percentile(arr, 99)),
            "mean_us": float(arr.mean()), "samples": int(arr.size)}


def run_bench(url: str, *, entries: int, dims: int = 384, samples: int = 200,
              index: VectorIndex, seed: int = 0, batch: int = 500,
              progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Fill the shared tiers with ``entries`` random unit vectors, then time lookups that end
    in each tier (vectors given: embedding time is not part of a lookup's latency here)."""
    rng = np.random.default_rng(seed)
    config = AnswerCacheConfig(ttl_jitter=0.0, distance_threshold=0.1, ttl_s=86400.0,
                               l1_size=max(100, samples))
    # bulk transactions of HNSW inserts take longer than a lookup's fail-fast timeout
    store = RedisSharedStore(url, dims=dims, distance_threshold=config.distance_threshold,
                             index=index, timeout_s=60.0)
    with own_namespace(store):  # a fresh namespace, deleted at the end
        return _bench(store, rng, config, entries=entries, dims=dims, samples=samples,
                      index=index, batch=batch, progress=progress)


def _bench(store: RedisSharedStore, rng: np.random.Generator, config: AnswerCacheConfig, *,
           entries: int, dims: int, samples: int, index: VectorIndex, batch: int,
           progress: Callable[[str, int, int], None] | None) -> dict:
    writer = AnswerCache(config, store)
    vectors = rng.normal(size=(entries, dims)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    now = time.time()
    fill_start = time.perf_counter()
    for start in range(0, entries, batch):
        items = []
        for i in range(start, min(entries, start + batch)):
            q = f"bench question {i}"
            entry_key = writer.entry_for(q, f"answer {i}", now, answer_key=str(i))
            items.append((entry_key[0], entry_key[1], entry_key[2], vectors[i]))
        store.write_many(items)
        if progress is not None:
            progress("fill", min(entries, start + batch), entries)
    fill_s = time.perf_counter() - fill_start
    picks = rng.choice(entries, size=min(samples, entries), replace=False)

    found: dict[str, list[bool]] = {}

    def timed(cache: AnswerCache, query: str, vector: np.ndarray, want: str) -> float:
        start = time.perf_counter()
        got = cache.lookup(query, time.time(), embedding=vector)
        elapsed = time.perf_counter() - start
        found.setdefault(want, []).append(got.tier == want)
        return elapsed

    results: dict[str, dict] = {}
    l1_cache = AnswerCache(config, store)
    for i in picks:
        l1_cache.lookup(f"bench question {i}", time.time(), embedding=vectors[i])
    results["l1"] = _percentiles([timed(l1_cache, f"bench question {i}", vectors[i], "l1")
                                  for i in picks])
    results["l2"] = _percentiles([timed(AnswerCache(config, store), f"bench question {i}",
                                        vectors[i], "l2") for i in picks])
    # a paraphrase: the stored vector turned by ~0.03 in cosine distance, text never stored
    noisy = []
    for i in picks:
        v = vectors[i] + rng.normal(scale=0.25 / np.sqrt(dims), size=dims).astype(np.float32)
        noisy.append(v / np.linalg.norm(v))
    results["semantic"] = _percentiles([timed(AnswerCache(config, store), f"paraphrase {i}", v,
                                              "semantic") for i, v in zip(picks, noisy,
                                                                          strict=True)])
    far = rng.normal(size=(len(picks), dims)).astype(np.float32)
    results["miss"] = _percentiles([timed(AnswerCache(config, store), f"unseen {k}", far[k],
                                          "miss") for k in range(len(picks))])
    for tier, row in results.items():
        # how often the lookup ended where it should: below 1 for "semantic", the approximate
        # index missed a neighbour within the threshold (its recall at this size)
        row["expected_tier_rate"] = float(np.mean(found[tier]))
    return {"entries": entries, "dims": dims, "fill_s": fill_s, "lookup": results,
            "index": vars(index), "counters_note": "lookups with vectors given (no embedding)"}




def replay_decisions(texts: Sequence[str], answer_keys: Sequence[str],
                     embeddings: np.ndarray | None, url: str, *, config: AnswerCacheConfig,
                     instances: int = 1, routing: str = "round-robin",
                     index: VectorIndex | None = None) -> list[str]:
    """A trace's requests one after another through the real tiers (wall time): each miss
    "runs RAG" (its answer key is the answer) and writes back before the next request, as a
    sequential simulation does. Returns each request's tier."""
    from ragsim.cache.answers import Instances

    dims = 2 if embeddings is None else int(embeddings.shape[1])
    store = RedisSharedStore(url, dims=dims, distance_threshold=config.distance_threshold,
                             index=index or VectorIndex(algorithm="flat"), timeout_s=5.0)
    group = Instances(config, store, instances, routing=routing)
    tiers = []
    with own_namespace(store):
        for i, text in enumerate(texts):
            cache = group.route(text)
            vector = None if embeddings is None else embeddings[i]
            got = cache.lookup(text, time.time(), embedding=vector)
            if not got.hit:
                cache.write_back(text, answer_keys[i], time.time(), embedding=vector,
                                 answer_key=answer_keys[i])
            tiers.append(got.tier)
    return tiers


__all__ = ["Counters", "Golden", "answer_server", "own_namespace", "replay_decisions",
           "run_bench", "run_golden"]
