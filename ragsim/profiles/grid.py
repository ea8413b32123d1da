"""Monotone 2-D tables of seconds on a rectilinear grid, and their bilinear interpolation.

The paper estimates prefill time T(alpha cached, beta new tokens) by bilinear interpolation of an
offline profile (Algorithm 1); decode iterations are tabulated the same way over batch size and
context length. A grid answers one point at a time (the per-request hot path; this module is
Cython-compiled like the tree) and vectorised (numpy, for tools and plots).

Inside the grid the interpolation is exactly the paper's formula. Outside it the edge cells are
extended linearly, never below zero, and every such query is counted in
``extrapolated_queries`` so that runs can say, loudly, how often they left the measured region.
Grids must be non-decreasing along both axes (more tokens never take less time), which keeps the
interpolant monotone too, except along x where a grid says it was measured otherwise
(``monotone_x=False``): on a CPU a decode step of 4 rows ran faster than one of 3 (10.2 against
15.6 ms, one thread: the matrix products of 2-3 rows take a slower path), and a grid made
monotone priced 3 rows at 9.1 ms.
"""

from __future__ import annotations

import math

import cython
import numpy as np

from ragsim.errors import ProfileError


def monotone_along_y(values: list[list[float]]) -> list[list[float]]:
    """Each row made non-decreasing along y (isotonic regression, then a running maximum), x as
    measured: a decode grid's contexts (more context never costs less) over its batch sizes
    (which on a CPU can: ``BilinearGrid.monotone_x``)."""
    from scipy.optimize import isotonic_regression

    rows = [np.maximum.accumulate(isotonic_regression(row).x)
            for row in np.asarray(values, dtype=np.float64)]
    return [[float(v) for v in row] for row in rows]


def monotone_values(values: list[list[float]]) -> list[list[float]]:
    """The closest non-decreasing grid: isotonic regression along each axis, then a running
    maximum for what rounding leaves. (A plain running maximum would carry every upward noise
    spike of a measurement to all larger cells.)"""
    from scipy.optimize import isotonic_regression

    grid = np.asarray(values, dtype=np.float64)
    grid = np.vstack([isotonic_regression(row).x for row in grid])
    grid = np.column_stack([isotonic_regression(col).x for col in grid.T])
    grid = np.maximum.accumulate(np.maximum.accumulate(grid, axis=1), axis=0)
    return [[float(v) for v in row] for row in grid]


@cython.cclass
class BilinearGrid:
    """``values[i][j]`` seconds at ``x_axis[i]``, ``y_axis[j]`` (names say what x and y are)."""

    name = cython.declare(str, visibility="public")
    x_name = cython.declare(str, visibility="public")
    y_name = cython.declare(str, visibility="public")
    x_axis = cython.declare(list, visibility="public")
    y_axis = cython.declare(list, visibility="public")
    values = cython.declare(list, visibility="public")
    monotone_x = cython.declare(cython.bint, visibility="public")
    extrapolated_queries = cython.declare(cython.longlong, visibility="public")
    _array = cython.declare(object)

    def __init__(self, name: str, x_name: str, y_name: str, x_axis: list, y_axis: list,
                 values: list, *, source: str | None = None, field: str = "",
                 monotone_x: bool = True) -> None:
        self.name = str(name)
        # False: the values may fall along x as measured (non-decreasing along y still)
        self.monotone_x = monotone_x
        self.x_name = x_name
        self.y_name = y_name
        self.x_axis = list(x_axis)
        self.y_axis = list(y_axis)
        self.values = [list(row) for row in values]
        self.extrapolated_queries = 0
        self._validate(source or self.name, field)
        self.x_axis = [float(v) for v in self.x_axis]
        self.y_axis = [float(v) for v in self.y_axis]
        self.values = [[float(v) for v in row] for row in self.values]
        self._array = np.asarray(self.values, dtype=np.float64)

    def _validate(self, source: str, field: str) -> None:
        prefix = f"{field}." if field else ""
        for axis_name, axis in ((self.x_name, self.x_axis), (self.y_name, self.y_axis)):
            where = prefix + axis_name
            if len(axis) < 2:
                raise ProfileError("an axis needs at least two points", file=source, field=where)
            for i, value in enumerate(axis):
                if (isinstance(value, bool) or not isinstance(value, int | float)
                        or not math.isfinite(value) or value < 0):
                    raise ProfileError(f"entry {i} is {value!r}; must be finite and >= 0",
                                       file=source, field=where)
                if i and value <= axis[i - 1]:
                    raise ProfileError(f"axis must increase strictly; entry {i} ({value}) "
                                       f"follows {axis[i - 1]}", file=source, field=where)
        where = prefix + "seconds"
        if len(self.values) != len(self.x_axis):
            raise ProfileError(f"has {len(self.values)} rows but {self.x_name} has "
                               f"{len(self.x_axis)} points", file=source, field=where)
        for r, row in enumerate(self.values):
            if len(row) != len(self.y_axis):
                raise ProfileError(f"has {len(row)} columns, expected {len(self.y_axis)} "
                                   f"({self.y_name})", file=source, row=r, field=where)
            for c, value in enumerate(row):
                if (isinstance(value, bool) or not isinstance(value, int | float)
                        or not math.isfinite(value) or value < 0):
                    raise ProfileError(f"column {c} is {value!r}; times must be finite and >= 0",
                                       file=source, row=r, field=where)
            for c in range(1, len(row)):
                if row[c] < row[c - 1]:
                    raise ProfileError(
                        f"time falls from {row[c - 1]} to {row[c]} s as {self.y_name} grows "
                        f"(columns {c - 1} -> {c}); grids must be non-decreasing",
                        file=source, row=r, field=where)
            if r and self.monotone_x:
                for c in range(len(row)):
                    if row[c] < self.values[r - 1][c]:
                        raise ProfileError(
                            f"time falls from {self.values[r - 1][c]} to {row[c]} s as "
                            f"{self.x_name} grows (column {c}); grids must be non-decreasing",
                            file=source, row=r, field=where)

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
    def at(self, x: cython.double, y: cython.double) -> cython.double:
        """Bilinear interpolation, exactly as the paper's Algorithm 1 writes it."""
        xs: list = self.x_axis
        ys: list = self.y_axis
        if x < xs[0] or x > xs[len(xs) - 1] or y < ys[0] or y > ys[len(ys) - 1]:
            self.extrapolated_queries += 1
        i: cython.Py_ssize_t = self._cell(xs, x)
        j: cython.Py_ssize_t = self._cell(ys, y)
        x_lo: cython.double = xs[i]
        x_hi: cython.double = xs[i + 1]
        y_lo: cython.double = ys[j]
        y_hi: cython.double = ys[j + 1]
        row_lo: list = self.values[i]
        row_hi: list = self.values[i + 1]
        t00: cython.double = row_lo[j]
        t01: cython.double = row_lo[j + 1]
        t10: cython.double = row_hi[j]
        t11: cython.double = row_hi[j + 1]
        wx: cython.double = (x - x_lo) / (x_hi - x_lo)
        t_y_lo: cython.double = t00 + wx * (t10 - t00)
        t_y_hi: cython.double = t01 + wx * (t11 - t01)
        value: cython.double = t_y_lo + (y - y_lo) / (y_hi - y_lo) * (t_y_hi - t_y_lo)
        return value if value > 0.0 else 0.0

    @cython.ccall
    def at_steps(self, x: cython.longlong, y_sum: cython.longlong,
                 steps: cython.Py_ssize_t) -> list:
        """``at(x, (y_sum + x * k) / x)`` for ``k = 0 .. steps - 1``: a decode run, ``x``
        requests whose contexts sum to ``y_sum`` and grow by a token each per step (the
        simulator prices a run of steps at once; each value, and the extrapolation count, is
        what ``at`` gives for that step: the mean is the same correctly rounded quotient)."""
        values: list = []
        k: cython.Py_ssize_t
        for k in range(steps):
            values.append(self.at(cython.cast(cython.double, x),
                                  cython.cast(cython.double, y_sum + x * k)
                                  / cython.cast(cython.double, x)))
        return values

    def many(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Vectorised ``at`` (same formula, same extrapolation, same counting)."""
        a = np.asarray(x, dtype=np.float64)
        b = np.asarray(y, dtype=np.float64)
        xs = np.asarray(self.x_axis)
        ys = np.asarray(self.y_axis)
        i = np.clip(np.searchsorted(xs, a, side="right") - 1, 0, len(xs) - 2)
        j = np.clip(np.searchsorted(ys, b, side="right") - 1, 0, len(ys) - 2)
        outside = (a < xs[0]) | (a > xs[-1]) | (b < ys[0]) | (b > ys[-1])
        self.extrapolated_queries += int(np.count_nonzero(outside))
        g = self._array
        wx = (a - xs[i]) / (xs[i + 1] - xs[i])
        t_lo = g[i, j] + wx * (g[i + 1, j] - g[i, j])
        t_hi = g[i, j + 1] + wx * (g[i + 1, j + 1] - g[i, j + 1])
        return np.maximum(t_lo + (b - ys[j]) / (ys[j + 1] - ys[j]) * (t_hi - t_lo), 0.0)

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        data = {self.x_name: list(self.x_axis), self.y_name: list(self.y_axis),
                "seconds": [list(row) for row in self.values]}
        if not self.monotone_x:
            data[f"{self.x_name}_monotone"] = False
        return data

    @staticmethod
    def from_dict(data: object, *, name: str, x_name: str, y_name: str, source: str,
                  field: str) -> BilinearGrid:
        if not isinstance(data, dict):
            raise ProfileError("must be an object with axes and seconds", file=source,
                               field=field)
        for key in (x_name, y_name, "seconds"):
            if key not in data:
                raise ProfileError("missing", file=source, field=f"{field}.{key}")
        for key in (x_name, y_name):
            if not isinstance(data[key], list):
                raise ProfileError("must be a list of numbers", file=source,
                                   field=f"{field}.{key}")
        if not isinstance(data["seconds"], list) or not all(
                isinstance(row, list) for row in data["seconds"]):
            raise ProfileError("must be a list of rows", file=source, field=f"{field}.seconds")
        monotone_x = data.get(f"{x_name}_monotone", True)
        if not isinstance(monotone_x, bool):
            raise ProfileError("must be true or false", file=source,
                               field=f"{field}.{x_name}_monotone")
        return BilinearGrid(name, x_name, y_name, data[x_name], data[y_name], data["seconds"],
                            source=source, field=field, monotone_x=monotone_x)
