"""Every choice the quick start makes, made on validation queries held out from the training
split (never the reported split): can a tower read the data, which large tower teaches, is a
trained tower better than its start, which student fits the latency budget, and is the served
default the student alone or the student fused with BM25.

These are small pure functions over numbers and runs, so each rule is tested on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scalingnote.evaluation.metrics import per_query
from scalingnote.evaluation.significance import compare_runs, separates
from scalingnote.index.hybrid import Norm, choose_norm_and_weight, hybrid_search_run

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- can it read the data
def tokenizer_report(tokenizer: Any, texts: Sequence[str]) -> dict[str, float]:
    """Share of unknown tokens and characters per token of ``tokenizer`` on ``texts``.

    A vocabulary that cannot represent the text maps it to its unknown token (MiniLM's English
    WordPiece on Chinese: ~70% ``[UNK]``); byte-level BPE never does (its cost shows as fewer
    characters per token instead)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    n_tok = n_unk = n_chr = 0
    for t in texts:
        ids = tokenizer(t, add_special_tokens=False)["input_ids"]
        n_tok += len(ids)
        n_chr += len(t)
        if unk is not None:
            n_unk += sum(1 for i in ids if i == unk)
    return {
        "unk_share": round(n_unk / max(1, n_tok), 4),
        "chars_per_token": round(n_chr / max(1, n_tok), 2),
        "tokens": n_tok,
        "texts": len(texts),
    }


def readability(report: Mapping[str, float], max_unk_share: float) -> tuple[bool, str]:
    """(readable, reason) for a :func:`tokenizer_report`."""
    share = float(report["unk_share"])
    if share > max_unk_share:
        return False, (
            f"{share:.0%} of its tokens on {report['texts']} sample queries are the unknown token "
            f"(limit {max_unk_share:.0%}): its vocabulary cannot read this text"
        )
    return True, f"{share:.1%} unknown tokens, {report['chars_per_token']} characters per token"


# ----------------------------------------------------------------------------- how sure is a choice
def val_confidence(run_a, run_b, qrels) -> dict[str, Any] | None:
    """How far apart two candidates are on the validation queries: ``{"queries", "p"}`` of a
    paired t-test on per-query nDCG@10 (None without at least 2 validation queries), reported
    beside a choice (the served mode decides with it: :func:`cross_fit_fusion`)."""
    if not qrels or len(qrels) < 2:
        return None
    c = compare_runs(run_a, run_b, qrels, n_resamples=1000)
    p = float(c.ttest.pvalue)
    return {"queries": len(qrels), "p": None if np.isnan(p) else float(f"{p:.3g}")}


def conf_text(conf: Mapping[str, Any] | None) -> str:
    """:func:`val_confidence` in words ("" when there is no test to report)."""
    if not conf or conf.get("p") is None:
        return ""
    return f"paired t-test over {conf['queries']} validation queries: p {conf['p']:.3g}"


# ----------------------------------------------------------------------------- never worse than the start
def keep_better(
    trained_val: float, start_val: float | None, what: str, conf: Mapping[str, Any] | None = None
) -> tuple[bool, str]:
    """Keep the trained tower unless its validation score is below its start's.

    Returns (keep_trained, message); the message says what was kept and why, and with ``conf``
    (:func:`val_confidence`) how sure the validation split is of it."""
    sure = conf_text(conf)
    if start_val is None or trained_val >= start_val:
        return True, (
            f"{what}: trained {trained_val:.4f} >= start {start_val if start_val is not None else float('nan'):.4f} "
            f"on validation{f' ({sure})' if sure else ''}"
        )
    return False, (
        f"{what}: training made it worse on validation ({trained_val:.4f} < its start {start_val:.4f}"
        f"{f'; {sure}' if sure else ''}); keeping the start"
    )


# ----------------------------------------------------------------------------- teacher and student
def choose_best(val: Mapping[str, float], pinned: str | None = None) -> tuple[str, str]:
    """The key with the best validation score (ties: the first in order), or ``pinned``;
    returns (choice, reason)."""
    if not val:
        raise ValueError("choose_best: no candidate")
    listing = ", ".join(f"{k} {v:.4f}" for k, v in val.items())
    if pinned is not None:
        if pinned not in val:
            raise ValueError(f"pinned choice {pinned!r} is not a candidate ({list(val)})")
        return pinned, f"pinned by the config (validation nDCG@10: {listing})"
    best = max(val, key=lambda k: (val[k], -list(val).index(k)))
    return best, f"best validation nDCG@10 of {listing}"


def choose_student(
    cands: Sequence[Mapping[str, Any]], budget_ms: float | None
) -> tuple[str | None, list[dict[str, Any]], str]:
    """Among candidates ``{"name", "val", "p99_ms"}`` keep the best-validating one whose p99 is
    under ``budget_ms`` (None: no budget). Returns (name or None, the quality/latency frontier
    — the candidates no other one beats on both — and the reason)."""
    rows = [dict(c) for c in cands]
    frontier = [
        c
        for c in rows
        if not any(
            o["val"] >= c["val"] and o["p99_ms"] < c["p99_ms"] or o["val"] > c["val"] and o["p99_ms"] <= c["p99_ms"]
            for o in rows
        )
    ]
    frontier.sort(key=lambda c: c["p99_ms"])
    fits = [c for c in rows if budget_ms is None or c["p99_ms"] <= budget_ms]
    if not fits:
        fastest = min(rows, key=lambda c: c["p99_ms"]) if rows else None
        why = (
            f"no student meets p99 <= {budget_ms} ms (fastest: {fastest['name']} {fastest['p99_ms']:.2f} ms)"
            if fastest
            else "no student candidate"
        )
        return None, frontier, why
    # ties on validation: the smaller tower, then the first candidate. Not the lower p99: two
    # students of one architecture (e.g. two QKD loss weights) differ in p99 only by timing noise
    order = {id(c): i for i, c in enumerate(fits)}
    best = max(fits, key=lambda c: (c["val"], -c.get("layers", 0), -order[id(c)]))
    budget = "no latency budget" if budget_ms is None else f"p99 <= {budget_ms} ms"
    return (
        best["name"],
        frontier,
        f"best validation nDCG@10 ({best['val']:.4f}) with {budget} (p99 {best['p99_ms']:.2f} ms)",
    )


# ----------------------------------------------------------------------------- the served default
#: the served default when validation cannot separate the modes: lexical + dense is ahead of dense
#: alone on most BEIR sets, and a fused run cannot miss what BM25 finds
SAFE_SERVED = "hybrid"
#: a choice leaves its pre-declared default only at p below this (paired t-test over validation queries)
CHOICE_ALPHA = 0.05


def _per_query(run, qrels, qids) -> dict[str, float]:
    pq = per_query({q: run.get(q, {}) for q in qids}, {q: qrels[q] for q in qids}, ["ndcg@10"])
    return {q: float(pq.get(q, {}).get("ndcg@10", 0.0)) for q in qids}


#: the fusion the served hybrid uses unless validation separates another (norm, dense weight): min-max
#: normalised scores, equal weights. Fitting 42 (norm, weight) pairs to ~60 validation queries moved the
#: embedded default's served test nDCG@10 by 0.03 between seeds with nothing separated
DEFAULT_FUSION: tuple[Norm, float] = ("minmax", 0.5)


def _fused_per_query(dense_run, bm25_run, qrels, qids: list[str], norm: Norm, weight: float) -> dict[str, float]:
    hyb, _ = hybrid_search_run(
        {q: dense_run.get(q, {}) for q in qids},
        {q: bm25_run.get(q, {}) for q in qids},
        "weighted",
        k=100,
        weight=weight,
        norm=norm,
    )
    return _per_query(hyb, qrels, qids)


def fusion_unless_separated(dense_run, bm25_run, qrels) -> tuple[Norm, float, str]:
    """The fusion settings for these (validation) queries: :data:`DEFAULT_FUSION` unless the grid's best
    (:func:`~scalingnote.index.hybrid.choose_norm_and_weight`) is better on them with p <
    :data:`CHOICE_ALPHA` (paired t-test over the queries). Returns (norm, weight, reason)."""
    qids = sorted(q for q in qrels if q in dense_run or q in bm25_run)
    best, _ = choose_norm_and_weight(dense_run, bm25_run, qrels)
    norm, weight = DEFAULT_FUSION
    if (best.norm, best.weight) == DEFAULT_FUSION:
        return norm, weight, f"fusion {norm} w_dense={weight:g}: the declared default is the best fitted"
    if len(qids) < 2:
        return norm, weight, f"fusion {norm} w_dense={weight:g}, the declared default: too few queries to test another"
    fitted = _fused_per_query(dense_run, bm25_run, qrels, qids, best.norm, best.weight)
    default = _fused_per_query(dense_run, bm25_run, qrels, qids, norm, weight)
    wins, t = separates(fitted, default, CHOICE_ALPHA)
    test = f"{best.norm} w_dense={best.weight:g} vs {norm} w_dense={weight:g}: paired t-test over {t.n} queries"
    test += f" p {t.pvalue:.3g}"
    if wins:
        return (
            best.norm,
            best.weight,
            f"fusion {best.norm} w_dense={best.weight:g}: separated from the default ({test})",
        )
    return (
        norm,
        weight,
        f"fusion {norm} w_dense={weight:g}, the declared default: the best fit is not separated ({test})",
    )


def cross_fit_fusion(dense_run, bm25_run, qrels, seed: int = 0) -> dict[str, Any]:
    """Is the dense run alone better than fusing it with BM25, on validation queries?

    The fusion norm and weight are chosen on one half of the queries (:func:`fusion_unless_separated`:
    the declared default unless a fitted one is separated from it) and scored on the other (and the
    other way round), so fusion's extra free parameter cannot win by fitting the very queries it is
    judged on. The rule: the served default is :data:`SAFE_SERVED` (hybrid) unless
    the student alone is better on these held-out per-query scores with p < :data:`CHOICE_ALPHA`
    (paired t-test); when the evidence does not separate them, hybrid is served and the reason
    says so. Returns both held-out scores, the test, the choice and the norm / weight fitted on
    all the validation queries (what the served hybrid uses)."""
    qids = sorted(q for q in qrels if q in dense_run or q in bm25_run)
    order = np.random.default_rng(seed).permutation(len(qids))
    halves = [[qids[i] for i in sorted(order[: len(qids) // 2])], [qids[i] for i in sorted(order[len(qids) // 2 :])]]
    fused_pq: dict[str, float] = {}
    dense_pq: dict[str, float] = {}
    for fit, judge in (halves, halves[::-1]):
        if not fit or not judge:
            continue
        norm, weight, _ = fusion_unless_separated(
            {q: dense_run.get(q, {}) for q in fit}, {q: bm25_run.get(q, {}) for q in fit}, {q: qrels[q] for q in fit}
        )
        fused_pq.update(_fused_per_query(dense_run, bm25_run, qrels, judge, norm, weight))
        dense_pq.update(_per_query({q: dense_run.get(q, {}) for q in judge}, qrels, judge))
    fused = float(np.mean(list(fused_pq.values()))) if fused_pq else 0.0
    dense = float(np.mean(list(dense_pq.values()))) if dense_pq else 0.0
    full_norm, full_weight, weight_why = fusion_unless_separated(dense_run, bm25_run, qrels)
    scores = f"2-fold cross-fitted validation nDCG@10: student alone {dense:.4f}, student + BM25 {fused:.4f}"
    if len(dense_pq) >= 2:
        dense_wins, t = separates(dense_pq, fused_pq, CHOICE_ALPHA)
        p = None if np.isnan(t.pvalue) else float(f"{t.pvalue:.3g}")
        test = f"paired t-test over {t.n} validation queries p {t.pvalue:.3g}"
    else:
        dense_wins, p, test = False, None, "too few validation queries for a test"
    choice = "dense" if dense_wins else SAFE_SERVED
    rule = f"served default: {SAFE_SERVED} unless the student alone is better with p < {CHOICE_ALPHA:g}"
    why = (
        f"{scores}; {test}: the student alone is better, served alone"
        if dense_wins
        else f"{scores}; {test}: "
        + (
            "not separated, so the declared default (student + BM25) is served"
            if dense > fused
            else "student + BM25 is served"
        )
    )
    return {
        "choice": choice,
        "val_dense": round(dense, 4),
        "val_hybrid": round(fused, 4),
        "norm": full_norm,
        "weight": full_weight,
        "weight_reason": weight_why,
        "n_queries": len(qids),
        "p": p,
        "rule": rule,
        "default_kept": not dense_wins and dense > fused,
        "reason": why,
    }


def default_unless_beaten(val: Mapping[Any, float], default: Any, margin: float, what: str) -> tuple[Any, str]:
    """A choice among candidates scored by one number each (Stage I's validation nDCG@10) that
    keeps the pre-declared ``default`` unless another candidate is ahead of it by more than
    ``margin`` (the noise of that number: leads below it changed sign between runs on one data
    set). Returns (choice, reason)."""
    scores = f"validation nDCG@10 {_listing(val)}"
    if default not in val:
        best = max(val, key=lambda k: (val[k], -list(val).index(k)))
        return best, f"{what}: the best {scores}"
    best = max(val, key=lambda k: (val[k], k == default, -list(val).index(k)))
    lead = val[best] - val[default]
    if best != default and lead > margin:
        return (
            best,
            f"{what}: {_name(best)} ahead of the default {_name(default)} by {lead:.4f} > {margin:g} ({scores})",
        )
    if best != default:
        return default, (
            f"{what}: {_name(best)} leads the default {_name(default)} by {lead:.4f} <= {margin:g}, within the noise: "
            f"the default is kept ({scores})"
        )
    return default, f"{what}: the default {_name(default)} is best ({scores})"


def default_unless_separated(
    val: Mapping[Any, float],
    per_query: Mapping[Any, Mapping[str, float] | None],
    default: Any,
    margin: float,
    what: str,
) -> tuple[Any, str]:
    """The rule for Stage I's choices (head learning rate, embedding size): keep the pre-declared
    ``default`` unless a candidate is better on the validation queries with p < :data:`CHOICE_ALPHA`
    (paired t-test over the same queries' nDCG@10: :func:`~scalingnote.evaluation.significance.separates`);
    of several that are, the best-validating. Without per-query scores for every candidate (a run
    made before they were recorded): :func:`default_unless_beaten` with ``margin``. Returns (choice, reason)."""
    given = {k: per_query.get(k) for k in val}
    pq = {k: v for k, v in given.items() if v}  # every candidate's, or some are missing
    if default not in val or len(pq) < len(given) or len(pq[default]) < 2:
        return default_unless_beaten(val, default, margin, what)
    scores = f"validation nDCG@10 {_listing(val)}"
    tests = {k: separates(pq[k], pq[default], CHOICE_ALPHA) for k in val if k != default}
    if not tests:
        return default, f"{what}: the default {_name(default)}, the only candidate ({scores})"
    wins = [k for k, (w, _) in tests.items() if w]
    if wins:
        best = max(wins, key=lambda k: val[k])
        t = tests[best][1]
        return best, (
            f"{what}: {_name(best)} better than the default {_name(default)} (paired t-test over "
            f"{t.n} validation queries "
            f"p {t.pvalue:.3g} < {CHOICE_ALPHA:g}; {scores})"
        )
    near = max(tests, key=lambda k: val[k])
    t = tests[near][1]
    return default, (
        f"{what}: the default {_name(default)} is kept: the evidence does not separate "
        f"{_name(near)} from it (paired t-test "
        f"over {t.n} validation queries p {t.pvalue:.3g}, mean difference {t.mean_diff:+.4f}; {scores})"
    )


def _name(k: Any) -> str:
    return f"{k:g}" if isinstance(k, float) else str(k)


def _listing(val: Mapping[Any, float]) -> str:
    return ", ".join(f"{k:g} {v:.4f}" if isinstance(k, float) else f"{k} {v:.4f}" for k, v in val.items())


# ----------------------------------------------------------------------------- decide early
def halve(proxy_val: Mapping[str, float], margin: float, keep_at_most: int | None = None) -> tuple[list[str], str]:
    """Successive halving's elimination rule, one round: on the proxy's validation nDCG@10, keep
    every candidate within ``margin`` of the best (it can still win on the whole corpus), drop the
    rest; ``keep_at_most`` (the budget's cut) keeps only that many of the best. Ties and NaN-free
    order: the first candidate first. Returns (survivors in the given order, the reason)."""
    if not proxy_val:
        raise ValueError("halve: no candidate")
    if margin < 0:
        raise ValueError(f"halve: margin must be >= 0, got {margin}")
    order = list(proxy_val)
    best = max(order, key=lambda k: (proxy_val[k], -order.index(k)))
    top = proxy_val[best]
    keep = [k for k in order if proxy_val[k] >= top - margin]
    if keep_at_most is not None and len(keep) > keep_at_most:
        ranked = sorted(keep, key=lambda k: (-proxy_val[k], order.index(k)))[: max(1, keep_at_most)]
        keep = [k for k in order if k in ranked]
    dropped = [k for k in order if k not in keep]
    listing = ", ".join(f"{k} {proxy_val[k]:.4f}" for k in order)
    why = f"proxy validation nDCG@10 {listing}; kept within {margin:g} of the best ({best})"
    if keep_at_most is not None:
        why += f", at most {keep_at_most} (time budget)"
    if dropped:
        why += f"; dropped {', '.join(dropped)}"
    return keep, why


__all__ = [
    "choose_best",
    "choose_student",
    "conf_text",
    "cross_fit_fusion",
    "fusion_unless_separated",
    "default_unless_beaten",
    "default_unless_separated",
    "halve",
    "keep_better",
    "readability",
    "tokenizer_report",
    "val_confidence",
]
