"""Fixtures for the dense-index tests: towers of the tiny random BERT (``tiny_bert_dir``, real
tower code, random weights; in tests/conftest.py), a small corpus, clustered synthetic vectors."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.data import Document, Query

_WORDS = (
    "vitamin deficiency fracture risk dense retrieval vector query document model scaling "
    "product quantization centroid cluster protein cell gene cancer therapy dose trial "
    "language large small fast index search graph neighbour memory compression"
).split()


def make_corpus(n: int = 60, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        title = " ".join(rng.choice(_WORDS, size=3))
        content = " ".join(rng.choice(_WORDS, size=int(rng.integers(5, 30))))
        docs.append(Document(f"doc{i:03d}", title, "", content))
    return docs


def make_queries(n: int = 12, seed: int = 1) -> list[Query]:
    rng = np.random.default_rng(seed)
    return [Query(f"q{i}", " ".join(rng.choice(_WORDS, size=4))) for i in range(n)]


def clustered_vectors(n: int, d: int, n_clusters: int = 20, seed: int = 0, noise: float = 0.35) -> np.ndarray:
    """Unit vectors drawn from a Gaussian mixture (so ANN structure matters)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, d))
    x = centers[rng.integers(0, n_clusters, size=n)] + noise * rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


@pytest.fixture(scope="session")
def doc_tower(tiny_bert_dir):
    from scalingnote.models import load_tower

    return load_tower(tiny_bert_dir, role="document")


@pytest.fixture(scope="session")
def query_tower(tiny_bert_dir):
    from scalingnote.models import load_tower

    return load_tower(tiny_bert_dir, role="query")


@pytest.fixture(scope="session")
def tiny_corpus() -> list[Document]:
    return make_corpus()


@pytest.fixture(scope="session")
def syn_vectors() -> np.ndarray:
    return clustered_vectors(3000, 32)


@pytest.fixture(scope="session")
def syn_queries(syn_vectors) -> np.ndarray:
    rng = np.random.default_rng(7)
    q = syn_vectors[rng.choice(len(syn_vectors), size=100, replace=False)] + 0.2 * rng.normal(
        size=(100, syn_vectors.shape[1])
    )
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="session")
def corpus_factory():
    """``corpus_factory(n, seed)`` -> list of documents."""
    return make_corpus


@pytest.fixture(scope="session")
def queries_factory():
    return make_queries
