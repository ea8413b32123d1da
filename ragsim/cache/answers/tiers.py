"""The tier logic: lookup order, backfill, write-back, guards and counters — written once.

``AnswerCache`` is one service instance: its own L1 and a shared store (L2 + semantic).
``Instances`` puts N of them behind round-robin or hash routing over one shared store, the
article's multi-instance L1 consistency question. Time is a number handed in (``now_s``):
simulated seconds in the simulator, wall seconds in the real run. The semantic tier is asked
only when an embedding is given; a hit there needs cosine *distance* ≤ ``distance_threshold``
(redisvl's convention; the article's similarity s is distance 1 - s) and must pass the false-hit
``guard`` (``guard.py``: the two questions name the same entities); a refused candidate is a miss,
counted in ``guard_rejections``.
"""

from __future__ import annotations

import logging
import math
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from ragsim.cache.answers.guard import GUARDS, passes
from ragsim.cache.answers.hotkeys import HotKeys
from ragsim.cache.answers.keys import exact_key
from ragsim.cache.answers.stores import L1Store, SharedStore, StoreError

log = logging.getLogger(__name__)

NULL_RESULT = "NULL_RESULT"
TIERS = ("l1", "l2", "semantic")
Tier = Literal["l1", "l2", "semantic", "miss", "bypass"]
Embedding = np.ndarray | Callable[[], np.ndarray] | None


def similarity_to_distance(similarity: float) -> float:
    """The article's cosine similarity threshold as redisvl's cosine distance threshold."""
    if not 0.0 <= similarity <= 1.0:
        raise ValueError(f"similarity threshold {similarity} is not in [0, 1]")
    return 1.0 - similarity


@dataclass(frozen=True)
class Entry:
    """A cached answer. ``key`` is the exact key of the query it was stored for; ``answer`` is
    ``NULL_RESULT`` for a negative entry (RAG found no answer); ``expires_s`` is when its
    shared copies expire (stored with it, so a backfill into L1 never outlives them)."""

    key: str
    query: str
    answer: str
    answer_key: str = ""
    expires_s: float = math.inf

    @property
    def negative(self) -> bool:
        return self.answer == NULL_RESULT


@dataclass(frozen=True)
class AnswerCacheConfig:
    """Sizes, TTLs (seconds), the semantic threshold (cosine distance) and the guards."""

    l1_size: int = 100
    l1_ttl_s: float = 60.0
    ttl_s: float = 3600.0  # L2 and semantic entries
    null_ttl_s: float = 600.0  # negative entries (penetration guard)
    ttl_jitter: float = 0.1  # each TTL x (1 + U[0, jitter)) (avalanche guard)
    distance_threshold: float = 0.1
    semantic: bool = True
    guard: str = "entities"  # a semantic hit's false-hit guard (guard.py), or "none"
    hot_top_n: int | None = None  # admit only the window's top N keys (None: admit all)
    hot_window_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("l1_ttl_s", "ttl_s", "null_ttl_s", "hot_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"answer cache {name} must be > 0")
        if self.ttl_jitter < 0:
            raise ValueError("answer cache ttl_jitter must be >= 0")
        if not 0.0 <= self.distance_threshold <= 2.0:
            raise ValueError("answer cache distance_threshold (cosine distance) is not in [0, 2]")
        if self.guard not in GUARDS:
            raise ValueError(f"answer cache guard must be one of {', '.join(GUARDS)}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Lookup:
    """What a lookup found: the tier (or ``miss``/``bypass``), the entry and, for a semantic
    hit, its cosine distance."""

    tier: Tier
    entry: Entry | None = None
    distance: float | None = None

    @property
    def hit(self) -> bool:
        return self.entry is not None


@dataclass
class Counters:
    lookups: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    misses: int = 0
    bypassed: int = 0
    negative_hits: int = 0
    writes: int = 0
    not_admitted: int = 0
    store_errors: int = 0
    error_bursts: int = 0
    invalidations: int = 0
    guard_rejections: int = 0  # semantic candidates within the threshold the guard refused

    def add(self, other: Counters) -> None:
        for name, value in vars(other).items():
            if isinstance(value, dict):
                for tier, n in value.items():
                    self.hits[tier] += n
            else:
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict:
        out = asdict(self)
        total = self.lookups + self.bypassed
        out["hit_rate"] = sum(self.hits.values()) / total if total else 0.0
        return out


class AnswerCache:
    """One service instance: L1 of its own, ``shared`` for L2 and the semantic tier."""

    def __init__(self, config: AnswerCacheConfig, shared: SharedStore, *,
                 l1: L1Store | None = None, seed_offset: int = 0) -> None:
        self.config, self.shared = config, shared
        self.l1 = l1 if l1 is not None else L1Store(config.l1_size)
        self.counters = Counters()
        self._rng = random.Random(config.seed * 1_000_003 + seed_offset)
        self._hot = (HotKeys(config.hot_top_n, config.hot_window_s)
                     if config.hot_top_n is not None else None)
        self._failing: set[str] = set()  # operations failing since their last success

    # -- failures: fail open, count, log once per burst ------------------------------------
    # A burst lasts while any kind of operation (lookup, write-back) keeps failing: a server
    # that is down fails both (one burst), a full one under noeviction refuses writes while
    # reads still succeed (one burst too, until a write goes through again).
    def _failed(self, what: str, error: Exception) -> None:
        self.counters.store_errors += 1
        if not self._failing:
            self.counters.error_bursts += 1
            log.warning("answer cache store unavailable (%s: %s); serving from RAG", what, error)
        self._failing.add(what)

    def _ok(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            if not self._failing:
                log.warning("answer cache store is back")

    def ttl_with_jitter(self, ttl_s: float) -> float:
        return ttl_s * (1.0 + self._rng.random() * self.config.ttl_jitter)

    # -- lookup ---------------------------------------------------------------------------
    def _shared(self, tenant: str | None) -> SharedStore:
        return self.shared if tenant is None else self.shared.tenant(tenant)

    def lookup(self, query: str, now_s: float, *, embedding: Embedding = None,
               history: bool = False, tenant: str | None = None) -> Lookup:
        """L1 → L2 → semantic → miss. A lower hit is backfilled into L1 under this query's
        key. ``embedding`` may be a callable, called only when the semantic tier is asked.
        ``tenant``: look only among that tenant's entries (None: the shared, untenanted ones)."""
        if history:
            self.counters.bypassed += 1
            return Lookup("bypass")
        self.counters.lookups += 1
        key = exact_key(query, tenant)
        if self._hot is not None:
            self._hot.record(key, now_s)
        entry = self.l1.get(key, now_s)
        if entry is not None:
            return self._hit("l1", entry)
        shared = self._shared(tenant)
        try:
            entry = shared.get_exact(key, now_s)
            if entry is None and self.config.semantic and embedding is not None:
                vector = embedding() if callable(embedding) else embedding
                found = shared.nearest(vector, now_s)
                self._ok("lookup")
                if found is not None and found[1] <= self.config.distance_threshold:
                    if passes(self.config.guard, query, found[0].query):
                        self._backfill(key, found[0], now_s)
                        return self._hit("semantic", found[0], found[1])
                    self.counters.guard_rejections += 1
            else:
                self._ok("lookup")
        except StoreError as error:
            self._failed("lookup", error)
            entry = None
        if entry is not None:
            self._backfill(key, entry, now_s)
            return self._hit("l2", entry)
        self.counters.misses += 1
        return Lookup("miss")

    def _hit(self, tier: Tier, entry: Entry, distance: float | None = None) -> Lookup:
        self.counters.hits[tier] += 1
        self.counters.negative_hits += entry.negative
        return Lookup(tier, entry, distance)

    def _l1_ttl(self, entry: Entry, now_s: float) -> float:
        """L1's TTL, never past the shared copies' expiry (nor the null TTL)."""
        return min(self.config.l1_ttl_s, entry.expires_s - now_s)

    def _backfill(self, key: str, entry: Entry, now_s: float) -> None:
        ttl_s = self._l1_ttl(entry, now_s)
        if ttl_s > 0:
            self.l1.put(key, entry, ttl_s, now_s)

    # -- invalidation -----------------------------------------------------------------------
    def invalidate(self, query: str, *, tenant: str | None = None) -> None:
        """The answer to ``query`` changed: drop it from the shared tiers (L2 and its vector),
        as a knowledge-base update does. The instances' L1s are out of its reach (in-process):
        they keep serving the old answer until their short TTL ends, the article's
        multi-instance L1 consistency question ("short L1 TTLs, L2 as the source of truth")."""
        key = exact_key(query, tenant)
        try:
            self._shared(tenant).invalidate(key)
            self._ok("invalidate")
        except StoreError as error:
            self._failed("invalidate", error)
        self.counters.invalidations += 1

    # -- write-back -------------------------------------------------------------------------
    def entry_for(self, query: str, answer: str | None, now_s: float, *,
                  answer_key: str = "", tenant: str | None = None) -> tuple[str, Entry, float]:
        """(exact key, entry, shared TTL with jitter) of an answer written back at ``now_s``."""
        negative = answer is None or answer == NULL_RESULT
        ttl_s = self.ttl_with_jitter(self.config.null_ttl_s if negative else self.config.ttl_s)
        entry = Entry(exact_key(query, tenant), query, NULL_RESULT if negative else answer,
                      answer_key, now_s + ttl_s)
        return entry.key, entry, ttl_s

    def write_back(self, query: str, answer: str | None, now_s: float, *,
                   embedding: Embedding = None, answer_key: str = "",
                   history: bool = False, tenant: str | None = None) -> bool:
        """After a miss, RAG's answer goes to every tier (``None``: a ``NULL_RESULT`` with
        its short TTL, exact tiers only). With hot-key admission a positive answer is kept
        only when its key is in the window's top N. Returns whether anything was written."""
        if history:
            return False
        key = exact_key(query, tenant)
        negative = answer is None or answer == NULL_RESULT
        if (not negative and self._hot is not None
                and not self._hot.is_hot(key, now_s)):
            self.counters.not_admitted += 1
            return False
        key, entry, ttl_s = self.entry_for(query, answer, now_s, answer_key=answer_key,
                                           tenant=tenant)
        self.l1.put(key, entry, self._l1_ttl(entry, now_s), now_s)
        vector = None
        if not negative and self.config.semantic and embedding is not None:
            vector = embedding() if callable(embedding) else embedding
        try:
            self._shared(tenant).write_back(key, entry, ttl_s, now_s, vector)
            self._ok("write-back")
        except StoreError as error:
            self._failed("write-back", error)
        self.counters.writes += 1
        return True


class Instances:
    """N service instances, each with its own L1, over one shared store. ``routing`` is
    ``round-robin`` (request i goes to instance i mod N) or ``hash`` (by the exact key's CRC32,
    so a question always reaches the same instance)."""

    def __init__(self, config: AnswerCacheConfig, shared: SharedStore, n: int = 1, *,
                 routing: str = "round-robin") -> None:
        if n < 1:
            raise ValueError("instances must be at least 1")
        if routing not in ("round-robin", "hash"):
            raise ValueError(f"routing {routing!r} is not round-robin or hash")
        self.routing = routing
        self.caches: Sequence[AnswerCache] = [
            AnswerCache(config, shared, seed_offset=i) for i in range(n)]
        self._next = 0

    def route(self, query: str) -> AnswerCache:
        n = len(self.caches)
        if self.routing == "hash":
            return self.caches[zlib.crc32(exact_key(query).encode()) % n]
        cache = self.caches[self._next % n]
        self._next += 1
        return cache

    @property
    def counters(self) -> Counters:
        total = Counters()
        for cache in self.caches:
            total.add(cache.counters)
        return total
