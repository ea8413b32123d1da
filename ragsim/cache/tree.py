"""RAGCache's knowledge tree: per-document KV keyed by prefix path, in GPU and host tiers.

A request that retrieved [D1, D2, D3] follows root -> D1 -> D2 -> D3; each node holds the KV of
*that* document at *that* position. Lookup is a prefix match that stops at the first node not
cached, O(h). The query's own tokens are never cached.

Residency rules (checked by ``check_invariants``):

* a node is in GPU memory, in host memory, or nowhere; a GPU node may also keep a host copy,
  because KV is copied to host only the first time it leaves the GPU (swap out only once);
* a node's parent is in a tier at least as fast as the node (GPU nodes are ancestors of host
  nodes), so a cached node's whole prefix is cached;
* eviction takes only leaves of a tier: a GPU node none of whose children is in GPU, a host-only
  node none of whose children is cached; dropping the host copy of a GPU node is always allowed;
  a GPU node that cannot be copied to host is freed with its host-only descendants;
* a pinned node (in use by a running request) is never evicted;
* used bytes never exceed a tier's capacity.

Running requests also need GPU memory the cache cannot reuse (their query, generated tokens,
documents past the cached depth): ``reserve_gpu``/``free_gpu`` take it from the same GPU
capacity, evicting cache as needed, so cache and running requests compete as in a real engine.
``gpu_available_bytes`` is what a new request can still get: capacity minus pinned nodes and
reservations (every unpinned GPU node can be evicted). ``fail_gpu`` models losing the GPU.

The root is the shared system prompt; it stays resident in GPU for the life of the tree.

**Position-free reuse** (``reuse``, a ``ragsim.cache.reuse.ReuseRule``: ``blend:R`` or
``epic:K``; ``prefix``, the default, is RAGCache's tree alone). The tree then also keeps a
document-KV store keyed by document id alone: every node of a document is listed under its id
(``holders``). After the exact prefix match, each later document of the request is looked up
there and, if any node holding it is cached (GPU first, then host), reused at its new position
with the rule's recompute (CacheBlend, EPIC). A document's standalone KV is the KV *kept from
its first prefill* (LMCache's blending stores chunks as its prefills compute them): the store
costs no memory of its own, its entries are the tree's nodes in the tree's tiers, evicted,
pinned and swapped out once by the same rules and policy. A position-free hit pins the node it
reads (and its ancestors, which it keeps resident) while the request runs and counts as a
retrieval of it; its KV is copied into the
request's own path node at the new position (a host copy is read from host, it does not move),
which is admitted as computed, as the engine holds the blended KV there. For PGDSF such a hit
is a cost sample of what it saved: the request's cost per token times the share of the
document it did not recompute (``on_access`` with ``is_cached`` False).

**When KV is written to host** (``host_write``): ``"back"`` (RAGCache; SGLang HiCache's
``write_back``) copies a node the first time the GPU evicts it; ``"through"`` (HiCache's default
``write_through``; vLLM's CPU offloading connector, which stores every computed block) copies it
when it is computed, and a GPU eviction of a node without a host copy (the host could not take
it) frees it without a copy, as HiCache's ``_evict_regular`` does. ``host_evicts_gpu_copies``
False is HiCache's host eviction, which "only evicts the host value of evicted nodes": a host
copy of a node still in GPU is not a candidate (the tree's host candidates are then host-only
leaves); True (the default, and vLLM's CPU LRU, which knows nothing of GPU residency) lets the
host drop such a copy.

An engine that holds real KV per node asks the tree what moved: ``record_moves=True`` makes the
tree log every residency change as a ``Move`` (see ``KnowledgeTree.drain_moves`` for the kinds
and their order guarantees). Off, recording costs one flag test per change and no allocation.

The tree owns structure and residency; a ``TreePolicy`` turns accesses into ``node.value`` and
the tree evicts the lowest ``clock[tier] + value`` among a tier's leaves (ties: least recently
accessed). A node's priority in each tier is set when it is retrieved (the tier's clock then,
plus its value) and only then: moving between tiers or being replicated does not refresh it.
The candidates of each tier live in an indexed binary min-heap (each node knows its
position), so a priority change is one sift and the heaps hold exactly the candidates.

This module is plain Python with Cython annotations ("pure Python mode"): it runs as is, and
the build compiles it to C, which makes a replay several times faster. Keep it valid Python.
The C types of ``Node`` and of the policy hooks (``NodePolicy``) are in tree.pxd, where the
compiled policies cimport them: they read node fields as C members and the tree calls their
hooks through a C vtable, not a Python call per retrieved node.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple

import cython

if TYPE_CHECKING:
    from ragsim.cache.policies.base import TreePolicy

ROOT_KEY = -1

# How the tree counts a node's retrievals (``Node.frequency``), one rule for every policy:
#   admission: since the node last entered the cache; reset when it leaves the cache entirely
#              (in-cache LFU: libCacheSim's LFU and GDSF, Cherkasova's GDSF);
#   lifetime:  every retrieval since the system started, kept on ghost nodes (perfect LFU);
#   window:    retrievals in the last ``frequency_window_s`` seconds of trace time (a sliding
#              window: a retrieval at t counts while now < t + window), kept on ghosts too.
FREQUENCY_SCOPES = ("admission", "lifetime", "window")
# when a node's KV is copied to host: on its first GPU eviction, or when it is computed
HOST_WRITES = ("back", "through")
# The default for every policy. RAGCache defines PGDSF's Frequency as the retrievals in a time
# window "reset when the system starts or the cache is cleared", and a run has neither a
# cache clear nor a stated window, so the count runs over the whole run: lifetime. One default
# for all policies, so a comparison never measures a counting rule instead of a policy.
DEFAULT_FREQUENCY_SCOPE = "lifetime"


def check_frequency_scope(scope: str, window_s: float | None) -> None:
    """Raise ValueError unless ``scope`` is known and a window has (only) what it needs."""
    if scope not in FREQUENCY_SCOPES:
        raise ValueError(f"unknown frequency scope {scope!r}; choose one of "
                         f"{', '.join(FREQUENCY_SCOPES)}")
    if scope == "window":
        if window_s is None or not window_s > 0:
            raise ValueError(f"the window frequency scope needs a window > 0 seconds, "
                             f"got {window_s!r}")
    elif window_s is not None:
        raise ValueError(f"a frequency window applies only to the window scope, not {scope!r}")


class Tier(IntEnum):
    """Where a node's KV lives. A GPU node may also keep a host copy (swap out only once)."""

    NONE = 0
    HOST = 1
    GPU = 2


@cython.no_gc
@cython.cclass
class Node:
    """Tree node: structure, residency, and the policy's metadata.

    A node that left the cache stays in the tree as a *ghost* (tier NONE) so that PGDSF keeps
    its cost statistics over the m requests that computed it, and its retrieval count under
    the lifetime and window frequency scopes (under admission the count restarts).

    Nodes are invisible to the cyclic garbage collector (``no_gc``): a tree holds millions,
    and every full collection walked them all. The parent/children cycles are broken by the
    tree when it is freed (``KnowledgeTree.__dealloc__``), so reference counting frees them.
    """

    # fields (C types in tree.pxd): key, parent, children, depth, tokens, size_bytes, in_gpu,
    # host_copy, gpu_children, cached_children, pins, frequency, total_cost, num_computed,
    # value, last_access, priority_gpu, priority_host; gpu_pos/host_pos (-1: not a candidate)

    def __init__(self, key: cython.longlong, parent: object, tokens: cython.longlong,
                 size_bytes: cython.longlong) -> None:
        _set_fields(self, key, parent, tokens, size_bytes)

    @property
    def tier(self) -> Tier:
        if self.in_gpu:
            return Tier.GPU
        if self.host_copy:
            return Tier.HOST
        return Tier.NONE

    @property
    def cached(self) -> bool:
        return self.in_gpu or self.host_copy

    @property
    def avg_cost_per_token_s(self) -> float:
        return self.total_cost / self.num_computed if self.num_computed else 0.0

    def path_keys(self) -> list[int]:
        keys = []
        node = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return keys[::-1]

    def __repr__(self) -> str:
        return (f"Node({self.path_keys()}, {self.tier.name}, tokens={self.tokens}, "
                f"freq={self.frequency}, value={self.value:.6g})")


@cython.cfunc
@cython.exceptval(-1)
def _set_fields(n: Node, key: object, parent: object, tokens: cython.longlong,
                size_bytes: cython.longlong) -> cython.int:
    n.key = key
    n.parent = parent
    n.children = None
    n.depth = 0 if parent is None else cython.cast(Node, parent).depth + 1
    n.tokens = tokens
    n.size_bytes = size_bytes
    n.in_gpu = False
    n.host_copy = False
    n.gpu_children = 0
    n.cached_children = 0
    n.pins = 0
    n.frequency = 0
    n.total_cost = 0.0
    n.num_computed = 0
    n.value = 0.0
    n.last_access = 0
    n.priority_gpu = 0.0
    n.priority_host = 0.0
    n.gpu_pos = -1
    n.host_pos = -1
    return 0


@cython.cfunc
def _new_node(key: object, parent: Node, tokens: cython.longlong,
              size_bytes: cython.longlong) -> Node:
    """``Node(key, parent, tokens, size_bytes)`` without argument parsing (the hot path)."""
    n: Node = Node.__new__(Node)
    _set_fields(n, key, parent, tokens, size_bytes)
    return n


@cython.cclass
class NodePolicy:
    """The per-node hooks of a replacement policy: what the tree calls for each retrieval.

    ``ragsim.cache.policies.base.TreePolicy`` derives from it and is what policies implement;
    the hooks are declared here, with the node, so that a compiled policy overrides them in C
    (see tree.pxd) and the tree calls them without a Python call per node. A policy written in
    plain Python overrides them as usual and is called through Python.
    """

    @cython.annotation_typing(False)
    def on_access(self, node: Node, is_cached: bool, cost_per_token_s: float,
                  request_index: int, depth: int) -> None:
        """Called once per retrieval of ``node`` (after frequency and recency were updated):
        set ``node.value``. ``is_cached``: the request found it cached; ``cost_per_token_s``:
        the request's prefill time per uncached token, T(a, b) / b (or T(a, b) itself for a
        policy with ``cost_per_request``), 0 if the tree has no cost model; ``depth``: 1 for
        the request's first document."""
        raise NotImplementedError

    @cython.annotation_typing(False)
    def value_of(self, node: Node) -> float:
        """``node``'s value from its current state; the tree calls it when a node's count
        changes without a retrieval (a retrieval left the frequency window). Policies whose
        value does not depend on the count keep the value they have."""
        return node.value

    @cython.annotation_typing(False)
    def on_enter_cache(self, node: Node, seq: int) -> None:
        """Called when a node goes from nowhere into a tier (only for policies that set
        ``tracks_cache_entry``)."""


# The kinds of residency change the tree reports (``KnowledgeTree.drain_moves``). Each names one
# change of a node's (in GPU, host copy) pair; "before -> after" as (GPU, host):
MOVE_KINDS = (
    "admit_gpu",  # (no, no) -> (yes, no): the request computed it; store its new KV in GPU
    "swap_in",  # (no, yes) -> (yes, yes): host hit, copy host -> GPU; the host copy stays
    "swap_out",  # (yes, no) -> (yes, yes): copy GPU -> host (first departure; free_gpu follows;
    #              write-through: right after the node's admit_gpu, and it stays in GPU)
    "free_gpu",  # (yes, yes) -> (no, yes): free the GPU copy, the host copy remains
    "free_host",  # (yes, yes) -> (yes, no): free the host copy, the GPU copy stays
    "drop",  # (yes, no) or (no, yes) -> (no, no): free the only copy; the node is a ghost
    "replicate",  # (yes, no) -> (yes, yes): copy GPU -> host now (replicate_upper_nodes)
    "fail_gpu",  # (yes, *) -> (no, *): the GPU copy was lost with the GPU (fail_gpu)
)


class Move(NamedTuple):
    """One residency change of one node; ``kind`` is one of ``MOVE_KINDS``."""

    kind: str
    node: Node


_tuple_new = tuple.__new__  # builds a Move at C speed (the recording hot path)


class AccessResult(NamedTuple):
    """What one request found and caused. Token counts exclude the system prompt and query."""

    cached_tokens: int  # alpha: system prompt + documents hit (both tiers)
    new_tokens: int  # beta: documents recomputed + query
    hit_tokens_gpu: int
    hit_tokens_host: int
    recomputed_tokens: int
    swap_in_bytes: int
    path: list  # nodes of the request's cacheable prefix, root excluded
    # position-free reuse: documents after the exact prefix found elsewhere in the store
    free_hit_tokens_gpu: int = 0
    free_hit_tokens_host: int = 0
    free_recompute_tokens: int = 0  # of those, what the rule recomputes
    free_nodes: list | tuple = ()  # the nodes they were read from (pinned with the path)


@cython.final
@cython.no_gc_clear
@cython.cclass
class KnowledgeTree:
    """Prefix tree of document KV with GPU/host tiers and a pluggable replacement policy.

    ``no_gc_clear``: when the collector frees a tree caught in a reference cycle, its fields
    must still be there for ``__dealloc__`` to unlink its nodes, which the collector does not
    see (``Node`` is ``no_gc``).
    """

    policy = cython.declare(object, visibility="public")
    root = cython.declare(Node, visibility="public")
    prefill_cost_s = cython.declare(object, visibility="public")
    max_cached_depth = cython.declare(object, visibility="public")
    kv_bytes_per_token = cython.declare(cython.longlong, visibility="public")
    gpu_capacity_bytes = cython.declare(cython.longlong, visibility="public")
    host_capacity_bytes = cython.declare(cython.longlong, visibility="public")
    system_prompt_tokens = cython.declare(cython.longlong, visibility="public")
    gpu_used_bytes = cython.declare(cython.longlong, visibility="public")
    host_used_bytes = cython.declare(cython.longlong, visibility="public")
    clock_gpu = cython.declare(cython.double, visibility="public")
    clock_host = cython.declare(cython.double, visibility="public")
    evictions_gpu = cython.declare(cython.longlong, visibility="public")
    evictions_host = cython.declare(cython.longlong, visibility="public")
    swap_in_bytes = cython.declare(cython.longlong, visibility="public")
    swap_out_bytes = cython.declare(cython.longlong, visibility="public")
    replica_bytes = cython.declare(cython.longlong, visibility="public")
    dropped_bytes = cython.declare(cython.longlong, visibility="public")
    admission_failures = cython.declare(cython.longlong, visibility="public")
    pinned_gpu_bytes = cython.declare(cython.longlong, visibility="public")
    reserved_gpu_bytes = cython.declare(cython.longlong, visibility="public")
    gpu_failures = cython.declare(cython.longlong, visibility="public")
    node_count = cython.declare(cython.longlong, visibility="public")
    record_moves = cython.declare(cython.bint, visibility="readonly")
    _moves = cython.declare(list)  # Moves since the last drain; None unless recording
    _heap_gpu = cython.declare(list)
    _heap_host = cython.declare(list)
    _set_aside = cython.declare(list)
    _gpu_upper = cython.declare(dict)  # key -> first-level GPU node: replication's candidates
    _seq = cython.declare(cython.longlong)
    _use_cost = cython.declare(cython.bint)
    _cost_per_request = cython.declare(cython.bint)
    _uses_clock = cython.declare(cython.bint)
    _forget_on_drop = cython.declare(cython.bint)
    _windowed = cython.declare(cython.bint)
    _window_s = cython.declare(cython.double)
    _now_s = cython.declare(cython.double)
    _retrievals = cython.declare(object)  # window scope: deque of (time, node), oldest first
    _hooks = cython.declare(NodePolicy)  # the policy, as the tree calls it per node
    _tracks_entry = cython.declare(cython.bint)
    frequency_scope = cython.declare(str, visibility="readonly")
    frequency_window_s = cython.declare(object, visibility="readonly")
    host_write = cython.declare(str, visibility="readonly")
    host_evicts_gpu_copies = cython.declare(cython.bint, visibility="readonly")
    _write_through = cython.declare(cython.bint)
    reuse = cython.declare(object, visibility="readonly")  # a ReuseRule
    _free = cython.declare(cython.bint)  # position-free reuse on
    _holders = cython.declare(dict)  # document id -> its nodes, oldest first (the store)
    _r_free_gpu = cython.declare(cython.longlong)
    _r_free_host = cython.declare(cython.longlong)
    _r_free_recompute = cython.declare(cython.longlong)
    _r_free_nodes = cython.declare(list)
    # results of the last request served (``access`` packs them into an AccessResult)
    _r_alpha = cython.declare(cython.longlong)
    _r_beta = cython.declare(cython.longlong)
    _r_hit_gpu = cython.declare(cython.longlong)
    _r_hit_host = cython.declare(cython.longlong)
    _r_recomputed = cython.declare(cython.longlong)
    _r_swap_in = cython.declare(cython.longlong)

    def __init__(
        self,
        policy: TreePolicy,
        *,
        gpu_capacity_bytes: int,
        host_capacity_bytes: int = 0,
        kv_bytes_per_token: int,
        prefill_cost_s: Callable[[float, float], float] | None = None,
        system_prompt_tokens: int = 0,
        max_cached_depth: int | None = None,
        frequency_scope: str = DEFAULT_FREQUENCY_SCOPE,
        frequency_window_s: float | None = None,
        record_moves: bool = False,
        host_write: str = "back",
        host_evicts_gpu_copies: bool = True,
        reuse: object = None,
    ) -> None:
        from ragsim.cache.reuse import PREFIX, parse_reuse

        if not isinstance(policy, NodePolicy):
            raise TypeError(f"the tree's policy must be a TreePolicy, not {type(policy).__name__}")
        check_frequency_scope(frequency_scope, frequency_window_s)
        if host_write not in HOST_WRITES:
            raise ValueError(f"host_write must be one of {', '.join(HOST_WRITES)}")
        if gpu_capacity_bytes < 0 or host_capacity_bytes < 0:
            raise ValueError("capacities must be >= 0")
        if kv_bytes_per_token <= 0:
            raise ValueError("kv_bytes_per_token must be > 0")
        if max_cached_depth is not None and max_cached_depth < 0:
            raise ValueError("max_cached_depth must be >= 0")
        root_bytes = system_prompt_tokens * kv_bytes_per_token
        if root_bytes > gpu_capacity_bytes:
            raise ValueError(
                f"the system prompt's KV ({root_bytes} bytes) does not fit in GPU memory "
                f"({gpu_capacity_bytes} bytes)")
        self.policy = policy
        self.kv_bytes_per_token = kv_bytes_per_token
        self.gpu_capacity_bytes = gpu_capacity_bytes
        self.host_capacity_bytes = host_capacity_bytes
        self.prefill_cost_s = prefill_cost_s
        self.max_cached_depth = max_cached_depth
        self.system_prompt_tokens = system_prompt_tokens
        self.root = Node(ROOT_KEY, None, system_prompt_tokens, root_bytes)
        self.root.in_gpu = True
        self.root.pins = 1  # the shared system prompt stays resident
        self._gpu_upper = {}
        self.gpu_used_bytes = root_bytes
        self.pinned_gpu_bytes = root_bytes
        self.reserved_gpu_bytes = 0
        self.gpu_failures = 0
        self.host_used_bytes = 0
        self.clock_gpu = 0.0
        self.clock_host = 0.0
        self._heap_gpu = []
        self._heap_host = []
        self._set_aside = []
        self._seq = 0
        self._use_cost = prefill_cost_s is not None
        self._cost_per_request = bool(policy.cost_per_request)
        self._uses_clock = bool(policy.uses_clock)
        self.frequency_scope = frequency_scope
        self.frequency_window_s = frequency_window_s
        self.host_write = host_write
        self._write_through = host_write == "through"
        self.host_evicts_gpu_copies = bool(host_evicts_gpu_copies)
        self._forget_on_drop = frequency_scope == "admission"
        self._windowed = frequency_scope == "window"
        self._window_s = frequency_window_s if self._windowed else 0.0
        self._now_s = -float("inf")
        self._retrievals = deque()
        self._hooks = policy
        # most policies ignore entry into the cache: skip a million no-op calls for them
        self._tracks_entry = bool(policy.tracks_cache_entry)
        self.evictions_gpu = 0
        self.evictions_host = 0
        self.swap_in_bytes = 0
        self.swap_out_bytes = 0
        self.replica_bytes = 0
        self.dropped_bytes = 0
        self.admission_failures = 0
        self.node_count = 1
        self.record_moves = bool(record_moves)
        self._moves = [] if self.record_moves else None
        self.reuse = PREFIX if reuse is None else parse_reuse(reuse)
        self._free = self.reuse.position_free
        self._holders = {}
        self._r_free_nodes = []

    def __dealloc__(self) -> None:
        """Break the parent/children cycles so a discarded tree is freed at once.

        Without this, every node waits for the cyclic collector, which a replay pauses: a
        second replay in the same process would run beside a million dead nodes.
        """
        self._unlink_all()

    @cython.cfunc
    def _unlink_all(self) -> cython.void:
        if self.root is None:
            return
        stack: list = [self.root]
        n: Node
        while stack:
            n = stack.pop()
            if n.children is not None:
                stack.extend(n.children.values())
                n.children = None
            n.parent = None
        self._heap_gpu = []
        self._heap_host = []

    # ------------------------------------------------------------------ lookup / access
    def match_prefix(self, doc_ids: Sequence[int]) -> tuple[int, int, int]:
        """(documents matched, of them in GPU, in host) without changing anything."""
        node: Node = self.root
        child: Node
        gpu: cython.Py_ssize_t = 0
        host: cython.Py_ssize_t = 0
        limit: cython.Py_ssize_t = self._depth_limit(len(doc_ids))
        i: cython.Py_ssize_t
        for i in range(limit):
            if node.children is None:
                break
            found = node.children.get(doc_ids[i])
            if found is None:
                break
            child = found
            if child.in_gpu:
                gpu += 1
            elif child.host_copy:
                host += 1
            else:
                break
            node = child
        return gpu + host, gpu, host

    def cached_prefix_tokens(self, doc_ids: Sequence[int], doc_tokens: Sequence[int]) -> int:
        """Tokens of the request's context that are cached now (system prompt included)."""
        matched, _, _ = self.match_prefix(doc_ids)
        return self.system_prompt_tokens + sum(doc_tokens[:matched])

    @cython.cfunc
    def _depth_limit(self, n_docs: cython.Py_ssize_t) -> cython.Py_ssize_t:
        if self.max_cached_depth is None:
            return n_docs
        cap: cython.Py_ssize_t = self.max_cached_depth
        return n_docs if n_docs < cap else cap

    def access(
        self,
        doc_ids: Sequence[int],
        doc_tokens: Sequence[int],
        query_tokens: int = 0,
        *,
        request_index: int = -1,
        keep_pinned: bool = False,
        now_s: float | None = None,
    ) -> AccessResult:
        """Serve one request's retrieval: look up, update policy state, admit what it computed.

        With ``keep_pinned`` the request's path stays pinned until ``release(result.path)``, as
        a running request's KV must (the simulator uses this); replay releases at once.
        ``now_s`` is the request's time (trace or simulated seconds, never decreasing); the
        window frequency scope needs it, the other scopes ignore it.
        """
        ids = doc_ids if type(doc_ids) is list else list(doc_ids)
        tokens = doc_tokens if type(doc_tokens) is list else list(doc_tokens)
        if self._windowed:
            if now_s is None:
                raise ValueError("the window frequency scope needs each access's time (now_s)")
            self._advance(now_s)
        path = self._serve(ids, tokens, 0, len(ids), query_tokens, request_index, keep_pinned)
        if not self._free:
            return AccessResult(self._r_alpha, self._r_beta, self._r_hit_gpu, self._r_hit_host,
                                self._r_recomputed, self._r_swap_in, path)
        return AccessResult(self._r_alpha, self._r_beta, self._r_hit_gpu, self._r_hit_host,
                            self._r_recomputed, self._r_swap_in, path, self._r_free_gpu,
                            self._r_free_host, self._r_free_recompute, self._r_free_nodes)

    def access_many(self, doc_ids: list, doc_tokens: list,
                    doc_offsets: cython.const[cython.longlong][:],
                    query_tokens: cython.const[cython.longlong][:], start: cython.Py_ssize_t,
                    stop: cython.Py_ssize_t, out: cython.longlong[:, :],
                    arrival_s: cython.const[cython.double][:] | None = None) -> None:
        """Serve requests ``start..stop-1`` of a CSR-encoded trace, one after another.

        ``doc_offsets`` (int64, n_requests + 1), ``query_tokens`` and ``arrival_s`` (float64)
        are the whole trace's columns; ``doc_ids`` and ``doc_tokens`` hold only these
        requests' documents, from position ``doc_offsets[start]`` on, so that a caller going
        through a long trace in chunks keeps one chunk of Python ints alive, not the trace's.
        ``out`` (int64, shape (5, n_requests)) receives, per request: cached tokens, GPU-hit
        tokens, host-hit tokens, recomputed tokens, swapped-in bytes; with position-free reuse
        (shape (8, n_requests)) also its position-free GPU and host hit tokens and the tokens
        of them recomputed. This is ``access`` in a loop without per-request Python objects,
        for replay. ``arrival_s`` (per request) is needed by the window frequency scope.
        """
        i: cython.Py_ssize_t
        base: cython.Py_ssize_t = doc_offsets[start]
        if self._windowed and arrival_s is None:
            raise ValueError("the window frequency scope needs the requests' arrival times")
        if len(doc_ids) < doc_offsets[stop] - base or len(doc_tokens) < len(doc_ids):
            raise ValueError("doc_ids and doc_tokens must hold the requests' documents")
        if self._free and out.shape[0] < 8:
            raise ValueError("position-free reuse reports 8 rows per request")
        for i in range(start, stop):
            if self._windowed:
                self._advance(arrival_s[i])
            self._serve(doc_ids, doc_tokens, doc_offsets[i] - base, doc_offsets[i + 1] - base,
                        query_tokens[i], i, False)
            out[0, i] = self._r_alpha
            out[1, i] = self._r_hit_gpu
            out[2, i] = self._r_hit_host
            out[3, i] = self._r_recomputed
            out[4, i] = self._r_swap_in
            if self._free:
                out[5, i] = self._r_free_gpu
                out[6, i] = self._r_free_host
                out[7, i] = self._r_free_recompute

    @cython.ccall
    def _serve(self, doc_ids: list, doc_tokens: list, lo: cython.Py_ssize_t,
               hi: cython.Py_ssize_t, query_tokens: cython.longlong,
               request_index: cython.longlong, keep_pinned: cython.bint) -> list:
        """The request's documents are ``doc_ids[lo:hi]``; results land in ``self._r_*``."""
        n_docs: cython.Py_ssize_t = hi - lo
        depth_limit: cython.Py_ssize_t = lo + self._depth_limit(n_docs)
        kv: cython.longlong = self.kv_bytes_per_token
        path: list = []
        hit_gpu: cython.longlong = 0
        hit_host: cython.longlong = 0
        swap_in: cython.longlong = 0
        recomputed: cython.longlong = 0
        node: Node = self.root
        child: Node
        n: Node
        i: cython.Py_ssize_t = lo
        tokens: cython.longlong
        ghost: object = None  # the node where the match stopped, if it exists uncached
        # 1. prefix match over cached nodes
        while i < depth_limit:
            if node.children is None:
                break
            found = node.children.get(doc_ids[i])
            if found is None:
                break
            child = found
            if child.in_gpu:
                hit_gpu += child.tokens
            elif child.host_copy:
                hit_host += child.tokens
                swap_in += child.size_bytes
            else:
                ghost = child
                break
            path.append(child)
            node = child
            i += 1
        n_cached: cython.Py_ssize_t = i - lo
        # 2. nodes for the documents to compute (ghosts are reused, new ones created); the
        # first was looked up by the match already, and a new node's children are all new
        while i < depth_limit:
            if ghost is not None:
                child = ghost
                ghost = None
            else:
                key = doc_ids[i]
                if node.children is None:
                    node.children = {}
                    found = None
                else:
                    found = node.children.get(key)
                if found is None:
                    tokens = doc_tokens[i]
                    child = _new_node(key, node, tokens, tokens * kv)
                    node.children[key] = child
                    self.node_count += 1
                    if self._free:  # the store lists every node of a document
                        holders = self._holders.get(key)
                        if holders is None:
                            self._holders[key] = [child]
                        else:
                            holders.append(child)
                else:
                    child = found
            path.append(child)
            node = child
            i += 1
        free_nodes: list = []
        free_depths: list = []
        free_gpu: cython.longlong = 0
        free_host: cython.longlong = 0
        free_recompute: cython.longlong = 0
        if self._free:
            # 2b. every later document found at any position (the store), else computed
            for i in range(lo + n_cached, hi):
                tokens = doc_tokens[i]
                found = self._holder(doc_ids[i])
                if found is None:
                    recomputed += tokens
                    continue
                n = found
                if n.in_gpu:
                    free_gpu += tokens
                else:
                    free_host += tokens
                    swap_in += n.size_bytes
                free_recompute += self.reuse.recompute_tokens(tokens)
                free_nodes.append(n)
                free_depths.append(i - lo + 1)
        else:
            for i in range(lo + n_cached, hi):
                recomputed += cython.cast(cython.longlong, doc_tokens[i])
        alpha: cython.longlong = self.system_prompt_tokens + hit_gpu + hit_host
        beta: cython.longlong = recomputed + query_tokens
        cost_per_token: cython.double = 0.0
        n_path: cython.Py_ssize_t = len(path)
        # what the engine computes: with position-free hits, also their recomputed tokens
        cost_alpha: cython.longlong = alpha + free_gpu + free_host - free_recompute
        cost_beta: cython.longlong = beta + free_recompute
        if self._use_cost and (n_cached < n_path or free_nodes) and cost_beta > 0:
            cost_per_token = self.prefill_cost_s(cost_alpha, cost_beta)
            if not self._cost_per_request:
                cost_per_token /= cost_beta
        # 3. policy update (Algorithm 1: UPDATE_NODE_IN_GPU for every node retrieved)
        hooks: NodePolicy = self._hooks
        depth: cython.Py_ssize_t
        for depth in range(n_path):
            n = cython.cast(Node, path[depth])
            self._seq += 1
            n.frequency += 1
            if self._windowed:
                self._retrievals.append((self._now_s, n))
            n.last_access = self._seq
            n.pins += 1
            if n.pins == 1 and n.in_gpu:
                self.pinned_gpu_bytes += n.size_bytes
            hooks.on_access(n, depth < n_cached, cost_per_token, request_index, depth + 1)
            if depth < n_cached:
                n.priority_gpu = self.clock_gpu + n.value
                n.priority_host = self.clock_host + n.value
                self._sync(n, True)
        if free_nodes:
            self._touch_free(free_nodes, free_depths, doc_tokens, lo, cost_per_token,
                             request_index)
        # 4. admission into GPU, top-down, stopping at the first node that cannot be placed
        parent: Node
        rest: cython.Py_ssize_t
        for depth in range(n_path):
            n = cython.cast(Node, path[depth])
            if n.in_gpu:
                continue
            if not self._make_room(True, n.size_bytes):
                self.admission_failures += 1
                if self._forget_on_drop:  # counted from admission: never admitted, no count
                    for rest in range(depth, n_path):
                        n = cython.cast(Node, path[rest])
                        if not n.in_gpu and not n.host_copy:
                            n.frequency = 0
                break
            parent = n.parent
            if depth >= n_cached:  # newly computed
                self._seq += 1
                if self._tracks_entry:
                    hooks.on_enter_cache(n, self._seq)
                n.priority_gpu = self.clock_gpu + n.value
                n.priority_host = self.clock_host + n.value
                parent.cached_children += 1
            n.in_gpu = True
            if self.record_moves:
                self._note("admit_gpu" if depth >= n_cached else "swap_in", n)
            if n.depth == 1:
                self._gpu_upper[n.key] = n
            self.gpu_used_bytes += n.size_bytes
            self.pinned_gpu_bytes += n.size_bytes  # on the request's path, so pinned
            parent.gpu_children += 1
            self._sync(n)
            self._sync(parent)
            if self._write_through and depth >= n_cached:
                self._write_to_host(n)
        self.swap_in_bytes += swap_in
        if not keep_pinned:
            self.release(path)
            if free_nodes:
                self.release_read(free_nodes)
        self._r_free_gpu = free_gpu
        self._r_free_host = free_host
        self._r_free_recompute = free_recompute
        self._r_free_nodes = free_nodes
        self._r_alpha = alpha
        self._r_beta = beta
        self._r_hit_gpu = hit_gpu
        self._r_hit_host = hit_host
        self._r_recomputed = recomputed
        self._r_swap_in = swap_in
        return path

    @cython.cfunc
    def _holder(self, key: object) -> object:
        """The store's node for document ``key`` to read: a GPU one if any, else a host one
        (the oldest of each: a deterministic choice), else None."""
        holders = self._holders.get(key)
        if holders is None:
            return None
        n: Node
        host: object = None
        for item in cython.cast(list, holders):
            n = item
            if n.in_gpu:
                return n
            if host is None and n.host_copy:
                host = n
        return host

    @cython.cfunc
    @cython.exceptval(-1)
    def _touch_free(self, free_nodes: list, free_depths: list, doc_tokens: list,
                    lo: cython.Py_ssize_t, cost_per_token: cython.double,
                    request_index: cython.longlong) -> cython.int:
        """A retrieval of every node read position-free: counted, pinned, and for PGDSF a
        cost sample of what it saved (the request's cost per token, times the share of the
        document not recomputed)."""
        hooks: NodePolicy = self._hooks
        n: Node
        k: cython.Py_ssize_t
        tokens: cython.longlong
        saved: cython.double
        depth: cython.Py_ssize_t
        for k in range(len(free_nodes)):
            n = cython.cast(Node, free_nodes[k])
            depth = free_depths[k]
            tokens = doc_tokens[lo + depth - 1]
            saved = cost_per_token
            if tokens > 0:
                saved = cost_per_token * (tokens - self.reuse.recompute_tokens(tokens)) / tokens
            self._seq += 1
            n.frequency += 1
            if self._windowed:
                self._retrievals.append((self._now_s, n))
            n.last_access = self._seq
            self._pin_chain(n, 1)
            hooks.on_access(n, False, saved, request_index, depth)
            n.priority_gpu = self.clock_gpu + n.value
            n.priority_host = self.clock_host + n.value
            self._sync(n, True)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _pin_chain(self, n: Node, delta: cython.int) -> cython.int:
        """Pin (``delta`` 1) or unpin (-1) a node read position-free *and its ancestors*: a
        pinned node keeps its parents resident (eviction takes only leaves), so they must count
        as pinned too, or ``gpu_available_bytes`` would promise memory that cannot be freed."""
        m: Node = n
        while m.depth > 0:
            m.pins += delta
            if m.in_gpu and ((delta > 0 and m.pins == 1) or (delta < 0 and m.pins == 0)):
                self.pinned_gpu_bytes += m.size_bytes if delta > 0 else -m.size_bytes
            m = m.parent
        return 0

    def release_read(self, nodes: Sequence) -> None:
        """Unpin the nodes a request read position-free (``AccessResult.free_nodes``), with
        their ancestors, once it no longer needs their KV."""
        for item in nodes:
            self._pin_chain(item, -1)

    def holders(self, doc_id: int) -> list:
        """The store's nodes of document ``doc_id`` (every node of it, cached or not; empty
        unless position-free reuse is on)."""
        return list(self._holders.get(doc_id, ()))

    @cython.ccall
    def _advance(self, now_s: cython.double) -> cython.void:
        """Window scope: move time to ``now_s`` and forget the retrievals that left the window.

        A node whose count drops gets its value recomputed by the policy, and both tier
        priorities follow: a priority is the tier's clock at the node's last retrieval plus
        its value, so it becomes ``priority - old value + new value`` and the heaps are
        re-sifted. The global FIFO of retrievals is expired lazily, once per request.
        """
        if now_s < self._now_s:
            raise ValueError(f"access times must not decrease: {now_s} after {self._now_s}")
        self._now_s = now_s
        cutoff: cython.double = now_s - self._window_s
        retrievals = self._retrievals
        hooks: NodePolicy = self._hooks
        n: Node
        old: cython.double
        new: cython.double
        while retrievals and retrievals[0][0] <= cutoff:
            n = cython.cast(Node, retrievals.popleft()[1])
            n.frequency -= 1
            old = n.value
            new = hooks.value_of(n)
            if new != old:
                n.value = new
                n.priority_gpu = n.priority_gpu - old + new
                n.priority_host = n.priority_host - old + new
                self._sync(n, True)

    @cython.ccall
    def release(self, path: list) -> cython.void:
        """Unpin a request's nodes once it no longer needs their KV."""
        n: Node
        for item in path:
            n = item
            n.pins -= 1
            if n.pins == 0 and n.in_gpu:
                self.pinned_gpu_bytes -= n.size_bytes

    # ------------------------------------------------------------------ residency moves
    def drain_moves(self) -> list:
        """The residency changes since the last drain, oldest first, as ``Move(kind, node)``.

        For an engine that keeps real KV per node in a GPU pool and a host pool: applying the
        moves in order keeps its pools equal to the tree's ``in_gpu``/``host_copy`` for every
        node, and never needs more memory than the tree's capacities. A node is never removed
        from the tree (one that left the cache stays as a ghost), so it is a stable key for the
        engine's pools. Guarantees:

        * exactly one move per change of a node's ``in_gpu`` or ``host_copy``, in the order
          the tree decided them, which is the order an engine applies them (the one exception
          to the tree's own order: an evicted node's ``free_gpu`` follows its ``swap_out``);
          kinds and their before/after states are in ``MOVE_KINDS``;
        * room first: the moves that free a tier's memory come before the move that uses it.
          Within a request, the evictions that make room for a node come before its
          ``swap_in`` or ``admit_gpu``, nodes are admitted top-down (parent before child),
          and host evictions that make room for a swap-out come before that ``swap_out``;
        * copy before free: a node's ``swap_out`` comes immediately before its ``free_gpu``
          (swap out only once: a node that still has a host copy gets only ``free_gpu``);
          with ``host_write="through"`` a computed node's ``swap_out`` follows its
          ``admit_gpu`` instead (its KV is copied once the prefill has computed it; the real
          engines do not run write-through yet, ``ragsim.simulate`` refuses it for them);
        * ``drop`` frees a node's only copy; when a GPU node that the host cannot take is
          dropped, its host-only descendants' drops follow it;
        * ``admit_gpu`` means "the request computes this node's KV and the engine keeps it in
          GPU": the tree decides before the prefill, the engine stores the KV after it. A node
          of the request's path that could not be admitted (``admission_failures``) has no
          move: a host hit is then read from host memory where it stays, a computed node's KV
          is the request's private memory and is not kept;
        * ``fail_gpu`` reports each GPU node (root excluded: it is restored from its replica)
          that lost its KV, then ``drop`` for the host copies below lost nodes;
        * reservations (``reserve_gpu``/``free_gpu`` methods) move no node, but the evictions
          ``reserve_gpu`` makes are reported like any other.

        Raises ValueError unless the tree was made with ``record_moves=True`` (a driver that
        expects moves must never silently get none).
        """
        if not self.record_moves:
            raise ValueError("this tree does not record moves: make it with record_moves=True")
        moves = self._moves
        self._moves = []
        return moves

    @property
    def pending_moves(self) -> int:
        """How many moves wait for ``drain_moves`` (always 0 when not recording)."""
        return len(self._moves) if self.record_moves else 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _note(self, kind: str, n: Node) -> cython.int:
        """Log one residency change; callers test ``record_moves`` first (no cost when off)."""
        self._moves.append(_tuple_new(Move, (kind, n)))  # Move(kind, n) without its __new__
        return 0

    # ------------------------------------------------------------------ running requests
    @property
    def gpu_available_bytes(self) -> int:
        """GPU bytes a new request can still obtain: free plus evictable (unpinned) cache."""
        return self.gpu_capacity_bytes - self.pinned_gpu_bytes - self.reserved_gpu_bytes

    def reserve_gpu(self, n_bytes: int) -> bool:
        """Take ``n_bytes`` of GPU memory for a running request's private KV.

        Evicts cache (lowest priority first) as needed. False, with nothing changed, when
        pinned nodes and other reservations leave too little.
        """
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        if n_bytes > self.gpu_available_bytes:
            return False
        if not self._make_room(True, n_bytes):  # cannot happen: unpinned GPU nodes can go
            raise AssertionError("unpinned cache could not be evicted")
        self.gpu_used_bytes += n_bytes
        self.reserved_gpu_bytes += n_bytes
        return True

    def free_gpu(self, n_bytes: int) -> None:
        """Give back what ``reserve_gpu`` took."""
        if n_bytes < 0 or n_bytes > self.reserved_gpu_bytes:
            raise ValueError(f"cannot free {n_bytes} of {self.reserved_gpu_bytes} reserved bytes")
        self.gpu_used_bytes -= n_bytes
        self.reserved_gpu_bytes -= n_bytes

    def replicate_upper_nodes(self, max_nodes: int) -> int:
        """Give the ``max_nodes`` most retrieved first-level GPU nodes a host copy now.

        RAGCache's fault tolerance: the upper nodes are the most shared, so keeping host
        replicas of them lets a failed GPU recover them with a copy instead of a prefill. A
        replica is the same host copy swap-out-only-once makes (a later GPU eviction copies
        nothing); it takes host memory like any host node and can be evicted like one.
        Returns the bytes copied (GPU->host), also added to ``replica_bytes``.
        """
        if max_nodes <= 0 or not self._gpu_upper:
            return 0
        n: Node
        # the GPU's first-level nodes are kept aside: the root's children are every document
        # ever seen (ghosts too), and scanning them every period dominated long runs
        candidates = list(self._gpu_upper.values())
        candidates.sort(key=lambda item: (-item.frequency, -item.last_access))
        copied: cython.longlong = 0
        held: list = []  # pinned while this runs, so one replica never evicts another
        for item in candidates[:max_nodes]:
            n = item
            n.pins += 1
            if n.pins == 1:
                self.pinned_gpu_bytes += n.size_bytes
            held.append(n)
            if n.host_copy:
                continue
            if not self._make_room(False, n.size_bytes):
                break
            n.host_copy = True
            if self.record_moves:
                self._note("replicate", n)
            self.host_used_bytes += n.size_bytes
            self._sync(n)  # host priority as of its last retrieval, as for a swap-out
            copied += n.size_bytes
        self.release(held)
        self.replica_bytes += copied
        return copied

    def fail_gpu(self) -> int:
        """The GPU failed: every GPU node loses its KV; returns the bytes that are gone for good.

        Nodes with a host copy survive in host memory; the rest become ghosts, and host copies
        below a lost node go too (the prefix property: their KV depends on it). The root (the
        system prompt) is recovered from its host replica and stays resident; the caller
        charges that copy. Running requests must have released their paths and reservations.
        """
        if self.pinned_gpu_bytes != self.root.size_bytes or self.reserved_gpu_bytes:
            raise ValueError("release running requests' paths and reservations first")
        lost: cython.longlong = 0
        n: Node
        child: Node
        parent: Node
        gpu_nodes: list = []
        stack: list = [self.root]
        while stack:  # phase 1: nothing stays in GPU but the root
            n = stack.pop()
            if n.gpu_children and n.children is not None:
                for item in n.children.values():
                    child = item
                    if child.in_gpu:
                        stack.append(child)
                        gpu_nodes.append(child)
        for item in gpu_nodes:
            n = item
            parent = n.parent
            n.in_gpu = False
            if self.record_moves:
                self._note("fail_gpu", n)
            self.gpu_used_bytes -= n.size_bytes
            parent.gpu_children -= 1
            if not n.host_copy:
                parent.cached_children -= 1
                if self._forget_on_drop:
                    n.frequency = 0
                lost += n.size_bytes
        self._gpu_upper.clear()
        for item in gpu_nodes:  # phase 2: host copies below a lost node are invalid
            n = item
            if n.host_copy or n.children is None:
                continue
            stack = [n]
            while stack:
                parent = stack.pop()
                if parent.children is None:
                    continue
                for child_item in parent.children.values():
                    child = child_item
                    if child.in_gpu or not child.host_copy:
                        continue  # lost children without a copy get their own turn
                    child.host_copy = False
                    if self.record_moves:
                        self._note("drop", child)
                    self.host_used_bytes -= child.size_bytes
                    self.dropped_bytes += child.size_bytes
                    parent.cached_children -= 1
                    if self._forget_on_drop:
                        child.frequency = 0
                    lost += child.size_bytes
                    stack.append(child)
        self._heap_gpu = []
        self._heap_host = []
        for item in self.iter_nodes():  # rebuild the candidate heaps (failures are rare)
            n = item
            n.gpu_pos = -1
            n.host_pos = -1
        for item in self.iter_nodes():
            self._sync(item)
        self.gpu_failures += 1
        return lost

    # ------------------------------------------------------------------ heaps
    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _less(self, a: Node, b: Node, gpu: cython.bint) -> cython.bint:
        pa: cython.double = a.priority_gpu if gpu else a.priority_host
        pb: cython.double = b.priority_gpu if gpu else b.priority_host
        if pa != pb:
            return pa < pb
        return a.last_access < b.last_access

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _place(self, heap: list, n: Node, pos: cython.Py_ssize_t, gpu: cython.bint
               ) -> cython.void:
        heap[pos] = n
        if gpu:
            n.gpu_pos = pos
        else:
            n.host_pos = pos

    @cython.cfunc
    @cython.exceptval(check=False)
    def _sift_up(self, heap: list, pos: cython.Py_ssize_t, gpu: cython.bint) -> cython.void:
        n: Node = cython.cast(Node, heap[pos])
        parent: Node
        up: cython.Py_ssize_t
        start: cython.Py_ssize_t = pos
        while pos > 0:
            up = (pos - 1) >> 1
            parent = cython.cast(Node, heap[up])
            if not self._less(n, parent, gpu):
                break
            self._place(heap, parent, pos, gpu)
            pos = up
        if pos != start:  # else it is already there
            self._place(heap, n, pos, gpu)

    @cython.cfunc
    @cython.exceptval(check=False)
    def _sift_down(self, heap: list, pos: cython.Py_ssize_t, gpu: cython.bint) -> cython.void:
        size: cython.Py_ssize_t = len(heap)
        n: Node = cython.cast(Node, heap[pos])
        child: cython.Py_ssize_t
        c: Node
        other: Node
        start: cython.Py_ssize_t = pos
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            c = cython.cast(Node, heap[child])
            if child + 1 < size:
                other = cython.cast(Node, heap[child + 1])
                if self._less(other, c, gpu):
                    child += 1
                    c = other
            if not self._less(c, n, gpu):
                break
            self._place(heap, c, pos, gpu)
            pos = child
        if pos != start:
            self._place(heap, n, pos, gpu)

    @cython.cfunc
    @cython.exceptval(check=False)
    def _sift(self, heap: list, pos: cython.Py_ssize_t, gpu: cython.bint) -> cython.void:
        """Restore the order around the node at ``pos`` (placed there, its priority set):
        up if it is less than its parent, else down."""
        if pos > 0 and self._less(cython.cast(Node, heap[pos]),
                                  cython.cast(Node, heap[(pos - 1) >> 1]), gpu):
            self._sift_up(heap, pos, gpu)
        else:
            self._sift_down(heap, pos, gpu)

    @cython.cfunc
    @cython.exceptval(-1)
    def _heap_remove(self, heap: list, pos: cython.Py_ssize_t, gpu: cython.bint) -> cython.int:
        removed: Node = cython.cast(Node, heap[pos])
        last: Node = cython.cast(Node, heap.pop())
        if gpu:
            removed.gpu_pos = -1
        else:
            removed.host_pos = -1
        if last is removed:
            return 0
        self._place(heap, last, pos, gpu)
        self._sift(heap, pos, gpu)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _heap_set(self, heap: list, n: Node, member: cython.bint, gpu: cython.bint,
                  moved: cython.bint) -> cython.int:
        """Make ``n``'s membership in ``heap`` equal to ``member``, at its current priority.
        ``moved``: its priority may have changed since it was placed (else a member stays
        where it is: every heap operation keeps the others in order)."""
        pos: cython.Py_ssize_t = n.gpu_pos if gpu else n.host_pos
        if member:
            if pos < 0:
                heap.append(n)
                pos = len(heap) - 1
                self._place(heap, n, pos, gpu)
                self._sift_up(heap, pos, gpu)
            elif moved:
                self._sift(heap, pos, gpu)
        elif pos >= 0:
            self._heap_remove(heap, pos, gpu)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _sync(self, n: Node, moved: cython.bint = False) -> cython.int:
        """Update ``n``'s place among the eviction candidates after any change to it;
        ``moved``: its priority changed (a retrieval, a window expiry), not only its tier.

        GPU candidates: GPU nodes without GPU children. Host candidates: nodes with a host copy
        that are in GPU (dropping the copy is allowed unless ``host_evicts_gpu_copies`` is
        off) or have no cached children. Pinned nodes stay candidates; eviction steps over them.
        """
        if n.depth == 0:
            return 0  # the root (system prompt) is never evicted
        self._heap_set(self._heap_gpu, n, n.in_gpu and n.gpu_children == 0, True, moved)
        self._heap_set(self._heap_host, n, self._host_candidate(n), False, moved)
        return 0

    @cython.cfunc
    def _host_candidate(self, n: Node) -> cython.bint:
        if not n.host_copy:
            return False
        if n.in_gpu:
            return self.host_evicts_gpu_copies
        return n.cached_children == 0

    @cython.cfunc
    def _victim(self, gpu: cython.bint) -> object:
        """The lowest-priority unpinned candidate of a tier (pinned ones are set aside)."""
        heap: list = self._heap_gpu if gpu else self._heap_host
        n: Node
        while heap:
            n = cython.cast(Node, heap[0])
            if n.pins == 0:
                return n
            self._heap_remove(heap, 0, gpu)
            self._set_aside.append(n)
        return None

    @cython.cfunc
    @cython.exceptval(-1)
    def _restore_set_aside(self) -> cython.int:
        n: Node
        while self._set_aside:
            n = self._set_aside.pop()
            self._sync(n)
        return 0

    # ------------------------------------------------------------------ eviction
    @cython.cfunc
    def _make_room(self, gpu: cython.bint, need_bytes: cython.longlong) -> cython.bint:
        """EVICT_IN_GPU (or its host twin): evict the tier's lowest-priority leaves until
        ``need_bytes`` fit. False if they cannot (too big, or only pinned nodes left)."""
        capacity: cython.longlong = self.gpu_capacity_bytes if gpu else self.host_capacity_bytes
        if need_bytes > capacity:
            return False
        ok: cython.bint = True
        while (self.gpu_used_bytes if gpu else self.host_used_bytes) + need_bytes > capacity:
            victim = self._victim(gpu)
            if victim is None:
                ok = False
                break
            if gpu:
                self._evict_from_gpu(victim)
            else:
                self._evict_from_host(victim)
        self._restore_set_aside()
        return ok

    @cython.cfunc
    @cython.exceptval(-1)
    def _write_to_host(self, n: Node) -> cython.int:
        """Write-through: copy a node just computed (in GPU, pinned) to host if host memory can
        take it; if it cannot, the node has no host copy (HiCache's write returns nothing)."""
        if n.host_copy or self.host_capacity_bytes == 0:
            return 0
        if not self._make_room(False, n.size_bytes):
            return 0
        n.host_copy = True
        if self.record_moves:
            self._note("swap_out", n)
        self.host_used_bytes += n.size_bytes
        self.swap_out_bytes += n.size_bytes
        self._sync(n)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _evict_from_gpu(self, n: Node) -> cython.int:
        if self._uses_clock and n.priority_gpu > self.clock_gpu:
            self.clock_gpu = n.priority_gpu
        self.evictions_gpu += 1
        parent: Node = n.parent
        n.in_gpu = False
        if n.depth == 1:
            del self._gpu_upper[n.key]
        self.gpu_used_bytes -= n.size_bytes
        parent.gpu_children -= 1
        self._sync(n)  # out of the GPU candidates before the host makes room
        if not n.host_copy and self._write_through:
            # write-through never copies on eviction: a node the host could not take is freed
            self._drop(n)
        elif not n.host_copy:
            # first departure from the GPU: copy to host if host memory can take it
            # its host priority stays what its last retrieval made it: a swap-out is not an
            # access, and stamping it with today's clock would make a node the GPU just gave
            # up on look as fresh as one retrieved now
            if self._make_room(False, n.size_bytes):
                n.host_copy = True
                if self.record_moves:  # the copy is made before the GPU copy is freed
                    self._note("swap_out", n)
                    self._note("free_gpu", n)
                self.host_used_bytes += n.size_bytes
                self.swap_out_bytes += n.size_bytes
                self._sync(n)
            else:
                self._drop(n)
        elif self.record_moves:
            self._note("free_gpu", n)
        self._sync(parent)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _evict_from_host(self, n: Node) -> cython.int:
        if self._uses_clock and n.priority_host > self.clock_host:
            self.clock_host = n.priority_host
        self.evictions_host += 1
        if n.in_gpu:
            # drop only the host copy; the GPU copy stays (a later eviction swaps out again)
            n.host_copy = False
            if self.record_moves:
                self._note("free_host", n)
            self.host_used_bytes -= n.size_bytes
            self._sync(n)
            return 0
        self._drop(n)
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _drop(self, n: Node) -> cython.int:
        """Free ``n`` (not in GPU) entirely, with its host-only descendants: it becomes a ghost."""
        stack: list = [n]
        m: Node
        child: Node
        while stack:
            m = stack.pop()
            if self.record_moves:  # n just left the GPU (its only copy) or held a host copy
                self._note("drop", m)
            if m.host_copy:
                m.host_copy = False
                self.host_used_bytes -= m.size_bytes
            self.dropped_bytes += m.size_bytes
            if m.cached_children:  # host-only children (ghosts need no visit)
                for item in m.children.values():
                    child = item
                    if child.host_copy:
                        stack.append(child)
            m.cached_children = 0
            if self._forget_on_drop:
                m.frequency = 0
            self._sync(m)
        parent: Node = n.parent
        parent.cached_children -= 1
        self._sync(parent)
        return 0

    # ------------------------------------------------------------------ inspection
    def iter_nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            if n.children:
                stack.extend(n.children.values())

    def tier_of(self, doc_ids: Sequence[int]) -> Tier:
        """Tier of the node at path ``doc_ids`` (NONE if it does not exist)."""
        node = self.root
        for key in doc_ids:
            node = node.children.get(key) if node.children else None
            if node is None:
                return Tier.NONE
        return node.tier

    def check_invariants(self) -> None:
        """Raise AssertionError if any residency rule is broken (used by property tests)."""
        gpu_bytes = host_bytes = pinned_bytes = 0
        for n in self.iter_nodes():
            if n.in_gpu:
                gpu_bytes += n.size_bytes
                if n.pins > 0:
                    pinned_bytes += n.size_bytes
            if n.host_copy:
                host_bytes += n.size_bytes
            assert n.pins >= 0, f"negative pins on {n}"
            children = list(n.children.values()) if n.children else []
            assert n.gpu_children == sum(c.in_gpu for c in children), f"gpu_children of {n}"
            assert n.cached_children == sum(c.cached for c in children), f"cached_children {n}"
            if n.parent is not None:
                assert n.parent.tier >= n.tier, f"{n} is faster than its parent {n.parent}"
                # eviction candidates: exactly the nodes _sync's rules name, in each heap
                assert (n.gpu_pos >= 0) == (n.in_gpu and n.gpu_children == 0), \
                    f"{n} in the GPU candidates: {n.gpu_pos}"
                host_candidate = n.host_copy and (
                    self.host_evicts_gpu_copies if n.in_gpu else n.cached_children == 0)
                assert (n.host_pos >= 0) == host_candidate, \
                    f"{n} in the host candidates: {n.host_pos}"
        assert self.root.in_gpu
        children = self.root.children.values() if self.root.children else ()
        assert set(self._gpu_upper.values()) == {c for c in children if c.in_gpu}, \
            "the first-level GPU nodes kept for replication are out of step"
        assert pinned_bytes == self.pinned_gpu_bytes, (pinned_bytes, self.pinned_gpu_bytes)
        assert self.reserved_gpu_bytes >= 0
        assert gpu_bytes + self.reserved_gpu_bytes == self.gpu_used_bytes, (
            gpu_bytes, self.reserved_gpu_bytes, self.gpu_used_bytes)
        assert host_bytes == self.host_used_bytes, (host_bytes, self.host_used_bytes)
        assert self.gpu_used_bytes <= self.gpu_capacity_bytes
        assert self.host_used_bytes <= self.host_capacity_bytes
        if self._free:  # the store lists exactly the tree's nodes, each under its document
            listed = [n for nodes in self._holders.values() for n in nodes]
            assert len(listed) == len(set(listed)) == self.node_count - 1, "store out of step"
            assert all(n.key == key for key, nodes in self._holders.items() for n in nodes)
        self._check_heaps()
        self._check_frequencies()

    def _check_heaps(self) -> None:
        """Each candidate heap is a min-heap on (priority, last access), positions in step."""
        for heap, gpu in ((self._heap_gpu, True), (self._heap_host, False)):
            def key(n: Node, gpu: bool = gpu) -> tuple:
                return (n.priority_gpu if gpu else n.priority_host, n.last_access)
            for pos, n in enumerate(heap):
                assert (n.gpu_pos if gpu else n.host_pos) == pos, f"{n} misplaced in its heap"
                if pos:
                    parent = heap[(pos - 1) >> 1]
                    assert key(parent) <= key(n), f"heap order broken at {n} under {parent}"

    def _check_frequencies(self) -> None:
        """Counts obey the frequency scope, and cached nodes' values follow their counts."""
        if self._windowed:
            in_window: dict = {}
            cutoff = self._now_s - self._window_s
            for t, n in self._retrievals:
                assert cutoff < t <= self._now_s, f"retrieval at {t} outside the window"
                in_window[n] = in_window.get(n, 0) + 1
            for n in self.iter_nodes():
                assert n.frequency == in_window.get(n, 0), \
                    f"{n}: frequency {n.frequency}, {in_window.get(n, 0)} in the window"
        for n in self.iter_nodes():
            assert n.frequency >= 0, f"negative frequency on {n}"
            if self._forget_on_drop and not n.cached and n.parent is not None:
                assert n.frequency == 0, f"{n} left the cache but kept its count"
            if n.cached and n.parent is not None:
                assert self._hooks.value_of(n) == n.value, f"{n}: value is not its count's"
