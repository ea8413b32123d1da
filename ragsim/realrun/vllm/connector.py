"""RAGCache inside vLLM: the knowledge tree and PGDSF as vLLM's host tier, a KV connector.

vLLM's own prefix cache (its paged blocks, LRU) stays the fast tier. This connector adds the
slow one, run by ragsim's policy core: the *scheduler side* is the run's
``ragsim.cache.tree.KnowledgeTree`` (the pipeline's own object, with its PGDSF policy, handed
over in-process, not a copy), whose nodes are documents in their prefix context; the *worker
side* holds each cached node's KV as per-block, per-layer tensors in host memory and copies
them into vLLM's blocks when a request hits them.

* **A node is whole blocks.** vLLM pages KV in blocks of ``block_tokens``; block ``i`` of a
  prompt (tokens ``[iB, (i+1)B)``) belongs to the node whose span holds its last token. So a
  node's KV is the blocks that end inside its document (a block that straddles two documents
  belongs to the second, whose path fixes everything before it), and a cached prefix of nodes
  gives the blocks that end by its last token: hits are whole blocks, as vLLM's own are.
* **Document boundaries** travel with the request in ``kv_transfer_params`` (vLLM's field for a
  connector's per-request data, set through ``SamplingParams.extra_args``): the documents' ids
  and token counts and the query's length. vLLM sees only token ids; the tree needs documents.
* **When the tree is asked.** ``get_num_new_matched_tokens`` (which vLLM may call several times,
  and must leave state alone) answers from the tree without changing it: the blocks of the
  request's cached prefix beyond vLLM's own hit, of nodes whose KV the worker holds, never the
  prompt's last token. When vLLM has allocated the request (``update_state_after_alloc``, once
  per request), the tree serves it (``access``: PGDSF's update, admission, evictions; the path
  stays pinned until ``request_finished``) and its residency moves are turned into the worker's
  orders.
* **What the worker holds.** Every node the tree caches, in either tier. A node's KV is copied
  out of vLLM's blocks while the request that computed it runs (``save_kv_layer``, in the step
  whose tokens complete each block), because when the tree later evicts it from the GPU tier
  (swap out only once) vLLM may long have reused those blocks. Until then the copy also serves
  a request whose blocks vLLM's LRU evicted before the tree's PGDSF did: vLLM counts that as an
  external hit where the tree counts a GPU hit; both are recorded. A dropped node's copy is
  freed. So host memory holds the tree's host tier plus a copy of its GPU tier.
* **Synchronous copies.** Loads happen before the step's forward pass (``start_load_kv``),
  saves right after each layer's attention (``save_kv_layer``); nothing is left in flight, so
  ``wait_for_layer_load`` and ``wait_for_save`` have nothing to wait for, and the cache is
  best-effort (``requires_kv_delivery`` is False: a lost save is a later miss).

The tree is handed over through ``register_tree`` (a key in ``kv_connector_extra_config``): the
harness runs vLLM's engine in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and the
summary reports the very tree the connector drove.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ragsim.cache.tree import KnowledgeTree, Node
from ragsim.realrun.vllm.blocks import block_owners, loadable_tokens
from ragsim.realrun.vllm.engine import TREE_CONNECTOR

PARAMS = "ragsim"  # the key of a request's document boundaries in kv_transfer_params

_keys = itertools.count()
_TREES: dict[str, KnowledgeTree] = {}
_SIDES: dict[tuple[str, str], Any] = {}  # (key, "scheduler" | "worker") -> the connector


def register_tree(tree: KnowledgeTree) -> str:
    """Hand ``tree`` (made with ``record_moves=True``) to the connector vLLM will build; the
    returned key goes into ``kv_connector_extra_config["tree"]``."""
    if not tree.record_moves:
        raise ValueError("the connector follows the tree's moves: make it with record_moves")
    key = f"tree-{next(_keys)}"
    _TREES[key] = tree
    return key


def connector_side(key: str, side: str):
    """The scheduler or worker side vLLM built for the tree registered under ``key``."""
    return _SIDES[(key, side)]


def forget(key: str) -> None:
    _TREES.pop(key, None)
    _SIDES.pop((key, "scheduler"), None)
    _SIDES.pop((key, "worker"), None)


def transfer_config(key: str, block_tokens: int) -> dict:
    """``KVTransferConfig``'s arguments that make vLLM build this connector."""
    return {"kv_connector": TREE_CONNECTOR, "kv_connector_module_path": __name__,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"tree": key, "block_tokens": block_tokens}}


def request_params(docs, doc_tokens, query_tokens: int, request: int) -> dict:
    """What a request carries in ``kv_transfer_params`` for the connector."""
    return {PARAMS: {"docs": [int(d) for d in docs], "doc_tokens": [int(t) for t in doc_tokens],
                     "query_tokens": int(query_tokens), "request": int(request)}}


@dataclass
class TreeMeta(KVConnectorMetadata):
    """One step's orders for the worker: free, then load, then save (during the forward)."""

    frees: list[int] = field(default_factory=list)  # node copies (uids) to drop
    loads: list[tuple[int, int, int]] = field(default_factory=list)  # (uid, block, vLLM block)
    saves: list[tuple[int, int, int]] = field(default_factory=list)  # (vLLM block, uid, block)


@dataclass
class RequestRecord:
    """One request as the tree and vLLM saw it (tokens)."""

    tree_hit_gpu: int = 0  # the tree's hits (its GPU tier: vLLM's blocks as the tree models them)
    tree_hit_host: int = 0
    local: int = 0  # vLLM's own prefix-cache hit
    external: int = 0  # loaded by this connector (when vLLM first scheduled the request)


@dataclass
class _Plan:
    params: dict
    path: list  # the tree's nodes for the request's documents (pinned while it runs)
    owner: list[int]  # block i of the cacheable prefix -> the uid of the node it belongs to
    pending: dict[int, int]  # blocks still to save: block -> uid
    record: RequestRecord


class RagsimTreeConnector(KVConnectorBase_V1):  # named TREE_CONNECTOR
    """The knowledge tree's host tier for vLLM (scheduler side) and its KV (worker side)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.key = str(extra["tree"])
        self.block = int(extra["block_tokens"])
        if self.block != vllm_config.cache_config.block_size:
            raise ValueError(f"the connector counts blocks of {self.block} tokens, vLLM pages "
                             f"{vllm_config.cache_config.block_size}")
        if role == KVConnectorRole.SCHEDULER:
            if self.key not in _TREES:
                raise RuntimeError("ragsim's tree connector runs in the harness's process "
                                   "(VLLM_ENABLE_V1_MULTIPROCESSING=0): no tree registered "
                                   f"under {self.key!r} here")
            self._init_scheduler(_TREES[self.key])
            _SIDES[(self.key, "scheduler")] = self
        else:
            self._init_worker()
            _SIDES[(self.key, "worker")] = self

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a save lost to a preemption is a later miss

    # ================================================================== scheduler side
    def _init_scheduler(self, tree: KnowledgeTree) -> None:
        self.tree = tree
        self._uid: dict[Node, int] = {}  # a cached node -> its copy's id (new at each admission)
        self._uids = itertools.count()
        self._unsaved: dict[int, int] = {}  # uid -> blocks not saved yet
        self._stored: set[int] = set()  # uids whose every block the worker holds
        self._plans: dict[str, _Plan] = {}
        self._local: dict[str, int] = {}  # request -> vLLM's own hit, as last asked
        self._frees: list[int] = []
        self._loads: list[tuple[int, int, int]] = []
        # ragsim's request index -> record (vLLM renames requests internally)
        self.records: dict[int, RequestRecord] = {}
        self.blocks_saved = self.blocks_loaded = self.copies_freed = 0
        self.never_saved = 0  # nodes cached by the tree whose request ended before saving them
        # the wall time this side spent inside vLLM's steps (its scheduler calls these from
        # ``schedule`` and ``update_from_output``), and the part of it the tree's ``access``
        # took: what a profile of vLLM without the connector cannot hold (``connector_costs``)
        self.scheduler_s = 0.0
        self.tree_access_s = 0.0
        self.requests_served = 0
        # blocks ordered saved since the harness last read them (``take_blocks_saved``): the
        # saves of the step it records
        self._saved_unread = 0
        root = tree.root
        self._admit(root, len(block_owners([(0, tree.system_prompt_tokens)], self.block)))

    def _admit(self, node: Node, n_blocks: int) -> int:
        uid = next(self._uids)
        self._uid[node] = uid
        if n_blocks:
            self._unsaved[uid] = n_blocks
        else:
            self._stored.add(uid)
        return uid

    def _free(self, node: Node) -> None:
        uid = self._uid.pop(node, None)
        if uid is None:
            return
        self._stored.discard(uid)
        self._unsaved.pop(uid, None)
        self._frees.append(uid)
        self.copies_freed += 1
        for plan in self._plans.values():  # its blocks no longer need saving
            for i in [i for i, u in plan.pending.items() if u == uid]:
                del plan.pending[i]

    def _spans(self, params: dict, n_nodes: int) -> list[tuple[int, int]]:
        """Token spans of the root and the first ``n_nodes`` documents."""
        start = self.tree.system_prompt_tokens
        spans = [(0, start)]
        for tokens in params["doc_tokens"][:n_nodes]:
            spans.append((start, start + tokens))
            start += tokens
        return spans

    def _depth_limit(self, params: dict) -> int:
        n = len(params["docs"])
        limit = self.tree.max_cached_depth
        return n if limit is None else min(n, limit)

    def _held_prefix(self, params: dict, path: list | None) -> int:
        """Tokens of the request's prefix whose nodes the worker holds (root included)."""
        tree = self.tree
        if self._uid.get(tree.root) not in self._stored:
            return 0
        end = tree.system_prompt_tokens
        node = tree.root
        for k in range(self._depth_limit(params)):
            if path is not None:
                child = path[k] if k < len(path) else None
            else:
                child = node.children.get(params["docs"][k]) if node.children else None
            if child is None or not child.cached or self._uid.get(child) not in self._stored:
                break
            end += params["doc_tokens"][k]
            node = child
        return end

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        params = (request.kv_transfer_params or {}).get(PARAMS)
        if params is None:
            return 0, False
        started = time.perf_counter()
        self._local[request.request_id] = num_computed_tokens
        plan = self._plans.get(request.request_id)
        held = self._held_prefix(params, plan.path if plan else None)
        hit = loadable_tokens(held, request.num_tokens, self.block)
        self.scheduler_s += time.perf_counter() - started
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        params = (request.kv_transfer_params or {}).get(PARAMS)
        if params is None:
            return
        started = time.perf_counter()
        rid = request.request_id
        local = self._local.pop(rid, 0)
        plan = self._plans.get(rid)
        if plan is None:
            plan = self._serve(rid, params)
            plan.record.local, plan.record.external = local, num_external_tokens
        if num_external_tokens:
            ids = blocks.get_block_ids()[0]
            for i in range(local // self.block, (local + num_external_tokens) // self.block):
                self._loads.append((plan.owner[i], i, ids[i]))
            self.blocks_loaded += num_external_tokens // self.block
        self.scheduler_s += time.perf_counter() - started

    def _serve(self, rid: str, params: dict) -> _Plan:
        """The tree serves the request (once): PGDSF's update, admission, evictions."""
        tree = self.tree
        started = time.perf_counter()
        result = tree.access(params["docs"], params["doc_tokens"], params["query_tokens"],
                             request_index=params["request"], keep_pinned=True,
                             now_s=time.monotonic())
        self.tree_access_s += time.perf_counter() - started
        self.requests_served += 1
        self._apply(tree.drain_moves())
        path = list(result.path)
        spans = self._spans(params, len(path))
        owner_k = block_owners(spans, self.block)
        nodes = [tree.root, *path]
        owner = [self._uid.get(nodes[k], -1) for k in owner_k]
        pending = {}
        for i, uid in enumerate(owner):
            # blocks of nodes admitted for this request (and of the root, the first time)
            if uid in self._unsaved and not any(uid in p.pending.values()
                                                for p in self._plans.values()):
                pending[i] = uid
        record = RequestRecord(tree_hit_gpu=result.hit_tokens_gpu,
                               tree_hit_host=result.hit_tokens_host)
        plan = _Plan(params, path, owner, pending, record)
        self._plans[rid] = plan
        self.records[params["request"]] = record
        return plan

    def _apply(self, moves) -> None:
        """The tree's residency moves as the worker's orders: a node it admits gets a new copy
        (saved by the request computing it), a node it drops loses its copy; moves between its
        tiers move nothing here (the copy is made once, at admission)."""
        for kind, node in moves:  # in the tree's order: a dropped ghost may come back
            if kind == "admit_gpu":
                start = self.tree.system_prompt_tokens + sum(n.tokens
                                                             for n in node_path(node)[:-1])
                self._admit(node, len(block_owners([(start, start + node.tokens)], self.block)))
            elif kind == "drop":
                self._free(node)

    def build_connector_meta(self, scheduler_output) -> TreeMeta:
        started = time.perf_counter()
        meta = self._meta(scheduler_output)
        self.scheduler_s += time.perf_counter() - started
        return meta

    def _meta(self, scheduler_output) -> TreeMeta:
        self._apply(self.tree.drain_moves())  # e.g. replicas' host evictions between steps
        meta = TreeMeta(frees=self._frees, loads=self._loads)
        self._frees, self._loads = [], []
        before: dict[str, int] = {r.req_id: r.num_computed_tokens
                                  for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        before.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        manager = self._kv_cache_manager
        for rid, computed in before.items():
            plan = self._plans.get(rid)
            if plan is None or not plan.pending:
                continue
            done = computed + scheduler_output.num_scheduled_tokens.get(rid, 0)
            ready = [i for i in plan.pending if (i + 1) * self.block <= done]
            if not ready:
                continue
            ids = manager.get_block_ids(rid)[0]
            for i in sorted(ready):
                uid = plan.pending.pop(i)
                meta.saves.append((ids[i], uid, i))
                self.blocks_saved += 1
                self._saved_unread += 1
                self._unsaved[uid] -= 1
                if not self._unsaved[uid]:  # loadable from the next step on
                    del self._unsaved[uid]
                    self._stored.add(uid)
        return meta

    def request_finished(self, request, block_ids):
        started = time.perf_counter()
        plan = self._plans.pop(request.request_id, None)
        self._local.pop(request.request_id, None)
        if plan is not None:
            self.tree.release(plan.path)
            self.never_saved += len(set(plan.pending.values()))
        self.scheduler_s += time.perf_counter() - started
        return False, None

    def take_blocks_saved(self) -> int:
        """The blocks ordered saved since the last call (a step's, called after each step)."""
        taken, self._saved_unread = self._saved_unread, 0
        return taken

    def stats(self) -> dict:
        return {"blocks_saved": self.blocks_saved, "blocks_loaded": self.blocks_loaded,
                "copies_freed": self.copies_freed, "nodes_never_saved": self.never_saved,
                "nodes_held": len(self._stored), "requests_served": self.requests_served,
                "block_tokens": self.block,
                "scheduler_s": self.scheduler_s, "tree_access_s": self.tree_access_s}

    # ================================================================== worker side
    def _init_worker(self) -> None:
        self._kv: dict[str, Any] = {}
        self._store: dict[int, dict[int, dict[str, Any]]] = {}  # uid -> block -> layer -> KV
        self.bytes_held = 0
        self.peak_bytes_held = 0
        # the wall time the copies took inside vLLM's steps (loads before the forward, saves
        # after each layer's attention), and the blocks they copied (every layer of each)
        self.load_s = self.save_s = 0.0
        self.blocks_copied_in = self.blocks_copied_out = 0

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._kv = dict(kv_caches)

    @staticmethod
    def _block_view(kv_layer):
        """The layer's cache with blocks first: the CPU backend's is already
        ([blocks, heads, block, 2 x head]); CUDA's flash attention puts K and V first
        ([2, blocks, block, heads, head])."""
        if kv_layer.dim() == 5 and kv_layer.shape[0] == 2:
            return kv_layer.transpose(0, 1)
        return kv_layer

    def start_load_kv(self, forward_context, **kwargs) -> None:
        started = time.perf_counter()
        meta = self._get_connector_metadata()
        for uid in meta.frees:
            for layers in self._store.pop(uid, {}).values():
                self.bytes_held -= sum(t.numel() * t.element_size() for t in layers.values())
        for uid, i, target in meta.loads:
            layers = self._store[uid][i]
            for name, kv_layer in self._kv.items():
                self._block_view(kv_layer)[target].copy_(layers[name])
        self.blocks_copied_in += len(meta.loads)
        self.load_s += time.perf_counter() - started

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are done before the forward pass starts

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        meta = self._get_connector_metadata()
        if not meta.saves:
            return
        started = time.perf_counter()
        view = self._block_view(kv_layer)
        for target, uid, i in meta.saves:
            copy = view[target].to("cpu", copy=True)
            self._store.setdefault(uid, {}).setdefault(i, {})[layer_name] = copy
            self.bytes_held += copy.numel() * copy.element_size()
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        if layer_name == next(iter(self._kv), layer_name):  # each block once, not per layer
            self.blocks_copied_out += len(meta.saves)
        self.save_s += time.perf_counter() - started

    def wait_for_save(self) -> None:
        return  # every save was a synchronous copy


def node_path(node: Node) -> list[Node]:
    """The node's path from the root's child down to it."""
    path = []
    while node is not None and node.parent is not None:
        path.append(node)
        node = node.parent
    return path[::-1]
