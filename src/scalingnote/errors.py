"""Project-wide exception types.

Every error caused by user input derives from :class:`ScalingNoteError`; the CLI
prints its message (no traceback) and exits with status 2.
"""

from __future__ import annotations

from pathlib import Path


class ScalingNoteError(Exception):
    """Base class for errors caused by user input or configuration."""


class DataError(ScalingNoteError, ValueError):
    """A bad record in an input file; the message names the file, line and field.

    Attributes are kept so callers can react programmatically.
    """

    def __init__(self, path: str | Path | None, line: int | None, field: str | None, message: str):
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        where = []
        if self.path is not None:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(DataError):
    """A bad configuration value (file, key and reason)."""
