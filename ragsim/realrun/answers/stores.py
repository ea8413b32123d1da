"""The real shared store: L2 exact entries in Redis and the semantic tier through redisvl.

Everything ragsim writes lies in a *namespace* of its own: the L2 key of the core's
``exact:{md5}`` is ``ragsim:{namespace}:exact:{md5}``, the semantic index is named
``ragsim:{namespace}:semantic`` and indexes only the hashes under that prefix. The namespace is a
fresh run id unless a name is given (``--answer-namespace``: runs that give the same name share,
or warm, one cache). So a run never reads, serves or deletes another run's entries or a user's
own keys: ``clear()`` drops its index (without its documents) and deletes, by ``SCAN`` over its
prefix, only its own keys — never ``FLUSHDB``.

L2 values are JSON (query, answer, answer key, expiry) with a TTL in milliseconds. The
semantic tier is redisvl's ``SemanticCache`` (the library its users know) on an index whose
vector field is HNSW (M, EF_CONSTRUCTION, EF_RUNTIME, EPSILON configurable) or FLAT; the index
is created on first use and an existing one must have the embedder's dimension. A write-back
puts the exact key and the vector hash in *one* MULTI/EXEC transaction, in the hash layout
redisvl writes itself, so the two tiers cannot disagree. Lookups ask redisvl with
``distance_threshold`` (cosine distance). Every Redis error becomes ``StoreError`` (its message
without the URL's password): the tier logic fails open, and the next call reconnects
(re-creating the index on a restarted server).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ragsim.cache.answers import Entry
from ragsim.cache.answers.keys import NAME_RULE, valid_name
from ragsim.cache.answers.stores import StoreError, unit
from ragsim.errors import RagsimInputError
from ragsim.redact import redact

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VectorIndex:
    """The semantic tier's index: algorithm and HNSW parameters (RediSearch's names). Its name
    is the store's namespace's."""

    algorithm: str = "hnsw"  # or "flat" (exact)
    m: int = 16
    ef_construction: int = 200
    ef_runtime: int = 200  # the default 10 gave recall@10 ~0.5 on 5k vectors (DESIGN.md)
    # range queries on HNSW explore radius x (1 + epsilon): 0.01 (the default) missed 32% of
    # near neighbours among 5k random 384-d vectors, 0.1 none (1.4 ms a lookup)
    epsilon: float = 0.1

    def attrs(self) -> dict:
        if self.algorithm == "flat":
            return {"algorithm": "flat"}
        if self.algorithm != "hnsw":
            raise RagsimInputError(f"vector index algorithm {self.algorithm!r} is not hnsw or "
                                   f"flat", field="algorithm")
        return {"algorithm": "hnsw", "m": self.m, "ef_construction": self.ef_construction,
                "ef_runtime": self.ef_runtime, "epsilon": self.epsilon}


def _errors() -> tuple[type[Exception], ...]:
    """What an unreachable, slow or full server raises (redisvl wraps redis-py's errors)."""
    import redis
    from redisvl.exceptions import RedisVLError

    return (redis.exceptions.RedisError, RedisVLError, OSError)


def connect(url: str, *, timeout_s: float = 0.25):
    """A redis-py client that fails fast (no retries: the tier logic fails open instead)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0)


KEY_ROOT = "ragsim"  # every key ragsim writes starts ragsim:{namespace}:


def check_namespace(name: str, *, field: str = "--answer-namespace") -> str:
    """A namespace name: 1-64 letters, digits, ``_``, ``.`` or ``-`` (no ``:`` and no glob
    character, so its prefix is exactly its own keys' and a ``SCAN`` pattern over it matches
    nothing else)."""
    if not valid_name(name):
        raise RagsimInputError(f"namespace {name!r} must be {NAME_RULE}", field=field)
    return name


def new_namespace() -> str:
    """A run's own namespace: nobody else's keys can be in it."""
    return "run-" + uuid.uuid4().hex[:12]


class RedisSharedStore:
    """L2 + semantic on one Redis (Stack / 8 / the embedded server), in ``namespace`` (a fresh
    one when not given: ``named`` says whether it was given). ``embed(text)`` is the embedder
    redisvl is given (its dimension sizes the index); lookups pass vectors."""

    def __init__(self, url: str, *, dims: int, distance_threshold: float,
                 index: VectorIndex | None = None, embed: Callable[[str], list] | None = None,
                 timeout_s: float = 0.25, namespace: str | None = None) -> None:
        self.url, self.dims = url, dims
        self.distance_threshold = distance_threshold
        self.index = index or VectorIndex()
        self.named = namespace is not None
        self.namespace = check_namespace(namespace) if namespace is not None else new_namespace()
        self.prefix = f"{KEY_ROOT}:{self.namespace}:"
        self.index_name = self.prefix + "semantic"
        self.client = connect(url, timeout_s=timeout_s)
        self._embed = embed or (lambda _text: [1.0] + [0.0] * (dims - 1))
        self._semantic = None  # created on first use, again after a failure
        self._tenants: dict[str, RedisSharedStore] = {}

    def tenant(self, name: str) -> RedisSharedStore:
        """Tenant ``name``'s store: keys under ``ragsim:{namespace}:tenant:{name}:`` and an
        index of its own over them (so a semantic search never reaches another tenant's
        vectors); inside the namespace, so emptying the namespace empties its tenants too."""
        store = self._tenants.get(name)
        if store is None:
            if not valid_name(name):
                raise ValueError(f"tenant {name!r} must be {NAME_RULE}")
            store = copy.copy(self)
            store.prefix = f"{self.prefix}tenant:{name}:"
            store.index_name = store.prefix + "semantic"
            store._semantic, store._tenants = None, {}
            self._tenants[name] = store
        return store

    # -- where an entry lies -----------------------------------------------------------------
    def redis_key(self, key: str) -> str:
        """The Redis key of the core's exact key ``key``."""
        return self.prefix + key

    def vector_key(self, key: str) -> str:
        """The Redis key of ``key``'s vector hash (under the index's prefix)."""
        return f"{self.index_name}:{key.removeprefix('exact:')}"

    def _failure(self, error: Exception) -> StoreError:
        self._semantic = None
        return StoreError(redact(str(error), self.url))

    # -- the semantic index ------------------------------------------------------------------
    def _semantic_cache(self):
        if self._semantic is not None:
            return self._semantic
        from redisvl.extensions.cache.llm import SemanticCache
        from redisvl.index import SearchIndex
        from redisvl.utils.vectorize import CustomVectorizer

        cache = SemanticCache(name=self.index_name, distance_threshold=self.distance_threshold,
                              ttl=None, vectorizer=CustomVectorizer(embed=self._embed),
                              redis_client=self.client, create_index=False)
        search = cache._index
        field = search.schema.fields["prompt_vector"]
        if cache._vectorizer.dims != self.dims:
            raise RagsimInputError(f"the embedder gives {cache._vectorizer.dims}-d vectors, the "
                                   f"answer cache was configured for {self.dims}", field="dims")
        if search.exists():
            existing = SearchIndex.from_existing(self.index_name, redis_client=self.client)
            have = existing.schema.fields["prompt_vector"].attrs.dims
            if have != self.dims:
                raise RagsimInputError(f"Redis index {self.index_name!r} holds {have}-d vectors, "
                                       f"the embedder gives {self.dims}-d: empty the namespace "
                                       f"(ragsim answers clear) or name another",
                                       field="--answer-namespace")
        else:
            spec = search.schema.to_dict()
            for f in spec["fields"]:
                if f["name"] == field.name:
                    f["attrs"].update(self.index.attrs())
            search = SearchIndex.from_dict(spec, redis_client=self.client)
            search.create(overwrite=False)
            cache._index = search
        self._semantic = cache
        return cache

    # -- SharedStore ------------------------------------------------------------------------
    def get_exact(self, key: str, now_s: float) -> Entry | None:
        try:
            raw = self.client.get(self.redis_key(key))
        except _errors() as error:
            raise self._failure(error) from error
        if raw is None:
            return None
        value = json.loads(raw)
        return Entry(key, value["query"], value["answer"], value.get("answer_key", ""),
                     float(value["expires_s"]))

    def nearest(self, embedding: np.ndarray, now_s: float) -> tuple[Entry, float] | None:
        try:
            hits = self._semantic_cache().check(vector=unit(embedding).tolist(), num_results=1)
        except _errors() as error:
            raise self._failure(error) from error
        if not hits:
            return None
        hit = hits[0]
        meta = hit.get("metadata") or {}
        entry = Entry(meta.get("key", ""), hit["prompt"], hit["response"],
                      meta.get("answer_key", ""), float(meta.get("expires_s", np.inf)))
        return entry, float(hit["vector_distance"])

    def write_back(self, key: str, entry: Entry, ttl_s: float, now_s: float,
                   embedding: np.ndarray | None) -> None:
        self.write_many([(key, entry, ttl_s, embedding)])

    def write_many(self, items: list[tuple[str, Entry, float, np.ndarray | None]]) -> None:
        """Write-backs in one MULTI/EXEC: each exact key with its vector hash, or none."""
        from redisvl.extensions.cache.llm.schema import CacheEntry

        try:
            pipe = self.client.pipeline(transaction=True)
            for key, entry, ttl_s, embedding in items:
                ttl_ms = max(1, round(ttl_s * 1000))
                value = {"query": entry.query, "answer": entry.answer,
                         "answer_key": entry.answer_key, "expires_s": entry.expires_s}
                pipe.set(self.redis_key(key), json.dumps(value, ensure_ascii=False), px=ttl_ms)
                if embedding is None:
                    continue
                self._semantic_cache()  # the index exists before its first hash
                entry_id = key.removeprefix("exact:")
                data = CacheEntry(entry_id=entry_id, prompt=entry.query, response=entry.answer,
                                  prompt_vector=unit(embedding).tolist(),
                                  metadata={"key": key, "answer_key": entry.answer_key,
                                            "expires_s": entry.expires_s}).to_dict("float32")
                sem_key = self.vector_key(key)
                pipe.hset(sem_key, mapping=data)
                pipe.pexpire(sem_key, ttl_ms)
            pipe.execute()
        except _errors() as error:
            raise self._failure(error) from error

    def invalidate(self, key: str) -> None:
        """DEL the exact key and its vector hash in one MULTI/EXEC (both or neither)."""
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(self.redis_key(key))
            pipe.delete(self.vector_key(key))
            pipe.execute()
        except _errors() as error:
            raise self._failure(error) from error

    def server_stats(self) -> dict:
        """The server's memory limit and what it did about it: keys evicted (allkeys-lru) and
        writes refused (noeviction: ``store_errors`` of the tier logic count those)."""
        try:
            memory, stats = self.client.info("memory"), self.client.info("stats")
        except _errors() as error:
            return {"unavailable": str(error)}
        return {"used_memory_bytes": int(memory.get("used_memory", 0)),
                "maxmemory_bytes": int(memory.get("maxmemory", 0)),
                "maxmemory_policy": memory.get("maxmemory_policy"),
                "evicted_keys": int(stats.get("evicted_keys", 0))}

    def release(self) -> None:
        """The job using this store ended: a namespace of its own is emptied (a named one is
        kept: it is shared or warmed on purpose). A dead server is left alone (its keys
        expire by their TTLs)."""
        if not self.named:
            with contextlib.suppress(Exception):
                self.clear()

    def own_keys(self) -> list[bytes]:
        """Every key of this namespace (``SCAN`` over its prefix: other keys are never read)."""
        return list(self.client.scan_iter(match=self.prefix + "*", count=1000))

    def clear(self) -> None:
        """Empty this namespace, and only it: drop its index (``FT.DROPINDEX`` without ``DD``,
        so no document is deleted by the index's say) and delete its own keys, found by
        ``SCAN`` over its prefix. Keys of other namespaces and of the server's other users are
        never touched (no ``FLUSHDB``)."""
        import redis

        client = connect(self.url, timeout_s=30.0)  # a big index takes its time to drop
        for index in [self.index_name, *(t.index_name for t in self._tenants.values())]:
            with contextlib.suppress(redis.exceptions.ResponseError):  # no index (no vector)
                client.execute_command("FT.DROPINDEX", index)
        for tenant in self._tenants.values():
            tenant._semantic = None
        batch: list[bytes] = []
        for key in client.scan_iter(match=self.prefix + "*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.unlink(*batch)
                batch = []
        if batch:
            client.unlink(*batch)
        self._semantic = None


@contextlib.contextmanager
def own_namespace(store: RedisSharedStore) -> Iterator[RedisSharedStore]:
    """A store whose namespace is this job's alone (not named by the user): its keys are
    deleted at the end, whatever happens (a named namespace is kept: it is shared on purpose)."""
    try:
        yield store
    finally:
        store.release()
