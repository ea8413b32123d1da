"""Capacity planning: the cheapest GPU type, GPU count and host memory that meet a TTFT SLO.

For a trace, a request rate and an SLO (``ttft_p90_s<=0.5``), every shipped profile of the model
(one GPU type each; tensor-parallel profiles count their GPUs) is simulated at each host memory
and replica count as one sweep (so the planner's runs are ``ragsim run``'s). Replicas are a
simulated fleet (``ragsim run --replicas n --router R``): the whole traffic at ``rate`` behind
the router, each replica with its own cache and the host memory tried, ``requests`` per replica
(a fleet of n simulates n x requests, so that each replica is measured as deeply as a single
engine). Each router named (``--router``, repeatable; ``round-robin`` unless given) is a
candidate of its own for every fleet, so the plan says which router a fleet needs
(``prefix-affinity``: SGLang's cache-aware routing; ``kv-aware``: Dynamo's); one replica has
no router to choose. A configuration costs ``n x (GPUs x GPU price + host GiB x host
price)`` an hour; the prices are defaults to rank by (``--prices`` gives yours). The margin
curve runs the winner at multiples of the asked rate: how much more traffic it takes before the
SLO breaks.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from pathlib import Path

from ragsim.errors import RagsimInputError

GiB = 2**30
# On-demand cloud list prices, USD per GPU-hour, rounded (2025-2026; they vary by provider and
# region by 2x: rank with your own via --prices). Host memory: USD per GiB-hour of RAM.
DEFAULT_PRICES = {"gpu_usd_per_h": {"l4": 0.80, "a10g": 1.01, "a100": 3.67, "h100": 6.98,
                                    "h800": 6.98, "h200": 8.50},
                  "host_usd_per_gib_h": 0.005}
DEFAULT_HOST_MEM_GIB = (0, 32, 192)
DEFAULT_REPLICAS = (1, 2, 4, 8)
MARGIN_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
_SLO = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|<|>=|>)\s*([0-9.eE+-]+)\s*$")
_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class Slo:
    metric: str
    op: str
    bound: float

    def met(self, value: float | None) -> bool:
        return value is not None and value == value and _OPS[self.op](value, self.bound)

    def margin(self, value: float) -> float:
        """How far inside the bound, as a share of it (negative: outside)."""
        room = self.bound - value if self.op in ("<=", "<") else value - self.bound
        return room / abs(self.bound) if self.bound else room

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_slo(text: str) -> Slo:
    match = _SLO.match(text)
    if match is None:
        raise RagsimInputError(f"must read METRIC<=VALUE (e.g. ttft_p90_s<=0.5), got {text!r}",
                               field="--slo")
    metric, op, bound = match.groups()
    try:
        value = float(bound)
    except ValueError:
        raise RagsimInputError(f"not a number: {bound!r}", field="--slo") from None
    return Slo(metric, op, value)


def load_prices(path: Path | None) -> dict:
    """The price table: the defaults, or a TOML file with the same two keys."""
    if path is None:
        return DEFAULT_PRICES
    from ragsim.user_files import read_user_toml

    data = read_user_toml(path, what="price table")
    gpus = data.get("gpu_usd_per_h")
    if not isinstance(gpus, dict) or not all(
            isinstance(v, int | float) and v >= 0 for v in gpus.values()):
        raise RagsimInputError("must be a table of GPU name = USD per hour", file=str(path),
                               field="gpu_usd_per_h")
    host = data.get("host_usd_per_gib_h", 0.0)
    if not isinstance(host, int | float) or host < 0:
        raise RagsimInputError("must be a number >= 0", file=str(path),
                               field="host_usd_per_gib_h")
    return {"gpu_usd_per_h": dict(gpus), "host_usd_per_gib_h": float(host)}


@dataclass(frozen=True)
class GpuOption:
    profile: str
    gpu: str  # the hardware's short name (a10g, h100)
    gpus_per_replica: int


def gpu_options(model: str, prices: dict) -> list[GpuOption]:
    """The shipped profiles of ``model`` whose GPU has a price."""
    from ragsim.profiles.profile import load_profile, shipped_profile_names

    options = []
    for name in shipped_profile_names():
        profile = load_profile(name)
        gpu = str(profile.hardware.get("name", ""))
        if profile.model.name == model and gpu in prices["gpu_usd_per_h"]:
            options.append(GpuOption(name, gpu, int(profile.hardware.get("gpus", 1))))
    if not options:
        raise RagsimInputError(f"no shipped profile of model {model!r} on a priced GPU "
                               f"({', '.join(prices['gpu_usd_per_h'])})", field="--model")
    return options


def cost_per_h(option: GpuOption, replicas: int, host_gib: float, prices: dict) -> float:
    per_replica = (option.gpus_per_replica * prices["gpu_usd_per_h"][option.gpu]
                   + host_gib * prices["host_usd_per_gib_h"])
    return replicas * per_replica


def plan_sweep(*, trace: str, rate_rps: float, options: list[GpuOption], host_gib: list[float],
               replicas: list[int], base: dict, seeds: list[int],
               routers: list[str] = ("round-robin",), requests_per_replica: int = 2000):
    """The planner's candidates as a sweep (listed points: a profile, a host size, a fleet of
    so many replicas behind each of ``routers``, all at the fleet's rate; one replica once,
    behind the first router, since there is nothing to route)."""
    from ragsim.study.spec import parse_sweep

    points = [{"profile": o.profile, "host_cache_bytes": int(h * GiB), "rate_rps": rate_rps,
               "replicas": n, "router": r, "n_requests": requests_per_replica * n}
              for o in options for h in host_gib for n in replicas
              for r in (routers if n > 1 else routers[:1])]
    data = {"seeds": seeds, "base": {"trace": trace, **base}, "points": points}
    return parse_sweep(data, "<plan>")


def choose(table, slo: Slo, options: list[GpuOption], rate_rps: float, prices: dict
           ) -> list[dict]:
    """Every candidate with its cost, its SLO metric (mean over seeds) and whether it meets the
    SLO, cheapest first."""
    by_profile = {o.profile: o for o in options}
    if slo.metric not in table.columns:
        raise RagsimInputError(f"not a summary field: {slo.metric!r}", field="--slo")
    rows = []
    for (profile, host, replicas, router), group in table.groupby(
            ["profile", "host_cache_bytes", "replicas", "router"]):
        option = by_profile[profile]
        replicas = int(replicas)
        value = float(group[slo.metric].mean())
        rows.append({"profile": profile, "gpu": option.gpu, "replicas": replicas,
                     "router": str(router),
                     "gpus": replicas * option.gpus_per_replica,
                     "host_cache_bytes_per_replica": int(host),
                     "rate_rps_per_replica": rate_rps / replicas,
                     "cost_usd_per_h": cost_per_h(option, replicas, host / GiB, prices),
                     slo.metric: value, "meets_slo": slo.met(value),
                     "margin": slo.margin(value), "seeds": len(group)})
    rows.sort(key=lambda r: (r["cost_usd_per_h"], -r["margin"]))
    return rows


def margin_figure(curve: list[dict], slo: Slo, best: dict):
    """The winner's SLO metric against the offered rate, with the SLO's bound."""
    from ragsim.figures import new_figure, plain
    from ragsim.study.plot import label

    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    xs = [p["rate_rps"] for p in curve]
    ax.plot(xs, [p[slo.metric] for p in curve], marker="o",
            label=f"{best['replicas']} x {plain(best['profile'])}, "
                  f"{best['host_cache_bytes_per_replica'] / GiB:g} GiB host")
    ax.axhline(slo.bound, color="red", linestyle="--", label=f"SLO {slo}")
    ax.set_xlabel(label("rate_rps"))
    ax.set_ylabel(label(slo.metric))
    ax.set_title("Margin of the cheapest configuration", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
