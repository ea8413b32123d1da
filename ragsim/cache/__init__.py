"""The policy core: knowledge tree, replacement policies, flat caches.

Engine-agnostic by construction: nothing here imports SimPy, torch or a Redis client. Drivers
(``ragsim.sim``, ``ragsim.realrun``) call it and hand it numbers, e.g. a prefill-cost function.
"""

from ragsim.cache.policies import POLICY_NAMES, make_policy
from ragsim.cache.tree import AccessResult, KnowledgeTree, Node, Tier

__all__ = ["POLICY_NAMES", "AccessResult", "KnowledgeTree", "Node", "Tier", "make_policy"]
