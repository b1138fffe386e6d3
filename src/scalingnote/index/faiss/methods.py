"""Routed structures (:mod:`scalingnote.index.routing.routing`) built and served through the normal index
path: ``build_index(..., method=...)`` / ``scalingnote index build --method``.

Every method that can be served is a FAISS index (or, ``svs_vamana`` / ``scann_soar``, shaped as one), so
:class:`~scalingnote.index.DenseIndex`, ``scalingnote search``, ``serve`` and the page search it with the
manifest's search defaults:

* ``ivf``: ``IndexIVFPQ`` trained on documents (today's structure);
* ``ivf_qmetric``: an ``IndexIVFPQ`` whose lists were cut in the query metric x' = A x; the rule
  that puts a document in a list (nearest c' to A x, L2) is kept in ``routing.npz`` (A, c') so
  documents added later (live index) and compaction use the same rule;
* ``ivf_rabitq``: ``IndexIVFRaBitQFastScan`` (``IVF<n>,RaBitQfs<b>``, :mod:`scalingnote.index.faiss.rabitq`),
  re-ranked exactly over the full-precision vectors (FAISS's refine, reading the memory-mapped floats);
* ``ivf_pqfs``: ``IndexIVFPQFastScan`` (``IVF<n>,PQ<m>x4fs``, :mod:`scalingnote.index.faiss.pq_fastscan`):
  4-bit PQ codes scanned in SIMD blocks (one a component by default), re-ranked the same way;
* ``svs_vamana``: Intel SVS's dynamic Vamana graph over float32 vectors (:mod:`scalingnote.index.svs.vamana`),
  not a FAISS index but shaped as one (search, add, in-place delete), saved as ``index.svs/``;
* ``scann_soar``: ScaNN's partition tree with SOAR spilling over AH codes (:mod:`scalingnote.index.scann.soar`),
  shaped as a FAISS IVF (``nprobe`` = leaves searched; in-place add and delete), saved as ``index.scann/``;
* ``hnsw_lean``: an ``IndexPreTransform`` (a projection fitted to queries and documents, then an
  ``IndexHNSWSQ`` over 8-bit codes of the projected rows with query-guided edges,
  :mod:`scalingnote.index.routing.lean`), re-ranked at full width; its fitting queries are kept in
  ``routing.npz`` as ``hnsw_sq_qg``'s are;
* ``hnsw`` / ``hnsw_pq`` / ``hnsw_sq``: ``IndexHNSWFlat`` / ``IndexHNSWPQ`` / ``IndexHNSWSQ`` (graph
  built on full-precision vectors, searched over PQ codes or 4-bit scalar-quantised vectors). FAISS HNSW
  has no ``remove_ids``: the live index keeps a tombstone set and filters it at search; compaction rebuilds
  the graph over the live rows.

``ivf_routed`` (probes chosen by learnt routing vectors through ``search_preassigned``) is not a
plain FAISS search: it is measured by the study, never built here.

The manifest records ``routing = {"method", "config", "file"}``; ``factory`` is the label
``<method>:<FAISS structure>`` (e.g. ``hnsw_pq:HNSW32,PQ72x8``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import l2_normalize
from scalingnote.index.faiss.pq_fastscan import PQFS_BITS, pqfs_label, pqfs_m
from scalingnote.index.faiss.rabitq import rabitq_bits_within, rabitq_label
from scalingnote.index.routing.lean import lean_label, refill_lean
from scalingnote.index.routing.query_graph import add_guided_edges
from scalingnote.index.routing.routing import (
    CODED_GRAPH_METHODS,
    GRAPH_METHODS,
    GUIDED_METHODS,
    SQ_GRAPH_METHODS,
    RoutedIndex,
    RoutingConfig,
    attach_graph,
    flat_graph,
)
from scalingnote.index.scann.soar import soar_label
from scalingnote.index.svs.vamana import svs_label
from scalingnote.index.tune import exact_topk

SERVABLE: tuple[str, ...] = (
    "ivf",
    "ivf_qmetric",
    "ivf_rabitq",
    "ivf_pqfs",
    "hnsw",
    "hnsw_pq",
    "hnsw_sq",
    "hnsw_sq_qg",
    "hnsw_lean",
    "svs_vamana",
    "scann_soar",
)
#: hnsw_sq's graph degrees: its codes take d/2 bytes, so at 128 dimensions only M=4 (a level-0
#: degree of 8) would fit 1/4 of the floats. That graph met recall 0.99 on SciFact's validation
#: queries only at efSearch 512 (0.9901) and kept 0.988 of the exact top 10 on the test queries,
#: the served nDCG@10 0.0085 below the IVF it replaced; at M >= 16 (384 / 576 dimensions) served
#: rows rose. Below M=8 the method is sized at 8 and left above the memory bound (not eligible).
SQ_M_CHOICES: tuple[int, ...] = (32, 16, 8)
#: hnsw_lean's widest projection and its query-guided edges a document (:func:`default_routing`)
LEAN_DIM, LEAN_EDGES = 128, 32
#: the construction beam of every HNSW graph the index step builds (FAISS's default is 40; hnswlib's
#: and Milvus's 200): a better-connected graph reaches the same recall at a smaller efSearch. Measured at
#: a million 576-d vectors (``benchmarks/results/ood_efconstruction.json``): hnsw_lean64 built at 200 took
#: 1.6x the build time of 40 and served recall 0.99 (chosen on validation) at 1.76x its single-query QPS
GRAPH_EF_CONSTRUCTION = 200
ROUTING_FILE = "routing.npz"


def default_routing(
    method: str, n: int, dim: int, *, seed: int = 0, train_size: int = 131_072, **over: Any
) -> RoutingConfig:
    """The quick start's sizes for ``method`` over ``n`` x ``dim`` vectors: ~4 sqrt(n) lists (at most
    n/39, FAISS's 39 training points per centroid), one PQ sub-quantiser per 8 dimensions (the
    largest divisor of ``dim`` at most dim/8), 8-bit codes from 10k vectors on (4-bit below: 8-bit
    PQ needs 256 centroids x 39 points per sub-space)."""
    if method not in SERVABLE:
        raise ScalingNoteError(
            f"index method must be one of {', '.join(SERVABLE)}, got {method!r}"
            + (" (ivf_routed needs its own routed search: not servable)" if method == "ivf_routed" else "")
        )
    nlist = max(4, min(4096, int(4 * math.sqrt(n)), n // 39)) if n >= 4 else 1
    m = max(k for k in range(1, max(1, dim // 8) + 1) if dim % k == 0)
    bits = 8 if n >= 10_000 else 4
    base: dict[str, Any] = dict(
        method=method, nlist=min(nlist, n), pq_m=m, pq_bits=bits, seed=seed, train_size=train_size
    )
    if method == "hnsw_pq":
        base["hnsw_m"] = hnsw_m_within(dim, m * bits / 8)
    if method == "ivf_rabitq":  # the most code bits (<= 4) within the memory bound: 4 from 112 dimensions up
        base["rabitq_bits"] = over.get("rabitq_bits") or rabitq_bits_within(dim)
    if method == "ivf_pqfs":  # one 4-bit code a component: dim / 2 bytes, 1/8 of the floats
        base.update(pq_m=pqfs_m(dim, over.get("pq_m")), pq_bits=PQFS_BITS)
    if method in SQ_GRAPH_METHODS:  # sq_bits per component (4: dim / 2 bytes); M >= 8 (see SQ_M_CHOICES)
        base["hnsw_m"] = hnsw_m_within(
            dim, (over.get("sq_bits") or RoutingConfig.sq_bits) * dim / 8, choices=SQ_M_CHOICES
        )
    if method == "hnsw_lean":
        # a projection to at most 128 dimensions (half the width below 256), one byte a projected component, the
        # largest M whose graph + codes fit the bound and 32 guided edges where the level-0 list has room (M >= 32:
        # the ood_routing rows that met recall 0.99 at a million documents)
        lean = int(over.get("lean_dim") or min(LEAN_DIM, max(1, dim // 2)))
        m_lean = int(over.get("hnsw_m") or hnsw_m_within(dim, lean, choices=SQ_M_CHOICES))
        base.update(lean_dim=lean, hnsw_m=m_lean, query_edges=min(LEAN_EDGES, m_lean))
    if method in GRAPH_METHODS:
        base["ef_construction"] = GRAPH_EF_CONSTRUCTION
    base.update({k: v for k, v in over.items() if v is not None})
    return RoutingConfig(**base)


def query_edge_variants(cfg: RoutingConfig) -> list[RoutingConfig]:
    """``hnsw_sq_qg``'s candidates for the tuner: ``cfg`` and, where the graph's level-0 lists have
    room (at most half of the 2M slots go to query-guided edges), twice its edges per document (16 and
    32 at M=32: on KUAKE-QTR's recipe towers 32 edges met recall 0.99 at 3.3% of the corpus scanned
    where 16 needed 4.1%, an earlier `benchmarks.ood_routing` run). Same memory: the edges overwrite
    document neighbours. The tuner keeps whichever is cheaper on validation."""
    out = [cfg]
    if cfg.method == "hnsw_sq_qg" and 2 * cfg.query_edges <= cfg.hnsw_m:
        out.append(dataclasses.replace(cfg, query_edges=2 * cfg.query_edges))
    return out


def hnsw_m_within(dim: int, code_bytes: float, bound: float = 0.25, choices: tuple[int, ...] = (32, 16, 8, 4)) -> int:
    """The largest HNSW ``M`` whose graph + codes stay within ``bound`` of the float32 vectors
    (the index step's memory bound): FAISS keeps 2M 4-byte neighbours per vector at level 0, ~M/(M-1) of
    that over the upper levels, and 12 bytes of level bookkeeping. At 384 dimensions M=32 takes
    0.22 of the floats; at 128 (the quick start's default width) 0.57, so M=8 (0.19)."""
    for m in choices:
        if graph_memory_ratio(m, code_bytes, dim) <= bound:
            return m
    return choices[-1]


def graph_memory_ratio(m: int, code_bytes: float, dim: int) -> float:
    """An HNSW graph of degree ``m`` + ``code_bytes`` per vector, as a share of the float32 vectors
    (the estimate :func:`hnsw_m_within` sizes by; within 0.01 of the serialised index at 32k)."""
    return (8.0 * m * m / max(1, m - 1) + 12 + code_bytes) / (4.0 * dim)


def sq_graph_ratio(cfg: RoutingConfig, dim: int) -> float:
    """:func:`graph_memory_ratio` of an ``hnsw_sq`` / ``hnsw_sq_qg`` config (codes: sq_bits per component;
    ``hnsw_lean``: one byte a projected component)."""
    if cfg.method == "hnsw_lean":
        return graph_memory_ratio(cfg.hnsw_m, cfg.lean_dim, dim)
    return graph_memory_ratio(cfg.hnsw_m, cfg.sq_bits * dim / 8, dim)


def routing_from(
    entry: RoutingConfig | dict[str, Any] | None, method: str, n: int, dim: int, seed: int, train_size: int
) -> RoutingConfig:
    """A :class:`RoutingConfig` for ``method``: ``entry`` (a config or the manifest's dict) or the defaults."""
    if isinstance(entry, RoutingConfig):
        cfg = entry
    elif isinstance(entry, dict):
        names = {f.name for f in dataclasses.fields(RoutingConfig)}
        unknown = sorted(set(entry) - names)
        if unknown:
            raise ScalingNoteError(f"routing config: unknown field(s) {', '.join(unknown)}")
        cfg = RoutingConfig(**{**entry, "method": method})
    else:
        cfg = default_routing(method, n, dim, seed=seed, train_size=train_size)
    if cfg.method != method:
        cfg = dataclasses.replace(cfg, method=method)
    if method not in SERVABLE:
        default_routing(method, n, dim)  # raises the message
    return cfg


def train_query_vectors(train_queries: str | Path | np.ndarray | None, dim: int) -> np.ndarray | None:
    """Training-query vectors (an array or a ``.npy`` file), cut to the indexed prefix and normalised."""
    if train_queries is None:
        return None
    if isinstance(train_queries, (str, Path)):
        try:
            train_queries = np.load(train_queries)
        except (OSError, ValueError) as e:
            raise ScalingNoteError(f"{train_queries}: cannot read training-query vectors ({e})") from None
    q = np.asarray(train_queries, dtype=np.float32)
    if q.ndim != 2 or q.shape[0] == 0 or q.shape[1] < dim:
        raise ScalingNoteError(f"train_queries: expected a non-empty (n, >= {dim}) array, got shape {q.shape}")
    return np.ascontiguousarray(l2_normalize(q[:, :dim]))


def structure_label(index: Any, cfg: RoutingConfig) -> str:
    """``<method>:<FAISS structure>``, e.g. ``ivf_qmetric:IVF181,PQ72x8`` or ``hnsw_pq:HNSW32,PQ72x8``."""
    import faiss

    if cfg.method == "svs_vamana":
        return f"{cfg.method}:{svs_label(index)}"
    if cfg.method == "scann_soar":
        return f"{cfg.method}:{soar_label(index)}"
    if cfg.method == "hnsw_lean":
        return f"{cfg.method}:{lean_label(index, cfg)}"
    idx: Any = faiss.downcast_index(index)  # the stub types it as the base Index (no nlist)
    d = int(idx.d)
    m = cfg.pq_m or max(1, d // 8)
    if cfg.method == "ivf_rabitq":
        desc = rabitq_label(int(idx.nlist), cfg.rabitq_bits, cfg.rabitq_qb)
    elif cfg.method == "ivf_pqfs":
        desc = pqfs_label(int(idx.nlist), pqfs_m(d, cfg.pq_m))
    elif isinstance(idx, faiss.IndexIVF):
        desc = f"IVF{idx.nlist},PQ{m}x{cfg.pq_bits}"
    elif cfg.method == "hnsw_pq":
        desc = f"HNSW{cfg.hnsw_m},PQ{m}x{cfg.pq_bits}"
    elif cfg.method in SQ_GRAPH_METHODS:
        desc = f"HNSW{cfg.hnsw_m},SQ{cfg.sq_bits}" + (f",QG{cfg.query_edges}" if cfg.method == "hnsw_sq_qg" else "")
    else:
        desc = f"HNSW{cfg.hnsw_m},Flat"
    return f"{cfg.method}:{desc}"


def fill_routed(
    vectors: np.ndarray,
    cfg: RoutingConfig,
    *,
    train_queries: np.ndarray | None = None,
    state: dict[str, np.ndarray] | None = None,
    empty: Any = None,
) -> tuple[Any, dict[str, np.ndarray]]:
    """The filled FAISS index of ``cfg.method`` over ``vectors`` and its routing state (arrays
    saved as ``routing.npz``: ``a`` and ``centroids`` for ivf_qmetric; the fitting queries (float16)
    and their thresholds ``kth`` for hnsw_sq_qg / hnsw_lean; nothing otherwise).

    ``empty``: a trained, emptied index of an earlier generation (compaction): the documents go to
    lists by the stored rule (``state``), the HNSW graph is built again over the live vectors (and
    hnsw_sq_qg's query-guided edges from the stored queries) and the trained codebooks are kept.
    Else a fresh build (``state["a"]`` / ``state["queries"]``: rebuild with the stored query metric
    or queries when there are no training queries)."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if empty is not None:
        return _refill(x, cfg, empty, dict(state or {}))
    metric = None if train_queries is not None or not state else state.get("a")
    if train_queries is None and cfg.method in GUIDED_METHODS and state and "queries" in state:
        train_queries = state["queries"]
    if cfg.method in GUIDED_METHODS and train_queries is not None:
        # the edges from the queries as stored (float16), as compaction makes them
        train_queries = np.asarray(np.asarray(train_queries, np.float16), np.float32)
    r = RoutedIndex.build(x, cfg, train_queries=train_queries, metric=metric)
    out: dict[str, np.ndarray] = {}
    if cfg.method == "ivf_qmetric":
        assert r.partition is not None  # the build keeps ivf_qmetric's partition
        out = {
            "a": np.asarray(r.partition["a"], np.float32),
            "centroids": np.asarray(r.partition["centroids"], np.float32),
        }
    elif cfg.method in GUIDED_METHODS:
        # kth: each query's (edges + 1)-th best score, where the live index's inserts start
        assert r.partition is not None  # the build keeps the guided graphs' thresholds
        out = {"queries": np.asarray(train_queries, np.float16), "kth": np.asarray(r.partition["kth"], np.float32)}
    return r.index, out


def _refill(
    x: np.ndarray, cfg: RoutingConfig, empty: Any, state: dict[str, np.ndarray]
) -> tuple[Any, dict[str, np.ndarray]]:
    """(the refilled index, the routing state: the guided graphs' ``kth`` over the new rows)."""
    import faiss

    if getattr(empty, "engine", None) is not None:  # SVS / ScaNN: a new graph / tree over the live rows, same shape
        empty.reset()
        empty.add(x)
        return empty, state
    if cfg.method in GUIDED_METHODS and "queries" not in state:
        raise ScalingNoteError(
            f"{cfg.method}: the routing state keeps no fitting queries: cannot add the query-guided edges again"
        )
    if cfg.method == "hnsw_lean":  # the same projection and codes, a new graph, the stored queries' edges
        lean, kth = refill_lean(empty, x, np.asarray(state["queries"], np.float32), cfg, topk=exact_topk)
        return lean, {**state, "kth": kth}
    index = faiss.downcast_index(empty)
    if isinstance(index, faiss.IndexIVF):
        lists = assign_lists(state, index, x)
        _add_preassigned(index, x, lists, np.arange(len(x), dtype=np.int64))
        return index, state
    if cfg.method in CODED_GRAPH_METHODS:  # the trained PQ / SQ of the earlier generation encodes the live vectors
        index = attach_graph(index, x, flat_graph(x, cfg))
        if cfg.method == "hnsw_sq_qg":
            _, kth = add_guided_edges(
                index, x, np.asarray(state["queries"], np.float32), cfg.query_edges, topk=exact_topk, with_kth=True
            )
            state = {**state, **kth}
        return index, state
    index.add(x)  # hnsw (flat storage): the graph over the live vectors
    return index, state


def assign_lists(state: dict[str, np.ndarray] | None, ivf: Any, x: np.ndarray) -> np.ndarray:
    """Each row's inverted list by the rule the lists were cut with: ivf_qmetric = the nearest
    list centroid c' to A x (L2, the query metric); otherwise the nearest quantiser centroid by
    inner product (what FAISS's own ``add`` does)."""
    import faiss

    x = np.ascontiguousarray(x, dtype=np.float32)
    if state and "a" in state and "centroids" in state:
        xp = np.ascontiguousarray(x @ state["a"])  # A is symmetric
        _, lists = faiss.knn(xp, np.ascontiguousarray(state["centroids"], dtype=np.float32), 1, metric=faiss.METRIC_L2)
        return lists.ravel().astype(np.int64)
    _, lists = ivf.quantizer.search(x, 1)
    return lists.ravel().astype(np.int64)


def _add_preassigned(ivf: Any, x: np.ndarray, lists: np.ndarray, ids: np.ndarray) -> None:
    import faiss
    from faiss.contrib.ivf_tools import add_preassigned

    if isinstance(faiss.downcast_index(ivf), faiss.IndexIVFFastScan):
        # FAISS 1.15's FastScan IVFs (ivf_rabitq, ivf_pqfs) leave wrong codes when given their lists (add_core);
        # their lists are the quantiser's own, which add_with_ids assigns the same way
        ivf.add_with_ids(x, ids)
        return

    add_preassigned(ivf, x, lists, ids=ids)


def add_rows(index: Any, state: dict[str, np.ndarray] | None, x: np.ndarray, ids: np.ndarray) -> None:
    """Add ``x`` with FAISS ids ``ids`` to an IVF index by the lists' own rule (:func:`assign_lists`)."""
    import faiss

    ivf = faiss.extract_index_ivf(index)
    _add_preassigned(
        ivf, np.ascontiguousarray(x, dtype=np.float32), assign_lists(state, ivf, x), np.asarray(ids, dtype=np.int64)
    )


def save_state(root: Path, state: dict[str, np.ndarray]) -> str | None:
    """Write ``routing.npz`` into ``root`` (None: nothing to keep)."""
    if not state:
        return None
    # numpy's stub checks **arrays against savez's allow_pickle: bool
    np.savez(root / ROUTING_FILE, **state)  # type: ignore[arg-type]
    return ROUTING_FILE


def load_state(root: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The routing state an index directory keeps (None: a plain index or a method without one)."""
    entry = manifest.get("routing") or {}
    if not entry.get("file"):
        return None
    path = Path(root) / entry["file"]
    try:
        with np.load(path) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, KeyError) as e:
        raise ScalingNoteError(
            f"{path}: cannot read the routing state of method {entry.get('method')!r} ({e})"
        ) from None


def manifest_entry(cfg: RoutingConfig, file: str | None, train_queries: int | None) -> dict[str, Any]:
    return {"method": cfg.method, "config": dataclasses.asdict(cfg), "file": file, "train_queries": train_queries}


__all__ = [
    "ROUTING_FILE",
    "SERVABLE",
    "add_rows",
    "assign_lists",
    "default_routing",
    "fill_routed",
    "graph_memory_ratio",
    "load_state",
    "manifest_entry",
    "query_edge_variants",
    "routing_from",
    "save_state",
    "sq_graph_ratio",
    "structure_label",
    "train_query_vectors",
]
