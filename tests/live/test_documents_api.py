"""``POST /documents`` / ``DELETE /documents/{id}`` / live ``/metrics`` / the ``/admin/reload``
overlap check, on a running service over a live tiny index."""

from __future__ import annotations

import httpx
import pytest

from scalingnote.serve import BackgroundServer, ServeSettings, create_app, metric_value, parse_metrics

TOKEN = "live-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def server(live_index, tiny_bert_dir):
    app = create_app(
        live_index, tiny_bert_dir, ServeSettings(port=0, admin_token=TOKEN, max_wait_ms=2, reload_min_overlap=0.9)
    )
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        yield srv


def _search(url, q, mode="bm25", k=10):
    r = httpx.post(url + "/search", json={"query": q, "k": k, "mode": mode}, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_documents_upsert_delete_and_metrics(server):
    url = server.url
    doc = {"_id": "api1", "title": "narwhal tusk", "text": "the narwhal swims"}
    assert (
        httpx.post(url + "/documents", json={"documents": [doc]}, trust_env=False).status_code == 401
    )  # admin token needed
    r = httpx.post(url + "/documents", json={"documents": [doc]}, headers=AUTH, trust_env=False)
    assert r.status_code == 200 and r.json()["upserted"] == 1, r.text
    hits = _search(url, "narwhal")
    assert (
        [h["doc_id"] for h in hits] == ["api1"]
        and hits[0]["title"] == "narwhal tusk"
        and len(hits[0]["semantic_id"]) == 2
    )
    assert "api1" in [h["doc_id"] for h in _search(url, "narwhal tusk", mode="hybrid", k=48)]
    # upsert replaces: the old text is gone
    r = httpx.post(
        url + "/documents",
        json=[{"_id": "api1", "title": "beluga", "text": "white whale"}],
        headers=AUTH,
        trust_env=False,
    )
    assert r.status_code == 200 and r.json()["replaced"] == 1
    assert _search(url, "narwhal") == [] and [h["doc_id"] for h in _search(url, "beluga")] == ["api1"]
    # a batch with one bad record changes nothing (422 naming the position and the field)
    bad = [{"_id": "api2", "text": "fine"}, {"_id": 3, "text": "int id"}]
    r = httpx.post(url + "/documents", json={"documents": bad}, headers=AUTH, trust_env=False)
    assert r.status_code == 422 and "line 1" in r.json()["detail"] and "'_id'" in r.json()["detail"], r.text
    assert _search(url, "fine") == []
    # delete
    assert httpx.delete(url + "/documents/api1", headers=AUTH, trust_env=False).status_code == 200
    assert _search(url, "beluga") == []
    assert httpx.delete(url + "/documents/api1", headers=AUTH, trust_env=False).status_code == 404
    m = parse_metrics(httpx.get(url + "/metrics", trust_env=False).text)
    assert metric_value(m, "scalingnote_live_documents") == 48
    assert metric_value(m, "scalingnote_live_added_share") == pytest.approx(1 / 48, abs=1e-4)
    assert metric_value(m, "scalingnote_live_documents_total", op="upsert") == 2
    assert (
        0.0 < metric_value(m, "scalingnote_live_recall_estimate") <= 1.0
    )  # computed in the ingest thread after a write


def test_reload_refused_below_the_overlap_threshold(server, tiny_bert_dir, other_bert_dir):
    url = server.url
    for q in ("fox quick", "dense retrieval", "vitamin risk"):
        _search(url, q, mode="dense")
    ok = httpx.post(
        url + "/admin/reload", json={"query_tower": str(tiny_bert_dir)}, headers=AUTH, trust_env=False, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["overlap_check"]["overlap@10"] == 1.0, ok.text
    # a tower of another space is refused on its compat id before any overlap is measured
    r = httpx.post(
        url + "/admin/reload", json={"query_tower": str(other_bert_dir)}, headers=AUTH, trust_env=False, timeout=60
    )
    assert r.status_code == 409 and r.json()["error"] == "incompatible_query_tower"


def test_reload_low_overlap_keeps_the_old_tower(server):
    """A tower with the running one's compat id but other neighbours: the overlap is measured on
    the recent queries and the reload refused (threshold 0.9 here); the old tower keeps serving."""
    import numpy as np

    from scalingnote.serve.documents import check_reload
    from scalingnote.serve.processing import ServiceError

    svc = server.app.state.service
    old_fp = svc.tower.fingerprint
    for q in ("fox quick", "dense retrieval", "vitamin risk", "product codes"):
        _search(server.url, q, mode="dense")

    class Shifted:  # same space label, rotated vectors
        fingerprint, compat_id = "shifted", svc.tower.compat_id

        def encode_queries(self, texts, **kw):
            return np.roll(np.asarray(svc.tower.encode_queries(texts, show_progress=False)), 3, axis=1)

    with pytest.raises(ServiceError) as e:
        check_reload(svc, Shifted())
    assert (
        e.value.status == 409
        and "overlaps the running tower's by" in e.value.detail
        and "4 recent queries" in e.value.detail
    )
    assert svc.tower.fingerprint == old_fp
    assert _search(server.url, "fox quick", mode="dense")
