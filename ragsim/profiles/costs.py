"""Prefill-cost tables T(cached_tokens, new_tokens) and their bilinear interpolation.

PGDSF needs, for every request that computes a node, the prefill time of that request given how
many of its tokens were cached (alpha) and how many must be computed (beta). The paper profiles T
offline on a grid and interpolates bilinearly (Algorithm 1). This module holds the grid, reads and
checks the file format, and answers T(alpha, beta) both one point at a time (the per-request hot
path; Cython-compiled like the tree) and vectorised (numpy, for tools and plots).

Outside the grid the edge cells are extended linearly and every such query is counted in
``extrapolated_queries``, so a run can say how often it left the measured region.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import cython
import numpy as np

from ragsim.errors import ProfileError

FORMAT_NAME = "ragsim.prefill-cost-table"
FORMAT_VERSION = 1


@cython.cclass
class PrefillCostTable:
    """T(alpha cached tokens, beta new tokens) in seconds on a rectilinear grid."""

    name = cython.declare(str, visibility="public")
    cached_tokens = cython.declare(list, visibility="public")
    new_tokens = cython.declare(list, visibility="public")
    prefill_s = cython.declare(list, visibility="public")
    metadata = cython.declare(dict, visibility="public")
    extrapolated_queries = cython.declare(cython.longlong, visibility="public")
    _grid = cython.declare(object)

    def __init__(self, name: str, cached_tokens: list, new_tokens: list, prefill_s: list,
                 metadata: dict | None = None, *, source: str | None = None) -> None:
        self.name = str(name)
        self.cached_tokens = list(cached_tokens)
        self.new_tokens = list(new_tokens)
        self.prefill_s = [list(row) for row in prefill_s]
        self.metadata = dict(metadata or {})
        self.extrapolated_queries = 0
        self._validate(source or self.name)
        self.cached_tokens = [float(v) for v in self.cached_tokens]
        self.new_tokens = [float(v) for v in self.new_tokens]
        self.prefill_s = [[float(v) for v in row] for row in self.prefill_s]
        self._grid = np.asarray(self.prefill_s, dtype=np.float64)

    def _validate(self, source: str) -> None:
        for axis_name in ("cached_tokens", "new_tokens"):
            axis = getattr(self, axis_name)
            if len(axis) < 2:
                raise ProfileError("an axis needs at least two points", file=source,
                                   field=axis_name)
            for i, value in enumerate(axis):
                if (isinstance(value, bool) or not isinstance(value, int | float)
                        or not math.isfinite(value) or value < 0):
                    raise ProfileError(f"entry {i} is {value!r}; must be finite and >= 0",
                                       file=source, field=axis_name)
                if i and value <= axis[i - 1]:
                    raise ProfileError(f"axis must increase strictly; entry {i} ({value}) "
                                       f"follows {axis[i - 1]}", file=source, field=axis_name)
        if len(self.prefill_s) != len(self.cached_tokens):
            raise ProfileError(
                f"has {len(self.prefill_s)} rows but cached_tokens has "
                f"{len(self.cached_tokens)} points", file=source, field="prefill_s")
        for r, row in enumerate(self.prefill_s):
            if len(row) != len(self.new_tokens):
                raise ProfileError(f"has {len(row)} columns, expected {len(self.new_tokens)}",
                                   file=source, row=r, field="prefill_s")
            for c, value in enumerate(row):
                if (isinstance(value, bool) or not isinstance(value, int | float)
                        or not math.isfinite(value) or value < 0):
                    raise ProfileError(f"column {c} is {value!r}; times must be finite and >= 0",
                                       file=source, row=r, field="prefill_s")
        # more tokens never take less time: interpolation stays monotone only if the grid is
        for r, row in enumerate(self.prefill_s):
            for c in range(1, len(row)):
                if row[c] < row[c - 1]:
                    raise ProfileError(
                        f"time falls from {row[c - 1]} to {row[c]} s as new_tokens grows "
                        f"(columns {c - 1} -> {c}); grids must be non-decreasing",
                        file=source, row=r, field="prefill_s")
            if r:
                for c in range(len(row)):
                    if row[c] < self.prefill_s[r - 1][c]:
                        raise ProfileError(
                            f"time falls from {self.prefill_s[r - 1][c]} to {row[c]} s as "
                            f"cached_tokens grows (column {c}); grids must be non-decreasing",
                            file=source, row=r, field="prefill_s")

    # -- queries ---------------------------------------------------------------------------
    @cython.cfunc
    @cython.inline
    def _cell(self, axis: list, x: cython.double) -> cython.Py_ssize_t:
        """Index i of the cell [axis[i], axis[i+1]] used for x (edge cells outside)."""
        lo: cython.Py_ssize_t = 0
        hi: cython.Py_ssize_t = len(axis) - 2
        mid: cython.Py_ssize_t
        while lo < hi:  # largest i <= len-2 with axis[i] <= x, or 0
            mid = (lo + hi + 1) >> 1
            if cython.cast(cython.double, axis[mid]) <= x:
                lo = mid
            else:
                hi = mid - 1
        return lo

    @cython.ccall
    def prefill_s_at(self, cached_tokens: cython.double, new_tokens: cython.double
                     ) -> cython.double:
        """Bilinear interpolation of T, exactly as the paper's Algorithm 1 writes it."""
        a_axis: list = self.cached_tokens
        b_axis: list = self.new_tokens
        grid: list = self.prefill_s
        if (cached_tokens < a_axis[0] or cached_tokens > a_axis[len(a_axis) - 1]
                or new_tokens < b_axis[0] or new_tokens > b_axis[len(b_axis) - 1]):
            self.extrapolated_queries += 1
        i: cython.Py_ssize_t = self._cell(a_axis, cached_tokens)
        j: cython.Py_ssize_t = self._cell(b_axis, new_tokens)
        a_lo: cython.double = a_axis[i]
        a_hi: cython.double = a_axis[i + 1]
        b_lo: cython.double = b_axis[j]
        b_hi: cython.double = b_axis[j + 1]
        row_lo: list = grid[i]
        row_hi: list = grid[i + 1]
        t00: cython.double = row_lo[j]
        t01: cython.double = row_lo[j + 1]
        t10: cython.double = row_hi[j]
        t11: cython.double = row_hi[j + 1]
        wa: cython.double = (cached_tokens - a_lo) / (a_hi - a_lo)
        t_b_lo: cython.double = t00 + wa * (t10 - t00)
        t_b_hi: cython.double = t01 + wa * (t11 - t01)
        value: cython.double = t_b_lo + (new_tokens - b_lo) / (b_hi - b_lo) * (t_b_hi - t_b_lo)
        return value if value > 0.0 else 0.0

    def prefill_s_many(self, cached_tokens: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        """Vectorised ``prefill_s_at`` (same formula, same extrapolation)."""
        a = np.asarray(cached_tokens, dtype=np.float64)
        b = np.asarray(new_tokens, dtype=np.float64)
        a_axis = np.asarray(self.cached_tokens)
        b_axis = np.asarray(self.new_tokens)
        i = np.clip(np.searchsorted(a_axis, a, side="right") - 1, 0, len(a_axis) - 2)
        j = np.clip(np.searchsorted(b_axis, b, side="right") - 1, 0, len(b_axis) - 2)
        outside = (a < a_axis[0]) | (a > a_axis[-1]) | (b < b_axis[0]) | (b > b_axis[-1])
        self.extrapolated_queries += int(outside.sum())
        g = self._grid
        wa = (a - a_axis[i]) / (a_axis[i + 1] - a_axis[i])
        t_lo = g[i, j] + wa * (g[i + 1, j] - g[i, j])
        t_hi = g[i, j + 1] + wa * (g[i + 1, j + 1] - g[i, j + 1])
        out = t_lo + (b - b_axis[j]) / (b_axis[j + 1] - b_axis[j]) * (t_hi - t_lo)
        return np.maximum(out, 0.0)

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            **self.metadata,
            "cached_tokens": list(self.cached_tokens),
            "new_tokens": list(self.new_tokens),
            "prefill_s": [list(row) for row in self.prefill_s],
        }

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "<table>") -> PrefillCostTable:
        if not isinstance(data, dict):
            raise ProfileError("expected a JSON object", file=source)
        if data.get("format") != FORMAT_NAME:
            raise ProfileError(f"expected {FORMAT_NAME!r}, got {data.get('format')!r}",
                               file=source, field="format")
        if data.get("version") != FORMAT_VERSION:
            raise ProfileError(f"unsupported version {data.get('version')!r}; this ragsim "
                               f"reads version {FORMAT_VERSION}", file=source, field="version")
        for key in ("name", "cached_tokens", "new_tokens", "prefill_s"):
            if key not in data:
                raise ProfileError("missing", file=source, field=key)
        for key in ("cached_tokens", "new_tokens"):
            if not isinstance(data[key], list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in data[key]
            ):
                raise ProfileError("must be a list of numbers", file=source, field=key)
        if not isinstance(data["prefill_s"], list) or not all(
            isinstance(r, list) for r in data["prefill_s"]
        ):
            raise ProfileError("must be a list of rows", file=source, field="prefill_s")
        meta = {k: v for k, v in data.items()
                if k not in ("format", "version", "name", "cached_tokens", "new_tokens",
                             "prefill_s")}
        return cls(data["name"], data["cached_tokens"], data["new_tokens"], data["prefill_s"],
                   meta, source=source)


def shipped_table_names() -> list[str]:
    folder = resources.files("ragsim.profiles") / "data"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_cost_table(name_or_path: str) -> PrefillCostTable:
    """A shipped table by name (``a10g-mistral-7b``) or a JSON file by path."""
    path = Path(name_or_path)
    if not path.exists():
        if name_or_path not in shipped_table_names():
            raise ProfileError(
                f"no such file, and not a shipped table; shipped: {shipped_table_names()}",
                file=name_or_path)
        text = (resources.files("ragsim.profiles") / "data" / f"{name_or_path}.json").read_text()
        source = name_or_path
    else:
        text, source = path.read_text(), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"not valid JSON: {exc}", file=source) from exc
    return PrefillCostTable.from_dict(data, source=source)
