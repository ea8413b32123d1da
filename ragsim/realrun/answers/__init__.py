"""The answer cache on real stores: cachetools L1 (the core's ``L1Store``), Redis L2 and
redisvl's semantic cache (``stores``), and an embedded server when no Redis is given
(``server``). The tier logic is ``ragsim.cache.answers``: this package only supplies stores."""

from ragsim.realrun.answers.server import EmbeddedServer
from ragsim.realrun.answers.stores import RedisSharedStore, VectorIndex, connect

__all__ = ["EmbeddedServer", "RedisSharedStore", "VectorIndex", "connect"]
