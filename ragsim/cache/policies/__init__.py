"""Replacement policies, one file each, behind the ``TreePolicy`` interface."""

from __future__ import annotations

from ragsim.cache.policies.base import FlatCache, TreePolicy
from ragsim.cache.policies.belady import Belady
from ragsim.cache.policies.fifo import FIFO
from ragsim.cache.policies.gdsf import GDSF
from ragsim.cache.policies.lfu import LFU
from ragsim.cache.policies.lru import LRU
from ragsim.cache.policies.pgdsf import PGDSF, PGDSFConstCost, PGDSFNoSize

_POLICIES: dict[str, type[TreePolicy]] = {
    cls.name: cls for cls in (PGDSF, GDSF, LRU, LFU, FIFO, Belady, PGDSFConstCost, PGDSFNoSize)
}
POLICY_NAMES = tuple(_POLICIES)


def make_policy(name: str) -> TreePolicy:
    try:
        return _POLICIES[name.lower()]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")\
            from None


def describe_policies() -> list[dict]:
    """One row per policy for ``ragsim policies``: name, family, what it keeps, which parts of
    RAGCache's Algorithm 1 it has, and whether the frequency scope and a profile matter to it."""
    return [{
        "name": cls.name,
        "family": cls.family,
        "keeps": cls.description,
        "algorithm1": cls.algorithm1,
        "uses_frequency_scope": cls.uses_frequency,
        "needs_profile": cls.needs_cost,
        "needs_future": cls.needs_future,
    } for cls in _POLICIES.values()]


__all__ = ["POLICY_NAMES", "FlatCache", "TreePolicy", "describe_policies", "make_policy"]
