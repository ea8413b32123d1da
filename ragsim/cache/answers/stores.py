"""The storage interface the tier logic sees, and the stores the simulator models.

Two roles: ``L1Store`` (in-process, per instance: ``cachetools.TLRUCache`` whose clock is the
``now_s`` each call is given, so the simulator and the real run use the very same L1) and a
``SharedStore`` (L2 exact entries plus the semantic tier, shared by every instance). A shared
store writes the exact entry and the vector entry back *together* (one Redis transaction in the
real store), so the two can never disagree. ``ModelSharedStore`` is the simulator's shared store:
dicts and an exact cosine KNN in numpy, with expiry checked at the given time as Redis does
(an entry is alive while ``now < expires``). A real store signals an outage by raising
``StoreError``; the tier logic then fails open.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ragsim.cache.answers.tiers import Entry


class StoreError(Exception):
    """A shared store is down, slow or full: the request goes on to RAG (fail open)."""


class _Clock:
    """cachetools' timer protocol (callable and a context manager) over a settable time."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def __enter__(self) -> float:
        return self.now_s

    def __exit__(self, *exc: object) -> None:
        return None


class L1Store:
    """In-process exact-match tier: ``cachetools.TLRUCache`` (expired entries go first, then the
    least recently used), with a TTL per entry so ``NULL_RESULT`` and jittered entries keep
    their own. Time only moves forward: ``now_s`` earlier than the last call is clamped."""

    def __init__(self, maxsize: int) -> None:
        from cachetools import TLRUCache  # the [answers] extra

        if maxsize < 1:
            raise ValueError("L1 size must be at least 1")
        self.maxsize = maxsize
        self._clock = _Clock()
        self._cache = TLRUCache(maxsize, ttu=lambda _k, v, now: now + v[1], timer=self._clock)

    def _at(self, now_s: float) -> None:
        self._clock.now_s = max(self._clock.now_s, float(now_s))

    def get(self, key: str, now_s: float) -> Entry | None:
        self._at(now_s)
        value = self._cache.get(key)
        return None if value is None else value[0]

    def put(self, key: str, entry: Entry, ttl_s: float, now_s: float) -> None:
        self._at(now_s)
        self._cache[key] = (entry, float(ttl_s))

    def pop(self, key: str) -> None:
        """Forget ``key`` (no error if absent)."""
        self._cache.pop(key, None)

    def __len__(self) -> int:
        self._cache.expire()
        return len(self._cache)


class SharedStore(Protocol):
    """L2 exact entries and the semantic tier, shared by all instances."""

    def get_exact(self, key: str, now_s: float) -> Entry | None: ...

    def nearest(self, embedding: np.ndarray, now_s: float) -> tuple[Entry, float] | None:
        """The closest live vector entry and its cosine distance (1 - cosine similarity)."""
        ...

    def write_back(self, key: str, entry: Entry, ttl_s: float, now_s: float,
                   embedding: np.ndarray | None) -> None:
        """Write the exact entry and (when ``embedding`` is given) the vector entry together."""
        ...

    def invalidate(self, key: str) -> None:
        """Forget ``key``'s exact entry and its vector (the knowledge behind it changed)."""
        ...

    def tenant(self, name: str) -> SharedStore:
        """The store of tenant ``name``: its own L2 entries and vectors, which no other
        tenant's lookup can reach (a semantic search never crosses tenants)."""
        ...


def unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class ModelSharedStore:
    """The simulator's shared store. ``l2_capacity`` / ``semantic_capacity`` bound the entries
    (``None``: unbounded), evicting the least recently used as ``maxmemory-policy allkeys-lru``
    does (Redis samples; this is exact LRU). Nearest-neighbour search is exact (FLAT)."""

    def __init__(self, *, l2_capacity: int | None = None,
                 semantic_capacity: int | None = None) -> None:
        self.l2_capacity, self.semantic_capacity = l2_capacity, semantic_capacity
        self._exact: OrderedDict[str, tuple[Entry, float]] = OrderedDict()
        self._slot: OrderedDict[str, int] = OrderedDict()  # key -> row, in LRU order
        self._vecs = np.zeros((0, 0), dtype=np.float32)
        self._expires = np.zeros(0)
        self._entries: list[Entry | None] = []
        self._free: list[int] = []
        self._tenants: dict[str, ModelSharedStore] = {}

    def tenant(self, name: str) -> ModelSharedStore:
        store = self._tenants.get(name)
        if store is None:
            store = self._tenants[name] = ModelSharedStore(
                l2_capacity=self.l2_capacity, semantic_capacity=self.semantic_capacity)
        return store

    def get_exact(self, key: str, now_s: float) -> Entry | None:
        found = self._exact.get(key)
        if found is None:
            return None
        if not now_s < found[1]:
            del self._exact[key]
            return None
        self._exact.move_to_end(key)
        return found[0]

    def nearest(self, embedding: np.ndarray, now_s: float) -> tuple[Entry, float] | None:
        if not self._slot:
            return None
        scores = self._vecs @ unit(embedding)
        scores[~(self._expires > now_s)] = -np.inf
        row = int(np.argmax(scores))
        if scores[row] == -np.inf:
            return None
        entry = self._entries[row]
        assert entry is not None
        self._slot.move_to_end(self._key_of(row))
        return entry, float(1.0 - scores[row])

    def _key_of(self, row: int) -> str:
        return self._entries[row].key  # type: ignore[union-attr]

    def write_back(self, key: str, entry: Entry, ttl_s: float, now_s: float,
                   embedding: np.ndarray | None) -> None:
        expires = now_s + ttl_s
        self._exact[key] = (entry, expires)
        self._exact.move_to_end(key)
        while self.l2_capacity is not None and len(self._exact) > self.l2_capacity:
            self._exact.popitem(last=False)
        if embedding is not None:
            self._put_vector(key, entry, unit(embedding), expires)

    def invalidate(self, key: str) -> None:
        self._exact.pop(key, None)
        row = self._slot.pop(key, None)
        if row is not None:
            self._drop(row)

    def _put_vector(self, key: str, entry: Entry, vec: np.ndarray, expires: float) -> None:
        row = self._slot.get(key)
        if row is None:
            row = self._free.pop() if self._free else self._grow(vec.size)
            self._slot[key] = row
        self._slot.move_to_end(key)
        self._vecs[row], self._expires[row], self._entries[row] = vec, expires, entry
        while self.semantic_capacity is not None and len(self._slot) > self.semantic_capacity:
            _, old = self._slot.popitem(last=False)
            self._drop(old)

    def _grow(self, dim: int) -> int:
        n = len(self._entries)
        if n == 0:
            self._vecs = np.zeros((16, dim), dtype=np.float32)
            self._expires = np.full(16, -np.inf)
        elif n == self._vecs.shape[0]:
            self._vecs = np.vstack([self._vecs, np.zeros_like(self._vecs)])
            self._expires = np.concatenate([self._expires, np.full(n, -np.inf)])
        self._entries.append(None)
        return n

    def _drop(self, row: int) -> None:
        self._vecs[row] = 0.0
        self._expires[row] = -np.inf
        self._entries[row] = None
        self._free.append(row)

    @property
    def vector_entries(self) -> int:
        """Vectors in the index (expired ones too, until dropped: Redis expires lazily)."""
        return len(self._slot)

    def live_counts(self, now_s: float) -> tuple[int, int]:
        """Live (exact, vector) entries at ``now_s``."""
        exact = sum(1 for _, exp in self._exact.values() if now_s < exp)
        return exact, int(np.sum(self._expires > now_s))
