"""The Milvus live index (Milvus Lite) under failed writes: a refused batch takes no row key (so
deleting it can never delete an acknowledged document), a batch logged but not written to Milvus
survives a compaction, and a failed Milvus write leaves the service consistent."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from tests.helpers.milvus_lite import open_live, row_counts


def _vec(w, n, seed):
    return np.random.default_rng(seed).standard_normal((n, int(w.manifest["dim"]))).astype(np.float32)


def _fail_once(monkeypatch, name, err=errno.EIO):
    real = getattr(os, name)
    left = [1]

    def fake(*args):
        if left[0]:
            left[0] = 0
            raise OSError(err, os.strerror(err))
        return real(*args)

    monkeypatch.setattr(os, name, fake)


def test_deleting_a_refused_document_never_deletes_an_acknowledged_one(lite, tiny_bert_dir, monkeypatch):
    """The log's fsync fails for batch "refused"; "acked" follows. Before: the refused record stayed
    in the log with the same first row key as "acked", came back at restart, and deleting it
    removed the acknowledged document's row."""
    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    w.upsert([Document("first", "zzfirst", "", "zzfirst words")], vectors=_vec(w, 1, 2))  # the log segment exists
    _fail_once(monkeypatch, "fsync")
    with pytest.raises((OSError, ScalingNoteError)):
        w.upsert([Document("refused", "zzrefused", "", "zzrefused words")], vectors=_vec(w, 1, 0))
    monkeypatch.undo()
    w.upsert([Document("acked", "zzacked", "", "zzacked words")], vectors=_vec(w, 1, 1))
    n = len(w)
    w.close()
    w = open_live(db, idx, tiny_bert_dir)
    gone = w.delete(["refused"])
    assert "acked" in w.row_of and row_counts(db, ["acked"]) == {
        "acked": 1
    }  # before: DELETE refused removed acked's row
    assert gone["deleted"] == 0 and "refused" not in w.row_of and len(w) == n
    assert w.searcher().search(["zzrefused"], 5, mode="bm25").doc_ids[0] == []
    w.close()


def test_a_batch_logged_but_not_written_survives_a_compaction(lite, tiny_bert_dir):
    """Milvus refuses the upsert after the log append (409: in the log); a compaction before any
    restart must not checkpoint without it and drop its log."""
    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    real = w.client.upsert
    w.client.upsert = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("milvus down"))
    with pytest.raises(ScalingNoteError, match="write-ahead log"):
        w.upsert([Document("pending", "zzpending", "", "zzpending words")], vectors=_vec(w, 1, 0))
    w.client.upsert = real
    try:
        w.compact()
    except ScalingNoteError:
        pass  # refusing the compaction keeps the batch too
    w.close()
    w = open_live(db, idx, tiny_bert_dir)
    assert "pending" in w.row_of and row_counts(db, ["pending"]) == {"pending": 1}
    assert w.searcher().search(["zzpending"], 5, mode="bm25").doc_ids[0] == ["pending"]
    w.close()


def test_a_compaction_while_milvus_still_refuses_is_refused_and_keeps_the_batch(lite, tiny_bert_dir):
    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    real = w.client.upsert
    w.client.upsert = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("milvus down"))
    with pytest.raises(ScalingNoteError, match="write-ahead log"):
        w.upsert([Document("pending", "zzpending", "", "zzpending words")], vectors=_vec(w, 1, 0))
    with pytest.raises(ScalingNoteError, match="wait to be written"):
        w.compact()
    with pytest.raises(ScalingNoteError, match="nothing of this request was logged"):
        w.delete(["d0"])  # a later write is refused too, before it is logged
    assert w.wal.last_seq == 1 and "d0" in w.row_of
    w.client.upsert = real
    w.close()  # killed here: the batch is in the log
    w = open_live(db, idx, tiny_bert_dir)
    assert "pending" in w.row_of and "d0" in w.row_of and row_counts(db, ["pending"]) == {"pending": 1}
    w.close()


def test_the_service_answers_409_then_503_while_milvus_refuses_and_applies_the_logged_batch(lite, tiny_bert_dir):
    """409: the batch is in the log (applied before the next write goes ahead, or at restart); the
    next write is refused with 503 backend_unavailable (nothing logged); /healthz says degraded;
    once Milvus takes writes again the next write applies the logged batch first."""
    import time

    from fastapi.testclient import TestClient

    from scalingnote.serve import ServeSettings, create_app

    db, idx = lite
    token = "milvus-live-admin-token-0123"
    settings = ServeSettings(
        port=0, backend="milvus", uri=db, collection="docs", live_dir=str(idx), admin_token=token, max_wait_ms=2
    )
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(db, tiny_bert_dir, settings), client=("127.0.0.1", 50000)) as c:
        t0 = time.monotonic()
        while c.get("/healthz").status_code != 200 and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        w = c.app.state.service.index
        real = w.client.upsert
        w.client.upsert = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("milvus down"))
        r = c.post("/documents", json=[{"_id": "p1", "title": "tapir", "text": "zztapir"}], headers=auth)
        assert r.status_code == 409 and r.json()["error"] == "ingest_refused" and "seq 1" in r.json()["detail"], r.text
        r = c.post("/documents", json=[{"_id": "p2", "title": "okapi", "text": "zzokapi"}], headers=auth)
        assert (
            r.status_code == 503 and r.json()["error"] == "backend_unavailable" and r.headers["Retry-After"] == "5"
        ), r.text
        h = c.get("/healthz").json()
        assert h["status"] == "degraded" and h["writes"]["cause"] == "backend_unavailable"
        assert (
            c.post("/search", json={"query": "zztapir", "k": 5, "mode": "bm25"}).status_code == 200
        )  # searches answer
        w.client.upsert = real
        r = c.post("/documents", json=[{"_id": "p3", "title": "kudu", "text": "zzkudu"}], headers=auth)
        assert r.status_code == 200 and r.json()["seq"] == 2, r.text
        found = {
            q: [h["doc_id"] for h in c.post("/search", json={"query": q, "k": 5, "mode": "bm25"}).json()["results"]]
            for q in ("zztapir", "zzokapi", "zzkudu")
        }
        assert (
            found == {"zztapir": ["p1"], "zzokapi": [], "zzkudu": ["p3"]} and c.get("/healthz").json()["status"] == "ok"
        )
