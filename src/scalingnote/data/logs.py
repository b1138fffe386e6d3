"""Search logs -> one-hop training triplets (ScalingNote §4.1.1, "Data Collection").

Two log kinds, each as TSV or JSONL:

* **click log** — one impression per line: ``query_id, doc_id, position, clicked``
  (``position`` a non-negative integer, ``clicked`` 0/1; JSONL also accepts
  true/false). A (query, doc) pair may appear in several impressions; it counts
  as clicked if any impression was clicked.
* **relevance log** — ``query_id, doc_id, score`` with the score of a ranking
  model (any finite number, higher = more relevant); one score per pair.

TSV files may start with a header naming the columns (then the columns may come
in any order and extra columns are ignored); without a header the columns are in
the order above. JSONL records are objects with those keys. The format is chosen
by extension (``.jsonl``/``.json`` vs anything else = TSV). Every bad record
raises :class:`~scalingnote.errors.DataError` naming the file, the line and the
field, including ids unknown to the given query / corpus id sets.

Builders (paper §4.1.1):

* :func:`click_one_hop` — every clicked document is a positive; one exposed but
  never-clicked document of the same query, drawn at random (seeded), is its hard
  negative (``neg_id=None`` when the query has none).
* :func:`relevance_one_hop` — the top-scored document is the positive; the hard
  negative is drawn at random from ranks ``K+1..T`` (1-based) after skipping the
  top ``K`` to avoid false negatives (``neg_id=None`` when fewer than ``K+1``
  documents were scored).

Random draws use one RNG per (seed, source, query), so results do not depend on
the order of the log lines.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalingnote.data.jsonl import iter_jsonl, iter_text_lines
from scalingnote.data.types import Triplet
from scalingnote.errors import DataError
from scalingnote.utils.io import atomic_write

CLICK_COLUMNS = ("query_id", "doc_id", "position", "clicked")
RELEVANCE_COLUMNS = ("query_id", "doc_id", "score")
_ALIASES = {
    "query-id": "query_id",
    "qid": "query_id",
    "corpus-id": "doc_id",
    "docid": "doc_id",
    "doc-id": "doc_id",
    "pid": "doc_id",
}


@dataclass(frozen=True, slots=True)
class ClickRecord:
    query_id: str
    doc_id: str
    position: int
    clicked: bool
    line: int = 0


@dataclass(frozen=True, slots=True)
class RelevanceRecord:
    query_id: str
    doc_id: str
    score: float
    line: int = 0


def _is_jsonl(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".jsonl") or name.endswith(".json")


def _iter_fields(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any], bool]]:
    """Yield ``(line, {column: raw value}, from_json)`` for each non-blank line."""
    if _is_jsonl(path):
        for lineno, rec in iter_jsonl(path):
            rec = {_ALIASES.get(k, k): v for k, v in rec.items()}
            for c in columns:
                if c not in rec:
                    raise DataError(path, lineno, c, "missing required field")
            yield lineno, rec, True
        return
    header: list[str] | None = None
    for lineno, raw in iter_text_lines(path):  # invalid UTF-8 -> DataError naming the line
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("\t")]
        if header is None and lineno == 1:
            names = [_ALIASES.get(p.lower(), p.lower()) for p in parts]
            if names[0] == "query_id" or set(columns) <= set(names):
                missing = [c for c in columns if c not in names]
                if missing:
                    raise DataError(
                        path, lineno, missing[0], f"header lacks column {missing[0]!r} (need {list(columns)})"
                    )
                header = names
                continue
        if header is not None:
            if len(parts) != len(header):
                raise DataError(
                    path,
                    lineno,
                    None,
                    f"expected {len(header)} tab-separated columns (as in the header), got {len(parts)}",
                )
            yield lineno, dict(zip(header, parts, strict=True)), False
        else:
            if len(parts) != len(columns):
                raise DataError(
                    path,
                    lineno,
                    None,
                    f"expected {len(columns)} tab-separated columns ({', '.join(columns)}), got {len(parts)}",
                )
            yield lineno, dict(zip(columns, parts, strict=True)), False


def _id(rec: dict, key: str, path: Path, lineno: int, known: Container[str] | None, what: str) -> str:
    v = rec[key]
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str):
        raise DataError(path, lineno, key, f"expected a string id, got {type(v).__name__} {v!r:.60}")
    v = v.strip()
    if not v:
        raise DataError(path, lineno, key, "empty id")
    if known is not None and v not in known:
        raise DataError(path, lineno, key, f"unknown {what} id {v!r} (not in the {what} file)")
    return v


def _position(v: Any, path: Path, lineno: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise DataError(path, lineno, "position", f"expected a non-negative integer, got {v!r:.60}")
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise DataError(path, lineno, "position", f"expected a non-negative integer, got {v!r:.60}") from None
    if v < 0:
        raise DataError(path, lineno, "position", f"expected a non-negative integer, got {v}")
    return v


def _clicked(v: Any, path: Path, lineno: int) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip() in ("0", "1"):
        return v.strip() == "1"
    raise DataError(path, lineno, "clicked", f"expected 0 or 1, got {v!r:.60}")


def _score(v: Any, path: Path, lineno: int) -> float:
    if isinstance(v, bool):
        raise DataError(path, lineno, "score", f"expected a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise DataError(path, lineno, "score", f"expected a number, got {v!r:.60}") from None
    if not math.isfinite(f):
        raise DataError(path, lineno, "score", f"expected a finite number, got {v!r}")
    return f


def iter_click_log(
    path: str | Path, query_ids: Container[str] | None = None, doc_ids: Container[str] | None = None
) -> Iterator[ClickRecord]:
    """Stream and validate a click log (see the module docstring)."""
    path = Path(path)
    for lineno, rec, _ in _iter_fields(path, CLICK_COLUMNS):
        qid = _id(rec, "query_id", path, lineno, query_ids, "query")
        did = _id(rec, "doc_id", path, lineno, doc_ids, "document")
        yield ClickRecord(
            qid, did, _position(rec["position"], path, lineno), _clicked(rec["clicked"], path, lineno), lineno
        )


def iter_relevance_log(
    path: str | Path, query_ids: Container[str] | None = None, doc_ids: Container[str] | None = None
) -> Iterator[RelevanceRecord]:
    """Stream and validate a relevance-score log. A repeated (query, doc) pair is an error."""
    path = Path(path)
    seen: dict[tuple[str, str], int] = {}
    for lineno, rec, _ in _iter_fields(path, RELEVANCE_COLUMNS):
        qid = _id(rec, "query_id", path, lineno, query_ids, "query")
        did = _id(rec, "doc_id", path, lineno, doc_ids, "document")
        score = _score(rec["score"], path, lineno)
        if (qid, did) in seen:
            raise DataError(
                path, lineno, "doc_id", f"second score for ({qid!r}, {did!r}) (first on line {seen[qid, did]})"
            )
        seen[qid, did] = lineno
        yield RelevanceRecord(qid, did, score, lineno)


def read_click_log(path, query_ids=None, doc_ids=None) -> list[ClickRecord]:
    return list(iter_click_log(path, query_ids, doc_ids))


def read_relevance_log(path, query_ids=None, doc_ids=None) -> list[RelevanceRecord]:
    return list(iter_relevance_log(path, query_ids, doc_ids))


def write_click_log(path: str | Path, records) -> None:
    """Write click records as TSV (with header) or JSONL, atomically."""
    _write_log(Path(path), CLICK_COLUMNS, ((r.query_id, r.doc_id, r.position, int(r.clicked)) for r in records))


def write_relevance_log(path: str | Path, records) -> None:
    _write_log(Path(path), RELEVANCE_COLUMNS, ((r.query_id, r.doc_id, round(r.score, 6)) for r in records))


def _write_log(path: Path, columns, rows) -> None:
    with atomic_write(path) as fh:
        if _is_jsonl(path):
            for row in rows:
                fh.write(json.dumps(dict(zip(columns, row, strict=True)), ensure_ascii=False) + "\n")
        else:
            fh.write("\t".join(columns) + "\n")
            for row in rows:
                fh.write("\t".join(str(x) for x in row) + "\n")


# --------------------------------------------------------------------------- builders


@dataclass
class QueryClicks:
    """Aggregated impressions of one query: clicked docs (by best position) and
    exposed-but-never-clicked docs."""

    positives: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)


def aggregate_clicks(records) -> dict[str, QueryClicks]:
    best: dict[str, dict[str, tuple[int, bool]]] = {}
    for r in records:
        d = best.setdefault(r.query_id, {})
        pos, clicked = d.get(r.doc_id, (r.position, False))
        d[r.doc_id] = (min(pos, r.position), clicked or r.clicked)
    out: dict[str, QueryClicks] = {}
    for qid, docs in best.items():
        ranked = sorted(docs.items(), key=lambda x: (x[1][0], x[0]))
        out[qid] = QueryClicks([d for d, (_, c) in ranked if c], [d for d, (_, c) in ranked if not c])
    return out


def _rng(seed: int, source: str, qid: str) -> random.Random:
    return random.Random(f"{seed}\x1f{source}\x1f{qid}")


def click_one_hop(
    clicks: Mapping[str, QueryClicks], seed: int = 0, source: str = "click_one_hop"
) -> dict[str, list[Triplet]]:
    """Clicked doc = positive; a random exposed-not-clicked doc = hard negative (§4.1.1)."""
    out: dict[str, list[Triplet]] = {}
    for qid in sorted(clicks):
        qc = clicks[qid]
        if not qc.positives:
            continue
        rng = _rng(seed, source, qid)
        out[qid] = [Triplet(qid, p, rng.choice(qc.negatives) if qc.negatives else None, source) for p in qc.positives]
    return out


def rank_relevance(records) -> dict[str, list[str]]:
    """query id -> doc ids by descending score (ties by doc id)."""
    by_q: dict[str, list[tuple[float, str]]] = {}
    for r in records:
        by_q.setdefault(r.query_id, []).append((r.score, r.doc_id))
    return {q: [d for _, d in sorted(v, key=lambda x: (-x[0], x[1]))] for q, v in by_q.items()}


def relevance_one_hop(
    ranked: Mapping[str, list[str]],
    skip_top_k: int = 5,
    top_t: int = 30,
    seed: int = 0,
    source: str = "relevance_one_hop",
) -> dict[str, list[Triplet]]:
    """Top-1 = positive; hard negative drawn from ranks K+1..T (1-based) (§4.1.1)."""
    if skip_top_k < 1 or top_t <= skip_top_k:
        raise ValueError(f"need 1 <= skip_top_k < top_t, got K={skip_top_k}, T={top_t}")
    out: dict[str, list[Triplet]] = {}
    for qid in sorted(ranked):
        docs = ranked[qid]
        if not docs:
            continue
        pool = docs[skip_top_k:top_t]
        neg = _rng(seed, source, qid).choice(pool) if pool else None
        out[qid] = [Triplet(qid, docs[0], neg, source)]
    return out
