"""The routed index's build settings (:class:`RoutingConfig`), its method names and the result of
one search (:class:`RoutedResult`); built and searched by
:class:`~scalingnote.index.routing.routing.RoutedIndex`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from scalingnote.errors import ScalingNoteError

Method = Literal[
    "ivf",
    "ivf_qmetric",
    "ivf_routed",
    "ivf_rabitq",
    "ivf_pqfs",
    "scann_soar",
    "svs_vamana",
    "hnsw",
    "hnsw_pq",
    "hnsw_sq",
    "hnsw_sq_qg",
    "hnsw_lean",
]
METHODS: tuple[str, ...] = get_args(Method)
#: searched by walking an HNSW graph (efSearch, no remove_ids); coded: PQ / SQ storage, graph built on
#: full precision; SQ: scalar-quantised; QUERY_FIT: the build needs training / pseudo-query vectors
GRAPH_METHODS: tuple[str, ...] = ("hnsw", "hnsw_pq", "hnsw_sq", "hnsw_sq_qg", "hnsw_lean")
CODED_GRAPH_METHODS: tuple[str, ...] = ("hnsw_pq", "hnsw_sq", "hnsw_sq_qg")
SQ_GRAPH_METHODS: tuple[str, ...] = ("hnsw_sq", "hnsw_sq_qg")
QUERY_FIT_METHODS: tuple[str, ...] = ("ivf_qmetric", "ivf_routed", "hnsw_sq_qg", "hnsw_lean")
#: graphs with query-guided edges: their fitting queries are kept (routing state) for live inserts and compaction
GUIDED_METHODS: tuple[str, ...] = ("hnsw_sq_qg", "hnsw_lean")
#: FAISS scalar quantisers of ``hnsw_sq`` by bits per component
SQ_TYPES = {4: "QT_4bit", 6: "QT_6bit", 8: "QT_8bit"}


@dataclass
class RoutingConfig:
    """How to build a routed index. ``nlist`` None = 4 sqrt(N) rounded (at least 1); ``pq_m`` None = d/8
    (``ivf_pqfs``: d, one 4-bit code a component; its codes are 4-bit whatever ``pq_bits`` says)."""

    method: str = "ivf_qmetric"
    nlist: int | None = None
    pq_m: int | None = None
    pq_bits: int = 8
    hnsw_m: int = 32
    #: bits per component of ``hnsw_sq``'s scalar quantiser (4, 6 or 8)
    sq_bits: int = 4
    #: hnsw_sq_qg: query-guided level-0 edges per document (:mod:`scalingnote.index.routing.query_graph`)
    query_edges: int = 16
    #: hnsw_lean: width of the projection its graph is walked in (:mod:`scalingnote.index.routing.lean`)
    lean_dim: int = 128
    #: ivf_rabitq: code bits per component (1-9) and bits of the query's lookup tables (1-8)
    rabitq_bits: int = 4
    rabitq_qb: int = 8
    #: scann_soar: SOAR's lambda (0: no spilling), dimensions per 4-bit AH block, AH threshold
    scann_soar_lambda: float = 1.5
    scann_dims_per_block: int = 2
    scann_aq_threshold: float = 0.2
    #: svs_vamana: graph degree, construction window and pruning factor alpha (SVS's MIP default)
    svs_degree: int = 32
    svs_window: int = 64
    svs_alpha: float = 0.95
    ef_construction: int = 40
    train_size: int = 131_072
    #: ridge added to the query second moment, relative to its mean eigenvalue (ivf_qmetric)
    metric_ridge: float = 0.05
    #: weight of the query mean in the metric (0: covariance only; 1: second moment)
    metric_mean_weight: float = 0.0
    #: ridge of the query -> document-space routing map (ivf_routed), relative as in ridge_fit
    map_ridge: float = 1e-2
    #: ivf_routed: base partition ("ivf_qmetric" or "ivf")
    routed_base: str = "ivf_qmetric"
    #: neighbours per routing-training query whose mean is the map's target
    map_k: int = 10
    #: IVF coarse step: "flat" (nlist inner products per query) or "hnsw" (an HNSW graph over the
    #: centroids: FAISS ``IndexHNSWFlat`` quantizer, efSearch = max(2 nprobe, 64)); not for ivf_routed
    coarse: str = "flat"
    kmeans_iters: int = 20
    #: list assignment at build: "flat" (exact), "hnsw" (an HNSW over the centroids, efSearch 128:
    #: approximate, cheaper at millions x thousands of lists), "auto" = hnsw above 2e9 pairs
    assign: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ScalingNoteError(f"routing method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.routed_base not in ("ivf", "ivf_qmetric"):
            raise ScalingNoteError(f"routed_base must be 'ivf' or 'ivf_qmetric', got {self.routed_base!r}")
        for name in ("nlist", "pq_m"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ScalingNoteError(f"{name} must be >= 1, got {v}")
        if self.sq_bits not in SQ_TYPES:
            raise ScalingNoteError(f"sq_bits must be one of {', '.join(map(str, SQ_TYPES))}, got {self.sq_bits!r}")
        if self.assign not in ("auto", "flat", "hnsw"):
            raise ScalingNoteError(f"assign must be 'auto', 'flat' or 'hnsw', got {self.assign!r}")
        if self.coarse not in ("flat", "hnsw"):
            raise ScalingNoteError(f"coarse must be 'flat' or 'hnsw', got {self.coarse!r}")
        if self.coarse == "hnsw" and self.method == "ivf_routed":
            raise ScalingNoteError("coarse='hnsw' searches the centroids, not ivf_routed's routing vectors: use 'flat'")
        if self.metric_ridge < 0 or self.map_ridge < 0 or self.query_edges < 1:
            raise ScalingNoteError("metric_ridge and map_ridge must be >= 0, query_edges >= 1")
        if self.lean_dim < 1:
            raise ScalingNoteError(f"lean_dim must be >= 1, got {self.lean_dim}")


@dataclass
class RoutedResult:
    """Top-k ``ids`` [nq, k] (-1 = none), ``scores``, ``ndis`` = distance computations in all
    (coarse + codes + re-rank), split into ``coarse`` / ``codes`` / ``reranked``; ``probed`` =
    the lists searched per query (IVF methods) for the routing recall."""

    ids: np.ndarray
    scores: np.ndarray
    coarse: int
    codes: int
    reranked: int
    probed: np.ndarray | None = None

    @property
    def ndis(self) -> int:
        return self.coarse + self.codes + self.reranked
