"""SIGTERM handled as Ctrl-C: a job that is told to stop keeps what finished.

A long run or replay catches KeyboardInterrupt and keeps every request that ended; a SIGTERM
(a scheduler's or a sweep's stop) takes the same path while armed. Shared by the command line
and the sweep's points, which run the same jobs in workers.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop), raised where Ctrl-C would be so that it takes
    Ctrl-C's path: the simulation keeps what ended and says it was interrupted."""


class StopSignals:
    """What :func:`sigterm_like_ctrl_c` saw: whether SIGTERM came, and whether it still turns
    into :class:`Terminated` (``armed``) or is only noted (while results are written)."""

    def __init__(self) -> None:
        self.terminated = False
        self.armed = True

    @property
    def name(self) -> str:
        """The signal that interrupted the job (Ctrl-C is SIGINT)."""
        return "SIGTERM" if self.terminated else "SIGINT"

    @property
    def exit_code(self) -> int:
        """The shell's code for it: 128 + its number (130 for Ctrl-C, 143 for SIGTERM)."""
        return 128 + int(signal.SIGTERM if self.terminated else signal.SIGINT)

    def disarm(self) -> None:
        """From now on a SIGTERM is noted, not raised: the results being written are kept."""
        self.armed = False


@contextmanager
def sigterm_like_ctrl_c() -> Iterator[StopSignals]:
    """Route SIGTERM into the Ctrl-C path for the duration; the previous handler comes back
    afterwards. Only the first SIGTERM while armed raises; later ones are noted, so a second
    ``kill`` cannot cut the writing of what the first one kept."""
    seen = StopSignals()

    def on_sigterm(signum, frame) -> None:
        first = not seen.terminated
        seen.terminated = True
        if first and seen.armed:
            raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, previous)
