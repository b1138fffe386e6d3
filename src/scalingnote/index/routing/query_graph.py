"""Query-guided edges for the HNSW graph methods (routing built for asymmetric towers).

The distilled query tower's vectors are out of distribution for a graph built from document-document
distances: a query's exact neighbours are often far apart in document space, so the greedy walk
reaches some of them and has to widen its beam (efSearch) to find the rest. RoarGraph (Chen et al.,
VLDB 2024) builds the graph under the guidance of the query distribution: it connects, for each
training query, the document nearest to it (the *pivot*) to the query's other nearest documents,
projected from a query-document bipartite graph. No kept library does it (FAISS, hnswlib, usearch
build from base points only), so here is the smallest form of it that FAISS can serve unchanged:

* for every fitting query (training queries and pseudo-queries encoded by the *query* tower — never
  validation or test queries) its exact top ``per_node + 1`` documents are found; the pivot gets
  edges to the other ``per_node`` and each of them an edge back to the pivot (the reverse edges that
  RoarGraph adds so that a walk entering the result set anywhere reaches the pivot);
* per document at most ``per_node`` such edges (and at most half of its 2 M level-0 slots) are kept,
  the most frequent first, written into the *tail* of its level-0 neighbour list of the FAISS HNSW
  graph: its document neighbours are ordered nearest first and the farthest give way only when the
  list (2 M slots) is full.

The index stays a plain FAISS ``IndexHNSW*`` (same memory, same search code, ``write_index`` keeps
the edges); ``efSearch`` is still the knob. Documents the live index inserts get their edges as they
arrive (:func:`add_live_edges`: only the fitting queries whose exact neighbours they enter). Measured
in ``benchmarks/ood_routing.py`` (``hnsw_sq_qg`` rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError

#: rows of the level-0 table re-ordered at once (chunk x 2M x d floats are gathered)
_CHUNK = 2048


def guided_edges(docs: np.ndarray, queries: np.ndarray, per_node: int, *, topk: Any) -> tuple[np.ndarray, np.ndarray]:
    """The query-guided edges ``(src, dst)`` (int64 document rows), at most ``per_node`` per source,
    most frequent first. ``topk(docs, queries, k)`` gives the exact top-k rows per query."""
    _check(per_node, len(queries))
    return _edges(_neighbours(docs, queries, per_node, topk), per_node)


def _check(per_node: int, n_queries: int) -> None:
    if per_node < 1:
        raise ScalingNoteError(f"query_edges must be >= 1, got {per_node}")
    if n_queries == 0:
        raise ScalingNoteError("query-guided edges need fitting queries (training / pseudo-query vectors); got none")


def _neighbours(docs: np.ndarray, queries: np.ndarray, per_node: int, topk: Any) -> np.ndarray:
    """Each query's exact top ``per_node + 1`` document rows, nearest first."""
    return np.asarray(topk(docs, queries, min(per_node + 1, len(docs))), dtype=np.int64)


def _kth_of(q: np.ndarray, x: np.ndarray, nn: np.ndarray) -> np.ndarray:
    """Each query's score of the last of its neighbours ``nn`` (its (per_node + 1)-th nearest row)."""
    return np.einsum("nd,nd->n", q, x[nn[:, -1]]).astype(np.float32)


def _edges(nn: np.ndarray, per_node: int) -> tuple[np.ndarray, np.ndarray]:
    pivot = np.repeat(nn[:, :1], nn.shape[1] - 1, axis=1).ravel()
    rest = nn[:, 1:].ravel()
    src, dst = np.concatenate([pivot, rest]), np.concatenate([rest, pivot])
    ok = (src >= 0) & (dst >= 0) & (src != dst)
    src, dst = src[ok], dst[ok]
    if not len(src):
        return src, dst
    n = int(max(src.max(), dst.max())) + 1
    pair, count = np.unique(src * n + dst, return_counts=True)
    s, d = pair // n, pair % n
    order = np.lexsort((d, -count, s))  # per source: most frequent first, then by row
    s, d = s[order], d[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    rank = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
    keep = rank < per_node
    return s[keep], d[keep]


def add_guided_edges(
    index: Any, docs: np.ndarray, queries: np.ndarray, per_node: int, *, topk: Any, with_kth: bool = False
) -> Any:
    """Write the query-guided edges of ``queries`` into ``index``'s (a FAISS ``IndexHNSW*`` over
    ``docs``, inner product) level-0 lists (module doc). Returns the number of edges added; with
    ``with_kth``, ``(added, {"kth": each query's score of its (per_node + 1)-th nearest document})``,
    the threshold :func:`add_live_edges` starts from (kept in the routing state)."""
    x = np.ascontiguousarray(docs, dtype=np.float32)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    hnsw = index.hnsw
    if index.ntotal != len(x):
        raise ScalingNoteError(f"the graph holds {index.ntotal} documents, {len(x)} vectors given")
    _check(per_node, len(q))
    per = _per_node(hnsw, per_node)
    nn = _neighbours(x, q, per, topk)
    added = _write(hnsw, x, _edges(nn, per))
    return (added, {"kth": _kth_of(q, x, nn)}) if with_kth else added


def _per_node(hnsw: Any, per_node: int) -> int:
    """Guided edges per document: at most half of its level-0 list (the rest stays the document graph's)."""
    return min(int(per_node), int(hnsw.nb_neighbors(0)) // 2)


def _write(hnsw: Any, x: np.ndarray, edges: tuple[np.ndarray, np.ndarray]) -> int:
    """Merge ``edges`` (src, dst) into the level-0 lists of ``hnsw`` (:func:`_merge`)."""
    import faiss

    src, dst = edges
    if not len(src):
        return 0
    width = int(hnsw.nb_neighbors(0))
    per_node = int(np.bincount(src).max())
    nb = faiss.vector_to_array(hnsw.neighbors)
    offsets = faiss.vector_to_array(hnsw.offsets).astype(np.int64)
    nodes, first = np.unique(src, return_index=True)
    counts = np.diff(np.r_[first, len(src)])
    new = np.full((len(nodes), per_node), -1, np.int64)
    new[np.repeat(np.arange(len(nodes)), counts), np.arange(len(src)) - np.repeat(first, counts)] = dst
    added = 0
    for a in range(0, len(nodes), _CHUNK):
        rows = nodes[a : a + _CHUNK]
        pos = offsets[rows, None] + np.arange(width)
        table, n_added = _merge(x, rows, nb[pos].astype(np.int64), new[a : a + _CHUNK], width)
        nb[pos] = table.astype(nb.dtype)
        added += n_added
    faiss.copy_array_to_vector(nb, hnsw.neighbors)
    return added


def add_live_edges(
    index: Any,
    docs: np.ndarray,
    queries: np.ndarray,
    per_node: int,
    first_new: int,
    *,
    topk: Any,
    alive: np.ndarray | None = None,
    kth: np.ndarray | None = None,
) -> tuple[int, np.ndarray]:
    """Query-guided edges for the rows ``first_new..`` just inserted into a built graph (the live
    index's adds, which FAISS links by document distance only). A fitting query whose exact top
    ``per_node + 1`` over the live rows now holds a new row -- its best score over the new rows is
    above ``kth``, its (per_node + 1)-th best over the rows before (computed when None) -- has its
    edges written again over every live row (:func:`add_guided_edges`: edges already there are kept,
    not doubled); the others are untouched. Dead rows (``alive`` False) are never an edge's end.
    Returns (edges added, ``kth`` updated), so a stream of adds pays for the queries it changes."""
    x = np.ascontiguousarray(docs, dtype=np.float32)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    live = np.ones(len(x), bool) if alive is None else np.asarray(alive, bool)
    per_node = _per_node(index.hnsw, per_node)
    live_topk = _over_live(topk, live)
    if kth is None:
        kth = (
            _kth(x[:first_new], q, per_node, live_topk)
            if int(live[:first_new].sum()) > per_node
            else np.full(len(q), -np.inf, np.float32)
        )
    kth = np.array(kth, np.float32)
    if first_new >= len(x) or not live[first_new:].any():
        return 0, kth
    hit = np.flatnonzero(np.where(live[first_new:], q @ x[first_new:].T, -np.inf).max(axis=1) > kth)
    if not len(hit):
        return 0, kth
    added, new = add_guided_edges(index, x, q[hit], per_node, topk=live_topk, with_kth=True)
    if int(live.sum()) > per_node:  # fewer live rows than a query's neighbours: every new row enters
        kth[hit] = new["kth"]
    return added, kth


def _over_live(topk: Any, live: np.ndarray) -> Any:
    """``topk`` restricted to the rows ``live`` marks (row numbers of the whole matrix kept)."""
    if live.all():
        return topk
    rows = np.flatnonzero(live)

    def live_topk(d: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
        sub = rows[rows < len(d)]
        return sub[np.asarray(topk(d[sub], q, min(k, len(sub))), dtype=np.int64)]

    return live_topk


def _kth(x: np.ndarray, q: np.ndarray, per_node: int, topk: Any) -> np.ndarray:
    """Each query's score of its (per_node + 1)-th nearest row of ``x``."""
    return _kth_of(q, x, _neighbours(x, q, per_node, topk))


def _merge(x: np.ndarray, rows: np.ndarray, lists: np.ndarray, new: np.ndarray, width: int) -> tuple[np.ndarray, int]:
    """Level-0 lists of ``rows`` with ``new`` (-1 padded) appended: a guided edge already present is
    kept (not added twice), the other present neighbours ordered nearest first and the farthest cut
    when the list is full."""
    same = (new[:, :, None] == lists[:, None, :]) & (new[:, :, None] >= 0)
    present = same.any(axis=2)  # guided edges already among the document neighbours: kept, not added twice
    new = np.where(present | (new < 0), -1, new)
    new = np.take_along_axis(new, np.argsort(new < 0, axis=1, kind="stable"), axis=1)  # valid first
    n_new = (new >= 0).sum(axis=1)
    valid = lists >= 0
    sims = np.einsum("nd,nld->nl", x[rows], x[np.where(valid, lists, 0)])
    sims = np.where(same.any(axis=1), np.inf, np.where(valid, sims, -np.inf))
    lists = np.take_along_axis(lists, np.argsort(-sims, axis=1, kind="stable"), axis=1)  # nearest first, -1 last
    n_keep = np.minimum(valid.sum(axis=1), width - n_new)
    j = np.arange(width)[None, :]
    from_new = (j >= n_keep[:, None]) & (j < (n_keep + n_new)[:, None])
    tail = np.take_along_axis(new, np.clip(j - n_keep[:, None], 0, new.shape[1] - 1), axis=1)
    out = np.where(j < n_keep[:, None], lists, np.where(from_new, tail, -1))
    return out, int(n_new.sum())


__all__ = ["add_guided_edges", "add_live_edges", "guided_edges"]
