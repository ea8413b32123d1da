"""Parsing of human-written sizes such as ``4GiB`` or ``512MB`` into bytes."""

from __future__ import annotations

import math
import re

from ragsim.errors import RagsimInputError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pb": 10**15,
    "eb": 10**18,
    "pib": 2**50,
    "eib": 2**60,  # the largest size accepted is 1 EiB, as the refusal says: it must be typable
}
# a bare K/M/G/T means 2^30 to some tools (ls, Docker) and 10^9 to others (Kubernetes, disk
# vendors): refused, with both spellings offered, rather than guessed (32G was silently 32 GiB
# while 32GB was 29.8 GiB)
_AMBIGUOUS = {"k": "K", "m": "M", "g": "G", "t": "T", "p": "P", "e": "E"}
# past this a size is a typo, and int64 byte counters would overflow downstream
MAX_SIZE_BYTES = 2**60
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float, *, field: str = "size") -> int:
    """Return the number of bytes in ``text`` (``"4GiB"``, ``"0"``, ``"1.5 GB"``, ``1024``).

    Binary suffixes (KiB, MiB, GiB, TiB, PiB, EiB) are powers of 1024; decimal ones (KB ... EB)
    powers of 1000, as their names say; a bare K/M/G/T/P/E is refused as ambiguous.
    """
    if isinstance(text, bool):
        raise RagsimInputError(f"expected a size, got {text!r}", field=field)
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        match = _SIZE_RE.match(text)
        if match is None:
            raise RagsimInputError(
                f"cannot read {text!r} as a size; write e.g. 4GiB, 512MiB or 1000000", field=field
            )
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit in _AMBIGUOUS:
        number, letter = match.group(1), _AMBIGUOUS[unit]
        raise RagsimInputError(f"{text!r} is ambiguous: write {number}{letter}iB "
                               f"({letter}iB = 2^{10 * (list(_AMBIGUOUS).index(unit) + 1)} "
                               f"bytes) or {number}{letter}B (10^"
                               f"{3 * (list(_AMBIGUOUS).index(unit) + 1)})", field=field)
    if unit not in _UNITS:
        raise RagsimInputError(f"unknown size unit {unit!r} in {text!r}", field=field)
    if value < 0:
        raise RagsimInputError(f"a size cannot be negative: {text!r}", field=field)
    n_bytes = value * _UNITS[unit]
    if not math.isfinite(n_bytes) or n_bytes > MAX_SIZE_BYTES:
        raise RagsimInputError(f"{text!r} is larger than any memory ragsim models "
                               f"(at most {MAX_SIZE_BYTES:,} bytes, 1 EiB)", field=field)
    return round(n_bytes)


def format_bytes(n_bytes: float) -> str:
    """Short human form of a byte count, binary units."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def describe_bytes(n_bytes: int) -> str:
    """A size echoed in the unit it was most likely written in, so a reader sees what was
    understood: ``192 GiB``; decimal sizes with their binary value beside, because the two are
    easily confused (``--host-mem 32GB`` is ``32 GB (29.80 GiB)``, not 32 GiB). The largest
    unit, of either kind, that divides the size exactly into fewer than 10,000 wins; anything
    else (a profile's 6,043,326,464 bytes) is shown as :func:`format_bytes` does."""
    n_bytes = int(n_bytes)
    exact = [(size, unit) for unit, size in (*_BINARY, *_DECIMAL)
             if n_bytes >= size and n_bytes % size == 0 and n_bytes // size < 10_000]
    if not exact:
        return format_bytes(n_bytes)
    size, unit = max(exact)
    shown = f"{n_bytes // size:,} {unit}"
    return shown if unit.endswith("iB") else f"{shown} ({format_bytes(n_bytes)})"
