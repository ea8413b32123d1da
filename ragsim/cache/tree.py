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
* a pinned node (in use by a running request) is never evicted;
* used bytes never exceed a tier's capacity.

The root is the shared system prompt; it is resident in GPU for the life of the tree.

The tree owns structure and residency; a ``TreePolicy`` turns accesses into ``node.value`` and
the tree evicts the lowest ``clock[tier] + value`` among a tier's leaves (ties: least recently
accessed). Candidates live in one lazy min-heap per tier: entries carry the node's ``stamp`` and
are discarded on pop when the node changed since.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ragsim.cache.node import Node, Tier
from ragsim.cache.policies.base import TreePolicy

ROOT_KEY = -1


class AccessResult(NamedTuple):
    """What one request found and caused. Token counts exclude the system prompt and query."""

    cached_tokens: int  # alpha: system prompt + documents hit (both tiers)
    new_tokens: int  # beta: documents recomputed + query
    hit_tokens_gpu: int
    hit_tokens_host: int
    recomputed_tokens: int
    swap_in_bytes: int
    path: list[Node]  # nodes of the request's cacheable prefix, root excluded


class KnowledgeTree:
    """Prefix tree of document KV with GPU/host tiers and a pluggable replacement policy."""

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
    ) -> None:
        if gpu_capacity_bytes < 0 or host_capacity_bytes < 0:
            raise ValueError("capacities must be >= 0")
        if kv_bytes_per_token <= 0:
            raise ValueError("kv_bytes_per_token must be > 0")
        if max_cached_depth is not None and max_cached_depth < 0:
            raise ValueError("max_cached_depth must be >= 0")
        self.policy = policy
        self.kv_bytes_per_token = kv_bytes_per_token
        self.gpu_capacity_bytes = gpu_capacity_bytes
        self.host_capacity_bytes = host_capacity_bytes
        self.prefill_cost_s = prefill_cost_s
        self.max_cached_depth = max_cached_depth
        self.system_prompt_tokens = system_prompt_tokens
        root_bytes = system_prompt_tokens * kv_bytes_per_token
        if root_bytes > gpu_capacity_bytes:
            raise ValueError(
                f"the system prompt's KV ({root_bytes} bytes) does not fit in GPU memory "
                f"({gpu_capacity_bytes} bytes)")
        self.root = Node(ROOT_KEY, None, system_prompt_tokens, root_bytes)
        self.root.in_gpu = True
        self.root.pins = 1  # the shared system prompt stays resident
        self.gpu_used_bytes = root_bytes
        self.host_used_bytes = 0
        self.clock_gpu = 0.0
        self.clock_host = 0.0
        self._heap_gpu: list[tuple[float, int, int, Node]] = []
        self._heap_host: list[tuple[float, int, int, Node]] = []
        self._seq = 0
        self._use_cost = prefill_cost_s is not None
        # counters
        self.evictions_gpu = 0
        self.evictions_host = 0
        self.swap_in_bytes = 0
        self.swap_out_bytes = 0
        self.dropped_bytes = 0
        self.admission_failures = 0
        self.node_count = 1

    # ------------------------------------------------------------------ lookup / access
    def match_prefix(self, doc_ids: Sequence[int]) -> tuple[int, int, int]:
        """(documents matched, of them in GPU, in host) without changing anything."""
        node = self.root
        gpu = host = 0
        limit = len(doc_ids) if self.max_cached_depth is None else min(
            len(doc_ids), self.max_cached_depth)
        for i in range(limit):
            children = node.children
            child = children.get(doc_ids[i]) if children else None
            if child is None or not (child.in_gpu or child.host_copy):
                break
            if child.in_gpu:
                gpu += 1
            else:
                host += 1
            node = child
        return gpu + host, gpu, host

    def cached_prefix_tokens(self, doc_ids: Sequence[int], doc_tokens: Sequence[int]) -> int:
        """Tokens of the request's context that are cached now (system prompt included)."""
        matched, _, _ = self.match_prefix(doc_ids)
        return self.system_prompt_tokens + sum(doc_tokens[:matched])

    def access(
        self,
        doc_ids: Sequence[int],
        doc_tokens: Sequence[int],
        query_tokens: int = 0,
        *,
        request_index: int = -1,
        keep_pinned: bool = False,
    ) -> AccessResult:
        """Serve one request's retrieval: look up, update policy state, admit what it computed.

        With ``keep_pinned`` the request's path stays pinned until ``release(result.path)``, as
        a running request's KV must (the simulator uses this); replay releases at once.
        """
        root = self.root
        kv = self.kv_bytes_per_token
        n_docs = len(doc_ids)
        depth_limit = n_docs if self.max_cached_depth is None else min(n_docs,
                                                                       self.max_cached_depth)
        path: list[Node] = []
        hit_gpu = hit_host = 0
        swap_in = 0
        node = root
        i = 0
        # 1. prefix match over cached nodes
        while i < depth_limit:
            children = node.children
            child = children.get(doc_ids[i]) if children else None
            if child is None or not (child.in_gpu or child.host_copy):
                break
            if child.in_gpu:
                hit_gpu += child.tokens
            else:
                hit_host += child.tokens
                swap_in += child.size_bytes
            path.append(child)
            node = child
            i += 1
        n_cached = i
        # 2. nodes for the documents to compute (ghosts are reused, new ones created)
        while i < depth_limit:
            key = doc_ids[i]
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(key)
            if child is None:
                tokens = doc_tokens[i]
                child = Node(key, node, tokens, tokens * kv)
                children[key] = child
                self.node_count += 1
            path.append(child)
            node = child
            i += 1
        recomputed = 0
        for j in range(n_cached, n_docs):
            recomputed += doc_tokens[j]
        alpha = self.system_prompt_tokens + hit_gpu + hit_host
        beta = recomputed + query_tokens
        cost_per_token = 0.0
        if self._use_cost and n_cached < depth_limit and beta > 0:
            cost_per_token = self.prefill_cost_s(alpha, beta) / beta
        # 3. policy update (Algorithm 1: UPDATE_NODE_IN_GPU for every node retrieved)
        policy = self.policy
        on_access = policy.on_access
        for depth, n in enumerate(path, start=1):
            self._seq += 1
            n.frequency += 1
            n.last_access = self._seq
            n.pins += 1
            on_access(n, depth <= n_cached, cost_per_token, request_index, depth)
            if depth <= n_cached:
                n.priority_gpu = self.clock_gpu + n.value
                n.priority_host = self.clock_host + n.value
                self._refresh(n)
        # 4. admission into GPU, top-down, stopping at the first node that cannot be placed
        for depth, n in enumerate(path, start=1):
            if n.in_gpu:
                continue
            if not self._make_room_gpu(n.size_bytes):
                self.admission_failures += 1
                break
            parent = n.parent
            if depth > n_cached:  # newly computed
                self._seq += 1
                policy.on_enter_cache(n, self._seq)
                n.priority_gpu = self.clock_gpu + n.value
                n.priority_host = self.clock_host + n.value
                parent.cached_children += 1
            n.in_gpu = True
            self.gpu_used_bytes += n.size_bytes
            parent.gpu_children += 1
            self._refresh(n)
        self.swap_in_bytes += swap_in
        if not keep_pinned:
            self.release(path)
        return AccessResult(alpha, beta, hit_gpu, hit_host, recomputed, swap_in, path)

    def release(self, path: Sequence[Node]) -> None:
        """Unpin a request's nodes once it no longer needs their KV."""
        for n in path:
            n.pins -= 1
            if n.pins == 0:
                # it may have become evictable while pinned: offer it again
                self._refresh(n, bump=False)

    # ------------------------------------------------------------------ heaps
    def _refresh(self, n: Node, bump: bool = True) -> None:
        """Invalidate ``n``'s old heap entries (if ``bump``) and push current ones."""
        if bump:
            n.stamp += 1
        if n.pins:
            return
        if n.in_gpu:
            if n.gpu_children == 0:
                heapq.heappush(self._heap_gpu, (n.priority_gpu, n.last_access, n.stamp, n))
            if n.host_copy:
                heapq.heappush(self._heap_host, (n.priority_host, n.last_access, n.stamp, n))
        elif n.host_copy and n.cached_children == 0:
            heapq.heappush(self._heap_host, (n.priority_host, n.last_access, n.stamp, n))

    def _pop_gpu_victim(self) -> Node | None:
        heap = self._heap_gpu
        while heap:
            _, _, stamp, n = heapq.heappop(heap)
            if stamp == n.stamp and n.in_gpu and n.gpu_children == 0 and n.pins == 0:
                return n
        return None

    def _pop_host_victim(self) -> Node | None:
        heap = self._heap_host
        while heap:
            _, _, stamp, n = heapq.heappop(heap)
            if stamp != n.stamp or not n.host_copy:
                continue
            if n.in_gpu or (n.cached_children == 0 and n.pins == 0):
                return n
        return None

    # ------------------------------------------------------------------ eviction
    def _make_room_gpu(self, need_bytes: int) -> bool:
        """EVICT_IN_GPU: evict lowest-priority GPU leaves until ``need_bytes`` fit."""
        if need_bytes > self.gpu_capacity_bytes:
            return False
        while self.gpu_used_bytes + need_bytes > self.gpu_capacity_bytes:
            victim = self._pop_gpu_victim()
            if victim is None:
                return False
            self._evict_from_gpu(victim)
        return True

    def _evict_from_gpu(self, n: Node) -> None:
        if self.policy.uses_clock and n.priority_gpu > self.clock_gpu:
            self.clock_gpu = n.priority_gpu
        self.evictions_gpu += 1
        if not n.host_copy:
            # first departure from the GPU: copy to host if host memory can take it
            if self._make_room_host(n.size_bytes):
                n.host_copy = True
                self.host_used_bytes += n.size_bytes
                self.swap_out_bytes += n.size_bytes
                n.priority_host = self.clock_host + n.value
            else:
                n.in_gpu = False
                self.gpu_used_bytes -= n.size_bytes
                parent = n.parent
                parent.gpu_children -= 1
                self._drop(n)
                self._refresh(parent, bump=False)
                return
        n.in_gpu = False
        self.gpu_used_bytes -= n.size_bytes
        parent = n.parent
        parent.gpu_children -= 1
        self._refresh(n)
        if parent.gpu_children == 0:
            self._refresh(parent, bump=False)

    def _make_room_host(self, need_bytes: int) -> bool:
        if need_bytes > self.host_capacity_bytes:
            return False
        while self.host_used_bytes + need_bytes > self.host_capacity_bytes:
            victim = self._pop_host_victim()
            if victim is None:
                return False
            self._evict_from_host(victim)
        return True

    def _evict_from_host(self, n: Node) -> None:
        if self.policy.uses_clock and n.priority_host > self.clock_host:
            self.clock_host = n.priority_host
        self.evictions_host += 1
        if n.in_gpu:
            # drop only the host copy; the GPU copy stays (a later eviction swaps out again)
            n.host_copy = False
            self.host_used_bytes -= n.size_bytes
            self._refresh(n)
            return
        self._drop(n)

    def _drop(self, n: Node) -> None:
        """Free ``n`` (not in GPU) entirely, with its host-only descendants: it becomes a ghost."""
        stack = [n]
        while stack:
            m = stack.pop()
            if m.host_copy:
                m.host_copy = False
                self.host_used_bytes -= m.size_bytes
            self.dropped_bytes += m.size_bytes
            m.cached_children = 0
            m.frequency = 0
            m.stamp += 1
            if m.children:
                stack.extend(c for c in m.children.values() if c.host_copy)
        parent = n.parent
        parent.cached_children -= 1
        if not parent.in_gpu and parent.cached_children == 0:
            self._refresh(parent, bump=False)

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
        gpu_bytes = host_bytes = 0
        for n in self.iter_nodes():
            if n.in_gpu:
                gpu_bytes += n.size_bytes
            if n.host_copy:
                host_bytes += n.size_bytes
            assert n.pins >= 0, f"negative pins on {n}"
            children = list(n.children.values()) if n.children else []
            assert n.gpu_children == sum(c.in_gpu for c in children), f"gpu_children of {n}"
            assert n.cached_children == sum(c.cached for c in children), f"cached_children {n}"
            if n.parent is not None:
                assert n.parent.tier >= n.tier, f"{n} is faster than its parent {n.parent}"
        assert self.root.in_gpu
        assert gpu_bytes == self.gpu_used_bytes, (gpu_bytes, self.gpu_used_bytes)
        assert host_bytes == self.host_used_bytes, (host_bytes, self.host_used_bytes)
        assert self.gpu_used_bytes <= self.gpu_capacity_bytes
        assert self.host_used_bytes <= self.host_capacity_bytes
