"""Input of the live index: a batch of documents (JSONL file or the JSON of ``POST /documents``)
or of ids to delete, checked record by record. A batch is all or nothing: the first bad record
(malformed line, missing field, wrong type, oversized document, id repeated within the batch)
raises :class:`~scalingnote.errors.DataError` naming the file (or ``request``), the line (or the
position in the request) and the field, before anything is encoded, logged or applied."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scalingnote.data.beir import _document
from scalingnote.data.jsonl import iter_jsonl, iter_text_lines
from scalingnote.data.types import Document
from scalingnote.errors import DataError

#: Largest accepted document (title + topic + content), in characters.
MAX_DOC_CHARS = 100_000
#: Longest accepted document id.
MAX_ID_CHARS = 512


def check_document(rec: Any, where: str | Path, line: int, max_chars: int = MAX_DOC_CHARS) -> Document:
    """One record ``{"_id"|"id": str, "title"?: str, "topic"?: str, "text"|"content": str}``."""
    if not isinstance(rec, dict):
        raise DataError(where, line, None, f"expected a JSON object, got {type(rec).__name__}")
    unknown = sorted(set(rec) - {"_id", "id", "title", "topic", "text", "content", "metadata"})
    if unknown:
        raise DataError(where, line, unknown[0], "unknown field (expected _id, title, topic, text)")
    doc = _document(rec, where, line)  # id present, a non-empty string; text present; all strings
    if len(doc.id) > MAX_ID_CHARS:
        raise DataError(where, line, "_id", f"{len(doc.id)} characters, more than the limit of {MAX_ID_CHARS}")
    size = len(doc.title) + len(doc.topic) + len(doc.content)
    if size > max_chars:
        raise DataError(where, line, "text", f"document of {size} characters, more than the limit of {max_chars}")
    if not doc.text.strip():
        raise DataError(where, line, "text", "empty document (no title, topic or text)")
    return doc


def _no_repeats(docs: Sequence[Document], lines: Sequence[int], where: str | Path) -> None:
    seen: dict[str, int] = {}
    for d, ln in zip(docs, lines, strict=True):
        if d.id in seen:
            raise DataError(where, ln, "_id", f"id {d.id!r} appears twice in the batch (first on line {seen[d.id]})")
        seen[d.id] = ln


def documents_from_records(records: Iterable[Any], where: str = "request", max_chars: int = MAX_DOC_CHARS, first_line: int = 0) -> list[Document]:
    """Check a batch given as JSON records (``POST /documents``: lines are 0-based positions)."""
    docs, lines = [], []
    for i, rec in enumerate(records, start=first_line):
        docs.append(check_document(rec, where, i, max_chars))
        lines.append(i)
    if not docs:
        raise DataError(where, None, "documents", "empty batch")
    _no_repeats(docs, lines, where)
    return docs


def read_documents(path: str | Path, max_chars: int = MAX_DOC_CHARS) -> list[Document]:
    """Check a JSONL batch file (BEIR corpus records); every line is checked before any is used."""
    docs, lines = [], []
    for lineno, rec in iter_jsonl(path):  # malformed JSON / non-object -> DataError(file, line)
        docs.append(check_document(rec, path, lineno, max_chars))
        lines.append(lineno)
    if not docs:
        raise DataError(path, None, None, "no documents in the file")
    _no_repeats(docs, lines, path)
    return docs


def read_ids(path: str | Path) -> list[str]:
    """Document ids to delete: a text file with one id per line (blank lines skipped)."""
    ids: list[str] = []
    for lineno, line in iter_text_lines(path):
        s = line.strip()
        if s:
            if len(s) > MAX_ID_CHARS:
                raise DataError(path, lineno, "id", f"{len(s)} characters, more than the limit of {MAX_ID_CHARS}")
            ids.append(s)
    if not ids:
        raise DataError(path, None, None, "no ids in the file")
    return list(dict.fromkeys(ids))
