"""Indexes: resumable sharded corpus encoding, FAISS dense indexes (Flat / IVFPQ / HNSW /
HNSW+PQ / OPQ) with exact re-rank, residual-K-means semantic IDs, and the BM25 baseline.

FAISS is imported lazily (inside the functions that need it).
"""

# BM25 lexical baseline (scalingnote.index.bm25) — exported by its author below this line.
# from scalingnote.index.bm25 import ...

from scalingnote.index.dense import (
    DenseIndex,
    SearchResult,
    build_index,
    check_query_tower,
    code_bytes_per_vector,
    make_index,
    read_manifest,
)
from scalingnote.index.embeddings import (
    DocumentEncoder,
    EncodeResult,
    Embeddings,
    encode_corpus,
    l2_normalize,
    load_embeddings,
    tower_identity,
)
from scalingnote.index.semantic_ids import ResidualKMeans

__all__ = [
    "DenseIndex",
    "DocumentEncoder",
    "EncodeResult",
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
