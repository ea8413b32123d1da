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


class DeferredStop:
    """Ctrl-C and SIGTERM noted while a loop runs, and acted on where the loop says it is safe.

    Python raises KeyboardInterrupt (or a handler's exception) wherever the main thread happens
    to be, and there it can be lost or stick: a C extension that clears errors swallows it
    (numpy's dtype comparison calls back into Python and clears what that raised: a sweep once
    ran all its points after SIGTERM), and one raised inside ``concurrent.futures``' lock
    handling leaves a lock held that the pool's thread then waits on forever. A loop over a
    pool's results installs this (:func:`deferred_stop`), calls :meth:`raise_if_stopped` between
    its own steps, and the signal then takes its usual path from there: the handlers that were
    in place before get it (the command line's SIGTERM handler, Python's Ctrl-C)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _note(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def install(self) -> bool:
        """Note SIGINT and SIGTERM from now on; False where signals cannot be handled here
        (not the main thread): they then keep their usual behaviour."""
        try:
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._note)
        except ValueError:
            self.restore()
            return False
        return True

    def restore(self) -> None:
        """The handlers in place before :meth:`install`, back."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def raise_if_stopped(self) -> None:
        """At a safe point: if a signal came, hand it to the handlers that were in place before
        (raised again, so that they run here); a handler that ignores it lets the loop go on."""
        if self.signum is None:
            return
        signum, self.signum = self.signum, None
        installed = bool(self._previous)
        self.restore()
        try:
            signal.raise_signal(signum)  # the previous handler runs now, in this frame
        finally:
            if installed:
                self.install()


@contextmanager
def deferred_stop() -> Iterator[DeferredStop]:
    """:class:`DeferredStop` for the duration of the block (the previous handlers come back
    after it, whatever ends it)."""
    stop = DeferredStop()
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()
