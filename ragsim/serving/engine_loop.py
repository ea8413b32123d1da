"""The engine's serving loop, which the simulator and the replay of a real run charge alike.

A real engine does more than its steps: between two steps its loop hands each step's outputs
back and takes new requests in, and a serving process that does this on the engine's own
thread (ragsim's real vLLM run: its pipeline, clock and vLLM's own ``add_request``) delays the
next step by it. docs/validation.md ("The vLLM run's engine thread between steps") measured it
at 1.01 ms a gap at 90% load on the project's CPU, half of it vLLM's intake of a request at
1.9-3.9x what the profile's prices hold for it. The profile times the engine alone, so the
configuration carries the loop (``engine_loop_step_s``, ``engine_loop_request_s``), which
``validate`` measures through the real run's own loop (``realrun/vllm/loop.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLoop:
    """The engine's serving loop as the simulator charges it, on the engine's timeline (the
    configuration's ``engine_loop_step_s`` and ``engine_loop_request_s``; docs/validation.md,
    "The vLLM run's engine thread between steps"): ``step_s`` between two steps of a busy
    engine, ``request_s`` per request, with its first prompt chunk. The same rule prices the
    replay of a real run's decisions (``ragsim.decisions.replay``)."""

    step_s: float = 0.0
    request_s: float = 0.0

    def seconds(self, after_a_step: bool, new_requests: int) -> float:
        """What a step pays for the loop: ``after_a_step`` (begun as the last step ended) and
        the number of requests whose first chunk it takes."""
        return (self.step_s if after_a_step else 0.0) + self.request_s * new_requests

    @classmethod
    def of(cls, config) -> EngineLoop | None:
        """The configuration's loop (None: one that costs nothing)."""
        step = float(getattr(config, "engine_loop_step_s", 0.0))
        request = float(getattr(config, "engine_loop_request_s", 0.0))
        return cls(step, request) if step or request else None
