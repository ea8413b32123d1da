"""``ragsim.sweep`` and ``ragsim.plan``: studies of many runs (``ragsim/study`` does the work).

A sweep's spec is what a sweep TOML holds (``base``, ``axes``, ``points``, ``seeds``, ``mode``
in ``base``), as a dict or the file's path; its rows are the results table ``ragsim sweep``
writes (one row per point and seed: the swept settings, then the run's summary fields).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ragsim.api.options import as_bytes, label
from ragsim.errors import RagsimInputError

if TYPE_CHECKING:
    import pandas as pd

    from ragsim.study.sweep import SweepOutcome


class SweepFailed(RuntimeError):
    """Some points of a sweep did not finish (each one's reason in ``failed``); the points
    that did are in ``out_dir``'s results table, and running the same sweep there resumes."""

    def __init__(self, outcome: SweepOutcome, out_dir: Path | None) -> None:
        self.outcome, self.out_dir = outcome, out_dir
        self.failed = list(outcome.failed)
        first = f" (first: point {self.failed[0][0]}: {self.failed[0][1]})" if self.failed else ""
        where = f"; the finished points are in {out_dir}" if out_dir is not None else ""
        super().__init__(f"{len(self.failed)} of {outcome.total} point(s) failed{first}{where}")


def check_sweep_options(executor: str, jobs: int | None, address: str | None) -> None:
    """How a sweep runs, checked before any point does."""
    from ragsim.study.executors import EXECUTORS

    if executor not in EXECUTORS:
        raise RagsimInputError(f"must be one of {', '.join(EXECUTORS)}, got {executor!r}",
                               field=label("executor"))
    if jobs is not None and jobs < 1:
        raise RagsimInputError(f"must be >= 1, got {jobs}", field=label("jobs"))
    if address is not None and executor != "ray":
        raise RagsimInputError(f"applies only to {label('executor')} ray",
                               field=label("address"))


def _spec(spec):
    from ragsim.study.spec import Sweep, load_sweep, parse_sweep

    if isinstance(spec, Sweep):
        return spec
    if isinstance(spec, dict):
        return parse_sweep(spec, "<spec>")
    if isinstance(spec, str | Path):
        return load_sweep(spec)
    raise RagsimInputError(f"must be a dict shaped like a sweep file, or its path; got "
                           f"{type(spec).__name__}", field=label("spec"))


def sweep(spec, *, out_dir: str | Path | None = None, executor: str = "local",
          jobs: int | None = None, address: str | None = None, records: bool = True,
          progress: bool = False) -> pd.DataFrame:
    """Run every point of ``spec`` (a dict shaped like the sweep TOML: ``base``, ``axes``,
    ``points``, ``seeds``; or its path) as ``ragsim sweep`` does, and return the results
    table. ``out_dir`` keeps the points' files and resumes an earlier sweep there (None: a
    temporary folder, removed after). Raises :class:`SweepFailed` if a point failed."""
    from ragsim.outputs import check_out_dir
    from ragsim.study.executors import default_jobs
    from ragsim.study.results import read_results
    from ragsim.study.sweep import run_sweep

    check_sweep_options(executor, jobs, address)
    if out_dir is not None:
        check_out_dir(Path(out_dir), label("out_dir"))
    study = _spec(spec)
    folder = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(
        prefix="ragsim-sweep-"))
    try:
        from ragsim.progress import counted_bar

        with counted_bar("sweep", progress) as advance:
            outcome = run_sweep(study, folder, executor=executor, jobs=jobs or default_jobs(),
                                address=address, keep_requests=records, on_progress=advance)
        if outcome.failed:
            raise SweepFailed(outcome, Path(out_dir) if out_dir is not None else None)
        return read_results(folder)
    finally:
        if out_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def _run_quietly(spec, folder: Path, jobs: int, progress: bool, what: str):
    from ragsim.progress import counted_bar
    from ragsim.study.results import read_results
    from ragsim.study.sweep import run_sweep

    with counted_bar(what, progress) as advance:
        outcome = run_sweep(spec, folder, jobs=jobs, keep_requests=False, on_progress=advance)
    if outcome.failed:
        raise RagsimInputError(f"{len(outcome.failed)} candidate run(s) failed: "
                               f"{outcome.failed[0][1]}")
    return read_results(folder)


PLAN_FILE = "plan.json"
MARGIN_DIR = "margin"  # the winner's margin sweep, beside the candidates'


def _forget_earlier_plan(out: Path) -> None:
    """A forced plan over an earlier one starts from nothing: the earlier plan's tables go
    (its candidates are another sweep's points, which the sweep would refuse to mix with the
    new ones); its plan.json stays until the new one replaces it whole. A folder without
    plan.json is an interrupted plan: kept, so that it resumes."""
    from ragsim.study.results import RESULTS_FILE

    if not (out / PLAN_FILE).exists():
        return
    for path in (out / RESULTS_FILE, out / MARGIN_DIR / RESULTS_FILE):
        path.unlink(missing_ok=True)


def plan(trace: str = "mmlu", rate: float = 1.0, slo: str = "ttft_p90_s<=0.5",
         model: str = "mistral-7b", system: str = "ragcache",
         host_mem: list[str | int] | None = None, replicas: list[int] | None = None,
         requests: int = 2000, seeds: int = 1, prices: str | Path | None = None,
         jobs: int | None = None, out_dir: str | Path | None = None,
         plot: str | Path | None = None, router: str | list[str] = "round-robin",
         progress: bool = False, force: bool = False) -> dict:
    """The cheapest GPU type, GPU count, host memory and router that meet ``slo`` at ``rate``,
    searched with the simulator over ``model``'s shipped profiles, as ``ragsim plan`` finds it:
    the dict ``plan --json`` prints (``best``, ``candidates``, ``margin_curve``, ...).
    ``router`` is one router or a list of them, each tried for every fleet. An earlier plan
    in ``out_dir`` is replaced only with ``force``; an interrupted one (no plan.json yet)
    resumes."""
    from ragsim.figures import check_plot_path
    from ragsim.outputs import claim_output_dir
    from ragsim.study import plan as planning
    from ragsim.study.executors import default_jobs

    goal = planning.parse_slo(slo)
    if not rate > 0:
        raise RagsimInputError("must be > 0", field=label("rate"))
    for name, value in (("requests", requests), ("seeds", seeds), ("jobs", jobs or 1)):
        if value < 1:
            raise RagsimInputError("must be >= 1", field=label(name))
    if any(n < 1 for n in replicas or ()):
        raise RagsimInputError("must be >= 1", field=label("replicas"))
    from ragsim.cache.routers import ROUTERS

    routers = [router] if isinstance(router, str) else list(dict.fromkeys(router))
    if not routers:
        raise RagsimInputError("name at least one router", field=label("router"))
    for name in routers:
        if name not in ROUTERS:
            raise RagsimInputError(f"must be one of {', '.join(ROUTERS)}, got {name!r}",
                                   field=label("router"))
    plot_file = Path(plot) if plot is not None else None
    if plot_file is not None:
        check_plot_path(plot_file, field=label("plot"))
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:  # before the candidates run: an earlier plan must not be lost
        claim_output_dir(out, writes=(PLAN_FILE,), force=force, flag=label("out_dir"),
                         inputs=(prices,))
        _forget_earlier_plan(out)
    price_table = planning.load_prices(Path(prices) if prices is not None else None)
    options = planning.gpu_options(model, price_table)
    host_gib = ([as_bytes(h, "host_mem") / planning.GiB for h in host_mem]
                if host_mem else list(planning.DEFAULT_HOST_MEM_GIB))
    counts = sorted(set(replicas or planning.DEFAULT_REPLICAS))
    base = {"system": system}
    spec = planning.plan_sweep(trace=trace, rate_rps=rate, options=options, host_gib=host_gib,
                               replicas=counts, base=base, seeds=list(range(seeds)),
                               routers=routers, requests_per_replica=requests)
    folder = out or Path(tempfile.mkdtemp(prefix="ragsim-plan-"))
    table = _run_quietly(spec, folder, jobs or default_jobs(), progress, "plan")
    candidates = planning.choose(table, goal, options, rate, price_table)
    met = [c for c in candidates if c["meets_slo"]]
    best = met[0] if met else None
    curve = []
    if best is not None:
        points = [{"profile": best["profile"], "system": system,
                   "n_requests": requests * best["replicas"], "trace": trace,
                   "host_cache_bytes": best["host_cache_bytes_per_replica"],
                   "replicas": best["replicas"], "router": best["router"],
                   "rate_rps": rate * f}
                  for f in planning.MARGIN_FACTORS]
        from ragsim.study.spec import parse_sweep

        margin_spec = parse_sweep({"seeds": list(range(seeds)), "points": points}, "<plan>")
        margin = _run_quietly(margin_spec, folder / MARGIN_DIR, jobs or default_jobs(),
                              progress, "margin")
        for f in planning.MARGIN_FACTORS:
            rows = margin[abs(margin["rate_rps"] - rate * f) < 1e-12]
            value = float(rows[goal.metric].mean())
            curve.append({"rate_rps": rate * f, "rate_factor": f, goal.metric: value,
                          "meets_slo": goal.met(value)})
    result = {"trace": trace, "rate_rps": rate, "slo": str(goal), "model": model,
              "system": system, "routers": routers, "requests": requests, "seeds": seeds,
              "prices": price_table, "best": best, "margin_curve": curve,
              "candidates": candidates, "results_dir": str(folder)}
    if out is not None:
        from ragsim.atomic import write_text_atomically

        # whole or not at all: a plan.json cut by a full disk or a signal must not look finished
        write_text_atomically(out / PLAN_FILE, json.dumps(result, indent=2) + "\n")
    if plot_file is not None and curve:
        from ragsim.figures import save_figure

        save_figure(planning.margin_figure(curve, goal, best), plot_file)
    return result


__all__ = ["SweepFailed", "check_sweep_options", "plan", "sweep"]
