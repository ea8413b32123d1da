"""Opening the files users hand to ragsim: regular files only, of a size a reader can hold.

A configuration, a profile, an answer-latency profile, a sweep or price table, a JSONL trace or
a question set is named by a path the user typed, and a path can name anything: a folder, a
FIFO (whose ``open`` blocks until a writer comes, so the command hangs), ``/dev/zero`` (read
without end until memory runs out). Every such input is opened here: without blocking, checked
to be a regular file, and read up to a bound; anything else is one line naming the file. JSON
parsed here cannot end in a ``RecursionError`` either (a deeply nested array is valid JSON that
Python's parser cannot hold).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ragsim.errors import RagsimInputError

# whole documents (configurations, profiles, sweep files, price tables): the largest ragsim
# writes are tens of kilobytes, so past this it is the wrong file
MAX_DOCUMENT_BYTES = 64 * 2**20
# one line of a JSONL file (a request, a passage, a question): a long passage is kilobytes
MAX_LINE_BYTES = 64 * 2**20

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_user_file(path: str | os.PathLike, *, error: type[RagsimInputError] = RagsimInputError,
                   field: str | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file (a link to one is one).
    Opened without blocking, then checked on the open file itself, so a FIFO is refused
    without waiting for a writer and a file swapped after the check cannot slip through."""
    source = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error("no such file", file=source, field=field) from None
    except IsADirectoryError:
        raise error("is a folder; give a file", file=source, field=field) from None
    except OSError as exc:
        raise error(f"cannot open: {exc.strerror or exc}", file=source, field=field) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"is {_kind(mode)}, not a regular file; give a file", file=source,
                        field=field)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_bytes(path: str | os.PathLike, *, what: str,
                    error: type[RagsimInputError] = RagsimInputError,
                    field: str | None = None, max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (``what`` names the kind of file in
    the refusal: "configuration", "profile")."""
    with open_user_file(path, error=error, field=field) as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"cannot read: {exc.strerror or exc}", file=str(path),
                        field=field) from None
    if len(data) > max_bytes:
        raise error(f"is larger than {max_bytes // 2**20} MiB, more than any {what} ragsim "
                    "reads: is it the right file?", file=str(path), field=field)
    return data


def read_user_text(path: str | os.PathLike, *, what: str,
                   error: type[RagsimInputError] = RagsimInputError, field: str | None = None,
                   max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """:func:`read_user_bytes` decoded as UTF-8 (bytes that are not are one line too)."""
    data = read_user_bytes(path, what=what, error=error, field=field, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"not valid UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})",
                    file=str(path), field=field) from None


def parse_json(text: str | bytes, *, source: str,
               error: type[RagsimInputError] = RagsimInputError, row: int | None = None,
               field: str | None = None) -> object:
    """``json.loads``, every failure one line naming the file (and row): invalid JSON, and
    JSON nested deeper than Python's parser recurses."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON: {exc}", file=source, row=row, field=field) from None
    except RecursionError:
        raise error("nested too deeply to read (thousands of levels of arrays or objects)",
                    file=source, row=row, field=field) from None


def is_regular_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a regular file (following links), without opening it."""
    try:
        return stat.S_ISREG(Path(path).stat().st_mode)
    except OSError:
        return False


def parse_toml(text: str, *, source: str,
               error: type[RagsimInputError] = RagsimInputError) -> dict:
    """``tomllib.loads``, every failure one line naming the file (nesting too, as for JSON)."""
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"not valid TOML: {exc}", file=source) from None
    except RecursionError:
        raise error("not valid TOML here: nested too deeply to read", file=source) from None


def read_user_toml(path: str | os.PathLike, *, what: str,
                   error: type[RagsimInputError] = RagsimInputError) -> dict:
    """A TOML document from a regular file of bounded size (:func:`read_user_text`)."""
    return parse_toml(read_user_text(path, what=what, error=error), source=str(path),
                      error=error)
