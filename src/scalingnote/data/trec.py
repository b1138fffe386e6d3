"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document."""

from __future__ import annotations

from pathlib import Path

from scalingnote.data.jsonl import iter_text_lines
from scalingnote.data.types import Run
from scalingnote.errors import DataError
from scalingnote.utils.io import atomic_write


def read_run(path: str | Path) -> Run:
    """Read a TREC run. Errors name the file, line and column."""
    run: Run = {}
    for lineno, raw in iter_text_lines(path):  # invalid UTF-8 -> DataError naming the line
        if not raw.strip():
            continue
        parts = raw.split()
        if len(parts) != 6:
            raise DataError(path, lineno, None, f"expected 6 columns 'qid Q0 docid rank score tag', got {len(parts)}")
        qid, _, did, rank_s, score_s, _tag = parts
        try:
            int(rank_s)
        except ValueError:
            raise DataError(path, lineno, "rank", f"expected an integer, got {rank_s!r}") from None
        try:
            score = float(score_s)
        except ValueError:
            raise DataError(path, lineno, "score", f"expected a number, got {score_s!r}") from None
        if score != score or score in (float("inf"), float("-inf")):
            raise DataError(path, lineno, "score", f"score must be finite, got {score_s!r}")
        docs = run.setdefault(qid, {})
        if did in docs:
            raise DataError(path, lineno, "docid", f"document {did!r} listed twice for query {qid!r}")
        docs[did] = score
    return run


def write_run(path: str | Path, run: Run, tag: str = "scalingnote", k: int | None = None) -> None:
    """Write a TREC run atomically, documents sorted by descending score (ties by doc id)."""
    with atomic_write(path) as fh:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda x: (-x[1], x[0]))
            if k is not None:
                ranked = ranked[:k]
            for rank, (did, score) in enumerate(ranked, start=1):
                fh.write(f"{qid} Q0 {did} {rank} {score:.9g} {tag}\n")
