"""One sweep point, run as ``ragsim run --config POINT.toml --json --out D`` (or ``ragsim
replay``) would run it: through the API the command calls, so a point cannot drift from what a
user gets by hand. It runs in a folder of its own (on a Ray worker that may be another
machine) and hands back the files it wrote, which the sweep stores under ``points/<id>/``.
"""

from __future__ import annotations

import json
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ragsim.api.options import command_line_labels
from ragsim.stopping import Terminated, sigterm_like_ctrl_c
from ragsim.study.spec import RUN_ONLY

# what a point hands back from its folder (requests.parquet: per-request records, for CDFs)
POINT_FILES = ("summary.json", "config.toml", "requests.parquet")


@dataclass
class PointOutcome:
    """What came back from one point: the summary and files, or why it did not end."""

    point_id: str
    summary: dict | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    exit_code: int = 0
    message: str = ""  # what the command printed on stderr (its error, when exit_code != 0)

    @property
    def finished(self) -> bool:
        return (self.exit_code == 0 and self.summary is not None
                and not self.summary.get("interrupted"))


def run_point(mode: str, settings: dict, point_id: str, keep_requests: bool = True
              ) -> PointOutcome:
    """Run one point through the API that ``ragsim run`` (or ``replay``) calls, with the
    command's exit codes and messages (2: refused as bad input; 1: a bug; 130/143: stopped)."""
    outcome = PointOutcome(point_id=point_id)
    with tempfile.TemporaryDirectory(prefix="ragsim-point-") as tmp:
        out_dir = Path(tmp) / "out"
        try:
            with command_line_labels():  # said as `ragsim run` says it (--rate), as before
                outcome.exit_code, outcome.message = _execute(mode, settings, out_dir)
        except Terminated:
            outcome.exit_code = 128 + int(signal.SIGTERM)
            outcome.message = "terminated (SIGTERM) before anything was kept"
        except ValueError as exc:  # RagsimInputError included: bad input
            outcome.exit_code, outcome.message = 2, f"error: {exc}"
        except Exception as exc:  # a bug in this point's run: the others still run
            outcome.exit_code, outcome.message = 1, f"{type(exc).__name__}: {exc}"
        summary_file = out_dir / "summary.json"
        if summary_file.exists():
            outcome.summary = json.loads(summary_file.read_text())
        for name in POINT_FILES:
            if (out_dir / name).exists() and (keep_requests or name != "requests.parquet"):
                outcome.files[name] = (out_dir / name).read_bytes()
    return outcome


def _execute(mode: str, settings: dict, out_dir: Path) -> tuple[int, str]:
    """Run, keep the result's files in ``out_dir``; the exit code and what went wrong."""
    from ragsim.api.replays import setup_replay
    from ragsim.api.run import run_problem, setup_run
    from ragsim.outputs import save_run_result

    with sigterm_like_ctrl_c() as signals:
        if mode == "run":
            how = {k: v for k, v in settings.items() if k in RUN_ONLY}
            fields = {k: v for k, v in settings.items() if k not in RUN_ONLY}
            result = setup_run(fields, **how).execute()
            config_toml = result.config.to_toml()
        else:
            result = setup_replay(**settings).execute()
            config_toml = None
        signals.disarm()  # what ended is kept: a later SIGTERM cannot cut the writing
        summary = result.summary
        if summary["interrupted"]:
            summary["interrupted_by"] = signals.name
        save_run_result(out_dir, result.requests, summary, config_toml)
    if summary["interrupted"]:
        return signals.exit_code, "interrupted"
    problem = run_problem(summary) if mode == "run" else None
    if problem is not None:
        return problem[0], f"error: {problem[1]}"
    return 0, ""
