"""Where sweep points run: local processes (default) or a Ray cluster.

Both yield :class:`PointOutcome` objects as points end, in any order; the sweep stores each at
once. Both run the same function (:func:`ragsim.study.point.run_point`), so a point's result
does not depend on the executor. Stopping (Ctrl-C, SIGTERM) ends the points still running: they
are unfinished work, and a resumed sweep runs them again.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import ipaddress
import logging
import os
import secrets
import signal
import sys
from collections.abc import Iterator

from ragsim.children import die_with_parent
from ragsim.errors import MissingExtraError, RagsimInputError
from ragsim.stopping import DeferredStop, deferred_stop
from ragsim.study.point import PointOutcome, run_point
from ragsim.study.spec import Point

EXECUTORS = ("local", "ray")


def local_ray_env() -> dict[str, str]:
    """The environment a local Ray cluster is started with (what the user set wins).

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take loopback as the node's address (its
    single-machine mode; Ray otherwise replaces even a given 127.0.0.1 by the address it would
    use to reach the outside), so the GCS, raylets, workers, the object manager and the
    autoscaler's metrics all listen on 127.0.0.1 only. Token authentication stays on
    (``RAY_AUTH_MODE=token``) with a random token given in ``RAY_AUTH_TOKEN``: Ray then writes
    no token file, and the cluster's processes inherit it. One token per process (Ray's driver
    keeps the token it first read)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": _process_token()}


@functools.cache
def _process_token() -> str:
    return secrets.token_hex(32)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set where the user has not set them, and taken back afterwards."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


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
    with deferred_stop() as stop:  # Ctrl-C and SIGTERM act between the loop's steps
        yield from _pool_outcomes(mode, points, jobs, keep_requests, stop)


# how often the loop over a pool's results looks for a noted Ctrl-C or SIGTERM
STOP_CHECK_EVERY_S = 0.2


def _pool_outcomes(mode: str, points: list[Point], jobs: int, keep_requests: bool,
                   stop: DeferredStop) -> Iterator[PointOutcome]:
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
            stop.raise_if_stopped()
            done, pending = wait(pending, timeout=STOP_CHECK_EVERY_S,
                                 return_when=FIRST_COMPLETED)
            for future in done:  # what ended is kept, even after a stop came
                try:
                    outcome = future.result()
                except BrokenProcessPool:  # a worker was killed (out of memory, kill -9):
                    # the pool is gone, so the points not yet run are left for a rerun
                    yield PointOutcome(ids[future], exit_code=1, message=(
                        "a worker process died (killed, or out of memory)"))
                    return
                yield outcome
        stop.raise_if_stopped()
    finally:
        _stop_pool(pool)


def _stop_pool(pool) -> None:
    """End the pool now, with the points still running: they are unfinished work.

    ``concurrent.futures`` has no public way to do it before Python 3.14 (``kill_workers``),
    so this reaches into the pool. Its workers are killed. The pool's own thread may then be
    reading a result a killed worker had half sent (a point's requests table is megabytes), and
    would wait for the rest forever, since this process holds the pipe's write end open too:
    this process closes its copy, the read ends, the thread sees the pool broken and stops,
    and it is joined here, not by Python's exit handler. (Without that a stopped sweep hung at
    exit about once in ten runs, after printing that it was terminated.)"""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    thread = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)
    pool.shutdown(wait=False, cancel_futures=True)  # forgets the thread and the queue
    for process in processes:  # what still runs is unfinished: stop it now
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join()
    writer = getattr(results, "_writer", None)
    if writer is not None:
        writer.close()
    if thread is not None:
        thread.join()
    if results is not None:
        results.close()


def run_ray(mode: str, points: list[Point], jobs: int | None, keep_requests: bool,
            address: str | None) -> Iterator[PointOutcome]:
    """Points as Ray tasks, one CPU each, on the cluster at ``address`` (the user's: connected
    to as their environment says, authentication included) or on a local cluster of ``jobs``
    CPUs started (and stopped) here, listening on loopback only, with token authentication."""
    if importlib.util.find_spec("ray") is None:
        raise MissingExtraError("`sweep --executor ray` needs ray, which is not installed; "
                                "ragsim's 'study' extra: pip install '.[study]' in ragsim's "
                                "checkout", module="ray", extra="study")
    local = address is None and not _ray_running()
    with _environment(local_ray_env() if local else {}):
        import ray  # after the environment: Ray reads some of it when first imported

        started_here = not ray.is_initialized()
        if local:
            _start_local_ray(ray, jobs)
        elif started_here:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            yield from _ray_tasks(ray, mode, points, keep_requests)
        finally:
            if started_here:
                ray.shutdown()


def _ray_running() -> bool:
    """A Ray driver already set up in this process (whoever started it): used as it is."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _start_local_ray(ray, jobs: int | None) -> None:
    from ray.util import get_node_ip_address

    _require_loopback(get_node_ip_address())  # the address Ray would start the node on
    ray.init(num_cpus=jobs or default_jobs(), include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        _require_loopback(get_node_ip_address())
    except RagsimInputError:
        ray.shutdown()
        raise


def _require_loopback(node: str) -> None:
    if not ipaddress.ip_address(node).is_loopback:  # ray was imported with clusters enabled
        raise RagsimInputError(
            f"a local Ray cluster would listen on {node}, not only on loopback (ray was "
            f"imported in this process before the sweep set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
            f"=0): run the sweep in a process of its own, or start a cluster and give "
            f"--address", field="--executor")


def _ray_tasks(ray, mode: str, points: list[Point], keep_requests: bool
               ) -> Iterator[PointOutcome]:
    task = ray.remote(num_cpus=1, max_retries=0)(run_point)
    pending = [task.remote(mode, p.settings, p.point_id, keep_requests) for p in points]
    with deferred_stop() as stop:  # Ctrl-C and SIGTERM act between the loop's steps
        try:
            while pending:
                stop.raise_if_stopped()
                done, pending = ray.wait(pending, num_returns=1, timeout=STOP_CHECK_EVERY_S)
                for ref in done:
                    yield ray.get(ref)
            stop.raise_if_stopped()
        finally:
            for ref in pending:  # what still runs is unfinished: stop it now
                with contextlib.suppress(Exception):  # already finished or gone
                    ray.cancel(ref, force=True)
