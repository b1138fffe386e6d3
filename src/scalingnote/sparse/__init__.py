"""Sparse (lexical) retrieval: the BM25 baseline (bm25s), its saved index and BM25 hard-negative
mining. Sits below :mod:`scalingnote.training` (which mines negatives with it) and below
:mod:`scalingnote.index` (whose hybrid search fuses it with a dense index)."""

from scalingnote.sparse.bm25 import (
    BM25Config,
    BM25Retriever,
    bm25_search,
    chinese_bigrams,
    corpus_fingerprint,
    detect_language,
    open_or_build_bm25,
    sample_hard_negatives,
)

__all__ = [
    "BM25Config",
    "BM25Retriever",
    "bm25_search",
    "chinese_bigrams",
    "corpus_fingerprint",
    "detect_language",
    "open_or_build_bm25",
    "sample_hard_negatives",
]
