"""docs/api.md's examples run, in order, as a reader would paste them, in an empty folder: an
example that no longer works fails here, not in a user's notebook."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_every_example_in_the_api_guide_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/api.md example {number}", "exec"), namespace)
    assert (tmp_path / "first-run" / "summary.json").exists()
    assert "token hit rate" in capsys.readouterr().out
