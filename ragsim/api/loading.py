"""``ragsim.load_trace`` and ``ragsim.load_profile``: the inputs a run reads, as it reads them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragsim.profiles.profile import Profile
    from ragsim.traces.schema import Trace


def load_trace(name_or_path: str | Path, *, requests: int | None = None, seed: int = 0,
               drift: float | None = None) -> Trace:
    """A built-in trace (``mmlu``, ``nq``, ``wiki-trivia``, ...) or a trace folder / JSONL file,
    as ``ragsim run --trace`` reads it: the first ``requests`` (a synthetic trace generates that
    many, with ``seed`` and ``drift``). ``requests_table()`` and ``documents_table()`` give its
    two tables (pyarrow; ``.to_pandas()`` for DataFrames)."""
    from ragsim.api.options import generator_settings
    from ragsim.traces import resolve_trace

    return resolve_trace(str(name_or_path), seed=seed, n_requests=requests,
                         **generator_settings(drift))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped cost profile (``a10g-mistral-7b``, see ``ragsim profiles list``) or a JSON file
    that ``ragsim profile`` wrote."""
    from ragsim.profiles.profile import load_profile as load

    return load(str(name_or_path))


__all__ = ["load_profile", "load_trace"]
