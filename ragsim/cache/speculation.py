"""Dynamic speculative pipelining (RAGCache Algorithm 2): when to start and stop speculation.

Vector search runs in stages, each producing the current top-k. Algorithm 2, for one request::

    D = []
    while the vector search of request is not finished:
        D_temp = VECTOR_SEARCH(request, D)          # the next stage's top-k
        if D_temp != D:
            if {request, D} in pool: terminate {request, D} after the current iteration
            if pool.size < max_prefill_bs: pool.insert({request, D_temp})
            D = D_temp

When the final top-k arrives, a speculative generation that used the same list is kept (its
output is returned, no later than the search ends); otherwise the request is generated again
with the final list, whatever the load. Theorem 5.1 is the special case of an idle pool.

These are pure decisions; the driver owns time, the pool and the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StageDecision(NamedTuple):
    terminate_running: bool  # stop the speculation started with the previous list
    start_new: bool  # start a speculation with this stage's list
    changed: bool  # the stage produced a different list (D becomes D_temp)


def list_changed(previous: Sequence[int] | None, current: Sequence[int]) -> bool:
    """Whether a stage's list differs from the one before (the first list always does): a
    stage whose list did not change leads to no decision, so a driver that knows the lists in
    advance need not stop at it."""
    if previous is None:
        return True
    if type(previous) is list and type(current) is list:  # (the drivers' lists: no copies)
        return previous != current
    return list(previous) != list(current)


def on_intermediate_stage(previous: Sequence[int] | None, current: Sequence[int],
                          speculation_active: bool, pool_size: int,
                          max_prefill_bs: int) -> StageDecision:
    """Algorithm 2's loop body for a stage that is not the last one."""
    if not list_changed(previous, current):
        return StageDecision(False, False, False)
    return StageDecision(speculation_active, pool_size < max_prefill_bs, True)


class FinalDecision(NamedTuple):
    keep_speculation: bool  # the speculation used the final list: its output stands
    terminate_running: bool  # a speculation used another list: stop it
    start_final: bool  # generate with the final list (always, unless kept)


def on_final_result(speculated: Sequence[int] | None, final: Sequence[int]) -> FinalDecision:
    """The search finished with ``final``; ``speculated`` is the active speculation's list."""
    if speculated is not None and list(speculated) == list(final):
        return FinalDecision(True, False, False)
    return FinalDecision(False, speculated is not None, True)
