"""Ctrl-C and SIGTERM while a loop over a pool's results runs: noted at once, acted on where the
loop says it is safe, by the handlers that were in place before (ragsim.stopping)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from ragsim.stopping import Terminated, deferred_stop, sigterm_like_ctrl_c


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)


@pytest.fixture(autouse=True)
def _python_ctrl_c():
    """Python's own Ctrl-C handler, whatever started the tests: a shell that runs them in the
    background (``nohup ... &``) starts Python with SIGINT ignored, and an ignored Ctrl-C is
    rightly handed back as ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_sigterm_waits_for_the_safe_point_and_takes_the_commands_path():
    with sigterm_like_ctrl_c() as seen, deferred_stop() as stop:
        _send(signal.SIGTERM)
        # numpy compares dtypes through a Python call whose errors it clears: an exception
        # raised by a handler there would be lost (a sweep once ran on to its end)
        assert np.dtype("float64") != np.dtype("int64")
        assert not seen.terminated, "noted only: nothing raised yet"
        with pytest.raises(Terminated):
            stop.raise_if_stopped()
    assert seen.terminated and seen.exit_code == 143


def test_ctrl_c_raises_keyboard_interrupt_at_the_safe_point_only():
    raised_early = False
    with deferred_stop() as stop:
        try:
            _send(signal.SIGINT)
            sum(range(10_000))  # bytecode runs: a pending handler would have run by now
        except KeyboardInterrupt:
            raised_early = True
        with pytest.raises(KeyboardInterrupt):
            stop.raise_if_stopped()
    assert not raised_early


def test_the_first_signal_counts_and_the_previous_handlers_come_back():
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with deferred_stop() as stop:
            stop.raise_if_stopped()  # nothing came: nothing happens
            _send(signal.SIGTERM)
            _send(signal.SIGINT)
            stop.raise_if_stopped()  # the recording handler does not raise: the loop goes on
            assert calls == [signal.SIGTERM]
            stop.raise_if_stopped()
            assert calls == [signal.SIGTERM], "handed over once"
            assert signal.getsignal(signal.SIGTERM) is not previous, "still noting"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is not None and handler(signal.SIGTERM, None) is None
        assert calls == [signal.SIGTERM, signal.SIGTERM], "the previous handler is back"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with deferred_stop() as stop:
            _send(signal.SIGTERM)
            stop.raise_if_stopped()  # ignored before: ignored now (the process lives on)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
