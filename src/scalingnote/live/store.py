"""The dense side of a live index: the FAISS index, the full-precision vectors, the row <-> id
map, the semantic IDs and the document store (titles, snippets), all growing by rows.

Rows are append-only. A FAISS id is the row number (as ``build_index`` adds them), so an
upsert of an existing id marks its old row dead and appends a new row; a delete marks the row
dead. On an IVF index (IVFPQ, OPQ+IVFPQ, the routed ``ivf`` / ``ivf_qmetric``) the dead row is
also removed from the inverted lists (``remove_ids``); on Flat / HNSW / HNSW+PQ (FAISS HNSW has no
``remove_ids``) it stays as a tombstone: a bitmap of the live rows goes to the search as a FAISS ``IDSelectorBitmap``
(``SearchParametersHNSW.sel``: the graph is walked through dead nodes, never returns them), until
compaction rebuilds the graph without them. A new
row goes to an inverted list by the rule the lists were cut with (``ivf_qmetric``: the nearest
list centroid in the query metric, :func:`scalingnote.index.faiss.methods.assign_lists`); on HNSW it
is inserted into the graph (``hnsw_sq_qg`` / ``hnsw_lean``: with the query-guided edges of the stored fitting
queries whose exact neighbours it enters, :func:`scalingnote.index.routing.query_graph.add_live_edges`; ``hnsw_lean``
walks its graph in a projection, found through the ``IndexPreTransform`` it is wrapped in). Every
mutation happens under the live index's lock, so a search sees a batch entirely or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scalingnote.data.types import Document
from scalingnote.index.docstore import make_snippet
from scalingnote.index.engine_files import is_engine
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.faiss.faiss_utils import find_hnsw, find_ivf
from scalingnote.index.faiss.methods import add_rows, load_state
from scalingnote.index.routing.query_graph import add_live_edges
from scalingnote.index.routing.routing import GUIDED_METHODS
from scalingnote.index.searcher import SearchResult
from scalingnote.index.tune import exact_topk


class _Growing:
    """A 2-D numpy array with amortised O(1) row appends; ``view`` is the filled part."""

    def __init__(self, init: np.ndarray | None, width: int, dtype):
        n = 0 if init is None else int(init.shape[0])
        self.buf = np.zeros((max(16, 2 * n), width), dtype=dtype)
        if n:
            self.buf[:n] = init
        self.n = n

    def append(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self.buf):
            new = np.zeros((max(need, 2 * len(self.buf)), self.buf.shape[1]), dtype=self.buf.dtype)
            new[: self.n] = self.buf[: self.n]
            self.buf = new
        self.buf[self.n : need] = rows
        self.n = need

    @property
    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class RowStore:
    """The rows of a live dense index; wraps a :class:`DenseIndex` whose arrays it keeps current."""

    def __init__(self, dense: DenseIndex, alive: np.ndarray | None = None):
        self.dense = dense
        n = len(dense.doc_ids)
        self.vectors = _Growing(np.asarray(dense.vectors, dtype=np.float32), dense.dim, np.float32)
        sem = dense.semantic_ids
        self.sem = _Growing(np.asarray(sem, dtype=np.int32), sem.shape[1], np.int32) if sem is not None else None
        self.alive = np.ones(n, dtype=bool) if alive is None else np.asarray(alive, dtype=bool).copy()
        self.doc_ids: list[str] = list(dense.doc_ids)
        self.titles: list[str] = list(dense.titles) if dense.titles is not None else [""] * n
        self.snippets: list[str] = list(dense.snippets) if dense.snippets is not None else [""] * n
        self.row_of: dict[str, int] = {d: i for i, d in enumerate(self.doc_ids) if self.alive[i]}
        # IVF lists (FAISS remove_ids) or an engine that deletes in place (SVS's Vamana): no tombstones
        self.can_remove = find_ivf(dense.index) is not None or (is_engine(dense.index) and dense.index.supports_remove)
        self.routing = load_state(dense.root, dense.manifest)  # ivf_qmetric: the rule new rows go to lists by
        self.tombstones = int((~self.alive).sum()) if not self.can_remove else 0
        self._guide = _guide(dense, self.routing)  # hnsw_sq_qg / hnsw_lean: (fitting queries, edges per document)
        # each fitting query's (edges + 1)-th best score so far: from the build (routing state; deletes since
        # leave it high, which only misses an edge a deleted neighbour made room for), else computed at the first add
        guide = self._guide
        kth = (self.routing or {}).get("kth") if guide is not None else None
        self._kth: np.ndarray | None = (
            np.array(kth, np.float32) if kth is not None and guide is not None and len(kth) == len(guide[0]) else None
        )
        self.guided_edges_added = 0  #: query-guided edges given to inserted rows since this generation opened
        self._bitmap: np.ndarray | None = None  # kept alive while FAISS's selector points at it
        self._sync()

    # ------------------------------------------------------------------ state
    def _sync(self) -> None:
        """Point the wrapped DenseIndex at the current arrays (rows, vectors, ids, documents)."""
        d = self.dense
        d.vectors = self.vectors.view
        d.semantic_ids = self.sem.view if self.sem is not None else None
        d.doc_ids, d.titles, d.snippets = self.doc_ids, self.titles, self.snippets
        d.manifest["n_vectors"] = len(self.doc_ids)
        self._select()

    def _select(self) -> None:
        """The live rows as the searches' ID selector (HNSW / Flat with tombstones; none otherwise)."""
        import faiss

        idx = self.dense.index
        # a graph (hnsw_lean's inside its projection) or a flat index filters by selector; others: over-fetch + filter
        selectable = not is_engine(idx) and (
            find_hnsw(idx) is not None or isinstance(faiss.downcast_index(idx), faiss.IndexFlat)
        )
        if self.can_remove or not self.tombstones or not selectable:
            self.dense.selector, self._bitmap = None, None
            return
        self._bitmap = np.packbits(self.alive, bitorder="little")  # FAISS: bit i of byte i >> 3 (LSB first)
        self.dense.selector = faiss.IDSelectorBitmap(len(self.alive), faiss.swig_ptr(self._bitmap))

    @property
    def n_rows(self) -> int:
        return len(self.doc_ids)

    @property
    def n_alive(self) -> int:
        return len(self.row_of)

    def alive_rows(self) -> np.ndarray:
        return np.flatnonzero(self.alive)

    # ------------------------------------------------------------------ mutation (under the lock)
    def _kill(self, rows: list[int]) -> None:
        if not rows:
            return
        r = np.asarray(rows, dtype=np.int64)
        self.alive[r] = False
        if self.can_remove:
            self.dense.index.remove_ids(r)
        else:
            self.tombstones += len(rows)

    def delete(self, ids: Sequence[str]) -> list[str]:
        """Mark the rows of ``ids`` dead; returns the ids that were present."""
        rows, found = [], []
        for i in ids:
            r = self.row_of.pop(i, None)
            if r is not None:
                rows.append(r)
                found.append(i)
        self._kill(rows)
        self._select()
        return found

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray, sem: np.ndarray | None) -> tuple[int, int]:
        """Append one row per document (replacing a present id); returns ``(first_row, n_replaced)``."""
        old = [self.row_of[d.id] for d in docs if d.id in self.row_of]
        self._kill(old)
        first = self.n_rows
        rows = np.arange(first, first + len(docs), dtype=np.int64)
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.can_remove and self.routing is not None:
            add_rows(self.dense.index, self.routing, x, rows)
        elif self.can_remove:
            self.dense.index.add_with_ids(x, rows)
        else:
            assert self.dense.index.ntotal == first, (self.dense.index.ntotal, first)
            self.dense.index.add(x)
        self.vectors.append(x)
        if self.sem is not None:
            assert sem is not None, "the index holds semantic IDs: a batch must carry them"
            self.sem.append(sem)
        self.alive = np.concatenate([self.alive, np.ones(len(docs), dtype=bool)])
        if self._guide is not None and not self.can_remove:
            added, self._kth = add_live_edges(
                find_hnsw(self.dense.index),
                self.vectors.view,
                self._guide[0],
                self._guide[1],
                first,
                topk=exact_topk,
                alive=self.alive,
                kth=self._kth,
            )
            self.guided_edges_added += added
        for d, r in zip(docs, rows.tolist(), strict=True):
            self.doc_ids.append(d.id)
            self.titles.append(d.title)
            self.snippets.append(make_snippet(d.content or d.topic or ""))
            self.row_of[d.id] = r
        self._sync()
        return first, len(old)

    # ------------------------------------------------------------------ search (under the lock)
    def search(self, queries: Any, k: int = 10, **kw: Any) -> SearchResult:
        """:meth:`DenseIndex.search` over the live rows (tombstones: excluded by the selector; an
        index without one is over-fetched by their number and filtered)."""
        extra = 0 if self.dense.selector is not None else min(self.tombstones, self.n_rows)
        res = self.dense.search(queries, k + extra, **kw) if extra else self.dense.search(queries, k, **kw)
        if extra:
            res = filter_rows(res, self.alive, k)
        return res


def filter_rows(res: SearchResult, alive: np.ndarray, k: int) -> SearchResult:
    """Keep, per query, the first ``k`` hits whose row is alive (padding with -1 / -inf)."""
    nq = res.indices.shape[0]
    scores = np.full((nq, k), -np.inf, dtype=np.float32)
    idx = np.full((nq, k), -1, dtype=np.int64)
    res_sem = res.semantic_ids
    sem = None if res_sem is None else np.full((nq, k, res_sem.shape[2]), -1, dtype=np.int32)
    doc_ids, titles, snippets = [], [], []
    for q in range(nq):
        keep = [j for j, r in enumerate(res.indices[q]) if r >= 0 and alive[r]][:k]
        n = len(keep)
        scores[q, :n], idx[q, :n] = res.scores[q, keep], res.indices[q, keep]
        if sem is not None and res_sem is not None:
            sem[q, :n] = res_sem[q, keep]
        doc_ids.append([res.doc_ids[q][j] for j in keep])
        if res.titles is not None:
            assert res.snippets is not None  # a search result carries titles and snippets together
            titles.append([res.titles[q][j] for j in keep])
            snippets.append([res.snippets[q][j] for j in keep])
    return SearchResult(
        scores,
        doc_ids,
        sem,
        idx,
        titles if res.titles is not None else None,
        snippets if res.snippets is not None else None,
    )


def _guide(dense: DenseIndex, state: dict[str, np.ndarray] | None) -> tuple[np.ndarray, int] | None:
    """``hnsw_sq_qg`` / ``hnsw_lean``'s stored fitting queries and edges per document (None for other structures)."""
    entry = dense.manifest.get("routing") or {}
    if entry.get("method") not in GUIDED_METHODS or not state or "queries" not in state:
        return None
    return np.asarray(state["queries"], np.float32), int((entry.get("config") or {}).get("query_edges") or 16)
