"""The reference engine's KV store: real tensors per knowledge-tree node, in two tiers.

A node's KV is that document's keys and values *at its position on its path* (a document's KV
depends on everything before it), so the key is the tree's node object. The store has two
tiers, a GPU pool (the model's device) and a host pool (CPU memory), each with a byte budget;
moves between them are real copies. Which node lives where is the knowledge tree's decision:
``TorchIterations`` (``iterations.py``) carries out the tree's moves here and assembles each
prefill's cached prefix from the stored nodes. This module only does what it is told and
refuses what does not fit.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ragsim.profiles.torch_model import LayerKV

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

    def read(self, key: Hashable) -> NodeKV:
        """A node's KV from the fastest pool holding it: a position-free hit reads a host
        copy where it lies (the tree does not move it; the blended prefill copies it in)."""
        return self.gpu[key] if key in self.gpu else self.host[key]

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

    def begin_swap_in(self, key: Hashable) -> list[tuple[LayerKV, LayerKV]]:
        """``swap_in`` split by layer, for a prefill that overlaps it with compute: the node's
        GPU tensors are allocated and the node counts as in the GPU pool now; the caller copies
        each layer (``copy_layer``) before that layer's attention reads it. Returns per layer
        ((host keys, host values), (GPU keys, GPU values))."""
        if key in self.gpu:
            raise KeyError(f"node {key!r} is already in the GPU pool")
        kv = self.host[key]
        n_bytes = kv_bytes(kv)
        self._check_gpu(n_bytes, key)
        torch = self.torch
        device_kv = [(torch.empty(k.shape, dtype=k.dtype, device=self.device),
                      torch.empty(v.shape, dtype=v.dtype, device=self.device)) for k, v in kv]
        self.gpu[key] = device_kv
        self.gpu_bytes += n_bytes
        return list(zip(kv, device_kv, strict=True))

    def copy_layer(self, host: LayerKV, device: LayerKV) -> None:
        """One layer of a ``begin_swap_in``: asynchronous on CUDA (on the current stream, from
        pinned memory), a plain copy on a CPU."""
        for src, dst in zip(host, device, strict=True):
            dst.copy_(src, non_blocking=self._cuda)

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
