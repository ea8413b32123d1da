"""Pausing Python's cyclic garbage collector while a driver builds a large knowledge tree."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused():
    """Pause the cyclic garbage collector while a replay allocates millions of tree nodes.

    Nodes point to their parents and children, so every collection would walk the whole tree
    again (profiling showed an eighth of replay time in it); reference counting still frees
    what dies, and the collector runs as usual afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
