"""A sweep file: a base configuration, axes, listed points and seeds, expanded into points.

A sweep file is TOML::

    seeds = [0, 1, 2]                 # repetitions (optional; default: the base's seed or 0)
    [base]                            # any `ragsim run` option (or mode = "replay": any
    trace = "mmlu"                    #   `ragsim replay` option), named as in config.toml or
    n_requests = 2000                 #   as the option (host_mem = host_cache_bytes)
    [axes]                            # lists; the full grid of them is swept
    policy = ["pgdsf", "lru"]
    host_cache_bytes = ["8GiB", "32GiB"]
    [[points]]                        # optional listed points, each crossed with the axes
    system = "ragcache"

Run's names are normalised to its configuration fields (``host_mem`` -> ``host_cache_bytes``),
so a column of the results table has the name a user finds in ``config.toml``; replay's are
normalised to its options (its summary's ``config`` names the columns). Each point is checked
before anything runs: a bad value is one line naming the sweep file and the key that set it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from ragsim.errors import RagsimInputError
from ragsim.redact import redact_urls

SWEEP_FORMAT = "ragsim.sweep"
SWEEP_VERSION = 1
MODES = ("run", "replay")
_TOP_KEYS = {"format", "version", "seeds", "base", "axes", "points"}
# keys of ``ragsim run`` that are not configuration fields (they pick how it runs)
RUN_ONLY = ("backend", "device", "threads")
# a user's own Redis (its address may hold a password) and the key prefix there: a sweep writes
# its settings to sweep.toml and results.parquet and says them in errors, so it refuses them
# (its points serve the answer cache from a simulation or an embedded server, never a user's)
NOT_SWEPT = ("answer_redis_url", "answer_namespace")
# replay's options named as run's configuration fields or replay's own summary config, so one
# sweep file can switch modes and columns read the same
REPLAY_ALIASES = {
    "gpu_capacity_bytes": "gpu_mem", "host_capacity_bytes": "host_mem",
    "gpu_kv_bytes": "gpu_mem", "host_cache_bytes": "host_mem", "max_cached_depth": "cache_depth",
    "n_requests": "requests", "frequency_window_s": "frequency_window",
    "trace_drift_per_1k_requests": "drift",
}


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its settings (normalised names, the seed included) and its id, a
    hash of them, stable across sweeps, so a resumed or extended sweep knows what it has."""

    settings: dict
    swept: tuple[str, ...]  # the names that vary between points (axes, listed points, seed)

    @property
    def point_id(self) -> str:
        return point_id(self.settings)


def point_id(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass
class Sweep:
    """A parsed sweep file: what it said (for the resolved copy) and its points."""

    source: str
    mode: str
    base: dict
    axes: dict[str, list]
    listed: list[dict]
    seeds: list[int]
    points: list[Point] = field(default_factory=list)

    def to_toml(self) -> str:
        """The resolved sweep: the file's tables with normalised names, and every point with
        its id, so a results row can be traced back without reading code."""
        data = {"format": SWEEP_FORMAT, "version": SWEEP_VERSION, "seeds": self.seeds,
                "base": {"mode": self.mode, **self.base}, "axes": self.axes}
        if self.listed:
            data["points"] = self.listed
        data["resolved"] = [{"point_id": p.point_id, **p.settings} for p in self.points]
        return tomli_w.dumps(data)


def _fail(source: str, where: str, message: str) -> RagsimInputError:
    """One line naming the file and field; a URL the user typed anywhere in it is masked."""
    return RagsimInputError(redact_urls(message), file=source, field=redact_urls(where))


def _option_names(mode: str) -> tuple[set[str], dict[str, str]]:
    """The names a sweep may set in ``mode`` and the aliases mapped onto them."""
    if mode == "run":
        import dataclasses

        from ragsim.api.run import FIELD_OF_OPTION
        from ragsim.serving.config import SimConfig

        names = {f.name for f in dataclasses.fields(SimConfig)} | set(RUN_ONLY)
        return names, dict(FIELD_OF_OPTION)
    from ragsim.api.replays import REPLAY_OPTIONS

    return set(REPLAY_OPTIONS), dict(REPLAY_ALIASES)


def _normalise(table: dict, where: str, mode: str, source: str) -> dict:
    names, aliases = _option_names(mode)
    normal = {}
    for key, value in table.items():
        name = aliases.get(key, key)
        if name not in names:
            raise _fail(source, f"{where}.{key}", f"not a `ragsim {mode}` option; known: "
                        f"{', '.join(sorted(names))}")
        if name in normal:
            raise _fail(source, f"{where}.{key}", f"sets {name} twice")
        _refuse_not_swept(name, f"{where}.{key}", source)
        normal[name] = value
    return normal


def _refuse_not_swept(name: str, where: str, source: str) -> None:
    """One line naming the key, never its value: a Redis URL's password must not be echoed."""
    if name in NOT_SWEPT:
        raise _fail(source, where, "a user's Redis is not a sweep setting (a sweep records its "
                    "settings in its files); give it to one `ragsim run`")


def load_sweep(path: str | Path | None, *, settings: list[str] = (), axes: list[str] = (),
               seeds: str | None = None, approve: Callable[[int], None] | None = None
               ) -> Sweep:
    """Read and check a sweep file (or none), add the command line's ``--set KEY=VALUE``,
    ``--axis KEY=V1,V2`` and ``--seeds 0,1,2`` (which win over the file), expand the points and
    check each one's configuration. ``approve(count)`` sees the number of points before they
    are expanded and may refuse (a grid of a million points takes minutes just to check)."""
    data: dict = {}
    source = "command line"
    if path is not None:
        path = Path(path)
        source = str(path)
        from ragsim.user_files import read_user_toml

        data = read_user_toml(path, what="sweep file")
    if settings:
        data["base"] = {**data.get("base", {}), **dict(
            _flag(text, "--set", split=False) for text in settings)}
    if axes:
        data["axes"] = {**data.get("axes", {}), **dict(
            _flag(text, "--axis", split=True) for text in axes)}
    if seeds is not None:
        data["seeds"] = [_value(v.strip(), "--seeds") for v in seeds.split(",")]
    if not data:
        raise RagsimInputError("give a sweep file, or --set/--axis", field="SWEEP_FILE")
    return parse_sweep(data, source, approve=approve)


def _flag(text: str, flag: str, *, split: bool) -> tuple[str, object]:
    """``KEY=VALUE`` (``--set``) or ``KEY=V1,V2`` (``--axis``), values read as TOML values
    (numbers, true/false, quoted strings) or else as text (``lru``, ``8GiB``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RagsimInputError(f"must be KEY=VALUE, got {redact_urls(text)!r}", field=flag)
    if split:
        return key.strip(), [_value(v.strip(), flag) for v in value.split(",")]
    return key.strip(), _value(value.strip(), flag)


def _value(text: str, flag: str) -> object:
    if not text:
        raise RagsimInputError("an empty value", field=flag)
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def parse_sweep(data: dict, source: str, *, approve: Callable[[int], None] | None = None
                ) -> Sweep:
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0],
                    f"unknown key; a sweep file has {', '.join(sorted(_TOP_KEYS))}")
    if data.get("format", SWEEP_FORMAT) != SWEEP_FORMAT:
        raise _fail(source, "format", f"not a ragsim sweep (format {data['format']!r})")
    version = data.get("version", SWEEP_VERSION)
    if type(version) is not int or version != SWEEP_VERSION:  # not true, not 1.0
        raise _fail(source, "version", f"unsupported version {data['version']!r} (this ragsim "
                    f"reads {SWEEP_VERSION})")
    base = data.get("base", {})
    axes = data.get("axes", {})
    listed = data.get("points", [])
    if not isinstance(base, dict):
        raise _fail(source, "base", "must be a table")
    if not isinstance(axes, dict):
        raise _fail(source, "axes", "must be a table of lists")
    if not isinstance(listed, list) or not all(isinstance(p, dict) for p in listed):
        raise _fail(source, "points", "must be an array of tables ([[points]])")
    base = dict(base)
    mode = base.pop("mode", "run")
    if mode not in MODES:
        raise _fail(source, "base.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise _fail(source, f"axes.{key}", "must be a non-empty list of values")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) < len(values):
            raise _fail(source, f"axes.{key}", "lists a value twice")
    base = _normalise(base, "base", mode, source)
    axes = _normalise(axes, "axes", mode, source)
    listed = [_normalise(p, f"points[{i}]", mode, source) for i, p in enumerate(listed)]
    for i, point in enumerate(listed):
        for name in point:
            if name in axes:
                raise _fail(source, f"points[{i}].{name}", "is also an axis; give it in one "
                            "place")
    seeds = data.get("seeds")
    if seeds is not None:
        if "seed" in axes:
            raise _fail(source, "seeds", "the seeds are given twice (also axes.seed)")
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                           for s in seeds)):
            raise _fail(source, "seeds", "must be a non-empty list of integers >= 0")
        if len(set(seeds)) < len(seeds):
            raise _fail(source, "seeds", "lists a seed twice")
    elif "seed" not in axes:
        seeds = [base.get("seed", 0)]
    sweep = Sweep(source=source, mode=mode, base=base, axes=axes, listed=listed,
                  seeds=list(seeds) if seeds is not None else [])
    if approve is not None:
        approve(point_count(sweep))
    sweep.points = _expand(sweep)
    for point in sweep.points:
        check_point(sweep, point)
    return sweep


def point_count(sweep: Sweep) -> int:
    """How many points the sweep expands into, counted without expanding them."""
    count = max(len(sweep.listed), 1) * max(len(sweep.seeds), 1)
    for values in sweep.axes.values():
        count *= len(values)
    return count


def _expand(sweep: Sweep) -> list[Point]:
    """Listed points (or one empty point) x the grid of the axes x the seeds, in that order."""
    names = list(sweep.axes)
    swept = {*names, *(k for p in sweep.listed for k in p), "seed"}
    points, seen = [], set()
    for listed in sweep.listed or [{}]:
        for values in itertools.product(*(sweep.axes[n] for n in names)):
            for seed in sweep.seeds or [None]:
                settings = {**sweep.base, **listed, **dict(zip(names, values, strict=True))}
                if seed is not None:
                    settings["seed"] = seed
                settings.setdefault("seed", 0)
                point = Point(settings=settings, swept=tuple(sorted(swept)))
                if point.point_id in seen:
                    raise _fail(sweep.source, "points", f"point {settings} appears twice")
                seen.add(point.point_id)
                points.append(point)
    return points


def _origin(sweep: Sweep, point: Point, name: str) -> str:
    """The table and key of the sweep file that gave ``point`` its ``name`` (for errors)."""
    if name in sweep.axes:
        return f"axes.{name}"
    for i, listed in enumerate(sweep.listed):
        if name in listed and all(point.settings.get(k) == v for k, v in listed.items()):
            return f"points[{i}].{name}"
    if name == "seed" and sweep.seeds and "seed" not in sweep.base:
        return "seeds"
    return f"base.{name}"


def check_point(sweep: Sweep, point: Point) -> None:
    """Refuse a point that ``ragsim run`` would refuse, before anything runs, naming the sweep
    file and the key that set the bad value (the check is run's own: build_config)."""
    if sweep.mode != "run":
        return  # replay checks its options as it starts; the sweep stops at the first refusal
    from ragsim.serving.config import build_config

    fields = {k: v for k, v in point.settings.items() if k not in RUN_ONLY}
    try:
        build_config(fields)
    except RagsimInputError as exc:
        where = _origin(sweep, point, exc.field) if exc.field in point.settings else exc.field
        raise _fail(sweep.source, where, exc.detail) from None
