"""ragsim as a library: the one place where a run, a replay, a sweep or a validation is set up
and executed. The command line, the study layer and the notebooks all call it.

>>> import ragsim
>>> run = ragsim.simulate(trace="mmlu", requests=200, rate=1.5, seed=3)
>>> run.summary["requests_completed"]
200

Bad input raises :class:`ragsim.RagsimInputError` naming the option (``rate``), the file, the
row and the field, the same checks and words as ``ragsim run`` (which names ``--rate``).
Imported lazily: ``import ragsim`` stays light, and so does ``ragsim --help``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "simulate": "ragsim.api.run", "Run": "ragsim.api.run",
    "replay": "ragsim.api.replays", "Replay": "ragsim.api.replays",
    "sweep": "ragsim.api.study", "plan": "ragsim.api.study", "SweepFailed": "ragsim.api.study",
    "validate": "ragsim.api.validation", "Validation": "ragsim.api.validation",
    "load_trace": "ragsim.api.loading", "load_profile": "ragsim.api.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ragsim.api' has no attribute {name!r}")
