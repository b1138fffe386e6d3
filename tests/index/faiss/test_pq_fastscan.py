"""``ivf_pqfs`` (FAISS IVF + 4-bit PQ FastScan + exact re-rank) as an index method beside the others:
its default sizes, recall against exact search with and without the re-rank, built, saved, loaded
and searched through ``build_index`` / ``DenseIndex``, and Milvus's SCANN
as its export (rows added, deleted and refilled on compaction: ``test_rabitq.py``, both FastScan
methods). Clustered random
vectors, real FAISS."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.faiss.methods import default_routing, structure_label
from scalingnote.index.milvus.milvus_export import _method_index_type
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig
from scalingnote.index.tune import exact_topk, recall_vs_exact
from tests.helpers.vectors import clustered_docs_and_queries

N, D = 3000, 64


@pytest.fixture(scope="module")
def data():
    return clustered_docs_and_queries(5, N, D)  # documents, (out-of-distribution: noisier) queries


def test_default_sizes_spend_one_4bit_code_a_component_within_the_memory_bound():
    cfg = default_routing("ivf_pqfs", 1_000_000, 576)
    assert cfg.method == "ivf_pqfs" and cfg.pq_m == 576 and cfg.pq_bits == 4 and cfg.nlist == 4000
    assert default_routing("ivf_pqfs", 1000, 64, pq_m=32).pq_m == 32  # an option given is kept
    with pytest.raises(ScalingNoteError, match="pq_m=48 must divide the dimension 64"):
        default_routing("ivf_pqfs", 1000, 64, pq_m=48)


def test_recall_rises_with_probes_and_the_refine_reaches_exact(data):
    x, q = data
    cfg = RoutingConfig(method="ivf_pqfs", nlist=32, seed=0)
    r = RoutedIndex.build(x, cfg)
    exact = exact_topk(x, q, 10)
    runs = [r.search(q, 10, nprobe=p) for p in (1, 4, 32)]
    recalls = [recall_vs_exact(res.ids, exact) for res in runs]
    assert recalls[0] <= recalls[1] <= recalls[2] < 1.0, recalls  # the 4-bit estimate alone misses some
    assert runs[0].codes < runs[1].codes < runs[2].codes
    full = r.search(q, 10, nprobe=32, rerank=200)  # every list, the top 200 re-scored exactly
    assert recall_vs_exact(full.ids, exact) >= 0.99
    assert full.coarse == 32 * len(q) and full.codes == N * len(q) and full.reranked > 0
    assert structure_label(r.index, cfg) == "ivf_pqfs:IVF32,PQ64x4fs"
    # half the codes (two components a code): a coarser estimate, a smaller structure
    half = RoutedIndex.build(x, RoutingConfig(method="ivf_pqfs", nlist=32, pq_m=32, seed=0))
    assert recall_vs_exact(half.search(q, 10, nprobe=32).ids, exact) < recalls[2]
    assert half.memory_bytes() < r.memory_bytes() < 0.25 * x.nbytes


def test_built_saved_loaded_and_served_with_the_knobs_it_declares(tmp_path, data):
    x, q = data
    out = build_index(
        x,
        tmp_path / "fs",
        method="ivf_pqfs",
        routing=RoutingConfig(method="ivf_pqfs", nlist=32, seed=0),
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    man = json.loads((out / "manifest.json").read_text())
    assert man["factory"] == "ivf_pqfs:IVF32,PQ64x4fs" and man["routing"]["method"] == "ivf_pqfs"
    idx = DenseIndex.open(out)
    assert idx.has_ivf and not idx.has_hnsw
    served = idx.search(q, 10, nprobe=32, rerank=200)
    assert recall_vs_exact(np.asarray(served.indices), exact_topk(x, q, 10)) >= 0.99
    with pytest.raises(ScalingNoteError, match="has no HNSW graph"):
        idx.search(q, 10, ef_search=64)  # a knob it does not declare is refused, not ignored


def test_milvus_carries_it_as_scann():
    # Milvus's SCANN is this structure (IVF lists, 4-bit fast-scan PQ, a re-rank); Lite has no fast scan
    assert _method_index_type("auto", "ivf_pqfs", lite=False) == "SCANN"
    assert _method_index_type("auto", "ivf_pqfs", lite=True) == "IVF_SQ8"
