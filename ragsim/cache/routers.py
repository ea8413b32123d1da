"""Routers: which replica of a fleet serves a request, and so which replica's cache it meets.

The same objects drive the replay, the simulator and a real fleet: a router sees a request's
cached path (its documents, in order, with their tokens), its session and, where it balances
load, each replica's outstanding requests. It never sees a replica's real cache: like the
routers it models, a cache-aware router keeps its own approximate picture of what it sent where.

- ``round-robin``: request i of the trace goes to replica i mod N.
- ``random``: uniformly, seeded.
- ``session``: every request of a session to one replica (a stable hash of the session id);
  requests without a session take round-robin's turn.
- ``least-loaded``: the replica with the fewest outstanding requests (Vidur's least outstanding
  requests); ties to the lowest index. Needs the simulator's clock.
- ``prefix-affinity``: SGLang's cache-aware router (sgl-model-gateway, ``policies/cache_aware``;
  defaults from ``router_args.py``: cache_threshold 0.3, balance_abs_threshold 64,
  balance_rel_threshold 1.5). One approximate prefix tree per replica of what was routed there
  (documents, not characters: the unit our traces have). When the fleet is imbalanced (the most
  loaded replica has more than ``balance_abs`` requests over the least loaded *and* more than
  ``balance_rel`` times as many) the least loaded takes the request; otherwise the replica whose
  tree matches the longest share of the request's tokens, if that share exceeds
  ``cache_threshold``, else the replica with the smallest tree (the most room). The request's
  path is then inserted into the chosen replica's tree; trees are trimmed, least recently used
  leaves first, past ``max_tree_tokens``. Without load (replay) only the cache rule applies.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

ROUTERS = ("round-robin", "random", "session", "least-loaded", "prefix-affinity")
# the routers a replay can run: they need no clock (least-loaded needs outstanding requests)
TIMING_FREE_ROUTERS = ("round-robin", "random", "session", "prefix-affinity")


@dataclass(frozen=True)
class RouteRequest:
    """What a router sees of a request: its position in the trace, its cached path and its
    session (None: none)."""

    index: int
    docs: Sequence[int]
    tokens: Sequence[int]
    session: str | None = None


class Router:
    """Chooses a replica for each request, in arrival order. ``loads`` (outstanding requests
    per replica) is given where the driver has a clock, None in a replay."""

    name = "router"
    needs_load = False

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError(f"a fleet needs at least one replica, got {replicas}")
        self.replicas = replicas

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        return request.index % self.replicas


class RandomRouter(Router):
    name = "random"

    def __init__(self, replicas: int, seed: int = 0) -> None:
        super().__init__(replicas)
        self._random = random.Random(seed)

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        return self._random.randrange(self.replicas)


class SessionRouter(Router):
    """Sticky sessions: a stable hash (CRC-32) of the session id, so that a session's requests
    meet the cache its earlier turns filled, and the same id goes to the same replica in every
    run and process."""

    name = "session"

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        if request.session is None:
            return request.index % self.replicas
        return zlib.crc32(request.session.encode()) % self.replicas


class LeastLoaded(Router):
    name = "least-loaded"
    needs_load = True

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        if loads is None:
            raise ValueError("least-loaded routing needs the replicas' outstanding requests "
                             "(the simulator's clock), which a replay does not have")
        return min(range(self.replicas), key=lambda r: (loads[r], r))


@dataclass
class _Node:
    tokens: int
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0


class ApproximatePrefixTree:
    """What a router believes one replica holds: the paths routed there, as a trie of document
    ids weighted by their tokens, trimmed least recently used leaves first."""

    def __init__(self, max_tokens: int) -> None:
        self.root = _Node(0)
        self.size_tokens = 0
        self.max_tokens = max_tokens
        self._clock = 0

    def match_tokens(self, docs: Sequence[int], tokens: Sequence[int]) -> int:
        """Tokens of the longest prefix of ``docs`` this tree holds."""
        node, matched = self.root, 0
        for doc, n in zip(docs, tokens, strict=True):
            node = node.children.get(doc)
            if node is None:
                break
            matched += n
        return matched

    def insert(self, docs: Sequence[int], tokens: Sequence[int]) -> None:
        self._clock += 1
        node = self.root
        for doc, n in zip(docs, tokens, strict=True):
            child = node.children.get(doc)
            if child is None:
                child = node.children[doc] = _Node(n)
                self.size_tokens += n
            child.last_used = self._clock
            node = child
        while self.size_tokens > self.max_tokens and self._evict_one():
            pass

    def _evict_one(self) -> bool:
        """Drop the least recently used leaf; False when the tree is empty."""
        best, best_parent, best_key = None, None, None
        stack = [self.root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                if child.children:
                    stack.append(child)
                elif best is None or child.last_used < best.last_used:
                    best, best_parent, best_key = child, node, key
        if best is None:
            return False
        del best_parent.children[best_key]
        self.size_tokens -= best.tokens
        return True


class PrefixAffinity(Router):
    name = "prefix-affinity"

    def __init__(self, replicas: int, *, cache_threshold: float = 0.3, balance_abs: int = 64,
                 balance_rel: float = 1.5, max_tree_tokens: int = 2**26) -> None:
        super().__init__(replicas)
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.trees = [ApproximatePrefixTree(max_tree_tokens) for _ in range(replicas)]

    def _imbalanced(self, loads: Sequence[int]) -> bool:
        most, least = max(loads), min(loads)
        return most - least > self.balance_abs and most > least * self.balance_rel

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None) -> int:
        if loads is not None and self._imbalanced(loads):
            chosen = min(range(self.replicas), key=lambda r: (loads[r], r))
        else:
            total = sum(request.tokens)
            matched = [tree.match_tokens(request.docs, request.tokens) for tree in self.trees]
            best = max(range(self.replicas),
                       key=lambda r: (matched[r], -(loads[r] if loads else 0), -r))
            if total and matched[best] / total > self.cache_threshold:
                chosen = best
            else:  # no replica holds enough of it: the one with the most room
                chosen = min(range(self.replicas),
                             key=lambda r: (self.trees[r].size_tokens, r))
        self.trees[chosen].insert(request.docs, request.tokens)
        return chosen


def make_router(name: str, replicas: int, *, seed: int = 0) -> Router:
    """A router by name (see ``ROUTERS``)."""
    if name == "round-robin":
        return RoundRobin(replicas)
    if name == "random":
        return RandomRouter(replicas, seed)
    if name == "session":
        return SessionRouter(replicas)
    if name == "least-loaded":
        return LeastLoaded(replicas)
    if name == "prefix-affinity":
        return PrefixAffinity(replicas)
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
