"""One thread for a library's own pool inside a block, the count given back after.

The embedder (torch) and the staged index (faiss) each run fastest on one thread on this
project's 2-core machines, but their thread counts are the calling thread's, shared with
whatever else runs there (a real run's engine): a count left at one slows that engine down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def one_thread(get_count: Callable[[], int], set_count: Callable[[int], None]
               ) -> Iterator[None]:
    """``set_count(1)`` inside the block, ``set_count`` of what ``get_count`` said after."""
    before = get_count()
    set_count(1)
    try:
        yield
    finally:
        set_count(before)
