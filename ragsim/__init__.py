"""ragsim: what KV-cache, answer-cache and scheduling policies do to RAG serving.

The Python API (``ragsim.api``) is the one way in; the command line calls it::

    import ragsim
    run = ragsim.simulate(trace="mmlu", requests=2000, rate=1.5, seed=3)
    run.summary["ttft_mean_s"], run.requests.head()

The import arrow points one way: ``cli`` -> ``api`` -> ``study``/``sim``/``realrun`` ->
``serving`` -> ``cache``, ``profiles``, ``traces``. The policy core (``ragsim.cache``) never
imports a driver. The API's names are loaded on first use, so ``import ragsim`` stays light.
"""

from ragsim.errors import RagsimInputError

__version__ = "0.1.0"

_API = ("simulate", "replay", "sweep", "validate", "plan", "load_trace", "load_profile", "Run",
        "Replay", "Validation", "SweepFailed")
__all__ = ["RagsimInputError", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        from ragsim.api import _EXPORTS

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ragsim' has no attribute {name!r}")
