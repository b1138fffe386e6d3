"""Query-guided edges for the HNSW graph methods (issue 52, item 2: routing built for asymmetric towers).

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
  the most frequent first, written into the *tail* of its level-0 neighbour list of the FAISS HNSW graph: its document neighbours are ordered
  nearest first and the farthest give way only when the list (2 M slots) is full.

The index stays a plain FAISS ``IndexHNSW*`` (same memory, same search code, ``write_index`` keeps
the edges); ``efSearch`` is still the knob. Measured in ``benchmarks/ood_routing.py``
(``hnsw_sq_qg`` rows).
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
    if per_node < 1:
        raise ScalingNoteError(f"query_edges must be >= 1, got {per_node}")
    if len(queries) == 0:
        raise ScalingNoteError("query-guided edges need fitting queries (training / pseudo-query vectors); got none")
    nn = np.asarray(topk(docs, queries, min(per_node + 1, len(docs))), dtype=np.int64)
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


def add_guided_edges(index: Any, docs: np.ndarray, queries: np.ndarray, per_node: int, *, topk: Any) -> int:
    """Write the query-guided edges of ``queries`` into ``index``'s (a FAISS ``IndexHNSW*`` over
    ``docs``, inner product) level-0 lists (module doc). Returns the number of edges added."""
    import faiss

    x = np.ascontiguousarray(docs, dtype=np.float32)
    hnsw = index.hnsw
    if index.ntotal != len(x):
        raise ScalingNoteError(f"the graph holds {index.ntotal} documents, {len(x)} vectors given")
    width = int(hnsw.nb_neighbors(0))
    per_node = min(int(per_node), width // 2)  # at least half of each list stays the document graph's
    src, dst = guided_edges(x, np.ascontiguousarray(queries, dtype=np.float32), per_node, topk=topk)
    if not len(src):
        return 0
    nb = faiss.vector_to_array(hnsw.neighbors)
    offsets = faiss.vector_to_array(hnsw.offsets).astype(np.int64)
    nodes, first = np.unique(src, return_index=True)
    counts = np.diff(np.r_[first, len(src)])
    new = np.full((len(nodes), per_node), -1, np.int64)
    new[np.repeat(np.arange(len(nodes)), counts), np.arange(len(src)) - np.repeat(first, counts)] = dst
    added = 0
    for a in range(0, len(nodes), _CHUNK):
        rows = nodes[a:a + _CHUNK]
        pos = offsets[rows, None] + np.arange(width)
        table, n_added = _merge(x, rows, nb[pos].astype(np.int64), new[a:a + _CHUNK], width)
        nb[pos] = table.astype(nb.dtype)
        added += n_added
    faiss.copy_array_to_vector(nb, hnsw.neighbors)
    return added


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


__all__ = ["add_guided_edges", "guided_edges"]
