"""Query-guided edges on the FAISS HNSW graph (``hnsw_sq_qg``, issue 52 item 2): the edges chosen
from the fitting queries' exact neighbours, written into level 0 without breaking the graph, kept
through save / load and compaction. Tiny random vectors, real FAISS."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index.methods import default_routing, fill_routed
from scalingnote.index.query_graph import add_guided_edges, guided_edges
from scalingnote.index.routing import RoutedIndex, RoutingConfig, exact_topk, flat_graph


def _unit(x):
    x = np.asarray(x, np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _level0(index):
    import faiss

    nb = faiss.vector_to_array(index.hnsw.neighbors)
    off = faiss.vector_to_array(index.hnsw.offsets).astype(np.int64)
    w = index.hnsw.nb_neighbors(0)
    return nb[off[:-1, None] + np.arange(w)]


def _holds_edges(index, docs, queries, per_node) -> bool:
    table = _level0(index)
    src, dst = guided_edges(docs, queries, min(per_node, table.shape[1] // 2), topk=exact_topk)
    return bool(len(src)) and all(d in table[s] for s, d in zip(src.tolist(), dst.tolist()))


@pytest.fixture(scope="module")
def ood():
    """Documents in 16 clusters; queries off the document distribution (a shifted mean), as a
    distilled query tower's vectors are."""
    rng = np.random.default_rng(0)
    c = rng.standard_normal((16, 24)).astype(np.float32)
    docs = _unit(c[rng.integers(0, 16, 1500)] + 0.6 * rng.standard_normal((1500, 24)))
    shift = rng.standard_normal(24).astype(np.float32)

    def queries(n):
        return _unit(c[rng.integers(0, 16, n)] + 0.8 * rng.standard_normal((n, 24)) + 1.5 * shift)

    return docs, queries(1200), queries(200)  # documents, fitting queries, held-out queries


def test_edges_join_each_query_pivot_to_its_other_neighbours_and_back():
    docs = _unit(np.eye(6, dtype=np.float32) + 0.01)
    q = _unit(np.array([[1.0, 0.9, 0.8, 0, 0, 0], [1.0, 0.9, 0.7, 0, 0, 0]], np.float32))  # both: top 0, 1, 2
    src, dst = guided_edges(docs, q, 2, topk=exact_topk)
    pairs = set(zip(src.tolist(), dst.tolist()))
    assert pairs == {(0, 1), (0, 2), (1, 0), (2, 0)}  # pivot 0 -> the rest, the rest -> pivot 0; duplicates merged
    src1, dst1 = guided_edges(docs, q, 1, topk=exact_topk)
    assert np.bincount(src1).max() == 1  # at most per_node edges per document
    with pytest.raises(ScalingNoteError, match="fitting queries"):
        guided_edges(docs, q[:0], 2, topk=exact_topk)


def test_edges_land_in_level_zero_keeping_the_nearest_document_neighbours(ood):
    docs, fit, _ = ood
    index = flat_graph(docs, RoutingConfig(method="hnsw", hnsw_m=8))
    before = _level0(index).copy()
    src, dst = guided_edges(docs, fit, 4, topk=exact_topk)
    added = add_guided_edges(index, docs, fit, 4, topk=exact_topk)
    after = _level0(index)
    assert 0 < added <= len(src)
    width = after.shape[1]
    for s in np.unique(src)[:200]:
        row = after[s]
        valid = row[row >= 0]
        assert len(valid) == len(set(valid.tolist())) <= width and s not in valid  # no duplicates, no self loop
        assert set(dst[src == s].tolist()) <= set(valid.tolist())  # every guided edge is there
        old = before[s][before[s] >= 0]
        kept = [v for v in valid if v in set(old.tolist())]
        if len(kept) < len(old):  # only the farthest document neighbours gave way
            sims = docs[old] @ docs[s]
            assert np.sort(docs[kept] @ docs[s])[0] >= np.sort(sims)[::-1][len(kept) - 1] - 1e-6
    untouched = np.setdiff1d(np.arange(len(docs)), src)
    assert np.array_equal(before[untouched], after[untouched])


def test_query_guided_graph_finds_more_of_the_held_out_queries_neighbours(ood):
    docs, fit, held = ood
    truth = exact_topk(docs, held, 10)
    plain = RoutedIndex.build(docs, RoutingConfig(method="hnsw_sq", hnsw_m=8, sq_bits=8))
    guided = RoutedIndex.build(docs, RoutingConfig(method="hnsw_sq_qg", hnsw_m=8, sq_bits=8, query_edges=8), train_queries=fit)
    assert guided.info["query_edges_added"] > 0

    def recall(r):
        res = r.search(held, 10, ef_search=16)
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, truth)])

    assert recall(guided) > recall(plain) + 0.01
    with pytest.raises(ScalingNoteError, match="needs train_queries"):
        RoutedIndex.build(docs, RoutingConfig(method="hnsw_sq_qg"))


def test_state_keeps_the_queries_and_compaction_adds_the_edges_again(ood):
    import faiss

    docs, fit, held = ood
    cfg = default_routing("hnsw_sq_qg", len(docs), docs.shape[1])
    index, state = fill_routed(docs, cfg, train_queries=fit)
    assert state["queries"].dtype == np.float16 and state["queries"].shape == fit.shape
    clone = faiss.deserialize_index(faiss.serialize_index(index))  # write_index keeps the edges
    assert np.array_equal(_level0(clone), _level0(index))
    clone.reset()
    live = docs[::2]  # compaction: fewer live rows, the trained quantiser kept, edges from the stored queries
    refilled, state2 = fill_routed(live, cfg, state=state, empty=clone)
    assert refilled.ntotal == len(live) and np.array_equal(state2["queries"], state["queries"])
    stored = np.asarray(state["queries"], np.float32)
    assert _holds_edges(refilled, live, stored, cfg.query_edges)
    rebuilt, _ = fill_routed(docs, cfg, state=state)  # rebuild without training queries: the stored ones
    assert rebuilt.ntotal == len(docs) and _holds_edges(rebuilt, docs, stored, cfg.query_edges)
    with pytest.raises(ScalingNoteError, match="keeps no fitting queries"):
        fill_routed(live, cfg, state={}, empty=faiss.deserialize_index(faiss.serialize_index(refilled)))
