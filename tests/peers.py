"""Helpers that run libCacheSim (the real C library, via its Python wheel) on our sequences."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

INT64_MAX = 2**63 - 1


def write_oracle_general(path: Path, keys: np.ndarray, sizes: np.ndarray) -> Path:
    """libCacheSim's oracleGeneral binary format: <uint32 time, uint64 id, uint32 size,
    int64 next_access_vtime> per request, next access = index of the next request for the id."""
    keys = np.asarray(keys, dtype=np.int64)
    n = len(keys)
    next_access = np.full(n, INT64_MAX, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        k = int(keys[i])
        if k in last:
            next_access[i] = last[k]
        last[k] = i
    record = np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    assert record.itemsize == struct.calcsize("<IQIq")
    arr = np.empty(n, dtype=record)
    arr["t"] = np.arange(n, dtype=np.uint32)
    arr["id"] = keys.astype(np.uint64)
    arr["size"] = np.asarray(sizes, dtype=np.uint32)
    arr["next"] = next_access
    arr.tofile(path)
    return path


def libcachesim_miss_ratio(policy: str, capacity_bytes: int, trace_path: Path) -> float:
    import libcachesim as lcs

    reader = lcs.TraceReader(str(trace_path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache_cls = {"lru": lcs.LRU, "lfu": lcs.LFU, "gdsf": lcs.GDSF, "fifo": lcs.FIFO,
                 "belady": lcs.Belady}[policy]
    cache = cache_cls(capacity_bytes)
    object_miss_ratio, _ = cache.process_trace(reader)
    return object_miss_ratio
