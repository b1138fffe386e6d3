"""The learned-PQ tests use the dense-index fixtures (tiny random towers, a small corpus); the tiny
BERT directories come from tests/conftest.py."""

from tests.index.conftest import doc_tower, query_tower, syn_queries, syn_vectors, tiny_corpus  # noqa: F401
