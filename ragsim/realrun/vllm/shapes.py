"""The step sizes vLLM's engines have run in this process.

vLLM's CPU engine builds its matrix products per step token count (oneDNN primitives, kept in
caches that outlive one engine: a process-wide one of JIT-compiled kernels under each layer's
own), so a step of a count this process has run before does not pay the first-time price a
profile's ``new_shapes`` measures (``ragsim/profiles/new_shapes.py``). A validation runs its
points one after another in one process, after its own profile measurement and speed probes:
by the 50% point most prompt lengths of the trace have been run. The simulation of a point is
told which (``Profile.warmed``), as its engine would know.

Every engine ``build_engine`` makes is watched: each step its scheduler forms notes its total
token count, in the order of their last run. The process-wide cache is bounded (oneDNN's
primitive cache, 1,024 primitives: least recently used out), so a count run long ago behind
many others has been dropped and is built again; the order kept here lets a profile that knows
the bound (``NewShapes.built_capacity_counts``) tell which counts are still built.
"""

from __future__ import annotations

from ragsim.profiles.new_shapes import StepSizesRun

# every count run, oldest last run first
_STEPS_RUN = StepSizesRun()


def watch_step_tokens(llm) -> bool:
    """Note the token count of every step ``llm``'s in-process scheduler forms from now on;
    False where the engine core is not in this process (nothing can be noted)."""
    core = getattr(getattr(llm, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "schedule"):
        return False
    schedule = scheduler.schedule

    def noted(*args, **kwargs):
        out = schedule(*args, **kwargs)
        tokens = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
        _STEPS_RUN.note(tokens)
        return out

    scheduler.schedule = noted
    return True


def step_tokens_run() -> tuple[int, ...]:
    """Every step token count a watched engine of this process has run so far, each once, in
    the order of their last run (the least recently run first)."""
    return _STEPS_RUN.counts()


__all__ = ["step_tokens_run", "watch_step_tokens"]
