"""Streaming JSONL reading with errors that name file, line and field."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalingnote.errors import DataError


def open_text(path: str | Path):
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, None, "file not found")
    if path.is_dir():
        raise DataError(path, None, None, "expected a file, found a directory")
    return open(path, encoding="utf-8", errors="strict")


def iter_text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` of a UTF-8 text file (universal newlines, line ends kept).

    Invalid UTF-8 raises :class:`DataError` naming the line (decoding with
    ``surrogateescape`` keeps the line count exact up to the bad byte)."""
    with open_text(path) as _probe:  # existence / directory checks with clear messages
        pass
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as e:
                bad = ord(line[e.start]) - 0xDC00 if 0xDC80 <= ord(line[e.start]) <= 0xDCFF else ord(line[e.start])
                raise DataError(
                    path, lineno, None, f"not valid UTF-8 (byte 0x{bad:02x} at column {e.start + 1})"
                ) from None
            yield lineno, line


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for each non-blank line; each record must be a JSON object."""
    with open_text(path) as _probe:  # existence / directory checks with clear messages
        pass
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(path, lineno, None, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, lineno, None, f"malformed JSON: {e.msg} at column {e.colno}") from None
            if not isinstance(rec, dict):
                raise DataError(path, lineno, None, f"expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def get_str(
    rec: dict[str, Any],
    key: str,
    path: str | Path,
    lineno: int,
    *,
    required: bool = True,
    allow_empty: bool = True,
    aliases: tuple[str, ...] = (),
) -> str:
    """Fetch a string field, checking presence and type."""
    for k in (key, *aliases):
        if k in rec:
            key = k
            break
    else:
        if required:
            raise DataError(path, lineno, key, "missing required field")
        return ""
    val = rec[key]
    if val is None and not required:
        return ""
    if not isinstance(val, str):
        raise DataError(path, lineno, key, f"expected a string, got {type(val).__name__} {val!r:.60}")
    if not allow_empty and not val.strip():
        raise DataError(path, lineno, key, "must not be empty")
    return val


class SkipCounter:
    """Counts skipped records and emits one warning with the count at the end."""

    def __init__(self, path: str | Path, what: str):
        self.path, self.what, self.count = str(path), what, 0
        self.first: str | None = None

    def skip(self, err: DataError) -> None:
        self.count += 1
        if self.first is None:
            self.first = str(err)

    def report(self, *, stacklevel: int = 3) -> None:
        """``stacklevel`` as for :func:`warnings.warn`, counted from here (3: the caller of the reader)."""
        if self.count:
            warnings.warn(
                f"{self.path}: skipped {self.count} invalid {self.what} (first: {self.first})",
                stacklevel=stacklevel,
            )
