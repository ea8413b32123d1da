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
- ``kv-aware``: Dynamo's KV router (``lib/llm/src/kv_router/scheduler.rs``,
  ``DefaultWorkerSelector``; ``sequence.rs``, ``ActiveSequences``). For each replica w, with
  blocks of ``block_tokens`` tokens (Dynamo's ``--kv-cache-block-size``, backend-specific;
  vLLM's 16 here) and the request's prompt of ``isl`` tokens:
  ``logit(w) = overlap_score_weight x prefill_blocks(w) + decode_blocks(w)``, where
  ``prefill_blocks(w) = (active_prefill_tokens(w) + isl - overlap_blocks(w) x block) / block``
  (the prompt tokens routed to w and not yet prefilled, plus this request's uncached ones;
  ``overlap_blocks``: whole blocks of the prompt w holds in its cache, which Dynamo learns
  from the workers' KV events) and ``decode_blocks(w) = active_blocks(w) + new_blocks(w)``
  (the distinct blocks of the prompts w is serving, plus this prompt's blocks not among
  them). ``overlap_score_weight`` defaults to 1.0 (``--kv-overlap-score-weight``); the
  lowest logit wins, ties drawn at random (seeded; Dynamo's temperature 0). Blocks are
  counted as tokens / block (a document need not end on a block boundary), a request's
  generated tokens are not counted (Dynamo adds them as they are generated), and the
  prompt's documents are its shared blocks (its query is its own). Needs the clock. This is
  Dynamo's cost only: llm-d's weighted prefix-cache and load scorers are not modelled
  (docs/model.md section 10 says how the two relate).

What a router learns from the replicas (their caches, their outstanding requests and tokens)
may be ``staleness`` seconds late (``--router-staleness``, ``FleetState``); what it keeps itself
(prefix-affinity's trees, kv-aware's active prompts) is always current.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROUTERS = ("round-robin", "random", "session", "least-loaded", "prefix-affinity", "kv-aware")
# the routers a replay can run: they need no clock (least-loaded and kv-aware need the replicas'
# outstanding work)
TIMING_FREE_ROUTERS = ("round-robin", "random", "session", "prefix-affinity")
# the routers whose choice reads nothing of the replicas: decided ahead, the same as at arrival
STATELESS_ROUTERS = ("round-robin", "random", "session")
# Dynamo's KV router defaults (kv_router/mod.rs KvRouterConfig: overlap_score_weight 1.0,
# router_temperature 0.0); its block size is the backend's (vLLM: 16 tokens)
KV_OVERLAP_SCORE_WEIGHT = 1.0
KV_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class RouteRequest:
    """What a router sees of a request: its position in the trace, its cached path, its
    session (None: none) and its query's tokens."""

    index: int
    docs: Sequence[int]
    tokens: Sequence[int]
    session: str | None = None
    query_tokens: int = 0  # the prompt's own part, after its documents (kv-aware counts it)


@dataclass
class FleetState:
    """What a router sees of the replicas at a decision, kept by the driver (the simulator's
    fleet, a real fleet): ``requests`` and ``tokens`` outstanding per replica (routed, not
    ended; tokens: prompt + output), as the replicas report them, possibly late; and, for
    kv-aware routing, ``cached_tokens(replica, docs, tokens)`` (the prompt tokens the replica
    holds in its cache, possibly late) with ``active`` (the router's own record of the prompts
    each replica serves, ``ActivePrompts``)."""

    requests: Sequence[int]
    tokens: Sequence[int] = ()
    cached_tokens: Callable[[int, Sequence[int], Sequence[int]], int] | None = None
    active: Sequence[ActivePrompts] = ()
    system_prompt_tokens: int = 0


class ActivePrompts:
    """The prompts one replica serves, as Dynamo's ``ActiveSequences`` tracks them: each
    request's documents (shared prefixes: a document path counted once however many requests
    share it) and its query (its own), added when routed; its prompt tokens still to prefill
    (uncached at routing), dropped at its first token; everything dropped when it ends."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple, list] = {}  # document path -> [requests, its last tokens]
        self._requests: dict[int, tuple] = {}  # request -> (paths, own tokens, prefill tokens)
        self.active_tokens = 0  # distinct prompt tokens of the requests served
        self.prefill_tokens = 0  # prompt tokens routed here and not yet prefilled

    def new_tokens(self, docs: Sequence[int], tokens: Sequence[int], own_tokens: int) -> int:
        """Tokens of this prompt not among the served prompts' (Dynamo's ``new_blocks``)."""
        new = own_tokens
        path: tuple = ()
        for doc, n in zip(docs, tokens, strict=True):
            path = (*path, doc)
            if path not in self._prefixes:
                new += n
        return new

    def add(self, request: int, docs: Sequence[int], tokens: Sequence[int], own_tokens: int,
            prefill_tokens: int) -> None:
        paths = []
        path: tuple = ()
        for doc, n in zip(docs, tokens, strict=True):
            path = (*path, doc)
            entry = self._prefixes.get(path)
            if entry is None:
                self._prefixes[path] = [1, n]
                self.active_tokens += n
            else:
                entry[0] += 1
            paths.append(path)
        self.active_tokens += own_tokens
        self.prefill_tokens += prefill_tokens
        self._requests[request] = (paths, own_tokens, prefill_tokens)

    def prefilled(self, request: int) -> None:
        entry = self._requests.get(request)
        if entry is not None and entry[2]:
            self.prefill_tokens -= entry[2]
            self._requests[request] = (entry[0], entry[1], 0)

    def remove(self, request: int) -> None:
        entry = self._requests.pop(request, None)
        if entry is None:
            return
        paths, own, prefill = entry
        self.prefill_tokens -= prefill
        self.active_tokens -= own
        for path in paths:
            counted = self._prefixes[path]
            counted[0] -= 1
            if counted[0] == 0:
                del self._prefixes[path]
                self.active_tokens -= counted[1]


SYSTEM_PROMPT = "system prompt"  # the shared first part of every prompt, as a path key


def prompt_path(request: RouteRequest, system_prompt_tokens: int) -> tuple[list, list]:
    """The request's shared prompt blocks as a path (system prompt first, then its documents)
    with their tokens: what ``ActivePrompts`` counts once however many requests share it."""
    if not system_prompt_tokens:
        return list(request.docs), list(request.tokens)
    return [SYSTEM_PROMPT, *request.docs], [system_prompt_tokens, *request.tokens]


class Router:
    """Chooses a replica for each request, in arrival order. ``loads`` (outstanding requests
    per replica) is given where the driver has a clock, None in a replay; ``state`` (a
    ``FleetState``) where a router needs more of the fleet than its loads."""

    name = "router"
    needs_load = False

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError(f"a fleet needs at least one replica, got {replicas}")
        self.replicas = replicas

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        return request.index % self.replicas


class RandomRouter(Router):
    name = "random"

    def __init__(self, replicas: int, seed: int = 0) -> None:
        super().__init__(replicas)
        self._random = random.Random(seed)

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        return self._random.randrange(self.replicas)


class SessionRouter(Router):
    """Sticky sessions: a stable hash (CRC-32) of the session id, so that a session's requests
    meet the cache its earlier turns filled, and the same id goes to the same replica in every
    run and process."""

    name = "session"

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        if request.session is None:
            return request.index % self.replicas
        return zlib.crc32(request.session.encode()) % self.replicas


class LeastLoaded(Router):
    """Vidur's least outstanding requests (``by="requests"``, the default), or the fewest
    outstanding tokens (``by="tokens"``: prompt + output of the requests routed and not
    ended); ties to the lowest index."""

    name = "least-loaded"
    needs_load = True

    def __init__(self, replicas: int, by: str = "requests") -> None:
        super().__init__(replicas)
        if by not in ("requests", "tokens"):
            raise ValueError(f"least-loaded counts requests or tokens, not {by!r}")
        self.by = by

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        if self.by == "tokens":
            if state is None:
                raise ValueError("least-loaded by tokens needs the replicas' outstanding "
                                 "tokens (the simulator's clock)")
            loads = state.tokens
        if loads is None:
            raise ValueError("least-loaded routing needs the replicas' outstanding requests "
                             "(the simulator's clock), which a replay does not have")
        return min(range(self.replicas), key=lambda r: (loads[r], r))


class KvAware(Router):
    """Dynamo's KV router (see the module's docstring for the cost and its source)."""

    name = "kv-aware"
    needs_load = True

    def __init__(self, replicas: int, *, overlap_score_weight: float = KV_OVERLAP_SCORE_WEIGHT,
                 block_tokens: int = KV_BLOCK_TOKENS, seed: int = 0) -> None:
        super().__init__(replicas)
        self.overlap_score_weight = overlap_score_weight
        self.block_tokens = block_tokens
        self._random = random.Random(seed)

    def logits(self, request: RouteRequest, state: FleetState) -> list[float]:
        """Each replica's cost for this request (lower is better)."""
        block = self.block_tokens
        docs, tokens = prompt_path(request, state.system_prompt_tokens)
        isl = sum(tokens) + request.query_tokens
        out = []
        for r in range(self.replicas):
            cached = state.cached_tokens(r, request.docs, request.tokens)
            overlap_blocks = min(cached, isl) // block
            active = state.active[r]
            prefill_blocks = (active.prefill_tokens + isl - overlap_blocks * block) / block
            decode_blocks = (active.active_tokens
                             + active.new_tokens(docs, tokens, request.query_tokens)) / block
            out.append(self.overlap_score_weight * prefill_blocks + decode_blocks)
        return out

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
        if state is None or state.cached_tokens is None:
            raise ValueError("kv-aware routing needs the replicas' caches and active prompts "
                             "(the simulator's clock), which a replay does not have")
        logits = self.logits(request, state)
        best = min(logits)
        tied = [r for r, value in enumerate(logits) if value == best]
        return tied[0] if len(tied) == 1 else tied[self._random.randrange(len(tied))]


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

    def choose(self, request: RouteRequest, loads: Sequence[int] | None = None,
               state: FleetState | None = None) -> int:
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
    if name == "kv-aware":
        return KvAware(replicas, seed=seed)
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
