"""Processes ragsim starts end with it: a helper server or a sweep worker never outlives a
killed ragsim.

Python's own clean-up (``atexit``, ``finally``) does not run on SIGKILL or an out-of-memory
kill; Linux can still stop the children, if each asks to be sent a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``). Elsewhere this does nothing, and the children end as before,
when ragsim stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """In a child process: be sent ``sig`` when the process that started it ends. Call it first
    thing in the child (``preexec_fn``, a pool's initializer) with the parent's pid, taken in
    the parent: if the parent died before the call (the child then belongs to init already),
    nobody would send the signal, so the child ends at once."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def dying_with_this_process(sig: int = signal.SIGKILL):
    """A ``preexec_fn`` for ``subprocess.Popen``: the child ends when this process does."""
    parent_pid = os.getpid()
    return lambda: die_with_parent(parent_pid, sig)


def own_temp_dir(kind: str) -> str:
    """A temporary folder named after this process (``ragsim-KIND-PID-xxxx``), after removing
    those of the same kind whose process is gone: a killed run could not remove its own, and
    only ragsim names folders so."""
    pattern = re.compile(rf"ragsim-{re.escape(kind)}-(\d+)-")
    root = Path(tempfile.gettempdir())
    for path in root.glob(f"ragsim-{kind}-*"):
        match = pattern.match(path.name)
        if match and path.is_dir() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"ragsim-{kind}-{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, and not ours to judge
        return True
    return True
