"""One sweep point, run as ``ragsim run --config POINT.toml --json --out D`` (or ``ragsim
replay``) would run it: the command's own function is called, so a point cannot drift from what
a user gets by hand. It runs in a folder of its own (on a Ray worker that may be another
machine) and hands back the files it wrote, which the sweep stores under ``points/<id>/``.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

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
    """Run one point with the command line's own ``run`` (or ``replay``) function."""
    import typer

    stdout, stderr = io.StringIO(), io.StringIO()
    outcome = PointOutcome(point_id=point_id)
    with tempfile.TemporaryDirectory(prefix="ragsim-point-") as tmp:
        out_dir = Path(tmp) / "out"
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                if mode == "run":
                    _run(settings, Path(tmp), out_dir)
                else:
                    _replay(settings, out_dir)
        except typer.Exit as exc:
            outcome.exit_code = exc.exit_code
        except Exception as exc:  # a bug in this point's run: the others still run
            outcome.exit_code = 1
            stderr.write(f"\n{type(exc).__name__}: {exc}")
        outcome.message = stderr.getvalue().strip()
        summary_file = out_dir / "summary.json"
        if summary_file.exists():
            outcome.summary = json.loads(summary_file.read_text())
        for name in POINT_FILES:
            if (out_dir / name).exists() and (keep_requests or name != "requests.parquet"):
                outcome.files[name] = (out_dir / name).read_bytes()
    return outcome


def _run(settings: dict, tmp: Path, out_dir: Path) -> None:
    from ragsim.cli.run import run

    config_file = tmp / "point.toml"
    fields = {k: v for k, v in settings.items() if k not in RUN_ONLY}
    config_file.write_text(tomli_w.dumps({"format": "ragsim.config", "version": 1,
                                          "run": fields}))
    how = {k: v for k, v in settings.items() if k in RUN_ONLY}
    run(config_file=config_file, json_output=True, out_dir=out_dir, **how)


def _replay(settings: dict, out_dir: Path) -> None:
    from ragsim.cli.replay import replay

    options = dict(settings)
    for name in ("gpu_mem", "host_mem"):  # sizes are options' text: 4GiB or a byte count
        if name in options and not isinstance(options[name], str):
            options[name] = str(options[name])
    replay(**options, json_output=True, out_dir=out_dir)
