"""Errors for bad input that name the file, the row and the field.

Users feed ragsim traces, profiles and configurations they wrote themselves; a message that says
*where* the problem is saves them a search through a million-row file.
"""

from __future__ import annotations


class RagsimInputError(ValueError):
    """Malformed user input (trace, profile, configuration, command-line value)."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        row: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.row = row
        self.field = field
        self.detail = message
        where = []
        if file is not None:
            where.append(str(file))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message)


class TraceError(RagsimInputError):
    """A trace file that does not follow the trace format."""


class ProfileError(RagsimInputError):
    """A cost table / profile that does not follow the profile format."""


class ConfigError(RagsimInputError):
    """A simulation configuration (TOML file or flags) that cannot be used."""


class MissingExtraError(RagsimInputError):
    """A command needs an optional extra (``ragsim[profile]``, ``ragsim[corpus]``) that is not
    installed. A usage error like any other (exit code 2): the fix is an install command, which
    the message names, never a traceback."""

    def __init__(self, message: str, *, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(message)
