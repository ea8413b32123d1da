"""Where sweep points run: local processes (default) or a Ray cluster.

Both yield :class:`PointOutcome` objects as points end, in any order; the sweep stores each at
once. Both run the same function (:func:`ragsim.study.point.run_point`), so a point's result
does not depend on the executor. Stopping (Ctrl-C, SIGTERM) ends the points still running: they
are unfinished work, and a resumed sweep runs them again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator

from ragsim.children import die_with_parent
from ragsim.errors import MissingExtraError
from ragsim.study.point import PointOutcome, run_point
from ragsim.study.spec import Point

EXECUTORS = ("local", "ray")
# Ray started here runs offline: no token file, no probe of an outside address, no dashboard
RAY_OFFLINE_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def _worker_start(sweep_pid: int) -> None:
    # Ctrl-C reaches the whole process group; the sweep's own process decides what stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # and a SIGKILLed sweep takes its workers with it (with them goes multiprocessing's
    # resource tracker, which ends when the last process holding its pipe does)
    die_with_parent(sweep_pid)


def run_local(mode: str, points: list[Point], jobs: int, keep_requests: bool
              ) -> Iterator[PointOutcome]:
    """Points on ``jobs`` local processes (in this process when ``jobs`` is 1: nothing to
    spread, and a worker's start-up would cost more than a small point)."""
    if jobs == 1:
        for point in points:
            yield run_point(mode, point.settings, point.point_id, keep_requests)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start,
                               initargs=(os.getpid(),))
    try:
        ids = {pool.submit(run_point, mode, p.settings, p.point_id, keep_requests): p.point_id
               for p in points}
        pending = set(ids)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    yield future.result()
                except BrokenProcessPool:  # a worker was killed (out of memory, kill -9):
                    # the pool is gone, so the points not yet run are left for a rerun
                    yield PointOutcome(ids[future], exit_code=1, message=(
                        "a worker process died (killed, or out of memory)"))
                    return
    finally:
        processes = list(getattr(pool, "_processes", {}).values())  # no public kill before 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # what still runs is unfinished: stop it now
            if process.is_alive():
                process.kill()
        for process in processes:
            process.join()
        pool.shutdown(wait=True)  # the pool's own thread ends now, not in an exit handler


def run_ray(mode: str, points: list[Point], jobs: int | None, keep_requests: bool,
            address: str | None) -> Iterator[PointOutcome]:
    """Points as Ray tasks, one CPU each, on the cluster at ``address`` or on a local cluster
    of ``jobs`` CPUs started (and stopped) here."""
    try:
        import ray
    except ImportError:
        raise MissingExtraError("`sweep --executor ray` needs ray, which is not installed; "
                                "ragsim's 'study' extra: pip install '.[study]' in ragsim's "
                                "checkout", module="ray", extra="study") from None
    for name, value in RAY_OFFLINE_ENV.items():
        os.environ.setdefault(name, value)
    started_here = not ray.is_initialized()
    if started_here:
        if address is not None:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=jobs or default_jobs(), include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
    task = ray.remote(num_cpus=1, max_retries=0)(run_point)
    pending = [task.remote(mode, p.settings, p.point_id, keep_requests) for p in points]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        for ref in pending:  # what still runs is unfinished: stop it now
            with contextlib.suppress(Exception):  # already finished or gone
                ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
