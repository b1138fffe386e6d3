"""The checks every corpus reader's documents pass (:mod:`scalingnote.data.corpus`): invalid
records raise or are skipped and counted, duplicate ids raise, empty documents are skipped with one
warning; a user's reader is wrapped so that its documents are checked like the built-in ones."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Literal

from scalingnote.data.jsonl import SkipCounter
from scalingnote.data.types import Document
from scalingnote.errors import DataError

OnInvalid = Literal["error", "skip"]
#: ``read(path, on_invalid=..., on_empty=...)``: the documents of one file (or shard directory).
Reader = Callable[..., Iterable[Document]]


class DocumentScreen:
    """The checks every reader's documents pass, in one place: an invalid record raises, or is
    skipped and counted per file under ``on_invalid="skip"``; a duplicate id always raises; a
    document whose title and text are both empty is skipped with one warning at the end, or
    raises under ``on_empty="error"``. Errors name the file, the record (``"row 5"``,
    ``"document 5"``) and the field."""

    def __init__(self, on_invalid: OnInvalid, on_empty: OnInvalid):
        self.on_invalid, self.on_empty = on_invalid, on_empty
        self.seen: dict[str, str] = {}
        self.invalid: dict[str, SkipCounter] = {}
        self.n_empty, self.first_empty = 0, ""

    def admit(
        self, f: Path, where: str, make: Callable[[], Document], id_field: str = "_id", text_field: str = "text"
    ) -> Document | None:
        """The document ``make()`` builds, or None when it is skipped."""
        try:
            doc = make()
        except DataError as e:
            if self.on_invalid != "skip":
                raise
            self.invalid.setdefault(str(f), SkipCounter(f, "documents")).skip(e)
            return None
        if doc.id in self.seen:
            raise DataError(
                f, None, id_field, f"{where}: duplicate document id {doc.id!r} (first seen in {self.seen[doc.id]})"
            )
        self.seen[doc.id] = f"{f}, {where}"
        if doc.title.strip() or doc.content.strip():
            return doc
        if self.on_empty == "error":
            raise DataError(f, None, text_field, f"{where}: empty document: both 'title' and 'text' are empty")
        self.n_empty, self.first_empty = self.n_empty + 1, self.first_empty or f"{f}, {where}"
        return None

    def report(self) -> None:
        for counter in self.invalid.values():
            counter.report(stacklevel=4)  # the caller of iter_corpus
        if self.n_empty:
            warnings.warn(
                f"skipped {self.n_empty} empty documents (title and text both empty; first: {self.first_empty})",
                stacklevel=3,
            )


def checked_reader(read: Callable[[Path], Iterable[Document]], name: str) -> Reader:
    """``read`` (a user's reader) with the checks the built-in readers make (:class:`DocumentScreen`)."""

    def read_checked(path: Path, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> Iterator[Document]:
        screen = DocumentScreen(on_invalid, on_empty)
        for n, item in enumerate(read(path), start=1):
            doc = screen.admit(path, f"document {n}", partial(check_document, item, path, n, name))
            if doc is not None:
                yield doc
        screen.report()

    return read_checked


def check_document(doc: object, path: Path, n: int, name: str) -> Document:
    if not isinstance(doc, Document):
        raise DataError(
            path, None, None, f"document {n}: the {name!r} reader gave a {type(doc).__name__}, not a Document"
        )
    for fld, key in (("id", "_id"), ("title", "title"), ("topic", "topic"), ("content", "text")):
        v = getattr(doc, fld)
        if not isinstance(v, str):
            raise DataError(path, None, key, f"document {n}: expected a string, got {type(v).__name__} {v!r:.60}")
    if not doc.id.strip():
        raise DataError(path, None, "_id", f"document {n}: must not be empty")
    return doc
