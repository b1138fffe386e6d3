"""FAISS dense indexes: build/save/open, search, re-rank, semantic IDs, tower checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index, encode_corpus

FACTORIES = ["Flat", "IVF16,PQ8x8", "HNSW16", "HNSW16_PQ8", "OPQ8,IVF16,PQ8"]
TRAIN_SIZE = {"OPQ8,IVF16,PQ8": 1000}  # OPQ training is the slow part; keep the test fast


def exact_topk(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


def recall_vs_exact(res_idx: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(res_idx, truth, strict=True)]))


@pytest.fixture(scope="module")
def ids(syn_vectors):
    return [f"d{i}" for i in range(len(syn_vectors))]


@pytest.fixture(scope="module")
def built(tmp_path_factory, syn_vectors, ids):
    root = tmp_path_factory.mktemp("indexes")
    out = {}
    for f in FACTORIES:
        out[f] = build_index(
            syn_vectors,
            root / f.replace(",", "_"),
            f,
            doc_ids=ids,
            train_size=TRAIN_SIZE.get(f, 100_000),
            semantic_ids_layers=3,
            codebook_size=16,
            seed=0,
            progress=False,
        )
    return out


def test_flat_matches_exact_search_and_round_trips(built, syn_vectors, syn_queries, ids):
    idx = DenseIndex.open(built["Flat"])
    res = idx.search(syn_queries, k=10)
    truth = exact_topk(syn_vectors, syn_queries, 10)
    np.testing.assert_array_equal(res.indices, truth)
    assert res.doc_ids[0] == [ids[i] for i in truth[0]]
    np.testing.assert_allclose(res.scores, np.take_along_axis(syn_queries @ syn_vectors.T, truth, 1), atol=1e-5)
    # re-rank on a flat index changes nothing
    rr = idx.search(syn_queries, k=10, rerank=50)
    np.testing.assert_array_equal(rr.indices, truth)
    # a second open gives the same answers; unpacking gives (scores, doc_ids, semantic_ids)
    scores, doc_ids, sem = DenseIndex.open(built["Flat"]).search(syn_queries, k=10)
    np.testing.assert_allclose(scores, res.scores)
    assert doc_ids == res.doc_ids and sem.shape == (len(syn_queries), 10, 3)


@pytest.mark.parametrize("factory", FACTORIES[1:])
def test_rerank_improves_or_equals_recall(built, factory, syn_vectors, syn_queries):
    idx = DenseIndex.open(built[factory])
    truth = exact_topk(syn_vectors, syn_queries, 10)
    plain = recall_vs_exact(idx.search(syn_queries, k=10).indices, truth)
    rr = idx.search(syn_queries, k=10, rerank=100)
    reranked = recall_vs_exact(rr.indices, truth)
    assert reranked >= plain
    assert reranked > 0.8, (factory, plain, reranked)
    # re-ranked scores are exact inner products, sorted
    exact = np.einsum("qd,qkd->qk", syn_queries, syn_vectors[rr.indices])
    np.testing.assert_allclose(rr.scores, exact, atol=1e-5)
    assert np.all(np.diff(rr.scores, axis=1) <= 1e-7)


def test_manifest_contents(built, syn_vectors):
    for f, path in built.items():
        m = json.loads((path / "manifest.json").read_text())
        assert m["format"] == "scalingnote-index/1"
        assert m["factory"] == f and m["metric"] == "inner_product" and m["normalized"] is True
        assert m["dim"] == 32 and m["source_dim"] == 32 and m["n_vectors"] == len(syn_vectors)
        assert m["seed"] == 0 and m["n_train"] == min(TRAIN_SIZE.get(f, 100_000), len(syn_vectors))
        assert m["faiss_version"] and "numpy" in m["versions"]
        # each timing is rounded to 1 ms; the whole build covers its timed parts
        parts = m["train_seconds"] + m["add_seconds"] + m["semantic_ids_seconds"]
        assert m["build_seconds"] > 0 and m["build_seconds"] >= parts - 0.002, (f, m["build_seconds"], parts)
        assert m["index_bytes"] == (path / "index.faiss").stat().st_size
        assert m["semantic_ids"]["n_layers"] == 3 and m["semantic_ids"]["codebook_sizes"] == [16, 16, 16]
        assert (
            (path / "vectors.npy").is_file()
            and (path / "doc_ids.json").is_file()
            and (path / "semantic_ids.npy").is_file()
        )
    code = {f: json.loads((p / "manifest.json").read_text())["code_bytes_per_vector"] for f, p in built.items()}
    assert code == {"Flat": 128, "IVF16,PQ8x8": 8, "HNSW16": 128, "HNSW16_PQ8": 8, "OPQ8,IVF16,PQ8": 8}
    m = json.loads((built["IVF16,PQ8x8"] / "manifest.json").read_text())
    assert m["compression"] == 16.0 and m["search_defaults"] == {"nprobe": 16}
    m = json.loads((built["HNSW16"] / "manifest.json").read_text())
    assert m["search_defaults"] == {"ef_search": 128}


def test_semantic_ids_are_returned_for_hits(built, syn_queries):
    idx = DenseIndex.open(built["HNSW16"])
    res = idx.search(syn_queries[:5], k=7)
    stored = np.load(built["HNSW16"] / "semantic_ids.npy")
    np.testing.assert_array_equal(res.semantic_ids, stored[res.indices])
    model = idx.semantic_id_model()
    np.testing.assert_array_equal(model.assign(np.asarray(idx.vectors[:50])), stored[:50])


def test_search_parameters_per_call(built, syn_vectors, syn_queries):
    truth = exact_topk(syn_vectors, syn_queries, 10)
    ivf = DenseIndex.open(built["OPQ8,IVF16,PQ8"])  # through the OPQ pre-transform
    r1 = recall_vs_exact(ivf.search(syn_queries, 10, nprobe=1, rerank=100).indices, truth)
    r16 = recall_vs_exact(ivf.search(syn_queries, 10, nprobe=16, rerank=100).indices, truth)
    assert r16 > r1
    hnsw = DenseIndex.open(built["HNSW16"])
    e1 = recall_vs_exact(hnsw.search(syn_queries, 10, ef_search=1).indices, truth)
    e200 = recall_vs_exact(hnsw.search(syn_queries, 10, ef_search=200).indices, truth)
    assert e200 >= e1 and e200 > 0.95
    with pytest.raises(ScalingNoteError, match="no IVF layer"):
        hnsw.search(syn_queries, 10, nprobe=4)
    with pytest.raises(ScalingNoteError, match="no HNSW graph"):
        ivf.search(syn_queries, 10, ef_search=4)
    flat = DenseIndex.open(built["Flat"])
    with pytest.raises(ScalingNoteError, match="no IVF layer"):
        flat.search(syn_queries, 10, nprobe=4)


def test_k_larger_than_corpus_and_query_checks(tmp_path, syn_vectors, syn_queries):
    path = build_index(
        syn_vectors[:5],
        tmp_path / "tiny",
        "Flat",
        doc_ids=list("abcde"),
        semantic_ids_layers=2,
        codebook_size=4,
        progress=False,
    )
    idx = DenseIndex.open(path)
    res = idx.search(syn_queries[:2], k=8)
    assert res.scores.shape == (2, 8) and all(len(d) == 5 for d in res.doc_ids)
    assert np.all(res.indices[:, 5:] == -1) and np.all(np.isneginf(res.scores[:, 5:]))
    assert np.all(res.semantic_ids[:, 5:] == -1)
    run = res.to_run(["q1", "q2"])
    assert set(run["q1"]) == set("abcde")
    with pytest.raises(ScalingNoteError, match="index dim is 32"):
        idx.search(syn_queries[:, :20], k=3)
    with pytest.raises(ScalingNoteError, match="query tower"):
        idx.search(["a text query"], k=3)


def test_matryoshka_prefix(tmp_path, syn_vectors, syn_queries, ids):
    path = build_index(
        syn_vectors, tmp_path / "m16", "Flat", doc_ids=ids, dim=16, semantic_ids_layers=0, progress=False
    )
    idx = DenseIndex.open(path)
    assert idx.vectors.shape == (len(syn_vectors), 16)
    np.testing.assert_allclose(np.linalg.norm(idx.vectors, axis=1), 1.0, atol=1e-5)
    prefix = syn_vectors[:, :16] / np.linalg.norm(syn_vectors[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(idx.vectors, prefix, atol=1e-6)
    # full-dim queries are cut to the prefix; prefix queries are accepted as they are
    a = idx.search(syn_queries, k=5)
    b = idx.search(syn_queries[:, :16], k=5)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.semantic_ids is None and json.loads((path / "manifest.json").read_text())["matryoshka_prefix"] is True
    with pytest.raises(ScalingNoteError, match="Matryoshka"):
        build_index(syn_vectors, tmp_path / "bad", "Flat", doc_ids=ids, dim=64, progress=False)


def test_build_errors_are_clear_and_leave_nothing(tmp_path, syn_vectors, ids):
    with pytest.raises(ScalingNoteError, match="cannot build"):
        build_index(syn_vectors, tmp_path / "x", "IVFxx,Flat", doc_ids=ids, progress=False)
    with pytest.raises(ScalingNoteError, match="training on 100 vectors failed"):
        build_index(syn_vectors, tmp_path / "x", "IVF256,Flat", doc_ids=ids, train_size=100, progress=False)
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary directory left behind
    bad = syn_vectors[:10].copy()
    bad[7, 3] = np.nan
    with pytest.raises(ScalingNoteError, match="row 7 .*'d7'"):
        build_index(bad, tmp_path / "x", "Flat", doc_ids=ids[:10], progress=False)
    with pytest.raises(ScalingNoteError, match="duplicate"):
        build_index(syn_vectors[:3], tmp_path / "x", "Flat", doc_ids=["a", "b", "a"], progress=False)
    build_index(syn_vectors[:50], tmp_path / "y", "Flat", doc_ids=ids[:50], semantic_ids_layers=0, progress=False)
    with pytest.raises(ScalingNoteError, match="already exists"):
        build_index(syn_vectors[:50], tmp_path / "y", "Flat", doc_ids=ids[:50], progress=False)
    build_index(
        syn_vectors[:60],
        tmp_path / "y",
        "HNSW8",
        doc_ids=ids[:60],
        semantic_ids_layers=0,
        overwrite=True,
        progress=False,
    )
    assert len(DenseIndex.open(tmp_path / "y")) == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y"]
    with pytest.raises(ScalingNoteError, match="not an index directory"):
        DenseIndex.open(tmp_path)


def test_train_sample_is_seeded(tmp_path, syn_vectors, syn_queries, ids):
    a = build_index(
        syn_vectors,
        tmp_path / "a",
        "IVF16,PQ8x8",
        doc_ids=ids,
        train_size=1000,
        seed=5,
        semantic_ids_layers=0,
        progress=False,
    )
    b = build_index(
        syn_vectors,
        tmp_path / "b",
        "IVF16,PQ8x8",
        doc_ids=ids,
        train_size=1000,
        seed=5,
        semantic_ids_layers=0,
        progress=False,
    )
    assert (a / "index.faiss").read_bytes() == (b / "index.faiss").read_bytes()
    assert json.loads((a / "manifest.json").read_text())["n_train"] == 1000


# --------------------------------------------------------------------------- with real towers


@pytest.fixture(scope="module")
def tower_index(tmp_path_factory, doc_tower, tiny_corpus):
    root = tmp_path_factory.mktemp("tower_index")
    encode_corpus(doc_tower, tiny_corpus, root / "emb", shard_size=25, progress=False)
    return build_index(root / "emb", root / "idx", "HNSW8", semantic_ids_layers=2, codebook_size=4, progress=False)


def test_query_tower_search_and_identity(tower_index, doc_tower, query_tower, tiny_corpus):
    m = json.loads((tower_index / "manifest.json").read_text())
    assert m["tower"]["fingerprint"] == doc_tower.fingerprint and m["tower"]["compat_id"] == doc_tower.compat_id
    assert m["embeddings_dir"].endswith("emb")
    idx = DenseIndex.open(tower_index, query_tower=query_tower)
    res = idx.search(["vitamin deficiency fracture", "dense retrieval index"], k=5, rerank=20)
    assert len(res.doc_ids) == 2 and all(len(d) == 5 for d in res.doc_ids)
    assert set(res.doc_ids[0]) <= {d.id for d in tiny_corpus}
    # the same as searching with the precomputed query vectors
    qv = query_tower.encode_queries(["vitamin deficiency fracture", "dense retrieval index"], show_progress=False)
    np.testing.assert_array_equal(idx.search(qv, k=5, rerank=20).indices, res.indices)


def test_mismatched_query_tower_is_refused(tower_index, other_bert_dir, tiny_bert_dir, doc_tower):
    from scalingnote.models import load_tower

    other = load_tower(other_bert_dir, role="query")
    with pytest.raises(ScalingNoteError, match="not compatible") as ei:
        DenseIndex.open(tower_index, query_tower=other)
    assert other.compat_id in str(ei.value) and doc_tower.compat_id in str(ei.value)
    # same embedding space (compat id) but a different output dim
    narrow = load_tower(tiny_bert_dir, role="query", dim=16)
    narrow.compat_id = doc_tower.compat_id
    with pytest.raises(ScalingNoteError, match="16-d") as ei:
        DenseIndex.open(tower_index, query_tower=narrow)
    assert "index dim is 32" in str(ei.value)


def test_index_from_raw_vectors_cannot_check_a_tower(built, query_tower):
    with pytest.raises(ScalingNoteError, match="no document-tower compat id"):
        DenseIndex.open(built["Flat"], query_tower=query_tower)
