"""The service over a live index whose storage refuses writes: a full disk answers 507, an I/O
error 503, both with ``Retry-After`` and the cause; ``/healthz`` and ``/metrics`` say writes are
refused while searches go on; the next write that succeeds clears it; nothing refused is kept."""

from __future__ import annotations

import errno

import httpx
import pytest

from benchmarks._faults import FaultyOS
from scalingnote.serve import BackgroundServer, ServeSettings, create_app, metric_value, parse_metrics

TOKEN = "live-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def server(live_index, tiny_bert_dir):
    app = create_app(live_index, tiny_bert_dir, ServeSettings(port=0, admin_token=TOKEN, max_wait_ms=2))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        yield srv


def _post(url, *docs):
    return httpx.post(url + "/documents", json={"documents": list(docs)}, headers=AUTH, trust_env=False, timeout=60)


def _bm25(url, q):
    r = httpx.post(url + "/search", json={"query": q, "k": 5, "mode": "bm25"}, trust_env=False)
    assert r.status_code == 200, r.text
    return [h["doc_id"] for h in r.json()["results"]]


def _degraded(url):
    return metric_value(
        parse_metrics(httpx.get(url + "/metrics", trust_env=False).text), "scalingnote_live_writes_degraded"
    )


def test_a_full_disk_and_an_io_error_refuse_writes_and_searches_go_on(server):
    url, fio = server.url, FaultyOS()
    server.app.state.service.index.wal.io = fio  # the log's OS calls: the injection seam
    fio.arm("pwrite", errno.ENOSPC, partial=True)
    r = _post(url, {"_id": "full1", "title": "walrus", "text": "zzwalrus on the ice"})
    assert r.status_code == 507 and r.json()["error"] == "insufficient_storage", r.text
    assert (
        "ENOSPC" in r.json()["detail"]
        and "nothing of the batch was kept" in r.json()["detail"]
        and r.headers["Retry-After"] == "30"
    )
    h = httpx.get(url + "/healthz", trust_env=False)
    assert h.status_code == 200 and h.json()["status"] == "degraded" and h.json()["writes"]["cause"] == "ENOSPC", h.text
    assert _degraded(url) == 1 and _bm25(url, "zzwalrus") == []  # searches answer; the refused document is not there
    fio.arm("fsync", errno.EIO)
    r = httpx.delete(url + "/documents/d0", headers=AUTH, trust_env=False)
    assert (
        r.status_code == 503
        and r.json()["error"] == "storage_error"
        and "EIO" in r.json()["detail"]
        and r.headers["Retry-After"] == "5"
    )
    assert httpx.get(url + "/healthz", trust_env=False).json()["writes"]["cause"] == "EIO"
    m = parse_metrics(httpx.get(url + "/metrics", trust_env=False).text)
    assert metric_value(m, "scalingnote_live_write_errors_total", op="write", cause="ENOSPC") == 1
    assert metric_value(m, "scalingnote_live_write_errors_total", op="write", cause="EIO") == 1
    r = _post(url, {"_id": "ok1", "title": "seal", "text": "zzseal on the rock"})  # space is back
    assert r.status_code == 200 and r.json()["seq"] == 1, r.text  # the refused writes took no sequence number
    assert httpx.get(url + "/healthz", trust_env=False).json()["status"] == "ok" and _degraded(url) == 0
    assert (
        _bm25(url, "zzseal") == ["ok1"]
        and _bm25(url, "zzwalrus") == []
        and "d0" in server.app.state.service.index.row_of
    )
