"""Replacement policies, one file each, behind the ``TreePolicy`` interface."""

from __future__ import annotations

from ragsim.cache.policies.base import FlatCache, TreePolicy
from ragsim.cache.policies.belady import Belady
from ragsim.cache.policies.fifo import FIFO
from ragsim.cache.policies.gdsf import GDSF
from ragsim.cache.policies.lfu import LFU
from ragsim.cache.policies.lru import LRU
from ragsim.cache.policies.pgdsf import PGDSF

_POLICIES: dict[str, type[TreePolicy]] = {
    cls.name: cls for cls in (PGDSF, GDSF, LRU, LFU, FIFO, Belady)
}
POLICY_NAMES = tuple(_POLICIES)


def make_policy(name: str) -> TreePolicy:
    try:
        return _POLICIES[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")\
            from None


__all__ = ["POLICY_NAMES", "FlatCache", "TreePolicy", "make_policy"]
