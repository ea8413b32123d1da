"""The reference engine: a real transformer whose KV cache is held per knowledge-tree node.

A request is a path of documents (each a tree node, in retrieval order) and a query. The KV of
the path's leading nodes that sit in the GPU pool is concatenated along the token axis into the
request's cached prefix; only the rest (documents not cached, then the query) is prefilled, with
positions continuing from the cached length, and the new documents' KV slices are stored under
their node keys. A document's KV depends on everything before it, so a node's key must name its
whole path (the tree's node object does, and so does the tuple of document ids up to it).

Requests with different cached lengths share one forward pass and greedy decode steps
(``TorchModel``: left padding, a 2-D mask, per-row positions), the same passes the profiler
times. The store has two tiers, a GPU pool (the model's device) and a host pool (CPU memory),
each with a byte budget; moves between them are real copies. Which node lives where is the
caller's decision (the knowledge tree's: ``TorchIterations`` carries out its moves): this module
only does what it is told and refuses what does not fit.

``KVStore`` is what the real harness uses. ``ReferenceEngine`` is a standalone engine over it
(lockstep batches, no tree) that the exactness tests drive; its prefix assembly and node
storing repeat ``TorchIterations``' (``iterations.py``) in a simpler setting, and should become
tests of ``TorchIterations`` itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragsim.profiles.torch_model import LayerKV, Row, TorchModel

NodeKV = list[LayerKV]  # one (keys, values) pair per layer, each [kv_heads, tokens, head_dim]


class KVCapacityError(RuntimeError):
    """A node's KV does not fit in the pool it was put into (the caller must evict first)."""


def kv_bytes(kv: NodeKV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def kv_tokens(kv: NodeKV) -> int:
    return int(kv[0][0].shape[-2])


class KVStore:
    """Per-node KV tensors in two tiers: the GPU pool (on the model's device) and the host pool.

    On a CPU-only machine both pools are host memory and the GPU pool is only a byte budget;
    moves are still real copies (``copy=True``), so a moved node never aliases its source. On
    CUDA host tensors are pinned and copies are asynchronous on the current stream, which orders
    them before any forward pass that reads them.
    """

    def __init__(self, device: Any, gpu_capacity_bytes: int,
                 host_capacity_bytes: int | None = None) -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.gpu_capacity_bytes = gpu_capacity_bytes
        self.host_capacity_bytes = host_capacity_bytes
        self.gpu: dict[Hashable, NodeKV] = {}
        self.host: dict[Hashable, NodeKV] = {}
        self.gpu_bytes = 0
        self.host_bytes = 0

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def tier(self, key: Hashable) -> str | None:
        """The fastest pool holding ``key``: "gpu", "host" or None (not stored)."""
        if key in self.gpu:
            return "gpu"
        return "host" if key in self.host else None

    def _check_gpu(self, n_bytes: int, key: Hashable) -> None:
        if self.gpu_bytes + n_bytes > self.gpu_capacity_bytes:
            raise KVCapacityError(
                f"node {key!r} needs {n_bytes:,} bytes; the GPU pool has "
                f"{self.gpu_capacity_bytes - self.gpu_bytes:,} of {self.gpu_capacity_bytes:,} "
                "free")

    def _check_host(self, n_bytes: int, key: Hashable) -> None:
        cap = self.host_capacity_bytes
        if cap is not None and self.host_bytes + n_bytes > cap:
            raise KVCapacityError(
                f"node {key!r} needs {n_bytes:,} bytes; the host pool has "
                f"{cap - self.host_bytes:,} of {cap:,} free")

    def _copy(self, kv: NodeKV, device: Any) -> NodeKV:
        torch = self.torch
        result = []
        for keys, values in kv:
            pair = []
            for t in (keys, values):
                if self._cuda and device.type == "cpu":
                    dst = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    dst.copy_(t, non_blocking=True)
                else:
                    dst = t.to(device, non_blocking=self._cuda, copy=True)
                pair.append(dst)
            result.append((pair[0], pair[1]))
        return result

    def put(self, key: Hashable, kv: NodeKV) -> None:
        """Store a node's KV in the GPU pool (any copy of it in either pool is replaced).

        The store keeps the tensors it is given (moved to the device if they are elsewhere):
        pass slices that were ``.clone()``d, so a node does not keep a whole batch alive.
        """
        self.drop(key)
        n_bytes = kv_bytes(kv)
        self._check_gpu(n_bytes, key)
        self.gpu[key] = [(k.to(self.device), v.to(self.device)) for k, v in kv]
        self.gpu_bytes += n_bytes

    def get(self, key: Hashable) -> NodeKV:
        """A node's KV in the GPU pool (a forward pass reads only from there)."""
        return self.gpu[key]

    # The operations are the knowledge tree's residency moves (``ragsim.cache.MOVE_KINDS``):
    # a node may hold a GPU and a host copy at once (swap out only once), so copies and frees
    # are separate steps, as the tree reports them.
    def copy_to_host(self, key: Hashable) -> None:
        """GPU -> host copy; the GPU copy stays (``swap_out``, ``replicate``)."""
        if key in self.host:
            raise KeyError(f"node {key!r} already has a host copy")
        kv = self.gpu[key]
        n_bytes = kv_bytes(kv)
        self._check_host(n_bytes, key)
        self.host[key] = self._copy(kv, self.torch.device("cpu"))
        self.host_bytes += n_bytes

    def copy_to_gpu(self, key: Hashable) -> None:
        """Host -> GPU copy; the host copy stays (``swap_in``)."""
        if key in self.gpu:
            raise KeyError(f"node {key!r} is already in the GPU pool")
        kv = self.host[key]
        n_bytes = kv_bytes(kv)
        self._check_gpu(n_bytes, key)
        self.gpu[key] = self._copy(kv, self.device)
        self.gpu_bytes += n_bytes

    def free_gpu(self, key: Hashable) -> None:
        """Free the GPU copy (``free_gpu``, ``fail_gpu``)."""
        self.gpu_bytes -= kv_bytes(self.gpu.pop(key))

    def free_host(self, key: Hashable) -> None:
        """Free the host copy (``free_host``)."""
        self.host_bytes -= kv_bytes(self.host.pop(key))

    def drop(self, key: Hashable) -> None:
        """Forget a node in whichever pool holds it (no error if none does): ``drop``."""
        if key in self.gpu:
            self.free_gpu(key)
        if key in self.host:
            self.free_host(key)

    def apply(self, kind: str, key: Hashable) -> None:
        """Carry out one of the tree's moves. ``admit_gpu`` is not the store's to do: the
        request's prefill computes that KV and the engine stores it (``TorchIterations``)."""
        if kind == "admit_gpu":
            raise ValueError("admit_gpu: the engine stores a computed node's KV after its "
                             "prefill (TorchIterations)")
        try:
            operation = _MOVE_OPERATIONS[kind]
        except KeyError:
            raise ValueError(f"unknown move {kind!r}") from None
        getattr(self, operation)(key)


_MOVE_OPERATIONS = {"swap_in": "copy_to_gpu", "swap_out": "copy_to_host",
                    "replicate": "copy_to_host", "free_gpu": "free_gpu",
                    "fail_gpu": "free_gpu", "free_host": "free_host", "drop": "drop"}


@dataclass
class Document:
    """A document on a request's path: its node key and its token ids."""

    key: Hashable
    token_ids: Sequence[int] | Any


@dataclass
class EngineRequest:
    request_id: Hashable
    documents: list[Document]
    query_ids: Sequence[int] | Any
    max_new_tokens: int = 1


@dataclass
class EngineResult:
    request_id: Hashable
    tokens: list[int]  # greedy output, ``max_new_tokens`` of them
    first_logits: Any  # [vocab]: logits of the prompt's last token
    cached_documents: int
    cached_tokens: int
    computed_tokens: int  # prefilled: uncached documents and the query
    stored: list[Hashable] = field(default_factory=list)  # node keys stored by this request
    last_logits: Any = None  # [vocab]: logits that chose the last generated token


class ReferenceEngine:
    """Serve batches of requests on a ``TorchModel`` with per-node KV in a ``KVStore``."""

    def __init__(self, model: TorchModel, store: KVStore) -> None:
        self.model = model
        self.store = store

    def cached_documents(self, request: EngineRequest) -> int:
        """How many leading documents of the path have their KV in the GPU pool."""
        n = 0
        for doc in request.documents:
            if self.store.tier(doc.key) != "gpu":
                break
            n += 1
        return n

    def _prefix(self, request: EngineRequest, n_docs: int) -> NodeKV | None:
        """The cached documents' KV, concatenated along the token axis in path order.

        (Attention over cached keys does not depend on their order, since RoPE has already put
        each key's position into it; path order keeps the layout the uncached run would have.)
        """
        if not n_docs:
            return None
        torch = self.model.torch
        nodes = [self.store.get(doc.key) for doc in request.documents[:n_docs]]
        return [(torch.cat([node[layer][0] for node in nodes], dim=-2),
                 torch.cat([node[layer][1] for node in nodes], dim=-2))
                for layer in range(self.model.num_layers)]

    def run(self, requests: Sequence[EngineRequest], store_new: bool = True
            ) -> list[EngineResult]:
        """Prefill all ``requests`` in one pass, then decode greedily in lockstep.

        With ``store_new`` the KV of every document computed here is put into the GPU pool
        under its key (the first request computing a key stores it).
        """
        torch = self.model.torch
        rows, plans = [], []
        for request in requests:
            if len(request.query_ids) < 1 or request.max_new_tokens < 1:
                raise ValueError(f"request {request.request_id!r}: needs a query token and "
                                 "max_new_tokens >= 1")
            n_cached = self.cached_documents(request)
            prefix = self._prefix(request, n_cached)
            cached_tokens = 0 if prefix is None else kv_tokens(prefix)
            new_docs = request.documents[n_cached:]
            parts = [self.model.token_tensor(d.token_ids) for d in new_docs]
            parts.append(self.model.token_tensor(request.query_ids))
            rows.append(Row(prefix, torch.cat(parts), cached_tokens))
            plans.append((n_cached, cached_tokens, new_docs, [int(p.shape[0]) for p in parts]))
        prefilled = self.model.prefill(rows)
        results = []
        for request, (n_cached, cached_tokens, new_docs, lengths), new_kv in zip(
                requests, plans, prefilled.new_kv, strict=True):
            stored = []
            offset = 0
            for doc, n in zip(new_docs, lengths, strict=False):
                if store_new and self.store.tier(doc.key) is None:
                    self.store.put(doc.key, [(k[:, offset:offset + n].clone(),
                                              v[:, offset:offset + n].clone())
                                             for k, v in new_kv])
                    stored.append(doc.key)
                offset += n
            results.append(EngineResult(
                request_id=request.request_id, tokens=[],
                first_logits=prefilled.logits[len(results)], cached_documents=n_cached,
                cached_tokens=cached_tokens, computed_tokens=sum(lengths), stored=stored))
        steps = max(r.max_new_tokens for r in requests)
        logits = prefilled.logits
        for step in range(steps):
            next_ids = logits.argmax(dim=-1)
            for row, (result, request) in enumerate(zip(results, requests, strict=True)):
                if step < request.max_new_tokens:
                    result.tokens.append(int(next_ids[row]))
                    result.last_logits = logits[row]
            if step + 1 < steps:
                logits = self.model.decode(prefilled.batch, next_ids)
        return results
