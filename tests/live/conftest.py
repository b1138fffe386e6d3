"""Fixtures of the live-index tests: a tiny random BERT document tower (real tower code), a tiny
BEIR corpus and an IVF-PQ index with semantic IDs and a BM25 side built over it (seconds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _built_index(tmp_path_factory, tiny_bert_dir):
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower
    from tests.helpers.tiny_data import write_tiny_beir

    root = tmp_path_factory.mktemp("live-base")
    beir = write_tiny_beir(root / "beir", docs_per_topic=8)
    encode_with_tower(tiny_bert_dir, beir, root / "emb", shard_size=32, batch_size=16, progress=False)
    idx = build_index(
        root / "emb", root / "idx", "IVF4,PQ8x4", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False
    )
    return beir, idx


@pytest.fixture
def live_index(tmp_path, _built_index) -> Path:
    """A fresh copy of the built index (each test mutates its own)."""
    _beir, idx = _built_index
    dst = tmp_path / "idx"
    shutil.copytree(idx, dst)
    return dst


@pytest.fixture
def lite(live_index, tmp_path):
    """``(db, index_dir)``: the ``live_index`` fixture's index exported to a Milvus Lite file (a test
    module that requests it first skips itself without pymilvus and milvus-lite)."""
    from scalingnote.index.milvus.milvus_export import export_to_milvus

    db = str(tmp_path / "live.db")
    export_to_milvus(live_index, db, "docs", index_type="FLAT", progress=False)
    return db, live_index
