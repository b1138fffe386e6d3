"""Exact dense retrieval for evaluation: encode, inner-product top-k, score.

Used by the trainers to evaluate a (query tower, document embeddings) pair without
building an ANN index. Vectors are L2-normalised Matryoshka prefixes, so the inner
product is the cosine similarity the towers were trained with.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalingnote.data.types import Qrels, Run
from scalingnote.evaluation.metrics import evaluate
from scalingnote.evaluation.perplexity import contrastive_perplexity


def truncate_normalize(x: np.ndarray, dim: int | None = None) -> np.ndarray:
    """First ``dim`` components (Matryoshka prefix), L2-normalised, float32."""
    x = np.asarray(x, dtype=np.float32)
    if dim is not None:
        x = x[:, :dim]
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def exact_search(
    query_emb: np.ndarray,
    query_ids: Sequence[str],
    doc_emb: np.ndarray,
    doc_ids: Sequence[str],
    k: int = 1000,
    chunk: int = 256,
) -> Run:
    """Top-``k`` documents per query by inner product (brute force, chunked over queries)."""
    k = min(k, len(doc_ids))
    run: Run = {}
    doc_ids = list(doc_ids)
    for s in range(0, len(query_ids), chunk):
        scores = query_emb[s : s + chunk] @ doc_emb.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        for row, qid in enumerate(query_ids[s : s + chunk]):
            idx = top[row]
            run[qid] = {doc_ids[j]: float(scores[row, j]) for j in idx}
    return run


def perplexity_negatives(n_docs: int, qrels: Qrels, wanted: int = 256) -> int:
    """W for contrastive perplexity: the paper's 256, or fewer on a corpus too small for it."""
    most_rel = max((sum(1 for g in d.values() if g > 0) for d in qrels.values()), default=0)
    return max(1, min(wanted, n_docs - most_rel))


def dense_metrics(
    query_emb: np.ndarray,
    query_ids: Sequence[str],
    doc_emb: np.ndarray,
    doc_ids: Sequence[str],
    qrels: Qrels,
    metrics: Sequence[str] = ("ndcg@10", "r@100", "recall@100", "mrr@10"),
    tau: float | None = 0.05,
    perplexity_seed: int = 0,
) -> dict[str, float]:
    """Retrieval metrics (exact search) plus contrastive perplexity (scaling-laws §3.5; W=256,
    fixed seed; scores = cosine/``tau``) of a dual encoder on ``qrels``."""
    run = exact_search(query_emb, query_ids, doc_emb, doc_ids, k=max(1000, 100))
    out = evaluate(run, qrels, list(metrics))
    if tau:
        judged = {q: d for q, d in qrels.items() if q in set(query_ids)}
        out["contrastive_ppl"] = contrastive_perplexity(
            query_emb,
            list(query_ids),
            doc_emb,
            list(doc_ids),
            qrels=judged,
            temperature=tau,
            seed=perplexity_seed,
            num_negatives=perplexity_negatives(len(doc_ids), judged),
        )
    return out
