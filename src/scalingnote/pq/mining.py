"""Negative mining for learned PQ (TMJ §3.2, §3.4, Table 4).

Documents are corpus row numbers; per query, ``positives[i]`` is the set of its judged
relevant rows. Rankings are ``int64 [nq, k]`` arrays of rows, best first.

* Stage 1 (§3.2): "hard negatives sampled from top irrelevant documents pre-retrieved by
  the warm-up model with initialized PQ parameters" — :func:`top_negatives` of the PQ
  ranking.
* Stage 2 (§3.4): PQ-oriented negatives ``S_i = S_u ∩ S_c`` minus the positives, with
  ``S_u`` / ``S_c`` the top-200 of the flat (dense) and the PQ index —
  :func:`pq_oriented_negatives`. The Table 4 alternatives (``pq_top``: top-200 of the PQ
  index; ``difference``: ``S_u - S_c``) are available for ablations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

NegativeRule = Literal["intersection", "pq_top", "difference"]


def top_k(scores_fn, n_queries: int, k: int, chunk: int = 256) -> np.ndarray:
    """Top-``k`` rows per query, best first, from ``scores_fn(start, stop) -> [chunk, n_docs]``."""
    out = []
    for s in range(0, n_queries, chunk):
        sc = np.asarray(scores_fn(s, min(s + chunk, n_queries)), dtype=np.float32)
        kk = min(k, sc.shape[1])
        part = np.argpartition(-sc, kk - 1, axis=1)[:, :kk]
        order = np.argsort(-np.take_along_axis(sc, part, axis=1), axis=1, kind="stable")
        out.append(np.take_along_axis(part, order, axis=1))
    return np.concatenate(out, axis=0) if out else np.zeros((0, k), dtype=np.int64)


def search(queries: np.ndarray, docs: np.ndarray, k: int, chunk: int = 256) -> np.ndarray:
    """Exact inner-product top-``k`` rows of ``docs`` for each query (flat search; with ``docs``
    the PQ reconstructions ``x̂`` it is exactly an ``IndexPQ`` inner-product search)."""
    queries = np.asarray(queries, dtype=np.float32)
    docs = np.asarray(docs, dtype=np.float32)
    return top_k(lambda a, b: queries[a:b] @ docs.T, len(queries), k, chunk).astype(np.int64)


def top_negatives(ranking: np.ndarray, positives: Sequence[set[int]], depth: int | None = None) -> list[np.ndarray]:
    """The top ``depth`` rows of each ranking minus the query's positives, in rank order."""
    out = []
    for row, pos in zip(ranking, positives, strict=True):
        r = row[: depth if depth else len(row)]
        out.append(np.array([int(d) for d in r if d >= 0 and int(d) not in pos], dtype=np.int64))
    return out


def pq_oriented_negatives(
    pq_ranking: np.ndarray,
    flat_ranking: np.ndarray,
    positives: Sequence[set[int]],
    depth: int = 200,
    rule: NegativeRule = "intersection",
) -> list[np.ndarray]:
    """§3.4: per query, ``S_i = S_u ∩ S_c`` minus the positives, ordered by PQ rank.

    ``S_c`` = top-``depth`` of ``pq_ranking`` (quantized), ``S_u`` = top-``depth`` of
    ``flat_ranking`` (dense). ``rule="pq_top"``: ``S_c`` minus positives ("GT+Top-200");
    ``rule="difference"``: ``S_u - S_c`` minus positives ("GT+Difference set", §3.4
    defines ``S_d = S_u - S_c``), ordered by flat rank.
    """
    if pq_ranking.shape[0] != flat_ranking.shape[0] or pq_ranking.shape[0] != len(positives):
        raise ValueError(
            f"rankings for {pq_ranking.shape[0]} / {flat_ranking.shape[0]} queries, positives for {len(positives)}"
        )
    out = []
    for pq_row, flat_row, pos in zip(pq_ranking, flat_ranking, positives, strict=True):
        s_c = [int(d) for d in pq_row[:depth] if d >= 0]
        s_u = [int(d) for d in flat_row[:depth] if d >= 0]
        if rule == "intersection":
            su = set(s_u)
            neg = [d for d in s_c if d in su and d not in pos]
        elif rule == "pq_top":
            neg = [d for d in s_c if d not in pos]
        elif rule == "difference":
            sc = set(s_c)
            neg = [d for d in s_u if d not in sc and d not in pos]
        else:
            raise ValueError(f"rule must be intersection, pq_top or difference; got {rule!r}")
        out.append(np.array(neg, dtype=np.int64))
    return out


def sample_negatives(rng: np.random.Generator, pool: np.ndarray, n: int, n_docs: int, exclude: set[int]) -> np.ndarray:
    """``n`` negatives drawn without replacement from ``pool`` (with replacement when the pool is
    smaller than ``n``); an empty pool falls back to random documents outside ``exclude``."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if len(pool) >= n:
        return rng.choice(pool, size=n, replace=False).astype(np.int64)
    if len(pool) > 0:
        return np.concatenate([pool, rng.choice(pool, size=n - len(pool), replace=True)]).astype(np.int64)
    out: list[int] = []
    while len(out) < n:
        d = int(rng.integers(n_docs))
        if d not in exclude or len(exclude) >= n_docs:
            out.append(d)
    return np.array(out, dtype=np.int64)


def negative_stats(negatives: Sequence[np.ndarray]) -> dict[str, float]:
    """Mean / min size of the mined lists and the share of empty ones (for logs)."""
    sizes = np.array([len(n) for n in negatives], dtype=np.float64)
    if sizes.size == 0:
        return {"neg_mean": 0.0, "neg_min": 0.0, "neg_empty": 0.0}
    return {"neg_mean": float(sizes.mean()), "neg_min": float(sizes.min()), "neg_empty": float((sizes == 0).mean())}
