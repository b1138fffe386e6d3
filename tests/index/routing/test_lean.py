"""``hnsw_lean``: the graph walked in a projection fitted to queries and documents, re-ranked at full
width. Tiny random vectors, real FAISS."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index.routing.lean import graph_of, lean_projection
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig, exact_topk


def _unit(x):
    x = np.asarray(x, np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def ood():
    """48-d documents whose variance lives in 12 directions, queries off their distribution (a
    shifted mean along a direction the documents barely use)."""
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((48, 48)))[0].astype(np.float32)
    c = rng.standard_normal((20, 12)).astype(np.float32)
    lat = c[rng.integers(0, 20, 3000)] + 0.5 * rng.standard_normal((3000, 12)).astype(np.float32)
    docs = _unit(lat @ basis[:12] + 0.05 * rng.standard_normal((3000, 48)).astype(np.float32))

    def queries(n):
        lq = c[rng.integers(0, 20, n)] + 0.7 * rng.standard_normal((n, 12)).astype(np.float32)
        return _unit(lq @ basis[:12] + 2.0 * basis[12] + 0.05 * rng.standard_normal((n, 48)).astype(np.float32))

    return docs, queries(1500), queries(200), basis


def test_projection_is_orthonormal_and_keeps_the_directions_queries_carry(ood):
    docs, fit, _, basis = ood
    p = lean_projection(docs, fit, 13)
    assert p.shape == (48, 13)
    np.testing.assert_allclose(p.T @ p, np.eye(13), atol=1e-4)
    kept = np.linalg.norm(basis[:13] @ p, axis=1)  # share of each generating direction inside the projection
    assert kept.min() > 0.95  # the documents' 12 and the queries' own shift direction
    doc_only = lean_projection(docs, docs[:1], 12)  # queries that look like one document add nothing new
    assert np.linalg.norm(basis[12] @ doc_only) < 0.5


def test_projection_refuses_bad_widths_and_no_queries(ood):
    docs, fit, _, _ = ood
    with pytest.raises(ScalingNoteError, match="lean_dim"):
        lean_projection(docs, fit, 49)
    with pytest.raises(ScalingNoteError, match="fitting queries"):
        lean_projection(docs, fit[:0], 8)
    with pytest.raises(ScalingNoteError, match="lean_dim"):
        RoutingConfig(method="hnsw_lean", lean_dim=0)


def test_walk_in_the_projection_then_rerank_finds_the_exact_neighbours(ood):
    docs, fit, test, _ = ood
    cfg = RoutingConfig(method="hnsw_lean", lean_dim=16, hnsw_m=16, query_edges=8)
    idx = RoutedIndex.build(docs, cfg, train_queries=fit)
    truth = exact_topk(docs, test, 10)
    res = idx.search(test, 10, ef_search=128, rerank=64)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, truth, strict=True)])
    assert recall >= 0.95
    assert res.codes > 0 and res.reranked > 0  # projected distances and full-width re-rank both counted
    assert idx.info["query_edges_added"] > 0
    narrow = idx.search(test, 10, ef_search=16, rerank=16)
    assert narrow.codes < res.codes  # efSearch is the knob of the walk
    # 16 one-byte codes + the level-0 graph a document: far below its 48 floats
    assert idx.memory_bytes() < docs.nbytes
    with pytest.raises(ScalingNoteError, match="remove_ids"):
        idx.remove_ids(np.array([0]))


def test_written_index_searches_the_same(ood, tmp_path):
    import faiss

    docs, fit, test, _ = ood
    idx = RoutedIndex.build(docs, RoutingConfig(method="hnsw_lean", lean_dim=12, hnsw_m=8), train_queries=fit)
    faiss.write_index(idx.index, str(tmp_path / "lean.faiss"))
    back = faiss.read_index(str(tmp_path / "lean.faiss"))
    graph_of(back).hnsw.efSearch = graph_of(idx.index).hnsw.efSearch = 64
    np.testing.assert_array_equal(back.search(test, 10)[1], idx.index.search(test, 10)[1])


def test_needs_fitting_queries(ood):
    docs, _, _, _ = ood
    with pytest.raises(ScalingNoteError, match="train_queries"):
        RoutedIndex.build(docs, RoutingConfig(method="hnsw_lean", lean_dim=8))
