"""AUC over labelled (query, document, label) pairs — ScalingNote's AUC-SAT / AUC-REL.

ScalingNote §4.1.2 ("Manual" test set): *"we compute similarity scores for all
query-document pairs in the dataset, and rank all pairs based on these similarity
scores. We calculate AUC-SAT and AUC-REL using human-annotated satisfaction and
relevance labels"*. That is one ROC AUC over **all pairs ranked together**
(``average="global"``, the paper's metric). AUC-SAT and AUC-REL differ only in which
binary label is used. The per-query average (``average="query"``, often called
QAUC/GAUC) is offered too: the mean of the per-query AUCs over queries that have both
a positive and a negative pair.

Both use :func:`sklearn.metrics.roc_auc_score` (ties count one half).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from scalingnote.data.types import Qrels, Run
from scalingnote.errors import ScalingNoteError

Average = Literal["global", "query"]


def pair_auc(
    scores: Sequence[float] | np.ndarray,
    labels: Sequence[int] | np.ndarray,
    query_ids: Sequence[str] | None = None,
    *,
    average: Average = "global",
    threshold: float = 1,
) -> float:
    """ROC AUC of ``scores`` against binary labels ``label >= threshold``.

    ``labels`` may be binary (0/1) or graded (e.g. 0–3 with ``threshold=2``).
    ``average="global"``: one AUC over all pairs (ScalingNote §4.1.2).
    ``average="query"``: mean over queries (``query_ids`` required) of the per-query AUC,
    skipping queries whose pairs are all positive or all negative.
    Raises :class:`ScalingNoteError` when no AUC is defined (a single class).
    """
    from sklearn.metrics import roc_auc_score  # lazy: sklearn takes ~1 s to import

    s = np.asarray(scores, dtype=np.float64)
    y = (np.asarray(labels, dtype=np.float64) >= threshold).astype(np.int8)
    if s.shape != y.shape or s.ndim != 1:
        raise ScalingNoteError(f"scores and labels must be 1-D and the same length, got {s.shape} and {y.shape}")
    if not np.isfinite(s).all():
        raise ScalingNoteError("AUC: scores must be finite")
    if average == "global":
        if y.min(initial=1) == y.max(initial=0):
            raise ScalingNoteError(f"AUC undefined: all {len(y)} pairs have the same label")
        return float(roc_auc_score(y, s))
    if average != "query":
        raise ScalingNoteError(f"average must be 'global' or 'query', got {average!r}")
    if query_ids is None or len(query_ids) != len(y):
        raise ScalingNoteError("average='query' needs one query id per pair")
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(query_ids):
        groups.setdefault(q, []).append(i)
    aucs = []
    for idx in groups.values():
        yi = y[idx]
        if yi.min() != yi.max():
            aucs.append(roc_auc_score(yi, s[idx]))
    if not aucs:
        raise ScalingNoteError("per-query AUC undefined: no query has both a positive and a negative pair")
    return float(np.mean(aucs))


def judged_pairs(
    run: Run, qrels: Qrels, *, missing: Literal["ignore", "zero"] = "ignore"
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Every judged pair of ``qrels`` with its run score: ``(query_ids, doc_ids, scores, grades)``.

    A judged document the run did not score (not retrieved) gets a score below every
    score of the run (all such pairs tie). Queries absent from the run are skipped
    (``missing="ignore"``) or all their pairs get that floor score (``"zero"``).
    """
    finite = [v for docs in run.values() for v in docs.values() if np.isfinite(v)]
    floor = (min(finite) if finite else 0.0) - 1.0
    qids: list[str] = []
    dids: list[str] = []
    scores: list[float] = []
    grades: list[int] = []
    for qid, judged in qrels.items():
        docs = run.get(qid)
        if docs is None:
            if missing == "ignore":
                continue
            docs = {}
        for did, g in judged.items():
            qids.append(qid)
            dids.append(did)
            v = docs.get(did, floor)
            scores.append(max(v, floor))  # -inf scores rank with the unretrieved
            grades.append(g)
    return qids, dids, np.asarray(scores, dtype=np.float64), np.asarray(grades, dtype=np.int64)


def run_auc(
    run: Run,
    qrels: Qrels,
    *,
    relevance_level: int = 1,
    average: Average = "global",
    missing: Literal["ignore", "zero"] = "ignore",
) -> float:
    """AUC of a run's scores on the judged pairs of ``qrels`` (label = grade >= relevance_level).

    Use a run that scores every judged pair (e.g. produced by scoring the labelled pairs,
    as ScalingNote does on its Manual set); unretrieved judged documents rank last.
    Unlike ranking metrics, queries with no relevant pair are kept: their negatives
    still count in the global ranking.
    """
    qids, _, scores, grades = judged_pairs(run, qrels, missing=missing)
    if not qids:
        raise ScalingNoteError("AUC: no judged pair belongs to a query of the run")
    return pair_auc(scores, grades, qids, average=average, threshold=relevance_level)
