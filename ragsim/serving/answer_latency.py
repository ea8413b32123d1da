"""The answer cache's latency profile: what each tier's lookup and write cost, measured on the
real stores (``ragsim profile --answer-cache``), read by the simulator instead of constants.

Format (JSON), like the cost profiles a ``format`` and a ``version``::

    {"format": "ragsim.answer-profile", "version": 1, "name": "...",
     "measured": {...free-form: server, machine, index, samples...},
     "embed_s": 0.005,                       # the query embedding (paid before a vector lookup)
     "l1": {"lookup_s": 8e-6, "write_s": 4e-6},
     "l2": {"lookup_s": 1e-4, "write_s": 1.5e-4},
     "semantic": {"entries": [1000, 10000], "lookup_s": [...], "write_s": [...]}}

Every number is the p50 of its measured samples, in seconds (the file may carry p99s and
recall beside them: the simulator does not read them). A tier's latency is that of the store
operation alone (``L1Store.get``, the L2 ``GET``, the vector range query), so a request pays
the tiers it asks in turn. The semantic tier's cost depends on the index's size: it is
interpolated in log(entries) between the measured sizes and held flat past both ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ragsim.errors import ProfileError

FORMAT_NAME = "ragsim.answer-profile"
FORMAT_VERSION = 1
DEFAULT = "default"  # the shipped profile, measured on this project's machine


@dataclass(frozen=True)
class AnswerLatency:
    """Seconds per operation of each tier (p50s); semantic ones per index size."""

    name: str
    source: str
    l1_lookup_s: float
    l1_write_s: float
    l2_lookup_s: float
    l2_write_s: float
    semantic_entries: tuple[int, ...]
    semantic_lookup_s: tuple[float, ...]
    semantic_write_s: tuple[float, ...]
    embed_s: float

    def _at(self, values: tuple[float, ...], entries: int) -> float:
        x = np.log(np.asarray(self.semantic_entries, dtype=float))
        return float(np.interp(math.log(max(entries, 1)), x, values))

    def semantic_lookup_at(self, entries: int) -> float:
        """A vector lookup's seconds with ``entries`` vectors in the index."""
        return self._at(self.semantic_lookup_s, entries)

    def semantic_write_at(self, entries: int) -> float:
        return self._at(self.semantic_write_s, entries)

    def record(self) -> dict:
        """What a run's summary records of the profile it used."""
        return {"name": self.name, "source": self.source, "l1_lookup_s": self.l1_lookup_s,
                "l2_lookup_s": self.l2_lookup_s, "embed_s": self.embed_s,
                "semantic_entries": list(self.semantic_entries),
                "semantic_lookup_s": list(self.semantic_lookup_s)}


def _number(data: dict, key: str, source: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0:
        raise ProfileError(f"must be a number of seconds >= 0, got {value!r}", file=source,
                           field=f"{where}{key}")
    return float(value)


def _table(data: dict, key: str, source: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"must be an object, got {type(value).__name__}", file=source,
                           field=key)
    return value


def from_dict(data: object, *, source: str) -> AnswerLatency:
    """A checked latency profile; a bad one names the file and the field."""
    if not isinstance(data, dict):
        raise ProfileError("must be a JSON object", file=source)
    if data.get("format") != FORMAT_NAME:
        raise ProfileError(f"expected {FORMAT_NAME!r}, got {data.get('format')!r}", file=source,
                           field="format")
    version = data.get("version")
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise ProfileError(f"unsupported version {version!r}; this ragsim reads version "
                           f"{FORMAT_VERSION}", file=source, field="version")
    l1, l2, sem = (_table(data, k, source) for k in ("l1", "l2", "semantic"))
    entries = sem.get("entries")
    if not isinstance(entries, list) or not entries or any(
            isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in entries) \
            or entries != sorted(set(entries)):
        raise ProfileError(f"must be a non-empty increasing list of index sizes (>= 1), got "
                           f"{entries!r}", file=source, field="semantic.entries")
    columns = {}
    for key in ("lookup_s", "write_s"):
        values = sem.get(key)
        if not isinstance(values, list) or len(values) != len(entries):
            raise ProfileError(f"must be a list of {len(entries)} numbers (one per entry count)",
                               file=source, field=f"semantic.{key}")
        columns[key] = tuple(_number({key: v}, key, source, f"semantic.{key}[{i}].")
                             for i, v in enumerate(values))
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError("must be a non-empty text", file=source, field="name")
    return AnswerLatency(
        name=name, source=source,
        l1_lookup_s=_number(l1, "lookup_s", source, "l1."),
        l1_write_s=_number(l1, "write_s", source, "l1."),
        l2_lookup_s=_number(l2, "lookup_s", source, "l2."),
        l2_write_s=_number(l2, "write_s", source, "l2."),
        semantic_entries=tuple(entries), semantic_lookup_s=columns["lookup_s"],
        semantic_write_s=columns["write_s"],
        embed_s=_number(data, "embed_s", source, ""))


def shipped_path():
    return resources.files("ragsim.serving") / "data" / "answer-profile.json"


def load_answer_latency(name_or_path: str = DEFAULT) -> AnswerLatency:
    """The shipped profile (``default``) or a JSON file by path."""
    from ragsim.user_files import parse_json, read_user_text

    if name_or_path == DEFAULT:
        text, source = shipped_path().read_text(encoding="utf-8"), DEFAULT
    else:
        path = Path(name_or_path)
        source = str(path)
        if not path.exists():
            raise ProfileError(f"no such file (or '{DEFAULT}': the shipped profile)",
                               file=source)
        text = read_user_text(path, what="answer-latency profile", error=ProfileError)
    data = parse_json(text, source=source, error=ProfileError)
    return from_dict(data, source=source)
