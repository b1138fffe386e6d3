"""Routing for asymmetric towers (scalingnote.index.routing.routing) on tiny random data."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig, exact_topk, query_metric


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def ood_set(seed: int = 0, n: int = 3000, nq: int = 400):
    """Documents vary strongly along dims 0-7 and weakly along 8-15; queries score only with
    dims 8-15 (plus a shared offset): a document-trained partition cuts the wrong directions."""
    rng = np.random.default_rng(seed)
    d = 16
    x = np.zeros((n, d), np.float32)
    x[:, :8] = 3.0 * rng.normal(size=(n, 8))
    x[:, 8:] = 0.5 * rng.normal(size=(n, 8))
    q = np.zeros((nq, d), np.float32)
    q[:, 8:] = rng.normal(size=(nq, 8))
    q[:, 0] = 0.3
    return x, _unit(q[: nq // 2]), _unit(q[nq // 2 :])


def test_query_metric_keeps_inner_products():
    rng = np.random.default_rng(1)
    q, x = rng.normal(size=(50, 8)), rng.normal(size=(70, 8))
    a, a_inv = query_metric(q.astype(np.float32), 0.1)
    np.testing.assert_allclose((q @ a_inv) @ (x @ a).T, q @ x.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(a @ a_inv, np.eye(8), atol=1e-4)


@pytest.mark.parametrize("method", ["ivf", "ivf_qmetric", "ivf_routed"])
def test_full_probe_with_rerank_is_exact_and_counted(method):
    x, train_q, test_q = ood_set()
    idx = RoutedIndex.build(x, RoutingConfig(method=method, nlist=16, pq_m=4), train_queries=train_q)
    truth = exact_topk(x, test_q, 10)
    res = idx.search(test_q, 10, nprobe=16, rerank=len(x))
    assert np.array_equal(np.sort(res.ids, 1), np.sort(truth, 1))
    assert idx.routing_recall(res, truth) == 1.0
    assert res.coarse == 16 * len(test_q)
    assert res.codes == len(x) * len(test_q)  # every list scanned
    assert res.reranked == len(x) * len(test_q)


def test_partial_probe_counts_scanned_lists_and_routing_recall():
    x, train_q, test_q = ood_set()
    idx = RoutedIndex.build(x, RoutingConfig(method="ivf", nlist=16, pq_m=4), train_queries=train_q)
    truth = exact_topk(x, test_q, 10)
    res = idx.search(test_q, 10, nprobe=3, rerank=50)
    sizes = np.bincount(idx.list_of, minlength=16)
    assert res.codes == int(sizes[res.probed].sum())
    assert res.reranked <= 50 * len(test_q)
    hand = np.mean([[idx.list_of[t] in set(p) for t in row] for row, p in zip(truth, res.probed, strict=True)])
    assert idx.routing_recall(res, truth) == pytest.approx(hand)


def test_query_aware_partition_routes_ood_queries_better():
    x, train_q, test_q = ood_set()
    truth = exact_topk(x, test_q, 10)
    rr = {}
    for method in ("ivf", "ivf_qmetric", "ivf_routed"):
        idx = RoutedIndex.build(x, RoutingConfig(method=method, nlist=32, pq_m=4), train_queries=train_q)
        rr[method] = idx.routing_recall(idx.search(test_q, 10, nprobe=4), truth)
    assert rr["ivf_qmetric"] > rr["ivf"] + 0.1, rr
    assert rr["ivf_routed"] > rr["ivf"] + 0.15, rr


def test_hnsw_counts_distances_and_refuses_remove():
    x, train_q, test_q = ood_set(n=800)
    idx = RoutedIndex.build(x, RoutingConfig(method="hnsw", hnsw_m=8))
    res = idx.search(test_q, 10, ef_search=64, rerank=20)
    assert res.coarse == 0 and res.codes > 0 and res.probed is None
    assert idx.routing_recall(res, exact_topk(x, test_q, 10)) is None
    with pytest.raises(ScalingNoteError, match="remove_ids"):
        idx.remove_ids(np.array([0]))


def test_remove_ids_drops_documents_from_ivf():
    x, train_q, test_q = ood_set(n=1000)
    idx = RoutedIndex.build(x, RoutingConfig(method="ivf_qmetric", nlist=8, pq_m=4), train_queries=train_q)
    first = idx.search(test_q[:5], 5, nprobe=8, rerank=1000).ids
    gone = np.unique(first[:, 0])
    assert idx.remove_ids(gone) == len(gone)
    after = idx.search(test_q[:5], 5, nprobe=8, rerank=1000).ids
    assert not np.isin(after, gone).any()


def test_bad_inputs_are_named():
    x, train_q, _ = ood_set(n=500)
    with pytest.raises(ScalingNoteError, match="needs train_queries"):
        RoutedIndex.build(x, RoutingConfig(method="ivf_qmetric", nlist=4, pq_m=4))
    with pytest.raises(ScalingNoteError, match="routing method"):
        RoutingConfig(method="lsh")
    with pytest.raises(ScalingNoteError, match="must divide"):
        RoutedIndex.build(x, RoutingConfig(method="ivf", nlist=4, pq_m=5))
    idx = RoutedIndex.build(x, RoutingConfig(method="ivf", nlist=4, pq_m=4))
    with pytest.raises(ScalingNoteError, match="dim 8"):
        idx.search(np.ones((2, 8), np.float32), 5)
    with pytest.raises(ScalingNoteError, match="NaN"):
        idx.search(np.full((2, 16), np.nan, np.float32), 5)


@pytest.mark.parametrize("method,coarse", [("ivf", "hnsw"), ("ivf_qmetric", "hnsw")])
def test_hnsw_coarse_step_counts_its_distances(method, coarse):
    x, train_q, test_q = ood_set()
    flat = RoutedIndex.build(x, RoutingConfig(method=method, nlist=64, pq_m=4), train_queries=train_q)
    hnsw = RoutedIndex.build(x, RoutingConfig(method=method, nlist=64, pq_m=4, coarse=coarse), train_queries=train_q)
    truth = exact_topk(x, test_q, 10)
    a, b = flat.search(test_q, 10, nprobe=4), hnsw.search(test_q, 10, nprobe=4)
    assert a.coarse == 64 * len(test_q)
    assert 0 < b.coarse
    assert hnsw.routing_recall(b, truth) > 0.9 * flat.routing_recall(a, truth)
    full = hnsw.search(test_q, 10, nprobe=64, rerank=len(x))
    assert np.array_equal(np.sort(full.ids, 1), np.sort(truth, 1))


def test_hnsw_pq_is_small_and_reranks_to_exact_neighbours():
    x, _, test_q = ood_set(n=1500)
    flat = RoutedIndex.build(x, RoutingConfig(method="hnsw", hnsw_m=8))
    pq = RoutedIndex.build(x, RoutingConfig(method="hnsw_pq", hnsw_m=8, pq_m=4, pq_bits=4))
    assert pq.memory_bytes() < flat.memory_bytes()
    truth = exact_topk(x, test_q, 10)
    from scalingnote.index.tune import recall_vs_exact

    res = pq.search(test_q, 10, ef_search=400, rerank=400)
    same_graph = recall_vs_exact(flat.search(test_q, 10, ef_search=400).ids, truth)
    # the re-rank recovers the codes' loss: what is left is the graph's (same graph as the flat one)
    assert recall_vs_exact(res.ids, truth) >= same_graph - 0.02
    assert recall_vs_exact(pq.search(test_q, 10, ef_search=400).ids, truth) < same_graph - 0.1
    assert res.reranked <= 400 * len(test_q) and res.codes > 0


def test_hnsw_assignment_agrees_with_exact_assignment():
    x, train_q, test_q = ood_set()
    flat = RoutedIndex.build(x, RoutingConfig(method="ivf", nlist=32, pq_m=4, assign="flat"))
    graph = RoutedIndex.build(x, RoutingConfig(method="ivf", nlist=32, pq_m=4, assign="hnsw"))
    assert np.mean(flat.list_of == graph.list_of) > 0.97
    res = graph.search(test_q, 10, nprobe=32, rerank=len(x))
    assert np.array_equal(np.sort(res.ids, 1), np.sort(exact_topk(x, test_q, 10), 1))


def test_hnsw_sq_scores_closer_to_exact_than_pq_of_fewer_bytes():
    """4-bit scalar quantisation keeps d/2 bytes per vector (PQ d/8 keeps d/8): without any
    re-rank its top 10 is nearer the exact one, at the same graph, and it is smaller than the flat graph."""
    from scalingnote.index.tune import recall_vs_exact

    x, _, test_q = ood_set(n=1500)
    flat = RoutedIndex.build(x, RoutingConfig(method="hnsw", hnsw_m=8))
    sq = RoutedIndex.build(x, RoutingConfig(method="hnsw_sq", hnsw_m=8, sq_bits=4))
    pq = RoutedIndex.build(x, RoutingConfig(method="hnsw_pq", hnsw_m=8, pq_bits=4))
    assert sq.memory_bytes() < flat.memory_bytes()
    truth = exact_topk(x, test_q, 10)
    r_sq, r_pq = (recall_vs_exact(r.search(test_q, 10, ef_search=200).ids, truth) for r in (sq, pq))
    assert r_sq > r_pq
    with pytest.raises(ScalingNoteError, match="sq_bits"):
        RoutingConfig(method="hnsw_sq", sq_bits=5)
    with pytest.raises(ScalingNoteError, match="remove_ids"):
        sq.remove_ids(np.array([0]))
