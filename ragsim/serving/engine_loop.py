"""The engine's serving loop, which the simulator and the replay of a real run charge alike.

A real engine does more than its steps: between two steps its loop hands each step's outputs
back and takes new requests in, and a serving process that does this on the engine's own
thread (ragsim's real vLLM run: its pipeline, clock and vLLM's own ``add_request``) delays the
next step by it. docs/validation.md ("The vLLM run's engine thread between steps") measured it
at 1.01 ms a gap at 90% load on the project's CPU, half of it vLLM's intake of a request at
1.9-3.9x what the profile's prices hold for it. The profile times the engine alone, so the
configuration carries the loop (``engine_loop_step_s``, ``engine_loop_request_s``), which
``validate`` measures through the real run's own loop (``realrun/vllm/loop.py``).

The search tier in the engine's process is the third term (``engine_loop_search_s``): a
serving process whose search workers and front end run Python beside an in-process engine
shares one interpreter with it, and the engine's Python (vLLM's scheduling, its inputs and
outputs) waits while they hold it. On the project's CPU a background thread holding the
interpreter 9% of the time made vLLM's 1- and 3-row decode steps 10-23% longer, numpy work
that lets it go 54-59% of the time 1-11% (docs/validation.md, "The search tier in the engine's
interpreter"). A search takes the interpreter back several times (its hand-over, each
stage's list, its end), and each time the engine's thread waits to get it back: a search beside
vLLM's 4-row decode steps cost them 0.7 ms, where the search's threads held the interpreter
0.3 ms (``realrun/search_cost.py``). A request whose search ran while the engine was busy costs
the engine what validate measured a search to cost its steps (the engine's steps timed alone
and beside the trace's searches, after the probe runs of either engine: ``realrun/probe_runs``,
vLLM's loop probe); one searched while the engine sat idle costs it nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLoop:
    """The engine's serving loop as the simulator charges it, on the engine's timeline (the
    configuration's ``engine_loop_step_s``, ``engine_loop_request_s`` and
    ``engine_loop_search_s``; docs/validation.md, "The vLLM run's engine thread between steps"
    and "The search tier in the engine's interpreter"): ``step_s`` between two steps of a busy
    engine, ``request_s`` per request with its first prompt chunk, and ``search_s`` with it
    where the engine was busy while the request was searched. The same rule prices the replay
    of a real run's decisions (``ragsim.decisions.replay``)."""

    step_s: float = 0.0
    request_s: float = 0.0
    # per request searched beside a busy engine: what its search cost the engine's steps
    search_s: float = 0.0

    def seconds(self, after_a_step: bool, new_requests: int) -> float:
        """What a step pays for the loop: ``after_a_step`` (begun as the last step ended) and
        the number of requests whose first chunk it takes. A step begun as the one before it
        ended finds the engine busy since before its new requests were searched, so each pays
        what its search cost the engine too; after the engine sat idle, their searches ran
        beside an idle engine."""
        per_request = self.request_s + (self.search_s if after_a_step else 0.0)
        return (self.step_s if after_a_step else 0.0) + per_request * new_requests

    def without_search(self) -> EngineLoop | None:
        """This loop without the search tier's term (None: nothing left): what a replay at
        the real steps' measured durations charges, since that time was spent inside them."""
        if not (self.step_s or self.request_s):
            return None
        return EngineLoop(self.step_s, self.request_s)

    @classmethod
    def of(cls, config) -> EngineLoop | None:
        """The configuration's loop (None: one that costs nothing)."""
        step = float(getattr(config, "engine_loop_step_s", 0.0))
        request = float(getattr(config, "engine_loop_request_s", 0.0))
        search = float(getattr(config, "engine_loop_search_s", 0.0))
        return cls(step, request, search) if step or request or search else None
