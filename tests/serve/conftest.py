"""Fixtures for the service tests: a tiny BERT tower used zero-shot on both sides, a tiny
BEIR corpus, an IVF-PQ index with semantic IDs built from it, and a running service."""

from __future__ import annotations

import pytest

from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="session")
def serve_bert_dir(tmp_path_factory):
    from scalingnote.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("serve-models") / "tiny-bert", "bert", seed=0)


@pytest.fixture(scope="session")
def serve_other_bert_dir(tmp_path_factory):
    """Another tiny BERT (different random weights): an incompatible embedding space."""
    from scalingnote.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("serve-models") / "tiny-bert-other", "bert", seed=1)


@pytest.fixture(scope="session")
def serve_beir(tmp_path_factory):
    return write_tiny_beir(tmp_path_factory.mktemp("serve-beir") / "toy", docs_per_topic=8)


@pytest.fixture(scope="session")
def serve_index(tmp_path_factory, serve_bert_dir, serve_beir):
    """IVF4,PQ8x4 over the 48 tiny documents, 2 semantic-ID layers; the embeddings record the
    corpus path, so the service finds the titles without --corpus."""
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower

    root = tmp_path_factory.mktemp("serve-index")
    encode_with_tower(serve_bert_dir, serve_beir, root / "emb", shard_size=32, batch_size=16, progress=False)
    return build_index(root / "emb", root / "idx", "IVF4,PQ8x4", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False)
