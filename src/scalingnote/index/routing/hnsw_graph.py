"""The FAISS HNSW graph the graph methods share: built once over full-precision vectors
(:func:`flat_graph`), then attached to a coded index's storage (:func:`attach_graph`), so that
``hnsw_pq`` / ``hnsw_sq`` / ``hnsw_sq_qg`` and ``hnsw_lean`` walk the same kind of graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.index.routing.routing_config import RoutingConfig


def flat_graph(docs: np.ndarray, cfg: RoutingConfig) -> Any:
    """An ``IndexHNSWFlat`` (inner product, ``cfg.hnsw_m``, ``cfg.ef_construction``) over ``docs``."""
    import faiss

    index = faiss.IndexHNSWFlat(docs.shape[1], cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = cfg.ef_construction
    index.add(docs)
    return index


def attach_graph(coded: Any, docs: np.ndarray, graph: Any) -> Any:
    """``coded`` (a trained ``IndexHNSWPQ`` / ``IndexHNSWSQ``) with ``docs`` encoded into its storage
    and ``graph``'s HNSW (built on the full-precision ``docs``) as its graph."""
    coded.storage.add(docs)
    coded.hnsw = graph.hnsw
    coded.ntotal = graph.ntotal
    return coded


__all__ = ["attach_graph", "flat_graph"]
