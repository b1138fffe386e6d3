"""The service over a routed structure: an hnsw_pq index built with
``build_index(..., method=...)`` is served with its manifest's search defaults (no request flag),
answers as offline search does, and refuses an IVF knob it has no use for."""

from __future__ import annotations

import httpx
import pytest

from scalingnote.index import DenseIndex, build_index
from scalingnote.models import load_tower
from tests.serve.conftest import ready, running_server


def test_service_serves_an_hnsw_pq_index_at_its_defaults(tmp_path, serve_index, tiny_bert_dir):
    idx = build_index(
        serve_index.parent / "emb", tmp_path / "hp", method="hnsw_pq", semantic_ids_layers=0, progress=False
    )
    texts = ["quick brown fox", "river delta", "protein folding"]
    ref = DenseIndex.open(idx, query_tower=load_tower(tiny_bert_dir, role="query")).search(texts, 5)
    with running_server(idx, tiny_bert_dir) as srv:
        health = httpx.get(srv.url + "/healthz", trust_env=False).json()
        assert health["index"]["nlist"] is None
        for text, want in zip(texts, ref.doc_ids, strict=True):
            r = httpx.post(
                srv.url + "/search", json={"query": text, "k": 5, "mode": "dense"}, trust_env=False, timeout=30
            )
            assert r.status_code == 200, r.text
            assert [h["doc_id"] for h in r.json()["results"]] == want
        r = httpx.post(srv.url + "/search", json={"query": texts[0], "k": 5, "nprobe": 4}, trust_env=False, timeout=30)
        assert 400 <= r.status_code < 500 and "nprobe" in r.text


@pytest.mark.parametrize("method", ["ivf_rabitq", "ivf_pqfs", "scann_soar"])
def test_service_serves_a_partitioned_index_at_its_defaults(tmp_path, serve_index, tiny_bert_dir, method):
    """IVF RaBitQ / PQ FastScan and ScaNN's SOAR tree (not a FAISS index): served over HTTP as offline
    search answers, its nprobe and re-rank depth taken per request, an HNSW knob refused."""
    idx = build_index(serve_index.parent / "emb", tmp_path / "rq", method=method, semantic_ids_layers=0, progress=False)
    texts = ["quick brown fox", "river delta", "protein folding"]
    ref = DenseIndex.open(idx, query_tower=load_tower(tiny_bert_dir, role="query")).search(
        texts, 5, nprobe=2, rerank=20
    )
    with running_server(idx, tiny_bert_dir) as srv:
        health = httpx.get(srv.url + "/healthz", trust_env=False).json()
        assert health["index"]["factory"].startswith(f"{method}:") and health["index"]["nlist"]
        for text, want in zip(texts, ref.doc_ids, strict=True):
            r = httpx.post(
                srv.url + "/search",
                json={"query": text, "k": 5, "mode": "dense", "nprobe": 2, "rerank": 20},
                trust_env=False,
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert [h["doc_id"] for h in r.json()["results"]] == want
        r = httpx.post(
            srv.url + "/search", json={"query": texts[0], "k": 5, "ef_search": 32}, trust_env=False, timeout=30
        )
        assert 400 <= r.status_code < 500 and "ef_search" in r.text


def test_service_serves_an_svs_vamana_index_and_its_live_writes(tmp_path, serve_index, tiny_bert_dir):
    """SVS's Vamana graph (not a FAISS index): served over HTTP as offline search answers, its beam
    taken per request, an IVF knob refused."""
    idx = build_index(
        serve_index.parent / "emb", tmp_path / "vam", method="svs_vamana", semantic_ids_layers=0, progress=False
    )
    texts = ["quick brown fox", "river delta", "protein folding"]
    ref = DenseIndex.open(idx, query_tower=load_tower(tiny_bert_dir, role="query")).search(texts, 5, ef_search=40)
    with running_server(idx, tiny_bert_dir) as srv:
        health = httpx.get(srv.url + "/healthz", trust_env=False).json()
        assert health["index"]["factory"] == "svs_vamana:Vamana32,Flat" and health["index"]["nlist"] is None
        for text, want in zip(texts, ref.doc_ids, strict=True):
            r = httpx.post(
                srv.url + "/search",
                json={"query": text, "k": 5, "mode": "dense", "ef_search": 40},
                trust_env=False,
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert [h["doc_id"] for h in r.json()["results"]] == want
        r = httpx.post(srv.url + "/search", json={"query": texts[0], "k": 5, "nprobe": 4}, trust_env=False, timeout=30)
        assert 400 <= r.status_code < 500 and "nprobe" in r.text


def test_service_serves_a_lean_graph_and_its_live_writes(tmp_path, serve_index, tiny_bert_dir):
    """hnsw_lean (a graph walked in a fitted projection, inside a FAISS pre-transform): served over HTTP
    as offline search answers at its beam and re-rank, an IVF knob refused; a document added through the
    service is found by its own text, and one deleted is never returned (the graph's tombstone filter)."""
    import numpy as np
    from fastapi.testclient import TestClient

    from scalingnote.serve import ServeSettings, create_app

    tower = load_tower(tiny_bert_dir, role="query")
    fit = tower.encode_queries([f"query {i} about topic {i % 7}" for i in range(200)], show_progress=False)
    idx = build_index(
        serve_index.parent / "emb",
        tmp_path / "lean",
        method="hnsw_lean",
        train_queries=np.asarray(fit, np.float32),
        semantic_ids_layers=0,
        progress=False,
    )
    texts = ["quick brown fox", "river delta", "protein folding"]
    ref = DenseIndex.open(idx, query_tower=tower).search(texts, 5, ef_search=40, rerank=20)
    admin = {"Authorization": "Bearer " + "t" * 16}
    app = create_app(idx, tiny_bert_dir, ServeSettings(port=0, live=True, admin_token="t" * 16))
    with TestClient(app, client=("127.0.0.1", 50000)) as c:  # a loopback peer (the admin rule)
        assert ready(c)["index"]["factory"].startswith("hnsw_lean:HNSW")
        for text, want in zip(texts, ref.doc_ids, strict=True):
            r = c.post("/search", json={"query": text, "k": 5, "mode": "dense", "ef_search": 40, "rerank": 20})
            assert r.status_code == 200, r.text
            assert [h["doc_id"] for h in r.json()["results"]] == want
        r = c.post("/search", json={"query": texts[0], "k": 5, "nprobe": 4})
        assert 400 <= r.status_code < 500 and "nprobe" in r.text
        doc = {"_id": "capy", "title": "capybara", "text": "capybara grazing by the river at dusk"}
        r = c.post("/documents", json={"documents": [doc]}, headers=admin)
        assert r.status_code == 200, r.text
        hits = c.post("/search", json={"query": doc["text"], "k": 3, "mode": "dense"}).json()["results"]
        assert hits[0]["doc_id"] == "capy"
        gone = ref.doc_ids[0][0]
        assert c.delete(f"/documents/{gone}", headers=admin).status_code == 200
        hits = c.post("/search", json={"query": texts[0], "k": 5, "mode": "dense"}).json()["results"]
        assert gone not in [h["doc_id"] for h in hits] and len(hits) == 5
        app.state.service.index.close()
