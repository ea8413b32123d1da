"""Measure the answer cache's latency profile on the real stores (``ragsim profile
--answer-cache``): each tier's lookup and write, the semantic tier at a few index sizes, and the
query embedding. The result is the JSON the simulator reads (``ragsim.serving.answer_latency``).

Each number is one store operation timed alone, as the tier logic calls it: ``L1Store.get`` /
``put`` (cachetools), the L2 ``GET`` / ``SET PX`` of an ``exact:{md5}`` JSON value, a redisvl
range query for the nearest vector and the write-back transaction of an exact key with its
vector hash. The index is filled with random unit vectors up to each size in turn (the
measured write-backs count towards the next size); semantic lookups ask for a vector turned by
~0.03 in cosine distance from a stored one, and ``recall`` says how often the approximate index
found it.
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable, Sequence

import numpy as np

from ragsim.cache.answers import AnswerCache, AnswerCacheConfig, Entry, exact_key
from ragsim.cache.answers.stores import L1Store
from ragsim.realrun.answers.stores import RedisSharedStore, VectorIndex, own_namespace
from ragsim.serving.answer_latency import FORMAT_NAME, FORMAT_VERSION, from_dict

Progress = Callable[[str, int, int], None]


def _stats(seconds: Sequence[float]) -> dict:
    arr = np.asarray(seconds, dtype=float)
    return {"p50_s": float(np.median(arr)), "p99_s": float(np.percentile(arr, 99)),
            "samples": int(arr.size)}


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _unit_rows(rng: np.random.Generator, n: int, dims: int) -> np.ndarray:
    v = rng.normal(size=(n, dims)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def measure_l1(samples: int) -> tuple[dict, dict]:
    """(lookup, write) of the in-process L1 holding ``samples`` entries."""
    l1 = L1Store(max(samples, 1))
    now = time.time()
    entries = [Entry(exact_key(f"l1 question {i}"), f"l1 question {i}", f"answer {i}",
                     expires_s=now + 3600.0) for i in range(samples)]
    writes = [_timed(lambda e=e: l1.put(e.key, e, 3600.0, now)) for e in entries]
    lookups = [_timed(lambda e=e: l1.get(e.key, now)) for e in entries]
    return _stats(lookups), _stats(writes)


def measure_embed(embed: Callable[[str], object], samples: int) -> dict:
    embed("warm up the embedder")
    return _stats([_timed(lambda i=i: embed(f"What is the answer to question number {i}?"))
                   for i in range(samples)])


def measure(url: str, *, entries: Sequence[int], embed: Callable[[str], object],
            samples: int = 200, embed_samples: int = 50, dims: int = 384,
            index: VectorIndex | None = None, seed: int = 0, batch: int = 500,
            progress: Progress | None = None, name: str = "") -> dict:
    """The latency profile (a dict in the file format), measured in a namespace of its own
    (deleted at the end: the server's other keys are never touched)."""
    sizes = sorted(set(int(n) for n in entries))
    if not sizes or sizes[0] < 1 or samples < 1:
        raise ValueError("entries must be >= 1 and samples >= 1")
    index = index or VectorIndex()
    rng = np.random.default_rng(seed)
    report = progress or (lambda *_: None)
    config = AnswerCacheConfig(ttl_jitter=0.0, distance_threshold=0.1, ttl_s=86400.0)
    store = RedisSharedStore(url, dims=dims, distance_threshold=config.distance_threshold,
                             index=index, timeout_s=60.0)
    with own_namespace(store):
        return _measure(store, rng, config, sizes=sizes, embed=embed, samples=samples,
                        embed_samples=embed_samples, dims=dims, index=index, seed=seed,
                        batch=batch, report=report, name=name)


def _measure(store: RedisSharedStore, rng: np.random.Generator, config: AnswerCacheConfig, *,
             sizes: list[int], embed: Callable[[str], object], samples: int,
             embed_samples: int, dims: int, index: VectorIndex, seed: int, batch: int,
             report: Progress, name: str) -> dict:
    writer = AnswerCache(config, store)
    stored: list[np.ndarray] = []
    texts: list[str] = []  # the query stored with each vector, in order
    count = 0
    now = time.time()

    def item(text: str, vector: np.ndarray | None):
        key, entry, ttl_s = writer.entry_for(text, f"answer to {text}", now, answer_key=text)
        return key, entry, ttl_s, vector

    l2_lookup, l2_write, per_size = [], [], []
    for size in sizes:
        while count < size:  # fill up to this size
            n = min(batch, size - count)
            vecs = _unit_rows(rng, n, dims)
            batch_texts = [f"fill {count + j}" for j in range(n)]
            store.write_many([item(t, vecs[j]) for j, t in enumerate(batch_texts)])
            stored.append(vecs)
            texts += batch_texts
            count += n
            report(f"fill to {size:,}", count, size)
        every = np.concatenate(stored)
        picks = rng.choice(count, size=min(samples, count), replace=False)
        noisy = every[picks] + rng.normal(scale=0.25 / np.sqrt(dims),
                                          size=(len(picks), dims)).astype(np.float32)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        found, lookups = [], []
        for v, pick in zip(noisy, picks, strict=True):
            start = time.perf_counter()
            got = store.nearest(v, now)
            lookups.append(time.perf_counter() - start)
            found.append(got is not None and got[1] <= config.distance_threshold
                         and got[0].query == texts[pick])
        keys = [item(texts[p], None)[0] for p in picks]
        l2_lookup += [_timed(lambda k=k: store.get_exact(k, now)) for k in keys]
        # write-backs: exact only (L2), then exact + vector together (the semantic tier)
        exact_only = [item(f"exact only {size} {k}", None) for k in range(len(picks))]
        l2_write += [_timed(lambda it=it: store.write_many([it])) for it in exact_only]
        new = _unit_rows(rng, len(picks), dims)
        with_vector = [item(f"written {size} {k}", new[k]) for k in range(len(picks))]
        writes = [_timed(lambda it=it: store.write_many([it])) for it in with_vector]
        stored.append(new)
        texts += [it[1].query for it in with_vector]
        count += len(picks)
        per_size.append({"entries": size, "lookup": _stats(lookups), "write": _stats(writes),
                         "recall": float(np.mean(found))})
        report("measure sizes", len(per_size), len(sizes))
    l1_lookup, l1_write = measure_l1(samples)
    embedding = measure_embed(embed, embed_samples)
    l2_lookup_stats, l2_write_stats = _stats(l2_lookup), _stats(l2_write)
    profile = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "name": name or f"answer cache, {platform.machine()}",
        "measured": {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "python": platform.python_version(), "dims": dims, "index": vars(index),
            "samples": samples, "embed_samples": embed_samples, "seed": seed,
            "statistic": "p50 (p99 beside it)"},
        "embed_s": embedding["p50_s"], "embed_p99_s": embedding["p99_s"],
        "l1": {"lookup_s": l1_lookup["p50_s"], "write_s": l1_write["p50_s"],
               "lookup_p99_s": l1_lookup["p99_s"], "write_p99_s": l1_write["p99_s"]},
        "l2": {"lookup_s": l2_lookup_stats["p50_s"], "write_s": l2_write_stats["p50_s"],
               "lookup_p99_s": l2_lookup_stats["p99_s"], "write_p99_s": l2_write_stats["p99_s"]},
        "semantic": {
            "entries": sizes,
            "lookup_s": [r["lookup"]["p50_s"] for r in per_size],
            "write_s": [r["write"]["p50_s"] for r in per_size],
            "lookup_p99_s": [r["lookup"]["p99_s"] for r in per_size],
            "write_p99_s": [r["write"]["p99_s"] for r in per_size],
            "recall": [r["recall"] for r in per_size]},
    }
    from_dict(profile, source="measured")  # what is written can be read back
    return profile
