"""Routing for asymmetric towers: compressed indexes that find a distilled query tower's neighbours
while computing few distances.

A distilled query tower's vectors sit away from the documents (ScalingNote §3.5 serves its student
against an IVFPQ built on the LLM document tower's vectors). An IVF trained on documents alone
partitions the corpus along the directions in which *documents* vary; the inner products of the
student's queries vary along other directions, so the true neighbours of a query spread over
many lists and the probe count needed for a given recall grows.

Methods (all FAISS; every one returns the same :class:`RoutedResult` with the distance count):

* ``ivf`` — today's index: ``IVF<nlist>,PQ<m>x<bits>`` trained on documents, lists probed by
  inner product with the document centroids.
* ``ivf_qmetric`` — lists cut for the queries. With M = C + ridge (C the covariance of query
  vectors from training + pseudo-queries; no labels or neighbours needed) and A = M^(1/2), k-means
  runs on x' = A x: ||A (x - y)||^2 = E_q[<q - mu, x - y>^2], the spread of score differences
  across queries, so a list holds documents the queries score alike. Everything else stays in the
  original space: the list's centroid is the mean of its documents (probing by <q, c> is then the
  same score in either space), residual PQ codes are trained and stored in the original space.
  A plain FAISS ``IndexIVFPQ`` (lists filled with ``add_preassigned``): same search, same
  ``remove_ids``; only the partition differs.
* ``ivf_routed`` — those lists (or today's), probes chosen by routing vectors learnt in the query
  space (a ridge map W from each training/pseudo query to the mean of its exact top-k documents,
  folded into one vector and bias per list); searched with FAISS ``search_preassigned``.
* ``hnsw`` — FAISS ``IndexHNSWFlat`` (full-precision vectors inside: above any memory bound).
  ``hnsw_pq`` — the same graph over PQ codes (``IndexHNSWPQ``; TMJ's HNSW + PQ serving).
  ``hnsw_sq`` — over 4-bit scalar-quantised vectors (``IndexHNSWSQ``, d/2 bytes: closer to exact
  than PQ's d/8, so beam and re-rank stay short). ``hnsw_sq_qg`` — ``hnsw_sq`` whose level-0 lists
  also hold query-guided edges (:mod:`scalingnote.index.routing.query_graph`, after RoarGraph). FAISS HNSW
  has no ``remove_ids``. ``ivf_rabitq`` / ``ivf_pqfs`` / ``scann_soar`` / ``svs_vamana``:
  :mod:`scalingnote.index.routing.engines`.
  The IVF methods' coarse step can be an HNSW over the centroids (``coarse="hnsw"``).

Every search can re-rank its top ``rerank`` candidates exactly with the full-precision vectors
(a memory-mapped array works; TMJ §6 re-rank). :attr:`RoutedResult.ndis` counts distance
computations by one definition: coarse (routing) distances + codes scanned + re-ranked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.routing.engines import ENGINE_METHODS, build_engine, search_engine
from scalingnote.index.routing.hnsw_graph import attach_graph, flat_graph
from scalingnote.index.routing.lean import build_lean, graph_of
from scalingnote.index.routing.query_graph import add_guided_edges
from scalingnote.index.routing.routing_config import (
    CODED_GRAPH_METHODS,
    GRAPH_METHODS,
    GUIDED_METHODS,
    METHODS,
    QUERY_FIT_METHODS,
    SQ_GRAPH_METHODS,
    SQ_TYPES,
    Method,
    RoutedResult,
    RoutingConfig,
)
from scalingnote.index.tune import exact_topk


def _f32(x: Any, what: str) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if a.ndim != 2 or a.shape[0] == 0:
        raise ScalingNoteError(f"{what}: expected a non-empty 2-D array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ScalingNoteError(f"{what}: contains NaN or infinite values")
    return a


def query_metric(queries: np.ndarray, ridge: float, mean_weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(A, A^-1) with A = (C + mean_weight * mu mu^T + ridge * mean eigenvalue(C) * I)^(1/2), C the
    covariance and mu the mean of the query vectors: x' = A x and q' = A^-1 q keep every inner
    product, and ||A (x - y)||^2 = E_q[<q - mu, x - y>^2] (+ the mean and ridge terms), the spread
    of the score differences across queries. ``mean_weight`` 1 gives the second moment E[q q^T]
    (expected squared score error); 0 ignores the score shift every query shares (a document prior
    that does not decide which documents are whose neighbours)."""
    q = queries.astype(np.float64)
    mu = q.mean(0)
    c = (q - mu).T @ (q - mu) / len(q)
    w0 = np.linalg.eigvalsh(c)
    m = c + mean_weight * np.outer(mu, mu)
    w, v = np.linalg.eigh(m)
    w = np.clip(w, 0, None) + ridge * max(float(np.clip(w0, 0, None).mean()), 1e-12)
    if w.min() <= 0:
        raise ScalingNoteError("query second moment is singular: set metric_ridge > 0")
    a = (v * np.sqrt(w)) @ v.T
    a_inv = (v / np.sqrt(w)) @ v.T
    return a.astype(np.float32), a_inv.astype(np.float32)


def routing_map(queries: np.ndarray, targets: np.ndarray, ridge: float) -> np.ndarray:
    """``W`` [d, d] with ``q W^T ~ target`` (ridge least squares, centred by no intercept so a
    zero query routes nowhere in particular)."""
    q, t = queries.astype(np.float64), targets.astype(np.float64)
    gram = q.T @ q
    lam = ridge * float(np.trace(gram)) / gram.shape[0]
    return np.linalg.solve(gram + lam * np.eye(gram.shape[0]), q.T @ t).T.astype(np.float32)


@dataclass
class RoutedIndex:
    """A built index: ``index`` (FAISS),
    ``routes`` [nlist, d] routing vectors in the *original* query space (or None: the IVF's own),
    ``list_of`` [N] each document's list, ``build_s``; ``vectors`` full-precision for re-rank."""

    config: RoutingConfig
    index: Any
    vectors: np.ndarray
    routes: np.ndarray | None = None
    list_of: np.ndarray | None = None
    route_bias: np.ndarray | float = 0.0
    #: ivf_qmetric partitions: ``{"a": A, "centroids": c' (x' space), "centroids_orig"}``;
    #: hnsw_sq_qg / hnsw_lean: ``{"kth"}`` (build-time only)
    partition: dict | None = field(default=None, repr=False)
    build_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    _cent: np.ndarray | None = field(default=None, repr=False)
    _keep: Any = field(default=None, repr=False)  #: Python references FAISS objects must outlive

    def _centroids(self) -> np.ndarray:
        if self._cent is None:
            self._cent = self.index.quantizer.reconstruct_n(0, self.index.nlist)
        return self._cent

    # ------------------------------------------------------------------ build

    @classmethod
    def build(
        cls,
        docs: np.ndarray,
        config: RoutingConfig | None = None,
        *,
        train_queries: np.ndarray | None = None,
        vectors: np.ndarray | None = None,
        graph: RoutedIndex | None = None,
        metric: np.ndarray | None = None,
    ) -> RoutedIndex:
        """Build over ``docs`` [N, d] (float32). ``train_queries``: query-tower vectors of training
        and pseudo-queries (never validation/test), needed by ``ivf_qmetric`` and ``ivf_routed``.
        ``vectors``: the full-precision matrix kept for re-rank (default ``docs``; may be a memmap).
        ``graph``: an ``hnsw`` index over the same ``docs`` whose graph ``hnsw_pq`` / ``hnsw_sq`` reuse (its
        build time is added to this one's). ``metric``: the query metric A of an earlier build
        (``partition["a"]``) instead of ``train_queries`` (``ivf_qmetric`` rebuilt from its manifest)."""
        cfg = config or RoutingConfig()
        docs = _f32(docs, "documents")
        given_metric = cfg.method == "ivf_qmetric" and metric is not None
        if cfg.method in QUERY_FIT_METHODS and train_queries is None and not given_metric:
            raise ScalingNoteError(
                f"routing method {cfg.method!r} needs train_queries (training/pseudo query vectors; CLI: "
                "--train-queries Q.npy)"
            )
        tq = _f32(train_queries, "train_queries") if train_queries is not None else None
        if tq is not None and tq.shape[1] != docs.shape[1]:
            raise ScalingNoteError(f"train_queries have dim {tq.shape[1]}, documents {docs.shape[1]}")
        t0 = time.perf_counter()
        if cfg.method == "hnsw_lean":  # walked in a projection fitted to queries and documents
            assert tq is not None  # QUERY_FIT_METHODS without train_queries were refused above
            lean, info, keep = build_lean(docs, tq, cfg, topk=exact_topk)
            out = cls(cfg, lean, docs, partition={"kth": info.pop("kth")}, info=info, _keep=keep)
        elif cfg.method in GRAPH_METHODS:
            if graph is not None and (
                graph.config.method != "hnsw"
                or graph.ntotal != len(docs)
                or (graph.config.hnsw_m, graph.config.ef_construction) != (cfg.hnsw_m, cfg.ef_construction)
            ):
                raise ScalingNoteError(
                    "graph must be an 'hnsw' index over the same documents with the same hnsw_m and ef_construction"
                )
            out = cls._build_hnsw(docs, cfg, None if graph is None else graph.index)
            t0 -= 0.0 if graph is None else graph.build_s
            if cfg.method == "hnsw_sq_qg":  # on the coded index's own copy of the graph
                assert tq is not None  # QUERY_FIT_METHODS without train_queries were refused above
                out.info["query_edges_added"], out.partition = add_guided_edges(
                    out.index, docs, tq, cfg.query_edges, topk=exact_topk, with_kth=True
                )
        elif cfg.method in ENGINE_METHODS:
            out = cls(cfg, build_engine(docs, cfg), docs)
        else:
            out = cls._build_ivf(docs, cfg, tq, metric)
        out.vectors = docs if vectors is None else vectors
        out.build_s = time.perf_counter() - t0
        return out

    @classmethod
    def _build_hnsw(cls, docs: np.ndarray, cfg: RoutingConfig, index=None) -> RoutedIndex:
        d = docs.shape[1]
        if index is None:
            index = flat_graph(docs, cfg)
        if cfg.method in CODED_GRAPH_METHODS:
            # the graph is built on full-precision vectors, then searched over PQ codes (TMJ's
            # HNSW + PQ serving) or scalar-quantised vectors; the re-rank reads the full-precision ones
            coded = _coded_hnsw(d, cfg)
            rng = np.random.default_rng(cfg.seed)
            n = len(docs)
            coded.train(docs[np.sort(rng.choice(n, cfg.train_size, replace=False))] if n > cfg.train_size else docs)
            index = attach_graph(coded, docs, index)
        return cls(cfg, index, docs)

    @classmethod
    def _build_ivf(
        cls, docs: np.ndarray, cfg: RoutingConfig, tq: np.ndarray | None, metric: np.ndarray | None = None
    ) -> RoutedIndex:
        import faiss

        n, d = docs.shape
        nlist = min(cfg.nlist or max(1, int(round(4 * np.sqrt(n)))), n)
        m = cfg.pq_m or max(1, d // 8)
        if d % m:
            raise ScalingNoteError(f"pq_m={m} must divide the dimension {d}")
        qmetric = cfg.method == "ivf_qmetric" or (cfg.method == "ivf_routed" and cfg.routed_base == "ivf_qmetric")
        rng = np.random.default_rng(cfg.seed)
        sample = np.sort(rng.choice(n, cfg.train_size, replace=False)) if n > cfg.train_size else np.arange(n)
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFPQ(quantizer, d, nlist, m, cfg.pq_bits, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = cfg.seed
        index.cp.niter = cfg.kmeans_iters
        if not qmetric:
            index.train(docs[sample])
            list_of = _assign(docs, quantizer.reconstruct_n(0, nlist), faiss.METRIC_INNER_PRODUCT, cfg)
            from faiss.contrib.ivf_tools import add_preassigned

            add_preassigned(index, docs, list_of)
            part = None
        else:
            list_of, part = _qmetric_partition(docs, tq, nlist, sample, cfg, metric)
            cent = _list_means(docs, list_of, nlist, fallback=part["centroids_orig"])
            quantizer.add(cent)  # routing = <q, mean of the list>: inner products need no transform
            res = docs[sample] - cent[list_of[sample]]
            index.pq.train(np.ascontiguousarray(res))  # residual PQ in the original space
            index.is_trained = True
            from faiss.contrib.ivf_tools import add_preassigned

            add_preassigned(index, docs, list_of)
        if cfg.coarse == "hnsw":
            hq = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
            hq.add(index.quantizer.reconstruct_n(0, nlist))
            index.quantizer = hq
            index.own_fields = False
        keep = (quantizer, hq) if cfg.coarse == "hnsw" else (quantizer,)
        out = cls(cfg, index, docs, list_of=list_of.astype(np.int32), partition=part, _keep=keep)
        if cfg.method == "ivf_routed":
            assert tq is not None  # QUERY_FIT_METHODS without train_queries were refused by build
            out.fit_routes(docs, tq)
        return out

    def fit_routes(self, docs: np.ndarray, tq: np.ndarray) -> None:
        """Routing vectors in the query space. W = ridge map from a query to the mean of its exact
        top ``map_k`` documents; a query goes to the lists whose centroids are nearest (L2, in the
        space the partition was cut in: x' = A x, centroids c'_j) to A W q:
        score_j = 2 <A W q, c'_j> - ||c'_j||^2 = <q, r_j> + b_j with r_j = 2 W^T A c'_j, so
        routing still costs nlist inner products."""
        cfg = self.config
        q = tq[: len(tq)]
        top = exact_topk(docs, q, cfg.map_k)
        w = routing_map(q, docs[top].mean(axis=1), cfg.map_ridge)
        part = self.partition
        if part is None:
            cent, a = self._centroids(), None
        else:
            cent, a = part["centroids"], part["a"]
        ca = cent if a is None else cent @ a
        self.routes = np.ascontiguousarray((2 * ca @ w).astype(np.float32))
        self.route_bias = -(cent.astype(np.float64) ** 2).sum(1).astype(np.float32)
        self.info["map_fit_queries"] = int(len(q))

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def memory_bytes(self) -> int:
        """Bytes of the structure searched in memory: the serialised FAISS index + routing vectors
        + query transform (the full-precision re-rank vectors are not counted: memory-mappable)."""
        import faiss

        if hasattr(self.index, "memory_bytes"):  # another engine's structure measures itself
            return int(self.index.memory_bytes())
        b = int(faiss.serialize_index(self.index).nbytes)
        for extra in (self.routes, self.route_bias if self.routes is not None else None):
            if isinstance(extra, np.ndarray):
                b += int(extra.nbytes)
        return b

    def search(
        self, queries: np.ndarray, k: int, *, nprobe: int = 16, ef_search: int = 64, rerank: int = 0
    ) -> RoutedResult:
        """Top-``k`` by inner product; ``rerank`` > 0: the top ``max(rerank, k)`` candidates are
        re-scored exactly with :attr:`vectors`."""
        import faiss

        q = _f32(queries, "queries")
        if q.shape[1] != self.index.d:
            raise ScalingNoteError(f"queries have dim {q.shape[1]}, the index {self.index.d}")
        depth = max(k, rerank) if rerank else k
        probed = None
        stats: Any = faiss.cvar  # FAISS's global counters; its stub lists none of them
        if self.config.method in GRAPH_METHODS:
            stats.hnsw_stats.reset()
            graph_of(self.index).hnsw.efSearch = max(ef_search, depth)
            scores, ids = self.index.search(q, depth)
            coarse, codes = 0, int(stats.hnsw_stats.ndis)
        elif self.config.method in ENGINE_METHODS:
            scores, ids, coarse, codes = search_engine(self.index, self.config.method, q, depth, nprobe, ef_search)
        else:
            nprobe = min(nprobe, self.index.nlist)
            qx = q
            coarse = self.index.nlist * len(q)
            if self.routes is not None:
                probed = _top_lists(q @ self.routes.T + self.route_bias, nprobe)
            elif self.config.coarse == "hnsw":
                stats.hnsw_stats.reset()
                self._keep[1].hnsw.efSearch = max(2 * nprobe, 64)
                _, probed = self.index.quantizer.search(qx, nprobe)
                coarse = int(stats.hnsw_stats.ndis)
            else:
                _, probed = self.index.quantizer.search(qx, nprobe)
            stats.indexIVF_stats.reset()
            self.index.nprobe = nprobe
            # by-residual IP codes score <q, c_list> + <q, residual>: FAISS takes <q, c_list> from here
            cd = np.einsum("qd,qpd->qp", qx, self._centroids()[probed]).astype(np.float32)
            scores, ids = self.index.search_preassigned(qx, depth, probed, cd)
            codes = int(stats.indexIVF_stats.ndis)
        reranked = 0
        if rerank:
            ids, scores, reranked = _rerank(self.vectors, q, ids, k)
        return RoutedResult(ids[:, :k], scores[:, :k], coarse, codes, reranked, probed)

    def routing_recall(self, result: RoutedResult, exact: np.ndarray) -> float | None:
        """Share of the exact top-k whose list was probed: the recall an exact scan of the probed
        lists would reach (the coarse-routing loss, apart from the codes' quantisation loss)."""
        if result.probed is None or self.list_of is None:
            return None
        hits = [np.isin(self.list_of[e], p).mean() for e, p in zip(exact, result.probed, strict=True)]
        return float(np.mean(hits))

    def remove_ids(self, ids: np.ndarray) -> int:
        """Delete documents by row id (IVF methods: FAISS ``remove_ids``; lists and routing
        vectors stay). HNSW: FAISS has no removal: refused (filter at search and rebuild)."""
        import faiss

        if self.config.method in GRAPH_METHODS:
            raise ScalingNoteError("FAISS HNSW has no remove_ids: filter deleted ids at search time and rebuild")
        if getattr(self.index, "engine", None) is not None:  # SVS / ScaNN: their own in-place delete
            return int(self.index.remove_ids(ids))
        return int(self.index.remove_ids(faiss.IDSelectorBatch(np.asarray(ids, dtype=np.int64))))


def _coded_hnsw(d: int, cfg: RoutingConfig) -> Any:
    """The empty ``IndexHNSWPQ`` / ``IndexHNSWSQ`` of ``cfg`` (inner product), to be trained."""
    import faiss

    if cfg.method in SQ_GRAPH_METHODS:
        return faiss.IndexHNSWSQ(
            d, getattr(faiss.ScalarQuantizer, SQ_TYPES[cfg.sq_bits]), cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT
        )
    m = cfg.pq_m or max(1, d // 8)
    if d % m:
        raise ScalingNoteError(f"pq_m={m} must divide the dimension {d}")
    # faiss's stub lacks the IndexHNSWPQ(d, pq_m, M, nbits, metric) constructor FAISS has
    metric = faiss.METRIC_INNER_PRODUCT
    return faiss.IndexHNSWPQ(d, m, cfg.hnsw_m, cfg.pq_bits, metric)  # type: ignore[call-arg,arg-type]


def _qmetric_partition(
    docs: np.ndarray,
    tq: np.ndarray | None,
    nlist: int,
    sample: np.ndarray,
    cfg: RoutingConfig,
    metric: np.ndarray | None = None,
):
    """Lists cut by k-means in the query metric (x' = A x, :func:`query_metric`; ``metric``: a
    given A): each document's list and ``{"a", "centroids" (x' space), "centroids_orig" (A^-1 c')}``."""
    import faiss

    if metric is None:
        assert tq is not None  # without a given metric, build required train_queries
        a, a_inv = query_metric(tq, cfg.metric_ridge, cfg.metric_mean_weight)
    else:
        a = np.ascontiguousarray(metric, dtype=np.float32)
        a_inv = np.linalg.inv(a.astype(np.float64)).astype(np.float32)
    xp = np.ascontiguousarray(docs @ a)  # A is symmetric: rows x A = (A x)^T
    km = faiss.Kmeans(docs.shape[1], nlist, niter=cfg.kmeans_iters, seed=cfg.seed, max_points_per_centroid=10**9)
    km.train(np.ascontiguousarray(xp[sample]))
    assert km.centroids is not None  # set by train
    list_of = _assign(xp, km.centroids, faiss.METRIC_L2, cfg)
    return list_of, {"a": a, "centroids": km.centroids, "centroids_orig": km.centroids @ a_inv}


def _assign(x: np.ndarray, centroids: np.ndarray, metric: int, cfg: RoutingConfig) -> np.ndarray:
    """Nearest centroid of each row (inner product or L2), exact or through an HNSW graph."""
    import faiss

    d = x.shape[1]
    hnsw = cfg.assign == "hnsw" or (cfg.assign == "auto" and len(x) * len(centroids) > 2e9)
    index: faiss.Index
    if hnsw:
        graph = faiss.IndexHNSWFlat(d, 32, metric)
        graph.hnsw.efSearch = 128
        index = graph
    else:
        index = faiss.IndexFlat(d, metric)
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    out = np.empty(len(x), np.int64)
    for s in range(0, len(x), 65_536):
        out[s : s + 65_536] = index.search(np.ascontiguousarray(x[s : s + 65_536]), 1)[1].ravel()
    return out


def _list_means(x: np.ndarray, list_of: np.ndarray, nlist: int, fallback: np.ndarray) -> np.ndarray:
    """Mean vector of each list (``fallback`` rows for empty lists)."""
    from scipy.sparse import csr_matrix  # why: scipy takes ~2 s to import; only this routing method needs it

    onehot = csr_matrix(
        (np.ones(len(list_of), np.float32), (list_of, np.arange(len(list_of)))), shape=(nlist, len(list_of))
    )
    sums = np.asarray(onehot @ x, dtype=np.float64)
    cnt = np.bincount(list_of, minlength=nlist)
    out = fallback.astype(np.float64).copy()
    out[cnt > 0] = sums[cnt > 0] / cnt[cnt > 0, None]
    return np.ascontiguousarray(out.astype(np.float32))


def _top_lists(scores: np.ndarray, nprobe: int) -> np.ndarray:
    top = np.argpartition(-scores, nprobe - 1, axis=1)[:, :nprobe]
    order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1)
    return np.ascontiguousarray(np.take_along_axis(top, order, 1).astype(np.int64))


def _rerank(vectors: np.ndarray, q: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact inner products of each query with its candidates (rows read from ``vectors``)."""
    out_i = np.full((len(q), k), -1, dtype=np.int64)
    out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    n = 0
    for r, (qi, cand) in enumerate(zip(q, ids, strict=True)):
        cand = cand[cand >= 0]
        if not len(cand):
            continue
        uniq = np.unique(cand)
        s = np.asarray(vectors[uniq], dtype=np.float32) @ qi
        n += len(uniq)
        top = np.argsort(-s)[:k]
        out_i[r, : len(top)], out_s[r, : len(top)] = uniq[top], s[top]
    return out_i, out_s, n


__all__ = [
    "CODED_GRAPH_METHODS",
    "GRAPH_METHODS",
    "GUIDED_METHODS",
    "METHODS",
    "QUERY_FIT_METHODS",
    "SQ_GRAPH_METHODS",
    "SQ_TYPES",
    "Method",
    "RoutedIndex",
    "RoutedResult",
    "RoutingConfig",
    "attach_graph",
    "exact_topk",
    "flat_graph",
    "query_metric",
    "routing_map",
]
