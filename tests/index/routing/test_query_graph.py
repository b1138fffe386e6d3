"""Query-guided edges on the FAISS HNSW graph (``hnsw_sq_qg``, and ``hnsw_lean``'s graph inside its
projection): the edges chosen from the fitting queries' exact neighbours, written into level 0 without
breaking the graph, kept through save / load, compaction and the live index's inserts. Tiny random vectors,
real FAISS."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.methods import default_routing, fill_routed
from scalingnote.index.routing.lean import graph_of
from scalingnote.index.routing.query_graph import add_guided_edges, guided_edges
from scalingnote.index.routing.routing import GUIDED_METHODS, RoutedIndex, RoutingConfig, exact_topk, flat_graph

GUIDED = list(GUIDED_METHODS)


def _unit(x):
    x = np.asarray(x, np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _level0(index):
    import faiss

    hnsw = graph_of(faiss.downcast_index(index)).hnsw  # hnsw_lean: the graph inside its projection
    nb = faiss.vector_to_array(hnsw.neighbors)
    off = faiss.vector_to_array(hnsw.offsets).astype(np.int64)
    w = hnsw.nb_neighbors(0)
    return nb[off[:-1, None] + np.arange(w)]


def _holds_edges(index, docs, queries, per_node) -> bool:
    table = _level0(index)
    src, dst = guided_edges(docs, queries, min(per_node, table.shape[1] // 2), topk=exact_topk)
    return bool(len(src)) and all(d in table[s] for s, d in zip(src.tolist(), dst.tolist(), strict=True))


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
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
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
    guided = RoutedIndex.build(
        docs, RoutingConfig(method="hnsw_sq_qg", hnsw_m=8, sq_bits=8, query_edges=8), train_queries=fit
    )
    assert guided.info["query_edges_added"] > 0

    def recall(r):
        res = r.search(held, 10, ef_search=16)
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, truth, strict=True)])

    assert recall(guided) > recall(plain) + 0.01
    with pytest.raises(ScalingNoteError, match="needs train_queries"):
        RoutedIndex.build(docs, RoutingConfig(method="hnsw_sq_qg"))


@pytest.mark.parametrize("method", GUIDED)
def test_state_keeps_the_queries_and_compaction_adds_the_edges_again(ood, method):
    import faiss

    docs, fit, held = ood
    cfg = default_routing(method, len(docs), docs.shape[1])
    index, state = fill_routed(docs, cfg, train_queries=fit)
    assert state["queries"].dtype == np.float16 and state["queries"].shape == fit.shape
    stored = np.asarray(state["queries"], np.float32)  # the edges and thresholds come from the queries as stored
    per = min(cfg.query_edges, graph_of(index).hnsw.nb_neighbors(0) // 2)
    np.testing.assert_allclose(state["kth"], np.sort(stored @ docs.T, axis=1)[:, -(per + 1)], rtol=1e-5)
    clone = faiss.deserialize_index(faiss.serialize_index(index))  # write_index keeps the edges
    assert np.array_equal(_level0(clone), _level0(index))
    clone.reset()
    live = docs[::2]  # compaction: fewer live rows, the trained quantiser kept, edges from the stored queries
    refilled, state2 = fill_routed(live, cfg, state=state, empty=clone)
    assert refilled.ntotal == len(live) and np.array_equal(state2["queries"], state["queries"])
    np.testing.assert_allclose(
        state2["kth"], np.sort(stored @ live.T, axis=1)[:, -(per + 1)], rtol=1e-5
    )  # over the live rows
    assert _holds_edges(refilled, live, stored, cfg.query_edges)
    rebuilt, _ = fill_routed(docs, cfg, state=state)  # rebuild without training queries: the stored ones
    assert rebuilt.ntotal == len(docs) and _holds_edges(rebuilt, docs, stored, cfg.query_edges)
    with pytest.raises(ScalingNoteError, match="keeps no fitting queries"):
        fill_routed(live, cfg, state={}, empty=faiss.deserialize_index(faiss.serialize_index(refilled)))


def test_live_inserts_get_the_edges_of_the_queries_whose_neighbours_they_enter(ood):
    from scalingnote.index.routing.query_graph import add_live_edges

    docs, fit, _ = ood
    n0, per = 1000, 4
    index = flat_graph(docs[:n0], RoutingConfig(method="hnsw", hnsw_m=8))
    add_guided_edges(index, docs[:n0], fit, per, topk=exact_topk)
    index.add(docs[n0:])  # FAISS links the new rows by document distance only
    alive = np.ones(len(docs), bool)
    alive[[3, n0 + 5]] = False  # a dead old row and a dead new row: never an edge's end
    added, kth = add_live_edges(index, docs, fit, per, n0, topk=exact_topk, alive=alive)
    live_rows = np.flatnonzero(alive)
    top = live_rows[np.argsort(-(fit @ docs[live_rows].T), axis=1)[:, : per + 1]]
    hit = np.flatnonzero((top >= n0).any(axis=1))  # the queries a new row entered
    assert added > 0 and 0 < len(hit) < len(fit)
    table = _level0(index)
    src, dst = guided_edges(docs[live_rows], fit[hit], per, topk=exact_topk)
    src, dst = live_rows[src], live_rows[dst]
    assert all(
        d in table[s] for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    )  # their edges, over the live rows
    assert {n0 + 5, 3}.isdisjoint(set(dst.tolist()))
    want = np.sort(fit @ docs[live_rows].T, axis=1)[:, -(per + 1)]
    np.testing.assert_allclose(kth[hit], want[hit], rtol=1e-5)  # the hit queries' thresholds moved up
    untouched = np.setdiff1d(np.arange(len(fit)), hit)
    old = docs[:n0][alive[:n0]]
    np.testing.assert_allclose(kth[untouched], np.sort(fit[untouched] @ old.T, axis=1)[:, -(per + 1)], rtol=1e-5)
    assert (
        add_live_edges(index, docs, fit, per, len(docs), topk=exact_topk, alive=alive, kth=kth)[0] == 0
    )  # nothing new: nothing to do


N_BUILT = 1000  #: rows in the build; the rest of the ``ood`` documents arrive through the live index


def _built_qg(ood, tmp_path, method="hnsw_sq_qg"):
    """An ``method`` (hnsw_sq_qg / hnsw_lean) index directory over the first :data:`N_BUILT` documents (edges
    from the fitting queries) and the documents the live index adds after it."""
    from scalingnote.data import Document
    from scalingnote.index import build_index

    docs, fit, _ = ood
    ids = [f"d{i}" for i in range(len(docs))]
    out = build_index(
        docs[:N_BUILT],
        tmp_path / "qg",
        method=method,
        train_queries=fit,
        doc_ids=ids[:N_BUILT],
        progress=False,
        routing=default_routing(method, N_BUILT, docs.shape[1]),
    )
    return out, [Document(i, i, "", i) for i in ids[N_BUILT:]]


@pytest.mark.parametrize("method", GUIDED)
def test_the_live_index_gives_inserted_documents_their_query_guided_edges(ood, tmp_path, method):
    import shutil

    from scalingnote.live import LiveIndex

    docs, n0 = ood[0], N_BUILT
    out, new = _built_qg(ood, tmp_path, method)
    shutil.copytree(out, tmp_path / "plain")

    cfg = default_routing(method, n0, docs.shape[1])

    def share(index, stored) -> float:
        """Of the edges inserted row -> the pivot of a fitting query it is a neighbour of, the share in level 0."""
        top = np.argsort(-(stored @ docs.T), axis=1)[:, : cfg.query_edges + 1]
        hit = top[(top >= n0).any(axis=1)]  # the queries an inserted row entered
        table = _level0(index)
        return float(np.mean([p in table[r] for r, p in ((int(r), int(h[0])) for h in hit for r in h[1:] if r >= n0)]))

    def streamed(root, guide: bool) -> tuple[float, int]:
        live = LiveIndex.open(root)
        assert live.store._kth is not None  # the build's thresholds: the first insert does not scan every query
        if not guide:
            live.store._guide = None  # FAISS's own links only, as before
        for s in range(0, len(new), 100):  # a stream of batches
            live.upsert(new[s : s + 100], vectors=docs[n0 + s : n0 + s + 100])
        out = (
            share(live.store.dense.index, np.asarray(live.store.routing["queries"], np.float32)),
            live.store.guided_edges_added,
        )
        live.close()
        return out

    guided, added = streamed(out, True)
    plain, none = streamed(tmp_path / "plain", False)
    reader = LiveIndex.open(out, writer=False)
    stored = np.asarray(reader.store.routing["queries"], np.float32)
    reader.close()
    rebuilt = share(
        fill_routed(docs, cfg, train_queries=stored)[0], stored
    )  # every row in the build: the per-document cap applies
    assert added > 0 and none == 0
    assert guided >= rebuilt - 0.05 and guided > plain + 0.3, (guided, rebuilt, plain)


@pytest.mark.parametrize("method", GUIDED)
def test_a_restart_replays_the_inserts_into_the_same_guided_graph(ood, tmp_path, method):
    from scalingnote.live import LiveIndex

    docs, n0 = ood[0], N_BUILT
    out, new = _built_qg(ood, tmp_path, method)
    live = LiveIndex.open(out)
    for s in range(0, len(new), 250):
        live.upsert(new[s : s + 250], vectors=docs[n0 + s : n0 + s + 250])
    live.delete(["d1", "d1200"])
    before, gen = _level0(live.store.dense.index).copy(), live.stats()["generation"]
    live.close()
    again = LiveIndex.open(out)  # the log replayed over the same generation
    assert again.stats()["generation"] == gen and again.store.guided_edges_added > 0
    assert np.array_equal(_level0(again.store.dense.index), before)
    again.close()
