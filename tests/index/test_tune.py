"""Search settings chosen on queries (scalingnote.index.tune): the cheapest nprobe / re-rank depth
that reaches a recall@k against exact search, written into the index's search defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.tune import exact_topk, save_search_defaults, tune_search


def _recall(found: np.ndarray, exact: np.ndarray) -> float:  # an oracle independent of the module's
    return float(
        np.mean([len(set(a[: exact.shape[1]]) & set(b)) / exact.shape[1] for a, b in zip(found, exact, strict=True)])
    )


@pytest.fixture(scope="module")
def ivfpq(tmp_path_factory, syn_vectors):
    ids = [f"d{i}" for i in range(len(syn_vectors))]
    return build_index(
        syn_vectors,
        tmp_path_factory.mktemp("tune") / "ivfpq",
        "IVF64,PQ8x4",
        doc_ids=ids,
        semantic_ids_layers=0,
        nprobe=1,
        progress=False,
    )


def test_exact_topk_matches_brute_force_across_chunks(syn_vectors, syn_queries):
    want = np.argsort(-(syn_queries @ syn_vectors.T), axis=1, kind="stable")[:, :10]
    got = exact_topk(syn_vectors, syn_queries, 10, chunk=700)  # 3000 rows in 5 chunks
    assert all(set(a) == set(b) for a, b in zip(got, want, strict=True))


def test_tuning_reaches_the_target_at_the_cheapest_setting(ivfpq, syn_vectors, syn_queries):
    idx = DenseIndex.open(ivfpq)
    tune_q, held_q = syn_queries[:60], syn_queries[60:]
    before = _recall(
        idx.search(held_q, k=10).indices, exact_topk(syn_vectors, held_q, 10)
    )  # the build's nprobe=1, no re-rank
    rep = tune_search(idx, tune_q, k=10, target=0.95)
    c = rep["chosen"]
    assert rep["met"] and c["recall"] >= 0.95
    assert c["cost"] == min(g["cost"] for g in rep["grid"] if g["recall"] >= 0.95)
    # the reported recall is the recall of that setting on the tuning queries
    assert _recall(
        idx.search(tune_q, k=10, nprobe=c["nprobe"], rerank=c["rerank"]).indices, exact_topk(syn_vectors, tune_q, 10)
    ) == pytest.approx(c["recall"], abs=1e-4)
    defaults = save_search_defaults(ivfpq, rep)
    assert defaults["nprobe"] == c["nprobe"] and defaults.get("rerank", 0) == c["rerank"]
    man = json.loads((ivfpq / "manifest.json").read_text())
    assert man["search_tuning"]["chosen"] == c and man["search_defaults"] == defaults
    tuned = DenseIndex.open(ivfpq)
    after = _recall(tuned.search(held_q, k=10).indices, exact_topk(syn_vectors, held_q, 10))  # the defaults, as served
    assert after > before and after >= 0.85  # held-out queries: close to the target, far above the untuned default


def test_rerank_zero_means_none_even_with_a_default(ivfpq, syn_queries):
    idx = DenseIndex.open(ivfpq)
    rep = tune_search(idx, syn_queries[:40], k=10, target=0.99, reranks=(200,))
    save_search_defaults(ivfpq, rep)
    idx = DenseIndex.open(ivfpq)
    assert idx.manifest["search_defaults"]["rerank"] == 200
    raw = idx.search(syn_queries[:5], k=10, rerank=0)
    reranked = idx.search(syn_queries[:5], k=10)
    exact = syn_queries[:5] @ np.asarray(idx.vectors).T
    got = np.take_along_axis(exact, reranked.indices, 1)
    assert np.allclose(reranked.scores, got, atol=1e-5)  # the default re-rank gives exact scores
    assert not np.allclose(raw.scores, np.take_along_axis(exact, raw.indices, 1), atol=1e-5)  # PQ scores without it


def test_unreachable_target_keeps_the_best_setting_and_says_so(ivfpq, syn_queries):
    idx = DenseIndex.open(ivfpq)
    rep = tune_search(idx, syn_queries[:40], k=10, target=1.0, reranks=(0,))  # 4-bit codes alone never give exact order
    assert not rep["met"] and "no setting reached" in rep["reason"]
    assert rep["chosen"]["recall"] == max(g["recall"] for g in rep["grid"])


def test_flat_index_and_bad_arguments(tmp_path, syn_vectors, syn_queries):
    flat = DenseIndex.open(
        build_index(
            syn_vectors,
            tmp_path / "flat",
            "Flat",
            doc_ids=[str(i) for i in range(len(syn_vectors))],
            semantic_ids_layers=0,
            progress=False,
        )
    )
    rep = tune_search(flat, syn_queries[:20], k=10)
    assert rep["met"] and rep["chosen"] == {"rerank": 0, "recall": 1.0, "cost": rep["chosen"]["cost"]}
    with pytest.raises(ScalingNoteError, match="no queries"):
        tune_search(flat, syn_queries[:0])
    with pytest.raises(ScalingNoteError, match="target"):
        tune_search(flat, syn_queries[:5], target=1.5)


def test_hnsw_index_tunes_ef_search(tmp_path, syn_vectors, syn_queries):
    ids = [str(i) for i in range(len(syn_vectors))]
    root = build_index(
        syn_vectors, tmp_path / "hnsw", "HNSW16_PQ8", doc_ids=ids, semantic_ids_layers=0, ef_search=16, progress=False
    )
    idx = DenseIndex.open(root)
    rep = tune_search(idx, syn_queries[:40], k=10, target=0.95)
    c = rep["chosen"]
    assert rep["knob"] == "ef_search" and rep["met"] and c["recall"] >= 0.95
    save_search_defaults(root, rep)
    man = json.loads((root / "manifest.json").read_text())
    assert man["search_defaults"]["ef_search"] == c["ef_search"] and "nprobe" not in man["search_defaults"]
