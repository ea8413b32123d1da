"""Files written whole or not at all.

Traces, profiles, reports and results are read by other runs, sometimes while being rewritten;
an interrupted write must leave the previous file, never half of a new one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    The temporary name keeps ``path``'s suffix (numpy's ``savez`` would otherwise add one) and
    the process id (two writers do not share a temporary file). The file gets the default
    permissions, as any file the user writes: these are for sharing."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    return write_atomically(path, lambda tmp: tmp.write_text(text))
