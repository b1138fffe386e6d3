"""``scann_soar`` (ScaNN partition tree + SOAR spilling over AH codes, exact re-rank) as a routed
method and an index method beside the others: built, searched with the partitions knob, measured,
rows added and deleted in place, built, saved as ``index.scann/``, loaded and served through
``build_index`` / ``DenseIndex`` with the knobs it declares, compaction,
Milvus's SCANN as its export, its refusals. Real ScaNN (scann-core)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.faiss.methods import fill_routed
from scalingnote.index.milvus.milvus_export import _method_index_type
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig
from scalingnote.index.scann.soar import ScannSoar, SoarShape
from scalingnote.index.tune import exact_topk, recall_vs_exact

pytest.importorskip("scann", reason="the scann-core package")

N, D = 4000, 64


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    c = rng.standard_normal((40, D)).astype(np.float32)
    x = c[rng.integers(0, 40, N)] + 0.6 * rng.standard_normal((N, D)).astype(np.float32)
    q = 0.3 * c[rng.integers(0, 40, 50)] + rng.standard_normal((50, D)).astype(
        np.float32
    )  # queries off the documents' clusters
    return x / np.linalg.norm(x, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)


def test_leaves_knob_spill_and_refine(data):
    x, q = data
    soar = RoutedIndex.build(x, RoutingConfig(method="scann_soar", nlist=64, seed=0))
    plain = RoutedIndex.build(x, RoutingConfig(method="scann_soar", nlist=64, scann_soar_lambda=0.0, seed=0))
    exact = exact_topk(x, q, 10)
    runs = [soar.search(q, 10, nprobe=p) for p in (2, 8, 64)]
    recalls = [recall_vs_exact(r.ids, exact) for r in runs]
    assert recalls[0] < recalls[2] and recalls[0] <= recalls[1], recalls
    assert runs[0].codes < runs[1].codes < runs[2].codes and runs[2].coarse == 64 * len(q)
    assert soar.index.spill > 0.9 and plain.index.spill == 0.0  # one spilled copy a document with SOAR, none without
    assert recall_vs_exact(soar.search(q, 10, nprobe=64, rerank=200).ids, exact) >= 0.99  # every leaf + exact re-rank
    # SOAR: at the same leaves, the spilled assignments bring more of the exact top 10 among the candidates
    for p in (2, 4, 8):
        assert recall_vs_exact(soar.search(q, 10, nprobe=p, rerank=100).ids, exact) > recall_vs_exact(
            plain.search(q, 10, nprobe=p, rerank=100).ids, exact
        )
    # the same build after another one in the same process: the same tree (seeded k-means++)
    RoutedIndex.build(x[::7], RoutingConfig(method="scann_soar", nlist=16, seed=0))
    again = RoutedIndex.build(x, RoutingConfig(method="scann_soar", nlist=64, seed=0))
    assert np.array_equal(again.search(q, 10, nprobe=4).ids, soar.search(q, 10, nprobe=4).ids)
    ratio = soar.memory_bytes() / (N * D * 4)
    assert 0 < ratio < 0.5 and plain.memory_bytes() < soar.memory_bytes()


def test_refusals_are_clear(data):
    x, q = data
    with pytest.raises(ScalingNoteError, match="scann_dims_per_block must be 1, 2 or 4"):
        RoutedIndex.build(x[:500], RoutingConfig(method="scann_soar", nlist=8, scann_dims_per_block=3))
    with pytest.raises(ScalingNoteError, match="at least 16 documents"):
        RoutedIndex.build(x[:5], RoutingConfig(method="scann_soar", nlist=2))
    r = RoutedIndex.build(x[:500], RoutingConfig(method="scann_soar", nlist=8, seed=0))
    with pytest.raises(ScalingNoteError, match="has no HNSW graph"):
        r.index.search_params(None, 32, "scann_soar:Tree8,AH2,SOAR1.5")
    with pytest.raises(ScalingNoteError, match=r"expected vectors of shape \(n, 64\)"):
        r.index.add_with_ids(x[:2, :32], np.arange(500, 502))


def test_rows_are_added_and_deleted_in_place_and_refilled_on_compaction(data):
    x, q = data
    shape = SoarShape(nlist=32)
    index = ScannSoar.build(x[:3000], shape)
    index.add_with_ids(x[3000:], np.arange(3000, N))  # assigned by the trained tree, with their spill
    assert index.ntotal == N
    r = RoutedIndex(RoutingConfig(method="scann_soar", nlist=32), index, x)
    top = r.search(x[3500:3510], 1, nprobe=32, rerank=50).ids[:, 0]
    assert np.array_equal(top, np.arange(3500, 3510))  # an added row is its own nearest neighbour
    assert r.remove_ids(np.arange(3500, 3510)) == 10 and index.ntotal == N - 10
    assert index.remove_ids(np.arange(3500, 3510)) == 0  # already gone: skipped, not an error
    assert not set(r.search(x[3500:3510], 5, nprobe=32).ids.ravel()) & set(range(3500, 3510))
    # ScaNN moved the last datapoints into the deleted slots: every other row is still found as itself
    moved = r.search(x[N - 10 :], 1, nprobe=32, rerank=50).ids[:, 0]
    assert np.array_equal(moved, np.arange(N - 10, N))
    # compaction: the earlier generation's emptied index refilled with the live rows (a new tree)
    again, _ = fill_routed(x[:1000], RoutingConfig(method="scann_soar", nlist=32), state={}, empty=index)
    assert again.ntotal == 1000 and again.shape == shape


def test_built_saved_loaded_and_served_with_the_knobs_it_declares(tmp_path, data):
    x, q = data
    out = build_index(
        x,
        tmp_path / "sc",
        method="scann_soar",
        routing=RoutingConfig(method="scann_soar", nlist=32, seed=0),
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    man = json.loads((out / "manifest.json").read_text())
    assert man["factory"] == "scann_soar:Tree32,AH2,SOAR1.5" and man["files"]["index"] == "index.scann"
    assert man["nlist"] == 32 and man["search_defaults"] == {"nprobe": 16} and man["faiss_class"] == "ScannSoar"
    idx = DenseIndex.open(out)
    assert idx.has_ivf and not idx.has_hnsw
    exact = exact_topk(x, q, 10)
    full = idx.search(q, 10, nprobe=32, rerank=200)
    assert recall_vs_exact(np.asarray(full.indices), exact) >= 0.99
    assert np.allclose(full.scores[:, 0], np.einsum("qd,qd->q", q, x[full.indices[:, 0]]), atol=1e-5)
    # a query's answer does not depend on the batch it comes in (ScaNN's batched kernels would make it)
    alone = np.vstack([idx.search(q[i : i + 1], 10, nprobe=2).indices for i in range(len(q))])
    assert np.array_equal(alone, idx.search(q, 10, nprobe=2).indices)
    narrow = recall_vs_exact(np.asarray(idx.search(q, 10, nprobe=1).indices), exact)
    assert narrow < recall_vs_exact(np.asarray(idx.search(q, 10, nprobe=32).indices), exact)
    with pytest.raises(ScalingNoteError, match="has no HNSW graph"):
        idx.search(q, 10, ef_search=64)  # a knob it does not declare is refused, not ignored


def test_milvus_carries_it_as_scann():
    assert _method_index_type("auto", "scann_soar", lite=False) == "SCANN"
    assert _method_index_type("auto", "scann_soar", lite=True) == "IVF_SQ8"
