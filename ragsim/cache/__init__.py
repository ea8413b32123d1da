"""The policy core: knowledge tree, replacement policies, flat caches.

Engine-agnostic by construction: nothing here imports SimPy, torch or a Redis client. Drivers
(``ragsim.sim``, ``ragsim.realrun``) call it and hand it numbers, e.g. a prefill-cost function.
"""

from ragsim.cache.policies import POLICY_NAMES, make_policy
from ragsim.cache.tree import MOVE_KINDS, AccessResult, KnowledgeTree, Move, Node, Tier

__all__ = ["MOVE_KINDS", "POLICY_NAMES", "AccessResult", "KnowledgeTree", "Move", "Node", "Tier",
           "make_policy"]
