"""Indexes: resumable sharded corpus encoding, FAISS dense indexes (Flat / IVFPQ / HNSW /
HNSW+PQ / OPQ) with exact re-rank, residual-K-means semantic IDs, hybrid (BM25 + dense) search and
the export adapters that write a learned PQ (:mod:`scalingnote.pq`) into FAISS structures.
BM25 itself lives in :mod:`scalingnote.sparse`.

FAISS is imported lazily (inside the functions that need it).
"""

from scalingnote.index.backends import Backend, get_backend, open_searcher, register_backend
from scalingnote.index.build import IndexConfig, build_index
from scalingnote.index.embeddings import (
    DocumentEncoder,
    Embeddings,
    EncodeResult,
    encode_corpus,
    l2_normalize,
    load_embeddings,
    tower_identity,
)
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.faiss.faiss_utils import code_bytes_per_vector, make_index
from scalingnote.index.layout import check_query_tower, read_manifest
from scalingnote.index.searcher import BM25Searcher, Searcher, SearcherBase, SearchResult, VectorSearcher, search_run
from scalingnote.index.semantic_ids import ResidualKMeans
from scalingnote.index.settings import IndexBuildSettings

__all__ = [
    "BM25Searcher",
    "Backend",
    "get_backend",
    "open_searcher",
    "register_backend",
    "Searcher",
    "SearcherBase",
    "VectorSearcher",
    "search_run",
    "DenseIndex",
    "DocumentEncoder",
    "EncodeResult",
    "IndexBuildSettings",
    "IndexConfig",
    "Embeddings",
    "ResidualKMeans",
    "SearchResult",
    "build_index",
    "check_query_tower",
    "code_bytes_per_vector",
    "encode_corpus",
    "l2_normalize",
    "load_embeddings",
    "make_index",
    "read_manifest",
    "tower_identity",
]
