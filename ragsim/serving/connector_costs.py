"""A KV connector's work inside the engine's steps, which the simulation prices beside the
profile's.

RAGCache's connector on vLLM (``realrun/vllm/connector.py``) works inside vLLM's step: its
scheduler side serves each request from the knowledge tree when vLLM allocates it (PGDSF's
update, admission, evictions, the plan of the request's blocks), and its worker side copies KV
between vLLM's blocks and host memory, block by block and layer by layer: a node the tree admits
is saved in the step that computes it (write-through, so that a later eviction has it), and a
host-tier hit is loaded before the step's forward pass. A profile of vLLM times the engine
without a connector, so none of it is in the profile's prices, and the host-tier copy the
profile does time is one large copy, not a block's worth at a time.

Three terms, per request served, per token saved and per token loaded, which ``validate``
measures on the probe runs' own connector (``realrun/vllm/loop.py``: the connector times its
calls, ``host_tier`` in a run's summary) on requests the validation does not serve. The
simulator (``sim.predicted``) and the replay of a real run's decisions (``decisions.priced_s``)
charge them by one rule (``seconds``, ``load_s``): a request's tree work with its first prompt
chunk, a save with the chunk that computes the saved tokens, a load before the first chunk, at
the connector's rate instead of the profile's transfer bandwidth where it was measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectorCosts:
    """The configuration's ``connector_request_s``, ``connector_save_s_per_token`` and
    ``connector_load_s_per_token`` (0: not charged; a load rate of 0 leaves host-tier copies at
    the profile's transfer bandwidth)."""

    request_s: float = 0.0
    save_s_per_token: float = 0.0
    load_s_per_token: float = 0.0

    def seconds(self, new_requests: int, saved_tokens: int) -> float:
        """What a step pays for the connector's tree work on the ``new_requests`` whose first
        chunk it takes and its saves of ``saved_tokens`` (the loads are ``load_s``)."""
        return self.request_s * new_requests + self.save_s_per_token * saved_tokens

    def load_s(self, loaded_bytes: int, kv_bytes_per_token: int) -> float | None:
        """The loads of ``loaded_bytes`` of host-tier KV at the connector's measured rate
        (None: not measured; the profile's transfers price them)."""
        if not self.load_s_per_token:
            return None
        return self.load_s_per_token * loaded_bytes / kv_bytes_per_token

    @classmethod
    def of(cls, config) -> ConnectorCosts | None:
        """The configuration's connector costs (None: one that costs nothing)."""
        costs = cls(float(getattr(config, "connector_request_s", 0.0)),
                    float(getattr(config, "connector_save_s_per_token", 0.0)),
                    float(getattr(config, "connector_load_s_per_token", 0.0)))
        return costs if costs != cls() else None


def saved_in_chunk(save_tokens: int, prefilled: int, take: int) -> int:
    """The tokens of a prompt's ``save_tokens`` (its first new tokens: the documents the tree
    admits for it, which come right after its cached prefix) that a chunk of ``take`` tokens,
    after ``prefilled`` of them, computes."""
    return max(0, min(prefilled + take, save_tokens) - prefilled)
