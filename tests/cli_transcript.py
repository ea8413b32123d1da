"""A transcript of the command line: what a set of commands print (stdout, stderr, exit code).

Written once by the command line as it was before its commands became parsing and printing
over ``ragsim.api`` (``tests/data/cli_transcript.json``: commit bfd5cba with the RAGPulse
branch merged, whose drift default of 0.51 changes the synthetic traces), and compared by
``test_cli_transcript.py`` with what the commands print now: the move kept every byte,
wall-clock numbers aside. Rewrite it only when a change of output is meant, and say so in the
commit::

    python tests/cli_transcript.py write tests/data/cli_transcript.json
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

# (name, arguments); run in a fresh empty folder each, so paths read the same everywhere
COMMANDS = [
    ("run-json", "run --trace mmlu --requests 300 --rate 1.5 --seed 3 --json"),
    ("run-table", "run --trace nq --requests 300 --rate 2"),
    ("run-vllm-json", "run --system vllm --requests 200 --json"),
    ("run-sizes", "run --policy lru --host-mem 8GiB --gpu-mem 2GiB --requests 200 --json"),
    ("run-answers", "run --answer-cache --trace wiki-trivia --requests 200 --json"),
    ("run-failures", "run --requests 300 --rate 2 --gpu-failure-rate 200 --seed 1 --json"),
    ("run-config", "run --config c.toml --requests 100 --json"),
    ("run-config-bad", "run --config bad.toml"),
    ("run-config-missing", "run --config missing.toml"),
    ("run-bad-rate", "run --rate -1"),
    ("run-bad-size", "run --host-mem 3parsecs"),
    ("run-both-thresholds", "run --answer-threshold 0.9 --answer-distance 0.1"),
    ("run-bad-backend", "run --backend nope"),
    ("run-bad-threads", "run --threads -1"),
    ("run-long-search", "run --search-s 1e300"),
    ("run-bad-policy", "run --policy nope"),
    ("run-out", "run --requests 100 --out o"),
    ("run-out-twice", "run --requests 100 --out o2 && run --requests 100 --out o2"),
    ("replay-json", "replay --requests 2000 --json"),
    ("replay-table", "replay --requests 2000 --policy lru"),
    ("replay-flat", "replay --flat --requests 1000 --json"),
    ("replay-window-missing", "replay --frequency-scope window"),
    ("replay-window-alone", "replay --frequency-window 5"),
    ("replay-bad-policy", "replay --policy nope"),
    ("replay-bad-size", "replay --gpu-mem 1XB"),
    ("replay-bad-drift", "replay --drift 2"),
    ("replay-bad-kv", "replay --kv-bytes-per-token 0"),
    ("validate-sim", "validate --out v --backend sim --requests 20 --json"),
    ("validate-both-profiles", "validate --out v --profile a10g-mistral-7b --profile-now"),
    ("validate-bad-backend", "validate --out v --backend nope"),
    ("validate-bad-rate", "validate --out v --backend sim --rate -2"),
    ("sweep", "sweep --out s --set trace=mmlu --set n_requests=200 --axis policy=lru,pgdsf "
              "--jobs 1"),
    ("sweep-replay", "sweep --out s --set mode=replay --set requests=500 "
                     "--axis policy=lru,gdsf --jobs 1"),
    ("sweep-bad-executor", "sweep --out s --executor nope"),
    ("sweep-bad-point", "sweep --out s --set n_requests=50 --axis rate=-1,1 --jobs 1"),
    ("plan-bad-rate", "plan --rate -1"),
    ("plan", "plan --requests 150 --replicas 1 --host-mem 0 --json --jobs 1"),
]
FILES = {
    "c.toml": 'format = "ragsim.config"\nversion = 1\n[run]\nsystem = "sglang"\nrate_rps = 2.0\n',
    "bad.toml": 'format = "ragsim.config"\nversion = 1\n[run]\nrate_rps = -1.0\n',
}
# what measures the machine, not the program
WALL_KEYS = {"elapsed_s", "sim_requests_per_wall_s", "sim_s_per_wall_s", "requests_per_s",
             "scheduler_overhead_ms_per_decision", "decision_p50_ms", "decision_p99_ms",
             "set_id", "results_dir", "wall_s", "real_wall_s", "sim_wall_s"}
WALL_LINE = re.compile(r"wall|ms/decision|requests/s\)|elapsed")
NUMBER = re.compile(r"\d[\d,.]*")
BORDER = re.compile(r"^[\s┌┐└┘├┤┬┴┼─━┏┓┗┛┡┩╇╋┳┻┃]*$")


def _masked_json(value):
    if isinstance(value, dict):
        return {k: ("<wall>" if k in WALL_KEYS or k.endswith("_wall_s") else _masked_json(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_json(v) for v in value]
    return value


def _masked(text: str) -> str | dict:
    try:
        return _masked_json(json.loads(text))
    except ValueError:
        pass
    lines, after_wall = [], False
    for line in text.splitlines():
        cells = line.split("│")
        if after_wall and len(cells) > 2 and not cells[1].strip():
            continue  # the wall row wrapped onto this line (how far depends on its numbers)
        after_wall = bool(WALL_LINE.search(line))
        if after_wall:  # a table row keeps its label; a line of text its words
            line = (cells[1].strip() + " <wall>" if len(cells) > 2
                    else re.sub(r" +", " ", NUMBER.sub("#", line)))
        elif len(cells) > 2:  # a table row: its cells, not their padding (a wall-clock cell
            line = " | ".join(c.strip() for c in cells)  # can set a column's width)
        elif BORDER.match(line):
            continue
        lines.append(line.strip())
    return "\n".join(lines)


def _results_table(folder: Path) -> list | None:
    table = folder / "s" / "results.parquet"
    if not table.exists():
        return None
    import pandas as pd

    rows = pd.read_parquet(table).to_dict("records")
    return _masked_json(json.loads(json.dumps(rows, default=str)))


def transcript() -> dict:
    from typer.testing import CliRunner

    from ragsim.cli import app

    runner = CliRunner()
    found = {}
    here = os.getcwd()
    for name, line in COMMANDS:
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            try:
                for file, text in FILES.items():
                    Path(file).write_text(text)
                steps = []
                for command in line.split(" && "):
                    result = runner.invoke(app, command.split())
                    steps.append({"exit_code": result.exit_code,
                                  "stdout": _masked(result.stdout),
                                  "stderr": _masked(result.stderr)})
                found[name] = {"command": line, "steps": steps,
                               "results": _results_table(Path(tmp))}
            finally:
                os.chdir(here)
    return found


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        sys.exit("usage: python tests/cli_transcript.py write OUT.json")
    Path(sys.argv[2]).write_text(json.dumps(transcript(), indent=1, sort_keys=True) + "\n")
