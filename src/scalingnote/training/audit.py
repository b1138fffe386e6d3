"""``mining_audit.jsonl``: which mined candidates were dropped, which were kept, and why.

One line per candidate of a seeded sample of queries (``data.mining.audit_queries``): the query,
its labelled positive, the candidate (ids and text), the mining tower's score (and BM25's where
BM25 ranked it), its ranks, the weakest labelled positive's score, and the guard rule that fired
(``"kept"`` when none did); then one summary line (``{"type": "summary", ...}``). Written
atomically; ``scalingnote data audit RUN_OR_FILE`` prints it as a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data import Document
from scalingnote.data.jsonl import iter_jsonl
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.training.guard import KEPT, MinedQuery
from scalingnote.utils.io import write_jsonl

AUDIT_FILE = "mining_audit.jsonl"
TEXT_CHARS = 300  #: document text kept per line (the ids name the full documents)


def _text(doc: Document | None) -> str:
    if doc is None:
        return ""
    text = f"{doc.title} | {doc.content}" if doc.title else doc.content
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def audit_records(
    mined: Sequence[MinedQuery],
    positives: Mapping[str, Sequence[str]],
    corpus: Mapping[str, Document],
    queries: Mapping[str, str],
    n_queries: int,
    seed: int,
) -> list[dict[str, Any]]:
    """The candidate lines of a seeded sample of ``n_queries`` queries (every candidate of each)."""
    with_cands = [m for m in mined if m.candidates]
    rng = np.random.default_rng([seed, 50])
    pick = (
        sorted(rng.choice(len(with_cands), size=min(n_queries, len(with_cands)), replace=False).tolist())
        if with_cands
        else []
    )
    out = []
    for i in pick:
        mq = with_cands[i]
        pos_id = sorted(positives.get(mq.query_id, ()))[0] if positives.get(mq.query_id) else None
        floor = min(mq.positive_scores.values()) if mq.positive_scores else None
        for c in mq.candidates:
            out.append(
                {
                    "type": "candidate",
                    "query_id": mq.query_id,
                    "query": queries.get(mq.query_id, ""),
                    "positive_id": pos_id,
                    "positive": _text(corpus.get(pos_id) if pos_id else None),
                    "candidate_id": c.doc_id,
                    "candidate": _text(corpus.get(c.doc_id)),
                    "dense": _r(c.dense),
                    "dense_rank": c.dense_rank,
                    "bm25": _r(c.bm25),
                    "bm25_rank": c.bm25_rank,
                    "positive_score": _r(floor),
                    "rule": c.rule,
                }
            )
    return out


def audit_summary(
    mined: Sequence[MinedQuery], rows: Sequence[tuple[str, str, list[str] | None, str]]
) -> dict[str, Any]:
    """Counts over every mined query (not only the sampled ones) and over the drawn examples."""
    cands = [c for m in mined for c in m.candidates]
    by_rule: dict[str, int] = {}
    for c in cands:
        by_rule[c.rule] = by_rule.get(c.rule, 0) + 1
    n_negs = [len(r[2] or []) for r in rows]
    return {
        "queries": len(mined),
        "candidates": len(cands),
        "kept": by_rule.get(KEPT, 0),
        "dropped": len(cands) - by_rule.get(KEPT, 0),
        "by_rule": dict(sorted(by_rule.items())),
        "queries_all_dropped": sum(1 for m in mined if m.candidates and not m.kept),
        "examples": len(rows),
        "examples_without_negative": sum(1 for n in n_negs if n == 0),
        "examples_bm25_fallback": sum(1 for r in rows if r[3] == "bm25_fallback"),
        "examples_with_repeated_negatives": sum(1 for r in rows if r[2] and len(set(r[2])) < len(r[2])),
    }


def write_audit(path: str | Path, records: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """The audit file (atomic): the candidate lines, then the summary line."""
    write_jsonl(path, [*records, {"type": "summary", **summary}])


def read_audit(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(candidate lines, summary) of an audit file, or of the one in a run directory."""
    p = Path(path)
    if p.is_dir():
        p = p / AUDIT_FILE
    if not p.is_file():
        raise ScalingNoteError(
            f"{p}: no mining audit here (a run trained with data.negatives: dense | mixed writes {AUDIT_FILE})"
        )
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for lineno, rec in iter_jsonl(p):  # named errors for bad UTF-8, JSON and non-objects
        if rec.get("type") not in ("candidate", "summary"):
            raise DataError(p, lineno, "type", "expected an object with type 'candidate' or 'summary'")
        if rec["type"] == "summary":
            summary = {k: v for k, v in rec.items() if k != "type"}
        else:
            records.append(rec)
    return records, summary


__all__ = ["AUDIT_FILE", "audit_records", "audit_summary", "read_audit", "write_audit"]
