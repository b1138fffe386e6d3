"""Triplet JSONL: ``{"query_id", "pos_id", "neg_id", "source"}`` per line (``neg_id`` may be null)."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from pathlib import Path

from scalingnote.data.jsonl import get_str, iter_jsonl
from scalingnote.data.types import Triplet
from scalingnote.errors import DataError
from scalingnote.utils.io import write_jsonl


def iter_triplets(
    path: str | Path,
    query_ids: Container[str] | None = None,
    doc_ids: Container[str] | None = None,
) -> Iterator[Triplet]:
    """Stream triplets, validating types and (optionally) that ids exist."""
    for lineno, rec in iter_jsonl(path):
        qid = get_str(rec, "query_id", path, lineno, allow_empty=False)
        pos = get_str(rec, "pos_id", path, lineno, allow_empty=False)
        neg = rec.get("neg_id")
        if neg is not None and (not isinstance(neg, str) or not neg.strip()):
            raise DataError(path, lineno, "neg_id", f"expected a non-empty string or null, got {neg!r}")
        source = get_str(rec, "source", path, lineno, required=False) or "unknown"
        if query_ids is not None and qid not in query_ids:
            raise DataError(path, lineno, "query_id", f"unknown query id {qid!r}")
        if doc_ids is not None:
            if pos not in doc_ids:
                raise DataError(path, lineno, "pos_id", f"unknown document id {pos!r}")
            if neg is not None and neg not in doc_ids:
                raise DataError(path, lineno, "neg_id", f"unknown document id {neg!r}")
        if neg is not None and neg == pos:
            raise DataError(path, lineno, "neg_id", "hard negative equals the positive")
        yield Triplet(qid, pos, neg, source)


def load_triplets(path: str | Path, query_ids=None, doc_ids=None) -> list[Triplet]:
    return list(iter_triplets(path, query_ids, doc_ids))


def write_triplets(path: str | Path, triplets: Iterable[Triplet]) -> int:
    return write_jsonl(path, (t.to_json() for t in triplets))
