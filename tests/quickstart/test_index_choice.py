"""The quick start's index step offers ``hnsw_sq_qg`` and ``hnsw_lean`` only where their graphs can fit the
memory bound, with QKD's unlabelled pool as the edges' pseudo-queries; ``choose_method`` fits the
edges on those, the routers on the training queries. Real FAISS, tiny random vectors."""

from __future__ import annotations

import json

import numpy as np

from scalingnote.index.faiss.methods import default_routing
from scalingnote.index.routing.method_tune import choose_method
from scalingnote.quickstart import QuickstartConfig, index_choice


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_pseudo_queries_only_where_the_query_guided_graph_fits_the_bound_or_none_holds(tmp_path, monkeypatch):
    pool = tmp_path / "pool.jsonl"
    pool.write_text(
        "".join(json.dumps({"_id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(["a b", "", "c d"])),
        encoding="utf-8",
    )
    calls = []
    monkeypatch.setattr(index_choice.runs, "pseudo_queries", lambda cfg, data, out: calls.append(out) or [str(pool)])
    cfg = QuickstartConfig(out=str(tmp_path))
    big = 200_000  # held to the memory bound (above 100k documents)
    wide = index_choice._edge_pseudo_queries(cfg, {}, tmp_path, default_routing("hnsw_sq_qg", big, 384), big, 384)
    assert wide == ["a b", "c d"] and calls == [tmp_path]  # 384-d: HNSW16 + 4-bit codes take 0.22 of the floats
    narrow = index_choice._edge_pseudo_queries(cfg, {}, tmp_path, default_routing("hnsw_sq_qg", big, 128), big, 128)
    assert narrow == [] and len(calls) == 1  # 128-d: the M=8 floor takes 0.28: not a candidate, no pool read
    # 30k documents: no bound, so the 128-d graph is a candidate and its pool is read
    small = index_choice._edge_pseudo_queries(
        cfg, {}, tmp_path, default_routing("hnsw_sq_qg", 30_000, 128), 30_000, 128
    )
    assert small == ["a b", "c d"] and len(calls) == 2


def _ood_vectors():
    """1,500 clustered 64-d documents; 60 validation and 900 pseudo-queries shifted off them."""
    rng = np.random.default_rng(0)
    c = rng.standard_normal((12, 64))
    docs = _unit(c[rng.integers(0, 12, 1500)] + 0.5 * rng.standard_normal((1500, 64)))
    val = _unit(c[rng.integers(0, 12, 60)] + 0.7 * rng.standard_normal((60, 64)) + 1.0)
    return docs, val, _unit(c[rng.integers(0, 12, 900)] + 0.7 * rng.standard_normal((900, 64)) + 1.0)


def test_edges_fit_on_the_edge_queries_and_the_metric_on_the_training_queries():
    docs, val, pseudo = _ood_vectors()
    rep = choose_method(docs, val, None, methods=("hnsw_sq", "hnsw_sq_qg"), target=0.9, edge_queries=pseudo)
    rows = {r["method"]: r for r in rep["methods"]}
    assert "skipped" not in rows["hnsw_sq_qg"] and rows["hnsw_sq_qg"]["structure"].endswith(",QG16")
    assert rep["edge_fit_queries"] == 900
    rep = choose_method(
        docs, val, None, methods=("hnsw_sq", "hnsw_sq_qg", "ivf_qmetric"), target=0.9, edge_queries=pseudo
    )
    assert (
        "skipped" in {r["method"]: r for r in rep["methods"]}["ivf_qmetric"]
    )  # the metric never fits on the edge queries


def test_the_lean_graph_is_a_candidate_where_its_codes_and_graph_fit_the_bound(tmp_path, monkeypatch):
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"_id": "p0", "text": "a b"}) + "\n", encoding="utf-8")
    monkeypatch.setattr(index_choice.runs, "pseudo_queries", lambda cfg, data, out: [str(pool)])
    cfg, big = QuickstartConfig(out=str(tmp_path)), 200_000
    lean576, lean128 = default_routing("hnsw_lean", big, 576), default_routing("hnsw_lean", big, 128)
    # 576-d: a 128-d projection, one byte a component, M=32 with 32 guided edges (0.18 of the floats)
    assert (lean576.lean_dim, lean576.hnsw_m, lean576.query_edges) == (128, 32, 32)
    assert index_choice._graph_fits(lean576, big, 576) and not index_choice._graph_fits(lean128, big, 128)
    both = [default_routing(m, big, 128) for m in ("hnsw_sq_qg", "hnsw_lean")]
    assert index_choice._edge_pseudo_queries(cfg, {}, tmp_path, both, big, 128) == []  # neither fits at 128-d
    assert index_choice._edge_pseudo_queries(cfg, {}, tmp_path, [lean576], big, 576) == ["a b"]


def test_the_lean_graph_fits_its_projection_and_edges_on_the_edge_queries():
    docs, val, pseudo = _ood_vectors()
    rep = choose_method(docs, val, None, methods=("hnsw_lean",), target=0.95, edge_queries=pseudo)
    row = rep["methods"][0]
    assert row["structure"] == "hnsw_lean:HNSW8,Lean32,SQ8,QG8" and row["met"], row
    assert rep["edge_fit_queries"] == 900 and rep["routing"]["lean_dim"] == 32
