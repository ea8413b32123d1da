"""Running a sweep into a folder: resumable, written as points end, stoppable.

``DIR/results.parquet`` is rewritten (atomically) after every point that ends, so a killed sweep
loses only the points that were running; ``DIR/points/<id>/`` keeps each point's summary,
config.toml and per-request records. Rerunning the same sweep into the same folder skips the
points the table already holds. A folder holding points of another sweep is refused, not mixed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ragsim.atomic import write_atomically, write_text_atomically
from ragsim.errors import RagsimInputError
from ragsim.study.executors import run_local, run_ray
from ragsim.study.point import PointOutcome
from ragsim.study.results import (
    POINTS_DIR,
    RESULTS_FILE,
    SWEEP_FILE,
    read_results,
    result_row,
    write_results_table,
)
from ragsim.study.spec import Point, Sweep

INTERRUPTED_EXIT_CODES = (130, 143)


class PointInterrupted(KeyboardInterrupt):
    """A point run in this process saw the Ctrl-C (its run kept what ended and said so)."""


@dataclass
class SweepOutcome:
    """What a sweep call did: points run now, found done, and those that failed (id, why)."""

    total: int
    skipped: int = 0
    finished: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def _clean(row: dict) -> dict:
    """A row read back from Parquet, with NaN where the run wrote None, as None again."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def run_sweep(sweep: Sweep, out_dir: Path, *, executor: str = "local", jobs: int = 1,
              address: str | None = None, keep_requests: bool = True,
              on_progress: Callable[[int, int], None] | None = None) -> SweepOutcome:
    """Run the points of ``sweep`` that ``out_dir`` does not hold yet; ``on_progress(done,
    total)`` after each. A Ctrl-C (or SIGTERM turned into one) propagates after the table
    holds every point that ended."""
    with _disk_said(out_dir, "the folder", None, 0):
        out_dir.mkdir(parents=True, exist_ok=True)
    order = {p.point_id: i for i, p in enumerate(sweep.points)}
    existing = read_results(out_dir)
    foreign = sorted(set(existing["point_id"]) - set(order))
    if foreign:
        raise RagsimInputError(
            f"holds {len(foreign)} point(s) of another sweep (e.g. {foreign[0]}); give a new "
            "folder, or the same sweep file to resume", file=str(out_dir), field="--out")
    rows = {r["point_id"]: _clean(r) for r in existing.to_dict("records")}
    with _disk_said(out_dir, SWEEP_FILE, None, len(rows)):
        write_text_atomically(out_dir / SWEEP_FILE, sweep.to_toml())
    todo = [p for p in sweep.points if p.point_id not in rows]
    outcome = SweepOutcome(total=len(sweep.points), skipped=len(sweep.points) - len(todo))
    if on_progress is not None:
        on_progress(outcome.skipped, outcome.total)
    by_id = {p.point_id: p for p in todo}
    results = _outcomes(sweep.mode, todo, executor, jobs, address, keep_requests)
    with contextlib.closing(results):  # a refusal below stops the points still running
        return _store_each(sweep, out_dir, results, by_id, rows, order, outcome, on_progress)


def _store_each(sweep: Sweep, out_dir: Path, results: Iterator[PointOutcome],
                by_id: dict[str, Point], rows: dict, order: dict[str, int],
                outcome: SweepOutcome, on_progress) -> SweepOutcome:
    """Store each point as it ends (its files, then the whole table), or stop the sweep."""
    for result in results:
        point = by_id[result.point_id]
        if result.finished:
            with _disk_said(out_dir, "the point's files and results.parquet", point,
                            len(rows)):
                _store(out_dir, point, result)
                table = {**rows, point.point_id: result_row(
                    point.point_id, sweep.mode, point.swept, result.summary, point.settings)}
                write_results_table(out_dir, sorted(table.values(),
                                                    key=lambda r: order[r["point_id"]]))
            rows.update(table)
            outcome.finished += 1
        elif result.exit_code in INTERRUPTED_EXIT_CODES:
            raise PointInterrupted
        elif result.exit_code == 2:  # refused as bad input: every point would be
            raise RagsimInputError(f"point {point.point_id} ({_describe(point)}): "
                                   f"{_last_line(result.message)}", file=sweep.source)
        else:
            outcome.failed.append((point.point_id, _last_line(result.message)
                                   or f"exit code {result.exit_code}"))
        if on_progress is not None:
            on_progress(outcome.skipped + outcome.finished + len(outcome.failed), outcome.total)
    return outcome


@contextlib.contextmanager
def _disk_said(out_dir: Path, what: str, point: Point | None, kept: int):
    """A write of the sweep's own files that fails (a full disk) ends the sweep in one line:
    what was lost (the point that had just finished) and what is kept (the table as it was,
    every file written whole or not at all), and that the same command resumes."""
    try:
        yield
    except OSError as exc:
        lost = (f"point {point.point_id} ({_describe(point)}) finished but its result was "
                "lost; " if point is not None else "")
        raise RagsimInputError(
            f"could not write {what} ({exc.strerror or exc}): {lost}the {kept:,} point(s) "
            f"finished before are kept in {RESULTS_FILE}; free space and run the same command "
            "to resume", file=str(out_dir), field="--out") from None


def _outcomes(mode: str, points: list[Point], executor: str, jobs: int, address: str | None,
              keep_requests: bool) -> Iterator[PointOutcome]:
    if executor == "ray":
        return run_ray(mode, points, jobs, keep_requests, address)
    return run_local(mode, points, jobs, keep_requests)


def _store(out_dir: Path, point: Point, result: PointOutcome) -> None:
    folder = out_dir / POINTS_DIR / point.point_id
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in result.files.items():
        write_atomically(folder / name, lambda tmp, data=data: tmp.write_bytes(data))


def _describe(point: Point) -> str:
    return ", ".join(f"{k}={point.settings[k]}" for k in point.swept if k in point.settings)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("error: ") if lines else ""
