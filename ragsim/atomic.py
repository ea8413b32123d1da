"""Files written whole or not at all.

Traces, profiles, reports and results are read by other runs, sometimes while being rewritten;
an interrupted write must leave the previous file, never half of a new one.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    The temporary name keeps ``path``'s suffix (numpy's ``savez`` would otherwise add one) and
    is unique to this call (processes in different containers share pids; threads share one).
    A new file gets the default permissions, as any file the user writes: these are for
    sharing; a file replaced keeps its mode, and a symbolic link keeps pointing where it did
    (its target is replaced). Survives a killed process, not a power cut (no fsync)."""
    given = Path(path)
    path = Path(os.path.realpath(given))
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        write(tmp)
        if path.exists():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return given


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    return write_atomically(path, lambda tmp: tmp.write_text(text))
