"""The false-negative guard of mined hard negatives, and how it is measured.

A mined window (dense ranks K+1..T, known positives removed) still holds documents that are
relevant but unlabelled: training pushes them away from their query (RocketQA, Qu et al. 2021,
§3.2 "denoised hard negatives"; the synthetic log: 41% of BM25-mined negatives are relevant).
The guard drops candidates that look like unlabelled positives; its rules, by name
(``data.mining.guard``, tried in the order given; the first that fires names the drop):

* ``near_positive``: the mining tower scores the candidate at least as high as the query's weakest
  labelled positive minus ``guard_margin`` (cosine): a document the tower cannot tell from a
  positive (NV-Retriever's positive-aware mining, Moreira et al. 2024, uses a threshold relative to
  the positive's score in the same way);
* ``agree_top``: the candidate is in the top ``guard_top_r`` of *both* the dense and the BM25
  ranking: two unrelated rankers agreeing at the very top is evidence of relevance.

:func:`guard_counts` measures it on windows mined with some judged positives hidden from the
known-positive filter (:func:`scalingnote.training.guard_eval.measure_guard`): how many hidden
positives the unguarded window would offer as negatives, how many the guard removes, and how many
true negatives it removes too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KEPT = "kept"


@dataclass
class Candidate:
    """One candidate negative of a query: its document, scores and ranks (1-based; None where the
    ranking did not reach it), and the guard rule that dropped it (``"kept"`` when none did)."""

    doc_id: str
    dense: float | None = None
    dense_rank: int | None = None
    bm25: float | None = None
    bm25_rank: int | None = None
    rule: str = KEPT


@dataclass
class MinedQuery:
    """A query's window (every candidate, guarded or kept) and its known positives' dense scores."""

    query_id: str
    candidates: list[Candidate] = field(default_factory=list)
    positive_scores: dict[str, float] = field(default_factory=dict)
    #: the BM25 window (known positives removed): drawn from when the guard left nothing
    fallback: list[str] = field(default_factory=list)

    @property
    def kept(self) -> list[str]:
        return [c.doc_id for c in self.candidates if c.rule == KEPT]


def rule_fires(rule: str, c: Candidate, floor: float | None, margin: float, top_r: int) -> bool:
    """Whether guard ``rule`` drops candidate ``c`` (``floor``: the weakest known positive's dense score)."""
    if rule == "near_positive":
        return floor is not None and c.dense is not None and c.dense >= floor - margin
    if rule == "agree_top":
        return c.dense_rank is not None and c.bm25_rank is not None and c.dense_rank <= top_r and c.bm25_rank <= top_r
    raise ValueError(f"unknown guard rule {rule!r}")


def apply_guard(mined: Sequence[MinedQuery], mining: Any) -> None:
    """Mark every candidate with the first rule of ``mining.guard`` that fires (in place)."""
    for mq in mined:
        floor = min(mq.positive_scores.values()) if mq.positive_scores else None
        for c in mq.candidates:
            c.rule = next(
                (r for r in mining.guard if rule_fires(r, c, floor, mining.guard_margin, mining.guard_top_r)), KEPT
            )


def guard_counts(
    mined: Sequence[MinedQuery], hidden: Mapping[str, set[str]], positives: Mapping[str, set[str]]
) -> dict[str, Any]:
    """What the guard did to the hidden positives and to the true negatives of ``mined``.

    ``hidden``: per query, the judged positives removed from the known-positive filter;
    ``positives``: per query, every judged positive (a candidate outside it is a true negative).
    ``fn_rate_*``: the share of the window's candidates (unguarded) / of the kept ones (guarded)
    that are hidden positives."""
    in_window = removed = tn = tn_removed = window = kept = hidden_kept = 0
    by_rule: dict[str, int] = {}
    for mq in mined:
        hid, pos = hidden.get(mq.query_id, set()), positives.get(mq.query_id, set())
        for c in mq.candidates:
            window += 1
            dropped = c.rule != KEPT
            kept += not dropped
            if dropped:
                by_rule[c.rule] = by_rule.get(c.rule, 0) + 1
            if c.doc_id in hid:
                in_window += 1
                removed += dropped
                hidden_kept += not dropped
            elif c.doc_id not in pos:
                tn += 1
                tn_removed += dropped
    return {
        "hidden_positives": sum(len(v) for v in hidden.values()),
        "hidden_in_window": in_window,
        "hidden_removed_by_guard": removed,
        "guard_recall": round(removed / in_window, 4) if in_window else None,
        "true_negatives_in_window": tn,
        "true_negatives_removed": tn_removed,
        "true_negative_removal_rate": round(tn_removed / tn, 4) if tn else None,
        "fn_rate_unguarded": round(in_window / window, 4) if window else None,
        "fn_rate_guarded": round(hidden_kept / kept, 4) if kept else None,
        "removed_by_rule": dict(sorted(by_rule.items())),
    }


__all__ = ["KEPT", "Candidate", "MinedQuery", "apply_guard", "guard_counts", "rule_fires"]
