"""IndexBuildSettings: one settings object for the FAISS build and the Milvus export, taken
whole (``settings=``) or as keywords named like its fields, with the same index either way."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import IndexBuildSettings, build_index
from scalingnote.index.build import IndexConfig
from scalingnote.index.ray.ray_pool import RayPool


@pytest.fixture(scope="module")
def vectors():
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    return x, [f"d{i}" for i in range(len(x))]


def _built(path):
    m = json.loads((path / "manifest.json").read_text())
    return m["inputs_sha256"], np.load(path / "semantic_ids.npy"), (path / "index.faiss").read_bytes()


def test_settings_object_and_keywords_build_the_same_index(tmp_path, vectors):
    x, ids = vectors
    s = IndexBuildSettings(dim=8, semantic_ids_layers=2, codebook_size=4, train_size=200, seed=3)
    a = build_index(x, tmp_path / "a", "IVF4,Flat", doc_ids=ids, settings=s, progress=False)
    b = build_index(
        x,
        tmp_path / "b",
        "IVF4,Flat",
        doc_ids=ids,
        dim=8,
        semantic_ids_layers=2,
        codebook_size=4,
        train_size=200,
        seed=3,
        progress=False,
    )
    (da, sa, ia), (db, sb, ib) = _built(a), _built(b)
    assert da == db and ia == ib
    np.testing.assert_array_equal(sa, sb)
    m = json.loads((a / "manifest.json").read_text())
    assert m["dim"] == 8 and m["n_train"] == 200 and m["seed"] == 3 and m["semantic_ids"]["n_layers"] == 2


def test_keywords_override_the_settings_object(tmp_path, vectors):
    x, ids = vectors
    p = build_index(
        x,
        tmp_path / "c",
        "Flat",
        doc_ids=ids,
        settings=IndexBuildSettings(seed=1, semantic_ids_layers=0),
        seed=5,
        progress=False,
    )
    m = json.loads((p / "manifest.json").read_text())
    assert m["seed"] == 5 and m["semantic_ids"] is None


def test_unknown_keyword_is_a_type_error_naming_the_function(tmp_path, vectors):
    x, ids = vectors
    with pytest.raises(TypeError, match=r"build_index\(\) got an unexpected keyword argument 'semantic_id_layers'"):
        build_index(x, tmp_path / "d", "Flat", doc_ids=ids, semantic_id_layers=2, progress=False)
    with pytest.raises(TypeError, match=r"encode_corpus_ray\(\) got an unexpected keyword argument 'actors'"):
        RayPool.resolve(None, {"actors": 2})


def test_prefix_dim_and_training_rows():
    s = IndexBuildSettings(dim=4, train_size=5, seed=0)
    assert s.prefix_dim(16) == 4 and IndexBuildSettings().prefix_dim(16) == 16
    with pytest.raises(ScalingNoteError, match=r"dim: 4 is not a valid Matryoshka prefix of 3-d embeddings"):
        s.prefix_dim(3)
    rows = s.training_rows(100)
    assert len(rows) == 5 and list(rows) == sorted(set(rows.tolist()))
    np.testing.assert_array_equal(rows, IndexBuildSettings(train_size=5, seed=0).training_rows(100))
    np.testing.assert_array_equal(s.training_rows(3), np.arange(3))
    assert IndexBuildSettings(semantic_ids_layers=0).fit_semantic_ids(np.zeros((4, 2), np.float32)) is None


def test_index_config_is_the_shared_settings_plus_the_faiss_ones():
    cfg = IndexConfig(factory="HNSW8", dim=8, seed=2)
    assert isinstance(cfg, IndexBuildSettings)
    assert IndexBuildSettings.resolve(cfg, {}, "build_index") is cfg
    assert cfg.kwargs() == {
        "dim": 8,
        "semantic_ids_layers": 6,
        "codebook_size": 256,
        "train_size": 100_000,
        "seed": 2,
        "factory": "HNSW8",
        "nprobe": None,
        "ef_search": None,
        "overwrite": False,
        "reuse": False,
        "method": None,
        "train_queries": None,
    }
    assert RayPool(cpus_per_actor=2.5).threads == 2 and RayPool(threads_per_actor=3).threads == 3
