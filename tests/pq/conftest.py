"""The learned-PQ tests use the dense-index fixtures (tiny random towers, a small corpus)."""

from tests.index.conftest import doc_tower, other_bert_dir, query_tower, syn_queries, syn_vectors, tiny_bert_dir, tiny_corpus  # noqa: F401
