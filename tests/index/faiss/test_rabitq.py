"""``ivf_rabitq`` (FAISS IVF RaBitQ FastScan + exact re-rank) as an index method beside the others:
built, saved and loaded through ``build_index`` / ``DenseIndex``, searched with the declared knobs
(nprobe, rerank), rows added by the quantiser's rule and deleted, refilled on compaction, chosen on
validation like any other method. Clustered random vectors, real FAISS."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.faiss.methods import add_rows, default_routing, fill_routed, structure_label
from scalingnote.index.faiss.rabitq import rabitq_bits_within, rabitq_code_bytes
from scalingnote.index.routing.method_tune import choose_method, fastest_within_tie
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig
from scalingnote.index.tune import exact_topk, recall_vs_exact
from tests.helpers.vectors import clustered_docs_and_queries

N, D = 3000, 64


@pytest.fixture(scope="module")
def data():
    return clustered_docs_and_queries(3, N, D)  # documents, (out-of-distribution: noisier) queries


def test_default_sizes_keep_the_codes_within_the_memory_bound():
    cfg = default_routing("ivf_rabitq", 1_000_000, 576)
    assert cfg.method == "ivf_rabitq" and cfg.rabitq_bits == 4 and cfg.nlist == 4000
    assert rabitq_code_bytes(576, 4) <= 0.25 * 4 * 576  # 316 of 576 bytes
    assert rabitq_bits_within(32) == 1 and rabitq_bits_within(128) == 4  # 32-d: 4 bits (44 B) would exceed 32 B
    assert default_routing("ivf_rabitq", 1000, 64, rabitq_bits=2).rabitq_bits == 2  # an option given is kept


def test_recall_rises_with_probes_and_the_refine_reaches_exact(data):
    x, q = data
    cfg = RoutingConfig(method="ivf_rabitq", nlist=32, rabitq_bits=4, seed=0)
    r = RoutedIndex.build(x, cfg)
    exact = exact_topk(x, q, 10)
    runs = [r.search(q, 10, nprobe=p) for p in (1, 4, 32)]
    recalls = [recall_vs_exact(res.ids, exact) for res in runs]
    assert recalls[0] <= recalls[1] <= recalls[2] < 0.99, (
        recalls
    )  # the 4-bit estimate alone misses some of the exact top 10
    assert runs[0].codes < runs[1].codes < runs[2].codes
    full = r.search(q, 10, nprobe=32, rerank=200)  # every list, the top 200 re-scored exactly
    assert recall_vs_exact(full.ids, exact) >= 0.99
    assert full.coarse == 32 * len(q) and full.codes == N * len(q) and full.reranked > 0  # every code scanned once
    assert structure_label(r.index, cfg) == "ivf_rabitq:IVF32,RaBitQfs4,qb8"
    # fewer bits: a coarser estimate, the same probes recover less before the refine
    one = RoutedIndex.build(x, RoutingConfig(method="ivf_rabitq", nlist=32, rabitq_bits=1, seed=0))
    assert recall_vs_exact(one.search(q, 10, nprobe=32).ids, exact) < recalls[2]
    assert one.memory_bytes() < r.memory_bytes()


def test_bad_options_are_refused_before_faiss_sees_them(data):
    x, _ = data
    for field, value, msg in (
        ("rabitq_bits", 12, "rabitq_bits must be one of 1..9"),
        ("rabitq_qb", 0, "rabitq_qb must be in 1..8"),
    ):
        with pytest.raises(ScalingNoteError, match=msg):
            RoutedIndex.build(x[:200], RoutingConfig(method="ivf_rabitq", nlist=4, **{field: value}))


def test_built_saved_loaded_and_served_with_the_knobs_it_declares(tmp_path, data):
    x, q = data
    ids = [f"d{i}" for i in range(N)]
    out = build_index(
        x,
        tmp_path / "rq",
        method="ivf_rabitq",
        routing=RoutingConfig(method="ivf_rabitq", nlist=32, seed=0),
        doc_ids=ids,
        semantic_ids_layers=0,
        progress=False,
    )
    man = json.loads((out / "manifest.json").read_text())
    assert man["factory"] == "ivf_rabitq:IVF32,RaBitQfs4,qb8" and man["routing"]["method"] == "ivf_rabitq"
    idx = DenseIndex.open(out)
    assert idx.has_ivf and not idx.has_hnsw
    exact = exact_topk(x, q, 10)
    served = idx.search(q, 10, nprobe=32, rerank=200)
    assert recall_vs_exact(np.asarray(served.indices), exact) >= 0.99
    with pytest.raises(ScalingNoteError, match="has no HNSW graph"):
        idx.search(q, 10, ef_search=64)  # a knob it does not declare is refused, not ignored
    # the saved index answers as one built in memory with the same config (FAISS's threaded k-means
    # may swap a near-tie: at most a few ids of the 600 differ)
    mem = RoutedIndex.build(x, RoutingConfig(method="ivf_rabitq", nlist=32, seed=0))
    same = np.asarray(idx.search(q, 10, nprobe=4).indices) == mem.search(q, 10, nprobe=4).ids
    assert same.mean() >= 0.98, same.mean()


@pytest.mark.parametrize(
    "method, faiss_class", [("ivf_rabitq", "IndexIVFRaBitQFastScan"), ("ivf_pqfs", "IndexIVFPQFastScan")]
)
def test_rows_are_added_by_the_quantiser_deleted_and_refilled_on_compaction(data, method, faiss_class):
    """Both FastScan IVF methods (RaBitQ and PQ codes): FAISS 1.15.1 writes wrong codes when a FastScan
    IVF is given its rows' lists, so their rows go through FAISS's own add."""
    x, q = data
    cfg = RoutingConfig(method=method, nlist=16, seed=0)
    index, state = fill_routed(x[:2000], cfg)
    add_rows(index, state, x[2000:], np.arange(2000, N, dtype=np.int64))
    r = RoutedIndex(cfg, index, x)
    top = r.search(x[2500:2510], 1, nprobe=16, rerank=50).ids[:, 0]
    assert np.array_equal(top, np.arange(2500, 2510))  # an added row is its own nearest neighbour
    assert r.remove_ids(np.arange(2500, 2510)) == 10
    assert not set(r.search(x[2500:2510], 5, nprobe=16).ids.ravel()) & set(range(2500, 2510))
    # compaction: an emptied copy of the trained index refilled with the live rows
    import faiss

    empty = faiss.clone_index(index)
    empty.reset()
    again, _ = fill_routed(x[:1000], cfg, state=state, empty=empty)
    assert again.ntotal == 1000 and type(faiss.downcast_index(again)).__name__ == faiss_class


def test_chosen_on_validation_by_single_query_latency(data):
    x, q = data
    rep = choose_method(x, q[:40], None, methods=("ivf", "ivf_rabitq"), target=0.95, memory_bound=10.0, seed=0)
    rows = {r["method"]: r for r in rep["methods"]}
    assert set(rows) == {"ivf", "ivf_rabitq"} and rows["ivf_rabitq"]["structure"].startswith("ivf_rabitq:IVF")
    met = [r for r in rows.values() if r["met"]]
    assert met and rep["chosen"]["method"] == fastest_within_tie(met)[0]["method"]
    assert "ms a query alone" in rep["reason"]
