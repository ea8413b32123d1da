"""Real engines, retrieval and answer caches driven by the same policy core (later issues)."""
