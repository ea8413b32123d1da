"""The answer cache in front of RAG: one implementation of its tier logic.

L1 (in-process exact match) → L2 (shared exact match, ``exact:{md5}``) → semantic (KNN over
query embeddings) → miss; backfill of L1 on lower hits, write-back of every tier on a miss,
``NULL_RESULT`` negative entries, TTL jitter, hot-key admission, history bypass and per-tier
counters (``tiers.AnswerCache``). The tier logic sees its stores through a small interface
(``stores``) and is given the clock as numbers, so the simulator (modelled stores, simulated
seconds) and the real run (cachetools + Redis, wall seconds) make their decisions with the same
code. Nothing here imports a Redis client or SimPy.
"""

from ragsim.cache.answers.keys import exact_key, normalize_query
from ragsim.cache.answers.stores import L1Store, ModelSharedStore, SharedStore
from ragsim.cache.answers.tiers import (
    NULL_RESULT,
    TIERS,
    AnswerCache,
    AnswerCacheConfig,
    Counters,
    Entry,
    Instances,
    Lookup,
    similarity_to_distance,
)

__all__ = ["NULL_RESULT", "TIERS", "AnswerCache", "AnswerCacheConfig", "Counters", "Entry",
           "Instances", "L1Store", "Lookup", "ModelSharedStore", "SharedStore", "exact_key",
           "normalize_query", "similarity_to_distance"]
