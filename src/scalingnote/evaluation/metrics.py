"""Ranking metrics over a :data:`~scalingnote.data.Run` and :data:`~scalingnote.data.Qrels`.

Every value agrees with trec_eval as exposed by ``pytrec_eval`` (tested to 1e-6):

==============  ==============================================================  ===================
name            definition                                                      trec_eval measure
==============  ==============================================================  ===================
``r@K``         1 if ANY relevant document is in the top K, averaged over       ``success.K``
                queries — ScalingNote §4.1.2: R@K = Success@K / #Queries
``recall@K``    relevant documents in the top K / all relevant documents        ``recall.K``
``recall``      same over the whole ranked list                                  ``recall`` (num_rel_ret/num_rel)
``mrr@K``       1 / rank of the first relevant document if it is within K       ``recip_rank`` on the top K
``mrr``         same without a cut-off                                          ``recip_rank``
``ndcg@K``      graded nDCG: gain = grade (grades <= 0 give 0), discount        ``ndcg_cut.K``
                log2(rank + 1); ideal list = all judged grades, sorted
``ndcg``        same without a cut-off                                          ``ndcg``
``map``         mean average precision (sum of precision at each relevant      ``map``
                rank / all relevant documents)
``map@K``       same, counting only relevant documents within the top K         ``map_cut.K``
                (denominator stays all relevant documents)
``p@K``         relevant documents in the top K / K                             ``P.K``
==============  ==============================================================  ===================

Conventions (all documented choices, chosen to agree with trec_eval / pytrec_eval):

* A document is *relevant* when its grade is ``>= relevance_level`` (default 1);
  grades ``<= 0`` (and unjudged documents) are never relevant and give no gain.
* Ranking: documents are sorted by score descending; ties are broken by document
  id descending (byte order), and scores are compared as 32-bit floats — exactly
  how trec_eval orders a run (it stores similarities as C ``float``).
* Queries of the qrels **with no relevant document are skipped**: every metric is 0
  for them by construction and R@K is undefined, so averaging them in only dilutes
  the mean (pytrec_eval would report zeros for them if asked; BEIR's qrels list
  positives only, so they never occur there).
* Queries of the qrels **absent from the run** are ignored by default
  (``missing="ignore"``), like pytrec_eval and BEIR, with a logged warning;
  ``missing="zero"`` counts them as 0 on every metric (trec_eval ``-c``).
  A query present in the run with an empty ranking always counts as 0.
* Queries of the run absent from the qrels are ignored.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from scalingnote.data.types import Qrels, Run
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation.auc import run_auc

log = logging.getLogger(__name__)

Missing = Literal["ignore", "zero"]

#: Metrics reported when none are asked for.
DEFAULT_METRICS: tuple[str, ...] = ("ndcg@10", "recall@100", "r@100", "mrr@10", "map")

#: Metrics that need no cut-off / allow none / require one.
_KINDS_OPTIONAL_K = {"ndcg", "recall", "mrr", "map"}
_KINDS_REQUIRED_K = {"r", "p"}
#: Corpus-level (not per-query) metrics computed over judged pairs, see :mod:`scalingnote.evaluation.auc`.
PAIR_METRICS = {"auc", "qauc"}
_ALIASES = {"precision": "p", "success": "r", "recip_rank": "mrr", "ndcg_cut": "ndcg", "map_cut": "map"}
_NAME_RE = re.compile(r"^([a-z_]+)(?:@(\d+))?$")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A parsed metric name: ``kind`` plus optional cut-off ``k``; ``name`` is canonical."""

    kind: str
    k: int | None = None

    @property
    def name(self) -> str:
        return self.kind if self.k is None else f"{self.kind}@{self.k}"

    @property
    def per_query(self) -> bool:
        return self.kind not in PAIR_METRICS


def parse_metric(name: str) -> MetricSpec:
    """Parse ``ndcg@10``, ``recall@100``, ``r@100``, ``mrr@10``, ``map``, ``map@100``, ``p@10``,
    ``auc``, ``qauc`` (case-insensitive; ``precision@K`` and ``success@K`` are aliases of
    ``p@K`` and ``r@K``). Raises :class:`ScalingNoteError` naming the bad metric."""
    m = _NAME_RE.match(name.strip().lower())
    if not m:
        raise ScalingNoteError(
            f"unknown metric {name!r}; expected e.g. ndcg@10, recall@100, r@100, mrr@10, map, p@10, auc"
        )
    kind, k_s = m.group(1), m.group(2)
    kind = _ALIASES.get(kind, kind)
    k = int(k_s) if k_s is not None else None
    if kind in PAIR_METRICS:
        if k is not None:
            raise ScalingNoteError(f"metric {name!r}: {kind} takes no cut-off")
    elif kind in _KINDS_REQUIRED_K:
        if k is None:
            raise ScalingNoteError(f"metric {name!r}: {kind} needs a cut-off, e.g. {kind}@10")
    elif kind not in _KINDS_OPTIONAL_K:
        raise ScalingNoteError(f"unknown metric {name!r}; known: ndcg, recall, r, mrr, map, p (with @K), auc, qauc")
    if k is not None and k < 1:
        raise ScalingNoteError(f"metric {name!r}: the cut-off must be >= 1")
    return MetricSpec(kind, k)


def parse_metrics(metrics: str | Iterable[str]) -> list[MetricSpec]:
    """Parse a comma-separated string or a list of names; duplicates are dropped, order kept."""
    if isinstance(metrics, str):
        metrics = [m for m in metrics.split(",") if m.strip()]
    specs: list[MetricSpec] = []
    for m in metrics:
        s = parse_metric(m)
        if s not in specs:
            specs.append(s)
    if not specs:
        raise ScalingNoteError("no metric given")
    return specs


def rank_documents(docs: Mapping[str, float]) -> list[str]:
    """Document ids of one query's run, best first, ordered exactly like trec_eval:
    score (as float32) descending, then document id descending."""
    if not docs:
        return []
    ids = list(docs)
    scores = np.asarray([docs[d] for d in ids], dtype=np.float64)
    if np.isnan(scores).any():
        bad = ids[int(np.flatnonzero(np.isnan(scores))[0])]
        raise ScalingNoteError(f"run score of document {bad!r} is NaN")
    # trec_eval keeps similarities as C float: equal-as-float32 scores tie and fall back to docid.
    scores32 = scores.astype(np.float32).tolist()
    return [d for _, d in sorted(zip(scores32, ids, strict=True), reverse=True)]


def _query_metrics(
    ranked: Sequence[str], judged: Mapping[str, int], specs: Sequence[MetricSpec], level: int
) -> dict[str, float]:
    """All per-query metrics of one query from its ranked list and its judgements."""
    grades = [judged.get(d, 0) for d in ranked]
    is_rel = [g >= level for g in grades]
    num_rel = sum(1 for g in judged.values() if g >= level)
    n = len(ranked)
    # cumulative hits; first relevant rank (1-based)
    first_rel = next((i + 1 for i, r in enumerate(is_rel) if r), None)
    out: dict[str, float] = {}
    ideal: list[int] | None = None
    for s in specs:
        k = s.k if s.k is not None else n
        kk = min(k, n)
        if s.kind == "r":
            v = 1.0 if first_rel is not None and first_rel <= k else 0.0
        elif s.kind == "recall":
            v = sum(is_rel[:kk]) / num_rel
        elif s.kind == "p":
            v = sum(is_rel[:kk]) / k
        elif s.kind == "mrr":
            v = 1.0 / first_rel if first_rel is not None and first_rel <= k else 0.0
        elif s.kind == "map":
            hits = 0
            total = 0.0
            for i in range(kk):
                if is_rel[i]:
                    hits += 1
                    total += hits / (i + 1)
            v = total / num_rel
        elif s.kind == "ndcg":
            if ideal is None:
                ideal = sorted((g for g in judged.values() if g > 0), reverse=True)
            # trec_eval: gain = grade for grades > 0, discount log2(rank + 1).
            dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:kk]) if g > 0)
            ik = len(ideal) if s.k is None else min(s.k, len(ideal))
            idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal[:ik]))
            v = dcg / idcg if idcg > 0 else 0.0
        else:  # pragma: no cover - parse_metric rejects anything else
            raise AssertionError(s.kind)
        out[s.name] = float(v)
    return out


@dataclass
class EvalReport:
    """Result of :func:`evaluate_report`: mean metrics plus how many queries went into them."""

    metrics: dict[str, float]
    num_queries: int  # queries averaged over
    num_missing: int  # qrels queries (with a relevant doc) absent from the run
    num_no_relevant: int  # qrels queries skipped because they have no relevant document
    missing: Missing = "ignore"
    per_query: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)


def _check_args(relevance_level: int, missing: str) -> None:
    if relevance_level < 1:
        raise ScalingNoteError(f"relevance_level must be >= 1, got {relevance_level}")
    if missing not in ("ignore", "zero"):
        raise ScalingNoteError(f"missing must be 'ignore' or 'zero', got {missing!r}")


def _per_query_with_counts(
    run: Run, qrels: Qrels, specs: Sequence[MetricSpec], relevance_level: int, missing: Missing
) -> tuple[dict[str, dict[str, float]], int, int]:
    _check_args(relevance_level, missing)
    results: dict[str, dict[str, float]] = {}
    n_missing = n_norel = 0
    for qid, judged in qrels.items():
        if not any(g >= relevance_level for g in judged.values()):
            n_norel += 1
            continue
        docs = run.get(qid)
        if docs is None:
            n_missing += 1
            if missing == "ignore":
                continue
            docs = {}
        results[qid] = _query_metrics(rank_documents(docs), judged, specs, relevance_level)
    return results, n_missing, n_norel


def per_query(
    run: Run,
    qrels: Qrels,
    metrics: str | Iterable[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
    missing: Missing = "ignore",
) -> dict[str, dict[str, float]]:
    """Per-query values ``{qid: {metric: value}}`` of ranking metrics (not ``auc``/``qauc``,
    which are corpus-level). Which queries appear follows the module conventions."""
    specs = parse_metrics(metrics)
    pair = [s.name for s in specs if not s.per_query]
    if pair:
        raise ScalingNoteError(f"{', '.join(pair)} is computed over all judged pairs, not per query; use evaluate()")
    return _per_query_with_counts(run, qrels, specs, relevance_level, missing)[0]


def evaluate_report(
    run: Run,
    qrels: Qrels,
    metrics: str | Iterable[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
    missing: Missing = "ignore",
) -> EvalReport:
    """Like :func:`evaluate`, also returning query counts and the per-query values."""
    specs = parse_metrics(metrics)
    rank_specs = [s for s in specs if s.per_query]
    pq, n_missing, n_norel = _per_query_with_counts(run, qrels, rank_specs, relevance_level, missing)
    if n_missing and missing == "ignore":
        log.warning(
            "%d of %d queries with relevant documents are absent from the run and were ignored "
            "(use missing='zero' to count them as 0)",
            n_missing,
            len(qrels) - n_norel,
        )
    out: dict[str, float] = {}
    if rank_specs and not pq:
        raise ScalingNoteError(
            f"no query of the qrels ({len(qrels) - n_norel} with a relevant document) appears in the run "
            f"({len(run)} queries): are the query ids from the same dataset?"
        )
    for s in specs:
        if s.per_query:
            out[s.name] = float(np.mean([v[s.name] for v in pq.values()]))
        else:
            out[s.name] = run_auc(
                run,
                qrels,
                relevance_level=relevance_level,
                average="query" if s.kind == "qauc" else "global",
                missing=missing,
            )
    return EvalReport(out, len(pq), n_missing, n_norel, missing, pq)


def evaluate(
    run: Run,
    qrels: Qrels,
    metrics: str | Iterable[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
    missing: Missing = "ignore",
) -> dict[str, float]:
    """Mean of each metric over the evaluated queries, ``{metric: value}`` in the order asked.

    ``metrics``: names such as ``ndcg@10``, ``recall@100``, ``r@100``, ``mrr@10``, ``map``,
    ``map@100``, ``p@10``, ``auc``, ``qauc`` (list or comma-separated string).
    ``relevance_level``: minimum grade counted as relevant (trec_eval ``-l``).
    ``missing``: ``"ignore"`` (default, like pytrec_eval/BEIR) or ``"zero"`` (trec_eval ``-c``)
    for qrels queries absent from the run. Queries with no relevant document are skipped.
    """
    return evaluate_report(run, qrels, metrics, relevance_level=relevance_level, missing=missing).metrics
