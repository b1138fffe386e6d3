"""Input of the live index: a batch of documents (JSONL file or the JSON of ``POST /documents``)
or of ids to delete, checked record by record. A batch is all or nothing: nothing is encoded,
logged or applied unless every record passes.

* ``POST /documents`` (:func:`documents_from_records`): every problem of every record is
  collected and raised together as one :class:`BatchError` (a :class:`~scalingnote.errors.DataError`
  whose ``problems`` name each document's position, ``_id``, field and reason).
* A JSONL file (:func:`read_documents`): the first bad record raises a ``DataError`` naming the
  file, the line and the field.

Ids are kept exactly as sent and matched exactly (add, replace, ``DELETE``). An id must be a
non-empty string of at most :data:`MAX_ID_CHARS` characters, valid Unicode (no lone surrogate),
without control characters and without leading or trailing whitespace: ``" padded id "`` is
refused rather than stored under another id than the one sent (:func:`id_problem`, which
``DELETE /documents/{id}`` applies too). Text fields must be strings of valid Unicode (a JSON
``"\\ud800"`` escape is valid JSON but no tokenizer can encode it).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalingnote.data.jsonl import iter_jsonl, iter_text_lines
from scalingnote.data.types import Document
from scalingnote.errors import DataError

#: Largest accepted document (title + topic + content), in characters.
MAX_DOC_CHARS = 100_000
#: Longest accepted document id.
MAX_ID_CHARS = 512
#: Fields a document record may carry (``metadata`` is accepted and ignored).
FIELDS = ("_id", "id", "title", "topic", "text", "content", "metadata")
#: Problems listed in one :class:`BatchError` message (all of them stay in ``problems``).
MAX_LISTED = 20


@dataclass(frozen=True)
class Problem:
    """Why document ``index`` (0-based position in the batch; ``line`` of a file) was refused."""

    index: int
    doc_id: str | None  #: the record's ``_id`` when it is a string (None: missing or not a string)
    field: str  #: the record's field, or ``document`` for the record as a whole
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "_id": self.doc_id, "field": self.field, "message": self.reason}

    def __str__(self) -> str:
        who = f"document {self.index}" + (f" (_id {self.doc_id!r})" if self.doc_id is not None else "")
        return f"{who}, field '{self.field}': {self.reason}"


class BatchError(DataError):
    """A refused batch: ``problems`` lists every document and field that refused it."""

    def __init__(self, where: str | Path, problems: Sequence[Problem], n_documents: int):
        self.problems = list(problems)
        bad = len({p.index for p in self.problems})
        listed = "; ".join(str(p) for p in self.problems[:MAX_LISTED])
        more = f"; ... and {len(self.problems) - MAX_LISTED} more" if len(self.problems) > MAX_LISTED else ""
        first = self.problems[0]
        super().__init__(
            where, first.index, first.field, f"{bad} of {n_documents} documents refused, none applied: {listed}{more}"
        )


def _unicode_problem(s: str) -> str | None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"not valid Unicode: lone surrogate U+{ord(s[e.start]):04X} at character {e.start}"
    return None


def id_problem(doc_id: str) -> str | None:
    """Why ``doc_id`` cannot be a document id (None: it can); see the module docstring."""
    if not doc_id.strip():
        return "must not be empty"
    bad = _unicode_problem(doc_id)
    if bad:
        return bad
    if len(doc_id) > MAX_ID_CHARS:
        return f"{len(doc_id)} characters, more than the limit of {MAX_ID_CHARS}"
    if doc_id != doc_id.strip():
        return (
            f"leading or trailing whitespace ({doc_id!r}): ids are stored and matched exactly as sent; "
            f"send {doc_id.strip()!r}"
        )
    ctrl = next((i for i, c in enumerate(doc_id) if unicodedata.category(c) == "Cc"), None)
    if ctrl is not None:
        return f"control character U+{ord(doc_id[ctrl]):04X} at character {ctrl}"
    return None


def _field_name(key: Any) -> str:
    """A field name safe to echo (a key may hold a lone surrogate)."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")[:100]


def _string(rec: dict, keys: tuple[str, ...], required: bool, problems: list[tuple[str, str]]) -> str:
    key = next((k for k in keys if k in rec), None)
    if key is None:
        if required:
            problems.append((keys[0], "missing required field"))
        return ""
    val = rec[key]
    if val is None and not required:
        return ""
    if not isinstance(val, str):
        problems.append((key, f"expected a string, got {type(val).__name__}"))
        return ""
    bad = _unicode_problem(val)
    if bad:
        problems.append((key, bad))
        return ""
    return val


def record_problems(rec: Any, max_chars: int = MAX_DOC_CHARS) -> tuple[Document | None, list[tuple[str, str]]]:
    """The document of ``rec`` and every ``(field, reason)`` that refuses it (then no document)."""
    if not isinstance(rec, dict):
        return None, [("document", f"expected a JSON object, got {type(rec).__name__}")]
    problems: list[tuple[str, str]] = []
    for k in rec:
        if k not in FIELDS:
            problems.append((_field_name(k), "unknown field (expected _id, title, topic, text)"))
    if "_id" in rec and "id" in rec:
        problems.append(("id", "both _id and id given; send one"))
    id_key = "_id" if "_id" in rec or "id" not in rec else "id"
    doc_id = rec.get(id_key)
    if id_key not in rec:
        problems.append(("_id", "missing required field"))
    elif not isinstance(doc_id, str):
        problems.append((id_key, f"expected a string, got {type(doc_id).__name__}"))
    elif (why := id_problem(doc_id)) is not None:
        problems.append((id_key, why))
    title = _string(rec, ("title",), False, problems)
    topic = _string(rec, ("topic",), False, problems)
    if "text" in rec and "content" in rec:
        problems.append(("content", "both text and content given; send one"))
    content = _string(rec, ("text", "content"), True, problems)
    size = len(title) + len(topic) + len(content)
    if size > max_chars:
        problems.append(("text", f"document of {size} characters, more than the limit of {max_chars}"))
    elif not problems and not (title + topic + content).strip():
        problems.append(("text", "empty document (no title, topic or text)"))
    if problems:
        return None, problems
    assert isinstance(doc_id, str)  # a missing or non-string id is a problem above
    return Document(doc_id, title, topic, content), problems


def _id_of(rec: Any) -> str | None:
    if not isinstance(rec, dict):
        return None
    v = rec.get("_id", rec.get("id"))
    return _field_name(v) if isinstance(v, str) else None


def check_document(rec: Any, where: str | Path, line: int, max_chars: int = MAX_DOC_CHARS) -> Document:
    """One record ``{"_id"|"id": str, "title"?: str, "topic"?: str, "text"|"content": str}``;
    the first problem raises :class:`DataError` naming ``where``, ``line`` and the field."""
    doc, problems = record_problems(rec, max_chars)
    if problems:
        field, reason = problems[0]
        raise DataError(where, line, field, reason)
    assert doc is not None  # record_problems gives a document whenever it finds no problem
    return doc


def _repeats(docs: Sequence[Document | None], positions: Sequence[int], records: Sequence[Any]) -> list[Problem]:
    seen: dict[str, int] = {}
    out = []
    for d, pos in zip(docs, positions, strict=True):
        if d is None:
            continue
        if d.id in seen:
            out.append(
                Problem(
                    pos,
                    _id_of(records[pos - positions[0]]),
                    "_id",
                    f"id {d.id!r} appears twice in the batch (first at document {seen[d.id]})",
                )
            )
        else:
            seen[d.id] = pos
    return out


def documents_from_records(
    records: Iterable[Any], where: str = "request", max_chars: int = MAX_DOC_CHARS, first_line: int = 0
) -> list[Document]:
    """Check a batch given as JSON records (``POST /documents``: positions are 0-based). Every
    problem of every record is collected; any problem raises one :class:`BatchError`."""
    records = list(records)
    if not records:
        raise BatchError(where, [Problem(first_line, None, "documents", "empty batch")], 0)
    docs: list[Document | None] = []
    problems: list[Problem] = []
    positions = list(range(first_line, first_line + len(records)))
    for pos, rec in zip(positions, records, strict=True):
        doc, probs = record_problems(rec, max_chars)
        docs.append(doc)
        problems.extend(Problem(pos, _id_of(rec), f, r) for f, r in probs)
    problems.extend(_repeats(docs, positions, records))
    if problems:
        problems.sort(key=lambda p: p.index)
        raise BatchError(where, problems, len(records))
    return [d for d in docs if d is not None]


def read_documents(path: str | Path, max_chars: int = MAX_DOC_CHARS) -> list[Document]:
    """Check a JSONL batch file (BEIR corpus records); every line is checked before any is used."""
    docs, lines = [], []
    for lineno, rec in iter_jsonl(path):  # malformed JSON / non-object -> DataError(file, line)
        docs.append(check_document(rec, path, lineno, max_chars))
        lines.append(lineno)
    if not docs:
        raise DataError(path, None, None, "no documents in the file")
    seen: dict[str, int] = {}
    for d, ln in zip(docs, lines, strict=True):
        if d.id in seen:
            raise DataError(path, ln, "_id", f"id {d.id!r} appears twice in the batch (first on line {seen[d.id]})")
        seen[d.id] = ln
    return docs


def read_ids(path: str | Path) -> list[str]:
    """Document ids to delete: a text file with one id per line (blank lines skipped; a line's
    surrounding whitespace is not part of the id, which may not carry any)."""
    ids: list[str] = []
    for lineno, line in iter_text_lines(path):
        s = line.strip()
        if s:
            why = id_problem(s)
            if why:
                raise DataError(path, lineno, "id", why)
            ids.append(s)
    if not ids:
        raise DataError(path, None, None, "no ids in the file")
    return list(dict.fromkeys(ids))
