"""The routed methods whose structure is another engine's (not FAISS IVF-PQ or HNSW): built and
searched through one pair of functions so :class:`~scalingnote.index.routing.routing.RoutedIndex`,
the method choice and the benchmarks treat them as the other methods.

* ``ivf_rabitq`` — FAISS IVF RaBitQ FastScan (:mod:`scalingnote.index.faiss.rabitq`);
* ``ivf_pqfs`` — FAISS IVF with 4-bit PQ FastScan codes (:mod:`scalingnote.index.faiss.pq_fastscan`);
* ``scann_soar`` — ScaNN's partition tree with SOAR spilling over AH codes (:mod:`scalingnote.index.scann.soar`);
* ``svs_vamana`` — Intel SVS's dynamic Vamana graph over float32 vectors (:mod:`scalingnote.index.svs.vamana`).

The partition methods probe ``nprobe`` partitions; the graph engines (:data:`GRAPH_ENGINES`) walk a beam
of ``ef_search``. Every one can be re-ranked over the full-precision vectors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.index.faiss.faiss_utils import search_ivf_counted
from scalingnote.index.faiss.pq_fastscan import build_ivf_pqfs
from scalingnote.index.faiss.rabitq import build_ivf_rabitq, search_ivf_rabitq
from scalingnote.index.scann.soar import ScannSoar, SoarShape
from scalingnote.index.svs.vamana import SvsVamanaIndex, VamanaShape, search_svs_counted

ENGINE_METHODS: tuple[str, ...] = ("ivf_rabitq", "ivf_pqfs", "scann_soar", "svs_vamana")
#: the engines searched by a graph beam (the ``ef_search`` knob) rather than by probed partitions
GRAPH_ENGINES: tuple[str, ...] = ("svs_vamana",)


def default_nlist(n: int) -> int:
    return max(1, int(round(4 * np.sqrt(n))))


def build_engine(docs: np.ndarray, cfg: Any) -> Any:
    """The built structure of ``cfg.method`` (a :class:`~scalingnote.index.routing.routing.RoutingConfig`)
    over ``docs``."""
    nlist = cfg.nlist or default_nlist(len(docs))
    trained = {"seed": cfg.seed, "train_size": cfg.train_size, "kmeans_iters": cfg.kmeans_iters}
    if cfg.method == "ivf_rabitq":
        return build_ivf_rabitq(docs, nlist, bits=cfg.rabitq_bits, qb=cfg.rabitq_qb, **trained)
    if cfg.method == "ivf_pqfs":
        return build_ivf_pqfs(docs, nlist, m=cfg.pq_m, **trained)
    if cfg.method == "svs_vamana":
        return SvsVamanaIndex.build(docs, VamanaShape(cfg.svs_degree, cfg.svs_window, cfg.svs_alpha))
    shape = SoarShape(nlist, cfg.scann_soar_lambda, cfg.scann_dims_per_block, cfg.scann_aq_threshold, cfg.train_size)
    return ScannSoar.build(docs, shape)


def search_engine(
    index: Any, method: str, q: np.ndarray, depth: int, nprobe: int, ef_search: int = 64
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(scores, ids, coarse distances, codes scanned)`` of a ``depth``-deep search probing ``nprobe``
    partitions (a graph engine: walking a beam of ``ef_search``)."""
    if method == "svs_vamana":
        return search_svs_counted(index, q, depth, ef_search)
    if method == "ivf_rabitq":
        return search_ivf_rabitq(index, q, depth, nprobe)
    if method == "ivf_pqfs":
        return search_ivf_counted(index, q, depth, nprobe)
    return index.search_counted(q, depth, nprobe)


__all__ = ["ENGINE_METHODS", "GRAPH_ENGINES", "build_engine", "search_engine"]
