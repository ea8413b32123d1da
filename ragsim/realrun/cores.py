"""A real run's engine on a core of its own, the run's other threads on the cores it leaves.

A profile times the engine's steps with nothing else on the machine. A served step is not
alone: the search workers, the front end that begins searches at arrivals and the threads of
the engine's own libraries (vLLM's CPU engine: 13 of gloo's, each waking about 110 times a
second) share the cores with it, and the operating system puts them on the engine's core and
moves the engine between cores. On the project's 2-core CPU (2026-12-05, vLLM at 50% load on
the held-out trace, run F's profile): the engine's thread was switched out 340-424 times a run
against 30 at idle, moved between cores 19-43 times against 0-1, and the run's decode steps ran
1.10-1.23x their prices, its prompt steps 1.09x; with the engine alone on one core and every
other thread on the other, 17-55 switches and no moves, and the decode steps ran 0.97-1.00x,
the prompt steps 1.03x. vLLM's own CPU guide does the same: it binds its OpenMP threads to cores
(``VLLM_CPU_OMP_THREADS_BIND``) and keeps a core for the serving front end
(``VLLM_CPU_NUM_OF_RESERVED_CPU``).

``EngineCore`` does it, for both real harnesses (vLLM's in-process engine and the torch
engine), for an engine that runs its steps on the calling thread, on one thread (its forward
passes' intra-op threads: 1), where the process may use more than one core: the calling thread
on the first core it may use, every other thread of the process on the rest.
Threads begun later by the calling thread inherit its core; those that serve the run (the
search workers, the front end) move off it as they begin (``off_engine_core``). Elsewhere it
does nothing and says why (``why_not``).
"""

from __future__ import annotations

import contextlib
import os
import threading

_OTHERS: set[int] | None = None  # the cores the run's other threads keep to, while one is split


def off_engine_core() -> None:
    """Move the calling thread off the engine's core, while a run keeps one apart (a search
    worker or the front end, as it begins)."""
    if _OTHERS is not None:
        os.sched_setaffinity(0, _OTHERS)


class EngineCore:
    """The calling thread (the engine's) on a core of its own while the run serves."""

    def __init__(self, threads: int | None, why_not: str | None = None) -> None:
        """``threads``: the engine's intra-op threads (None: torch's default, every core);
        ``why_not``: the caller's reason to leave the cores as they are."""
        placeable = hasattr(os, "sched_getaffinity") and os.path.isdir("/proc/self/task")
        self.allowed = sorted(os.sched_getaffinity(0)) if placeable else []
        if why_not is None and not placeable:
            why_not = "this system does not let a process place its threads on cores"
        elif why_not is None and threads != 1:
            why_not = (f"the engine runs on {threads or 'every'} thread(s): its intra-op "
                       "threads are not told apart from the run's others")
        elif why_not is None and len(self.allowed) < 2:
            why_not = "the process may use one core: the engine shares it"
        self.why_not = why_not
        self.engine_core = self.allowed[0] if self.allowed and self.why_not is None else None
        self.moved = 0  # the process's other threads moved off the engine's core
        self._before: dict[int, set[int]] = {}  # each thread's cores before, put back after

    def __enter__(self) -> EngineCore:
        global _OTHERS
        if self.why_not is not None:
            return self
        others = set(self.allowed[1:])
        me = threading.get_native_id()
        for tid in os.listdir("/proc/self/task"):
            if int(tid) == me:
                continue
            try:
                self._before[int(tid)] = os.sched_getaffinity(int(tid))
                os.sched_setaffinity(int(tid), others)
                self.moved += 1
            except OSError:  # the thread ended meanwhile
                pass
        self._before[me] = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.engine_core})
        _OTHERS = others
        return self

    def __exit__(self, *exc) -> None:
        global _OTHERS
        if self.why_not is not None:
            return
        _OTHERS = None
        # each thread back on the cores it had (a thread of the process's own choosing keeps
        # it); those begun meanwhile on every core the process may use
        everywhere = set(self.allowed)
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                os.sched_setaffinity(int(tid), self._before.get(int(tid), everywhere))

    def as_dict(self) -> dict:
        """What the run's summary records (``engine_core``)."""
        return {"core": self.engine_core, "other_threads_moved": self.moved,
                "why_not": self.why_not}
