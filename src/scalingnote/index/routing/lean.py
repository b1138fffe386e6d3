"""``hnsw_lean``: an HNSW graph walked in a low-dimensional projection fitted to queries and documents.

A graph walk over the documents' own width costs one full-width distance a visited node: over 4-bit
codes at 576 dimensions ~0.5 µs, so at a million documents a walk that reaches recall@10 0.99 for the
distilled tower's out-of-distribution queries spends milliseconds on distances alone. Intel SVS's
LeanVec (Tepper et al., "LeanVec: Searching vectors faster by making them fit", TMLR 2024) walks the
graph over vectors projected to a few dimensions and re-ranks the candidates at full width; its
LeanVec-OOD variant fits the projection to a sample of *queries* as well as the documents, because
an inner product ``<q, x>`` is kept by the directions both carry. SVS ships LeanVec for Intel CPUs
only (on other machines its build exits the process), so here is the smallest form FAISS can serve:

* the projection ``P`` [d, k]: the top-k eigenvectors of ``S_x / tr S_x + S_q / tr S_q``, the
  documents' and the fitting queries' second moments, each scaled to unit trace so that neither
  population's directions are drowned by the other's norm (the fitting queries are training and
  pseudo-queries encoded by the query tower, never validation or test queries);
* an HNSW graph built over the projected documents ``x P`` and stored as 8-bit scalar codes of
  them (k bytes a document), with the query-guided level-0 edges of
  :mod:`scalingnote.index.routing.query_graph` (their neighbours found at full width);
* a FAISS ``IndexPreTransform`` (the projection, then the coded graph): ``write_index`` keeps all
  of it; the searcher re-ranks the walk's candidates exactly at full width (``rerank``).

``efSearch`` stays the one knob; the distances the walk computes are counted (projected ones).
Served as any routed method (:mod:`scalingnote.index.faiss.methods`): the fitting queries are kept in
``routing.npz``, so the live index gives inserted rows their guided edges and compaction (:func:`refill_lean`)
builds the graph again under the same projection and codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.routing.hnsw_graph import attach_graph, flat_graph
from scalingnote.index.routing.query_graph import add_guided_edges

#: documents sampled for the projection's second moment (and the scalar quantiser's training)
_FIT_ROWS = 131_072


def lean_projection(docs: np.ndarray, queries: np.ndarray, dim: int, *, seed: int = 0) -> np.ndarray:
    """The projection ``P`` [d, dim] (orthonormal columns): top ``dim`` eigenvectors of the documents'
    and the queries' second moments, each scaled to unit trace (module doc)."""
    d = docs.shape[1]
    if not 1 <= dim <= d:
        raise ScalingNoteError(f"lean_dim must be in [1, {d}] (the vectors' width), got {dim}")
    if len(queries) == 0:
        raise ScalingNoteError("hnsw_lean's projection needs fitting queries (training / pseudo-query vectors)")
    x = _sample(docs, _FIT_ROWS, seed).astype(np.float64)
    q = np.asarray(queries, dtype=np.float64)
    sx, sq = x.T @ x / len(x), q.T @ q / len(q)
    m = sx / max(np.trace(sx), 1e-12) + sq / max(np.trace(sq), 1e-12)
    _, vecs = np.linalg.eigh(m)  # ascending eigenvalues
    return np.ascontiguousarray(vecs[:, ::-1][:, :dim].astype(np.float32))


def build_lean(docs: np.ndarray, queries: np.ndarray, cfg: Any, *, topk: Any) -> tuple[Any, dict, Any]:
    """``(index, info, keep)``: the ``IndexPreTransform`` of ``cfg`` (``lean_dim``, ``hnsw_m``,
    ``ef_construction``, ``query_edges``: at least 1, the config refuses fewer) over ``docs``; ``info`` says what was
    fitted (``kth``: each fitting query's (edges + 1)-th best score, where the live index's inserts start);
    ``keep``: the FAISS objects the Python side must hold alive."""
    import faiss

    proj = lean_projection(docs, queries, cfg.lean_dim, seed=cfg.seed)
    xp = np.ascontiguousarray(docs @ proj, dtype=np.float32)
    graph = flat_graph(xp, cfg)
    sq8 = getattr(faiss.ScalarQuantizer, "QT_8bit")  # noqa: B009 (faiss's stub types the enum as a class)
    coded = faiss.IndexHNSWSQ(cfg.lean_dim, sq8, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    coded.train(_sample(xp, _FIT_ROWS, cfg.seed))
    attach_graph(coded, xp, graph)
    del graph, xp
    # the true (full-width) neighbours of the fitting queries become edges; kth: where live inserts start
    added, kth = add_guided_edges(coded, docs, queries, cfg.query_edges, topk=topk, with_kth=True)
    info: dict[str, Any] = {"lean_dim": int(cfg.lean_dim), "query_edges_added": int(added), **kth}
    lt = faiss.LinearTransform(docs.shape[1], cfg.lean_dim, False)
    faiss.copy_array_to_vector(np.ascontiguousarray(proj.T).ravel(), lt.A)
    faiss.copy_array_to_vector(np.zeros(cfg.lean_dim, dtype=np.float32), lt.b)
    lt.is_trained = True
    index = faiss.IndexPreTransform(lt, coded)
    return index, info, (lt, coded)


def refill_lean(empty: Any, docs: np.ndarray, queries: np.ndarray, cfg: Any, *, topk: Any) -> tuple[Any, np.ndarray]:
    """``(index, kth)``: an emptied ``hnsw_lean`` index (compaction) filled with ``docs`` again: the
    same projection and trained 8-bit quantiser, a new graph over the projected rows and the stored
    fitting ``queries``' guided edges (``kth``: each query's threshold for live inserts)."""
    import faiss

    index = faiss.downcast_index(empty)
    if not isinstance(index, faiss.IndexPreTransform):
        raise ScalingNoteError("hnsw_lean: the index to refill is not the projection + graph it was built as")
    coded = graph_of(index)
    x = np.ascontiguousarray(docs, dtype=np.float32)
    chain: Any = index.chain  # a SWIG vector (the stub types it as a list)
    xp = np.ascontiguousarray(faiss.downcast_VectorTransform(chain.at(0)).apply(x), dtype=np.float32)
    attach_graph(coded, xp, flat_graph(xp, cfg))
    index.ntotal = coded.ntotal
    _, kth = add_guided_edges(coded, x, queries, cfg.query_edges, topk=topk, with_kth=True)
    return index, kth["kth"]


def lean_label(index: Any, cfg: Any) -> str:
    """``HNSW<M>,Lean<k>,SQ8,QG<edges>``: the graph's degree, the projection's width, the 8-bit codes
    and the query-guided edges a document."""
    return f"HNSW{cfg.hnsw_m},Lean{int(graph_of(index).d)},SQ8,QG{cfg.query_edges}"


def graph_of(index: Any) -> Any:
    """The HNSW index inside ``index`` (itself when it is not a pre-transform)."""
    import faiss

    return faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index


def _sample(x: np.ndarray, n: int, seed: int) -> np.ndarray:
    if len(x) <= n:
        return np.ascontiguousarray(x)
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(x[np.sort(rng.choice(len(x), n, replace=False))])


__all__ = ["build_lean", "graph_of", "lean_label", "lean_projection", "refill_lean"]
