"""A progress bar for library calls that asked for one (``ragsim.simulate(progress=True)``).

The command line draws its own (with its columns); the API draws this one on stderr, only when
asked: a notebook or a script that did not ask gets no output at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(label: str) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """``(start(total), advance(done))`` for one job's bar, gone when the job ends."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task(label, total=None)
    with bar:
        yield (lambda total: bar.update(task, total=total),
               lambda done: bar.update(task, completed=done))


@contextmanager
def counted_bar(label: str, enabled: bool = True, *extra_columns
                ) -> Iterator[Callable[[int, int], None]]:
    """``on_progress(done, total)`` for a job of many parts (a sweep's points) whose first call
    says how many were already done (a resumed sweep): the bar's speed counts only the rest."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   *extra_columns, TimeElapsedColumn(), console=Console(stderr=True),
                   transient=True, disable=not enabled)
    task = bar.add_task(label, total=None)
    with bar:
        yield resetting_advance(bar, task)


def resetting_advance(bar: Progress, task) -> Callable[[int, int], None]:
    """``(done, total)`` for ``bar``'s ``task``: the first call (the parts a resumed job found
    done) resets the bar, so that its speed and time left count only the parts run now."""
    started = False

    def advance(done: int, total: int) -> None:
        nonlocal started
        if not started:
            bar.reset(task, total=total, completed=done)
            started = True
        else:
            bar.update(task, completed=done)

    return advance
