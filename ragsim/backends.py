"""What runs a configuration: the simulator or a real engine, behind one call.

``ragsim run --backend`` and ``ragsim validate`` both pick a runner here, so the way a backend
is started exists once. Like ``validate``, this module sees both drivers and imports each only
when it is asked for (the simulator needs no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ragsim.errors import RagsimInputError

if TYPE_CHECKING:
    from ragsim.profiles.profile import Profile
    from ragsim.serving.config import SimConfig
    from ragsim.serving.pipeline import RunResult
    from ragsim.traces.schema import Trace

BACKENDS = ("sim", "torch", "vllm")
DEVICES_HELP = "cpu, cuda or cuda:N"
# what a real backend on a CPU serves when no profile is given: the shipped profiles measured on
# that engine's scaled-down model (a 7B model's weights do not fit a CPU run's memory or time)
CPU_PROFILES = {"torch": "cpu-mistral-7b-l2-h256", "vllm": "cpu-vllm-mistral-7b-l2-h256"}

Runner = Callable[["Trace", "SimConfig", "Profile", Callable | None], "RunResult"]


def runner(backend: str, *, device: str = "cpu", threads: int | None = None) -> Runner:
    """``(trace, config, profile, progress) -> RunResult`` for ``backend``: ``sim`` simulates
    with the profile's costs; ``torch`` serves for real on the profile's model (on ``device``,
    with ``threads`` CPU threads, None: as many as the profile was measured with); ``vllm``
    serves with vLLM's engine on the profile's model (its own platform; on a CPU ``threads``,
    None: the threads a vLLM profile was measured with, else every core)."""
    if backend == "sim":
        from ragsim.sim.simulator import run_simulation

        def simulate(trace, config, profile, progress=None):
            if config.replicas > 1:  # a fleet behind a router, on one clock
                from ragsim.sim.fleet import run_fleet

                return run_fleet(trace, config, profile, progress)
            return run_simulation(trace, config, profile, progress)

        return simulate
    if backend not in ("torch", "vllm"):
        raise RagsimInputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}",
                               field="--backend")
    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise RagsimInputError(f"must be {DEVICES_HELP}, got {device!r}", field="--device")
    if backend == "vllm":
        from ragsim.realrun.vllm import require_device, require_engine

        require_engine("--backend vllm")
        require_device(device)
        from ragsim.realrun.vllm.harness import run_vllm

        def served(trace, config, profile, progress=None):
            if config.replicas > 1:
                raise RagsimInputError("a real fleet runs the torch engine (a thread each); "
                                       "vLLM's engine takes the machine", field="--replicas")
            return run_vllm(trace, config, profile, seed=config.seed, progress=progress,
                            threads=threads)

        return served
    from ragsim.realrun.harness import run_real

    def real(trace, config, profile, progress=None):
        if config.scheduler != "prefill-first":
            raise RagsimInputError(
                "the torch engine runs prefill-first iterations; mixed steps (chunked prefill) "
                "are modelled by the simulator and run by vLLM (--backend vllm)",
                field="scheduler")
        if config.replicas > 1:  # two real engines (or more), a thread each
            from ragsim.realrun.fleet import run_real_fleet

            return run_real_fleet(trace, config, profile, device=device, threads=threads,
                                  seed=config.seed, progress=progress)
        return run_real(trace, config, profile, device=device, threads=threads,
                        seed=config.seed, progress=progress)

    return real
