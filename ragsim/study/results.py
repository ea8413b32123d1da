"""The results table of a sweep: one row per point and seed.

A row holds the point's id and seed, every configuration field the run used (named as in
``config.toml``; replay: as in its summary's ``config``) and every field of the ``--json``
summary. Nested summary values (``failed_by_reason``, ``trace_info``, ``warnings``) are kept as
JSON text, so every column is a scalar and the table reads back the same in any tool.
"""

from __future__ import annotations

import json
from pathlib import Path

from ragsim.atomic import write_atomically

RESULTS_FILE = "results.parquet"
SWEEP_FILE = "sweep.toml"
POINTS_DIR = "points"
# columns every row starts with (then the configuration, then the summary)
KEY_COLUMNS = ("point_id", "seed", "mode", "swept")


# replay's options whose summary ``config`` field has another name (the others: the same name)
REPLAY_FIELD_OF_OPTION = {"host_mem": "host_capacity_bytes", "gpu_mem": "gpu_capacity_bytes",
                          "cache_depth": "max_cached_depth", "requests": "n_requests",
                          "frequency_window": "frequency_window_s"}


def result_row(point_id: str, mode: str, swept: tuple[str, ...], summary: dict,
               settings: dict | None = None) -> dict:
    """A results row from a point's ``--json`` summary (which carries the configuration);
    ``swept`` lists the varied names as the row's columns name them. A swept setting that the
    recorded configuration leaves out (run records no answer-cache field with the cache off)
    is filled from the point's ``settings``, so every swept option is a column in every row."""
    if mode == "replay":
        settings = {REPLAY_FIELD_OF_OPTION.get(k, k): v for k, v in (settings or {}).items()}
        swept = tuple(REPLAY_FIELD_OF_OPTION.get(name, name) for name in swept)
    row: dict = {"point_id": point_id, "mode": mode, "swept": ",".join(swept)}
    for name in swept:
        if name not in summary["config"] and name in (settings or {}):
            row[name] = _scalar(settings[name])
    for name, value in summary["config"].items():
        row[name] = _scalar(value)
    for name, value in summary.items():
        if name == "config":
            continue
        if name in summary["config"] and (value is None or isinstance(value, list | dict)):
            # the configuration's value stands: an unset field the run resolved, or a field
            # the summary details (a fleet's ``replicas``: the count here, each replica's
            # summary in points/<id>/summary.json)
            continue
        row[name] = _scalar(value)
    row["seed"] = summary["config"]["seed"]
    return row


def _scalar(value):
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def read_results(out_dir: Path):
    """The table in ``out_dir`` (an empty frame when there is none yet)."""
    import pandas as pd

    path = Path(out_dir) / RESULTS_FILE
    if not path.exists():
        return pd.DataFrame(columns=list(KEY_COLUMNS))
    return pd.read_parquet(path)


def write_results_table(out_dir: Path, rows: list[dict]) -> None:
    """Rewrite the whole table atomically (a reader never sees half of it)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    front = [c for c in KEY_COLUMNS if c in frame.columns]
    frame = frame[front + [c for c in frame.columns if c not in front]]
    write_atomically(Path(out_dir) / RESULTS_FILE,
                     lambda tmp: frame.to_parquet(tmp, index=False))
