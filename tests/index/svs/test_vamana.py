"""``svs_vamana`` (Intel SVS's dynamic Vamana graph) as an index method beside the others: recall
against exact search as the beam widens, in-place add and delete, built, saved as ``index.svs/``,
loaded and served through ``build_index`` / ``DenseIndex`` with the knobs it declares, compaction,
the method choice and Milvus's HNSW as its export. Clustered random
vectors, the real SVS library."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.faiss.methods import fill_routed, structure_label
from scalingnote.index.milvus.milvus_export import _method_index_type
from scalingnote.index.routing.method_tune import choose_method
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig
from scalingnote.index.svs.vamana import SvsVamanaIndex, VamanaShape
from scalingnote.index.tune import exact_topk, recall_vs_exact
from tests.helpers.vectors import clustered_docs_and_queries

N, D = 3000, 64


@pytest.fixture(scope="module")
def data():
    return clustered_docs_and_queries(7, N, D)  # documents, (out-of-distribution: noisier) queries


def test_recall_rises_with_the_beam_and_reaches_exact(data):
    x, q = data
    cfg = RoutingConfig(method="svs_vamana", seed=0)
    r = RoutedIndex.build(x, cfg)
    exact = exact_topk(x, q, 10)
    runs = [r.search(q, 10, ef_search=ef) for ef in (10, 40, 400)]
    recalls = [recall_vs_exact(res.ids, exact) for res in runs]
    assert recalls[0] <= recalls[1] <= recalls[2] and recalls[2] >= 0.99, recalls
    assert runs[0].codes < runs[1].codes <= runs[2].codes <= N * len(q)  # the estimate grows with the beam
    assert structure_label(r.index, cfg) == "svs_vamana:Vamana32,Flat"
    # float32 vectors + a 32-degree graph: above a quarter of the floats (module doc)
    assert r.memory_bytes() > x.nbytes


def test_rows_are_added_and_deleted_in_place_and_refilled_on_compaction(data):
    x, q = data
    index = SvsVamanaIndex.build(x[:2000], VamanaShape())
    index.add_with_ids(x[2000:], np.arange(2000, N))
    assert index.ntotal == N
    r = RoutedIndex(RoutingConfig(method="svs_vamana"), index, x)
    top = r.search(x[2500:2510], 1, ef_search=64).ids[:, 0]
    assert np.array_equal(top, np.arange(2500, 2510))  # an added row is its own nearest neighbour
    assert r.remove_ids(np.arange(2500, 2510)) == 10 and index.ntotal == N - 10
    assert index.remove_ids(np.arange(2500, 2510)) == 0  # already gone: skipped, not an error
    assert not set(r.search(x[2500:2510], 5, ef_search=64).ids.ravel()) & set(range(2500, 2510))
    # fewer live rows than asked: padded as FAISS pads
    small = SvsVamanaIndex.build(x[:3], VamanaShape(degree=4, window=8))
    scores, ids = small.search(q[:2], 5)
    assert (ids[:, 3:] == -1).all() and np.isinf(scores[:, 3:]).all() and set(ids[0, :3]) == {0, 1, 2}
    # compaction: the earlier generation's emptied index refilled with the live rows
    again, _ = fill_routed(x[:1000], RoutingConfig(method="svs_vamana"), state={}, empty=index)
    assert again.ntotal == 1000 and again.shape == index.shape


def test_bad_shapes_and_knobs_are_refused(data):
    x, _ = data
    with pytest.raises(ScalingNoteError, match="svs_degree >= 4"):
        VamanaShape(degree=2).check()
    index = SvsVamanaIndex.build(x[:500], VamanaShape())
    with pytest.raises(ScalingNoteError, match=r"expected vectors of shape \(n, 64\)"):
        index.add_with_ids(x[:2, :32], np.arange(500, 502))
    with pytest.raises(ScalingNoteError, match="has no IVF layer"):
        index.search_params(4, None, "svs_vamana:Vamana32,Flat")


def test_built_saved_loaded_and_served_with_the_knobs_it_declares(tmp_path, data):
    x, q = data
    out = build_index(
        x,
        tmp_path / "vam",
        method="svs_vamana",
        routing=RoutingConfig(method="svs_vamana", seed=0),
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    man = json.loads((out / "manifest.json").read_text())
    assert man["factory"] == "svs_vamana:Vamana32,Flat" and man["files"]["index"] == "index.svs"
    assert (out / "index.svs").is_dir() and man["faiss_class"] == "SvsVamanaIndex"
    assert man["code_bytes_per_vector"] == 4 * D and man["search_defaults"] == {"ef_search": 128}
    idx = DenseIndex.open(out)
    assert idx.has_hnsw and not idx.has_ivf
    exact = exact_topk(x, q, 10)
    assert recall_vs_exact(np.asarray(idx.search(q, 10).indices), exact) >= 0.99
    narrow = idx.search(q, 10, ef_search=10)
    assert recall_vs_exact(np.asarray(narrow.indices), exact) <= recall_vs_exact(
        np.asarray(idx.search(q, 10, ef_search=400).indices), exact
    )
    alone = np.vstack([idx.search(q[i : i + 1], 10, ef_search=16).indices for i in range(len(q))])
    assert np.array_equal(alone, idx.search(q, 10, ef_search=16).indices)  # a query's answer is its batch's
    reranked = idx.search(q, 10, ef_search=64, rerank=50)
    assert np.allclose(reranked.scores[:, 0], np.einsum("qd,qd->q", q, x[reranked.indices[:, 0]]), atol=1e-5)
    with pytest.raises(ScalingNoteError, match="has no IVF layer"):
        idx.search(q, 10, nprobe=4)  # a knob it does not declare is refused, not ignored


def test_chosen_on_validation_like_the_others(data):
    x, q = data
    rep = choose_method(x, q[:40], None, methods=("ivf", "svs_vamana"), target=0.95, memory_bound=10.0, seed=0)
    rows = {r["method"]: r for r in rep["methods"]}
    assert rows["svs_vamana"]["knob"] == "ef_search" and rows["svs_vamana"]["structure"] == "svs_vamana:Vamana32,Flat"
    assert rows["svs_vamana"]["memory_ratio"] > 1.0  # above the bound a corpus over 100k documents gets
    assert rep["chosen"]["method"] in rows


def test_milvus_carries_it_as_its_in_memory_graph():
    # Milvus has no in-memory Vamana: HNSW is its graph over float vectors (Lite implements it too)
    assert _method_index_type("auto", "svs_vamana", lite=False) == "HNSW"
    assert _method_index_type("auto", "svs_vamana", lite=True) == "HNSW"
