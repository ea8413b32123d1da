"""How the API names its options in errors, and the small conversions every entry point shares.

The same check raises the same error whether a notebook called ``ragsim.simulate(rate=-1)`` or a
shell ran ``ragsim run --rate -1``; only the option's name is said as the caller wrote it
(``rate`` in Python, ``--rate`` on the command line). The CLI asks for its spelling with
:func:`command_line_labels` around its call, so the API never imports the CLI.
"""

from __future__ import annotations

import contextvars
import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ragsim.errors import RagsimInputError
from ragsim.units import parse_bytes

_COMMAND_LINE = contextvars.ContextVar("ragsim_command_line_labels", default=False)
# keywords whose flag is not their name in kebab case
_FLAGS = {"out_dir": "--out", "config": "--config", "config_file": "--config"}


def label(option: str) -> str:
    """``option`` as the caller spells it: ``host_mem`` (Python) or ``--host-mem`` (CLI)."""
    if not _COMMAND_LINE.get():
        return option
    return _FLAGS.get(option) or "--" + option.replace("_", "-")


def label_on(option: str) -> str:
    """How the caller turns a switch on: ``force=True`` (Python) or ``--force`` (CLI)."""
    return label(option) if _COMMAND_LINE.get() else f"{option}=True"


@contextmanager
def command_line_labels() -> Iterator[None]:
    """Within: errors name options as flags (``--host-mem``), as the command line spells them."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def unknown_option(name: str, known: Iterable[str], what: str) -> RagsimInputError:
    """An option ``what`` does not take, with the closest one it does."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
    return RagsimInputError(f"not an option of {what}{hint}", field=name)


def as_bytes(value, option: str) -> int:
    """A size as given: text (``4GiB``, ``32G``) or a number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RagsimInputError(f"must be a size such as 4GiB or a number of bytes, got "
                               f"{value!r}", field=label(option))
    if isinstance(value, int):
        return value
    return parse_bytes(value if isinstance(value, str) else repr(value), field=label(option))


def cosine_distance(similarity: float | None, distance: float | None, *, similarity_flag: str,
                    distance_flag: str, default_similarity: float | None = None
                    ) -> float | None:
    """One semantic threshold from either convention: the article's cosine similarity or
    redisvl's cosine distance (1 - similarity); both given is an error naming the options. None
    when neither is given and there is no default (the configuration's own then holds)."""
    if similarity is not None and distance is not None:
        raise RagsimInputError(f"give {similarity_flag} (similarity) or {distance_flag} "
                               "(distance), not both", field=similarity_flag)
    if distance is not None:
        if not 0.0 <= distance <= 2.0:
            raise RagsimInputError(f"must be a cosine distance in [0, 2], got {distance}",
                                   field=distance_flag)
        return distance
    similarity = default_similarity if similarity is None else similarity
    if similarity is None:
        return None
    if not 0.0 <= similarity <= 1.0:
        raise RagsimInputError(f"must be a cosine similarity in [0, 1], got {similarity}",
                               field=similarity_flag)
    return 1.0 - similarity


def generator_settings(drift: float | None) -> dict:
    """``resolve_trace``'s generator overrides for a drift (none when not given)."""
    return {} if drift is None else {"drift_per_1k_requests": drift}
