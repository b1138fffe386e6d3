"""Readers and writers for the BEIR layout (JSONL records and TSV qrels).

Stages read documents through :mod:`scalingnote.data.corpus` (any registered corpus format,
a BEIR directory, :func:`~scalingnote.data.corpus.load_beir`); :func:`iter_corpus` here is its
``jsonl`` reader.

A BEIR directory holds ``corpus.jsonl`` (``_id``, ``title``, ``text``, optional
``topic``), ``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv``
(``query-id<TAB>corpus-id<TAB>score`` with a header line). BEIR ``text`` maps to
:attr:`Document.content`.

Readers stream (``iter_*``) or load into dicts (``load_*``). Every bad record
raises :class:`~scalingnote.errors.DataError` naming the file, line and field.
With ``on_invalid="skip"`` invalid records (empty text, wrong types, missing
fields) are skipped instead and one warning reports the count; malformed JSON
and duplicate ids are always errors.

Documents whose title and text are both empty are skipped with one warning
(count + first line) by default (``on_empty="skip"``): real corpora contain them
(KUAKE-QTR has one) and they cannot be retrieved meaningfully. A qrel that points
at a skipped document is then reported as an unknown id. ``on_empty="error"``
makes them an error.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from scalingnote.data.jsonl import SkipCounter, get_str, iter_jsonl, iter_text_lines
from scalingnote.data.types import Document, Qrels, Query
from scalingnote.errors import DataError
from scalingnote.utils.io import atomic_write, write_jsonl

OnInvalid = Literal["error", "skip"]
_Rec = TypeVar("_Rec", Document, Query)


def _check_id(rec: dict, path: Path | str, lineno: int) -> str:
    doc_id = get_str(rec, "_id", path, lineno, aliases=("id",), allow_empty=False)
    return doc_id.strip()


def _document(rec: dict, path: str | Path, lineno: int) -> Document:
    doc_id = _check_id(rec, path, lineno)
    title = get_str(rec, "title", path, lineno, required=False)
    topic = get_str(rec, "topic", path, lineno, required=False)
    content = get_str(rec, "text", path, lineno, required=True, aliases=("content",))
    return Document(doc_id, title, topic, content)


def _query(rec: dict, path: str | Path, lineno: int) -> Query:
    qid = _check_id(rec, path, lineno)
    return Query(qid, get_str(rec, "text", path, lineno, allow_empty=False))


def _iter_records(
    path: str | Path, on_invalid: OnInvalid, parse: Callable[[dict, str | Path, int], _Rec], what: str, what_plural: str
) -> Iterator[tuple[int, _Rec]]:
    """``(line, record)`` for each record of a BEIR JSONL file that ``parse`` accepts; a rejected
    one is raised, or skipped with ``on_invalid="skip"`` (one warning with the count at the end);
    a duplicate id is always an error."""
    seen: dict[str, int] = {}
    skipped = SkipCounter(path, what_plural)
    for lineno, rec in iter_jsonl(path):
        try:
            item = parse(rec, path, lineno)
        except DataError as e:
            if on_invalid == "skip":
                skipped.skip(e)
                continue
            raise
        if item.id in seen:
            raise DataError(
                path, lineno, "_id", f"duplicate {what} id {item.id!r} (first seen on line {seen[item.id]})"
            )
        seen[item.id] = lineno
        yield lineno, item
    skipped.report(stacklevel=4)  # the caller of iter_corpus / iter_queries


def iter_corpus(path: str | Path, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> Iterator[Document]:
    """Stream documents from a BEIR ``corpus.jsonl``. Duplicate ids are an error."""
    empty = SkipCounter(path, "empty documents (title and text both empty)")
    for lineno, doc in _iter_records(path, on_invalid, _document, "document", "documents"):
        if not (doc.title.strip() or doc.content.strip()):
            err = DataError(path, lineno, "text", "empty document: both 'title' and 'text' are empty")
            if on_empty == "skip":
                empty.skip(err)
                continue
            raise err
        yield doc
    empty.report()


def iter_queries(path: str | Path, on_invalid: OnInvalid = "error") -> Iterator[Query]:
    """Stream queries from a BEIR ``queries.jsonl``. Duplicate ids are an error."""
    for _, query in _iter_records(path, on_invalid, _query, "query", "queries"):
        yield query


def load_corpus(path: str | Path, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> dict[str, Document]:
    return {d.id: d for d in iter_corpus(path, on_invalid, on_empty)}


def load_queries(path: str | Path, on_invalid: OnInvalid = "error") -> dict[str, Query]:
    return {q.id: q for q in iter_queries(path, on_invalid)}


def load_qrels(
    path: str | Path,
    query_ids: Iterable[str] | None = None,
    doc_ids: Iterable[str] | None = None,
) -> Qrels:
    """Read ``query-id<TAB>corpus-id<TAB>score`` (header optional). With ``query_ids`` /
    ``doc_ids`` given, a row naming an unknown id is an error."""
    qset = set(query_ids) if query_ids is not None else None
    dset = set(doc_ids) if doc_ids is not None else None
    qrels: Qrels = {}
    seen: dict[tuple[str, str], int] = {}
    for lineno, raw in iter_text_lines(path):  # invalid UTF-8 -> DataError naming the line
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        parts = line.split("\t") if "\t" in line else line.split()
        if lineno == 1 and parts and parts[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue
        if len(parts) == 4:  # TREC qrels: qid iter docid rel
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3:
            raise DataError(
                path, lineno, None, f"expected 3 tab-separated columns (query-id, corpus-id, score), got {len(parts)}"
            )
        qid, did, score_s = (p.strip() for p in parts)
        if not qid:
            raise DataError(path, lineno, "query-id", "empty id")
        if not did:
            raise DataError(path, lineno, "corpus-id", "empty id")
        try:
            score_f = float(score_s)
        except ValueError:
            raise DataError(path, lineno, "score", f"expected an integer grade, got {score_s!r}") from None
        if not math.isfinite(score_f) or score_f != int(score_f):
            raise DataError(path, lineno, "score", f"expected an integer grade, got {score_s!r}")
        if qset is not None and qid not in qset:
            raise DataError(path, lineno, "query-id", f"unknown query id {qid!r} (not in queries file)")
        if dset is not None and did not in dset:
            raise DataError(path, lineno, "corpus-id", f"unknown document id {did!r} (not in corpus file)")
        if (qid, did) in seen:
            raise DataError(
                path,
                lineno,
                "corpus-id",
                f"duplicate judgement for ({qid!r}, {did!r}) (first on line {seen[qid, did]})",
            )
        seen[qid, did] = lineno
        qrels.setdefault(qid, {})[did] = int(score_f)
    return qrels


@dataclass
class BeirDataset:
    """A loaded BEIR directory: the corpus, the queries of one split and its qrels."""

    root: Path
    split: str
    corpus: dict[str, Document]
    queries: dict[str, Query]
    qrels: Qrels
    all_queries: dict[str, Query] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.root.name


def qrels_path(root: str | Path, split: str, graded: bool = False) -> Path:
    root = Path(root)
    sub = "qrels_graded" if graded else "qrels"
    return root / sub / f"{split}.tsv"


def write_corpus(path: str | Path, docs: Iterable[Document]) -> int:
    return write_jsonl(path, (d.to_beir() for d in docs))


def write_queries(path: str | Path, queries: Iterable[Query]) -> int:
    return write_jsonl(path, (q.to_beir() for q in queries))


def write_qrels(path: str | Path, qrels: Qrels) -> None:
    with atomic_write(path) as fh:
        w = csv.writer(fh, delimiter="\t", lineterminator="\n")
        w.writerow(["query-id", "corpus-id", "score"])
        for qid, docs in qrels.items():
            for did, grade in docs.items():
                w.writerow([qid, did, int(grade)])


def write_beir(
    root: str | Path, corpus: Iterable[Document], queries: Iterable[Query], qrels_by_split: dict[str, Qrels]
) -> None:
    root = Path(root)
    write_corpus(root / "corpus.jsonl", corpus)
    write_queries(root / "queries.jsonl", queries)
    for split, qrels in qrels_by_split.items():
        write_qrels(root / "qrels" / f"{split}.tsv", qrels)
